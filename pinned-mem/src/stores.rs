//! How ring threads write into pinned slots: ordinary stores (`memcpy`) or
//! non-temporal ones, which send the bytes to memory without first reading
//! the slot's cache lines (x86-64 `movntdq`). The only unsafe code here is
//! the vector loop of [`copy`].

/// How a ring thread writes the bytes it copies into a pinned slot
/// ([`StreamConfig::slot_stores`](crate::StreamConfig::slot_stores),
/// [`FreeSlot::copy_from_with`](crate::FreeSlot::copy_from_with)).
///
/// Which is faster depends on the machine: ordinary stores leave the slot
/// in the CPU cache, where the copy engine's reads may find it, but each
/// line is first read from memory and later written back when evicted;
/// non-temporal stores write each line once, straight to memory. On targets
/// other than x86-64, [`SlotStores::NonTemporal`] copies as
/// [`SlotStores::Cached`] does. The bytes that arrive are the same either way.
///
/// ```
/// use wirespeed_pinned::{PinBudget, SlotStores, StreamConfig, Strategy};
/// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(512 << 20)).with_slot_stores(SlotStores::NonTemporal);
/// assert_eq!(cfg.slot_stores, SlotStores::NonTemporal);
/// assert_eq!(SlotStores::default(), SlotStores::Cached);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SlotStores {
    /// Ordinary stores (`memcpy`), the default.
    #[default]
    Cached,
    /// Non-temporal (streaming) stores, then a store fence before the slot is
    /// handed to the copy engine.
    NonTemporal,
}

impl std::fmt::Display for SlotStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotStores::Cached => "cached stores",
            SlotStores::NonTemporal => "non-temporal stores",
        })
    }
}

/// Copies `src` into the start of `dst` (which must be at least as long;
/// the caller checks) with `stores`.
pub(crate) fn copy(dst: &mut [u8], src: &[u8], stores: SlotStores) {
    let n = src.len().min(dst.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    match stores {
        #[cfg(target_arch = "x86_64")]
        SlotStores::NonTemporal => copy_nt(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// Bytes per step of the vector loop: four 16-byte stores, one cache line.
#[cfg(target_arch = "x86_64")]
const LINE: usize = 64;

#[cfg(target_arch = "x86_64")]
fn copy_nt(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let n = dst.len().min(src.len());
    // Ordinary stores up to the first 16-byte boundary of `dst`, then whole
    // lines with streaming stores, then ordinary stores for the tail.
    let head = dst.as_ptr().align_offset(16).min(n);
    let body = (n - head) / LINE * LINE;
    dst[..head].copy_from_slice(&src[..head]);
    let (d, s) = (dst[head..head + body].as_mut_ptr(), src[head..head + body].as_ptr());
    let mut i = 0;
    while i < body {
        // SAFETY: i + LINE <= body, so the 64 bytes at s + i lie inside
        // `src[head..head + body]` and those at d + i inside `dst[head..head +
        // body]`, which do not overlap (one is borrowed mutably, the other
        // shared). d + i is 16-byte aligned (d is, by `head`, and i is a
        // multiple of 64), as `_mm_stream_si128` requires; `_mm_loadu_si128`
        // takes any alignment. SSE2 is part of every x86-64 CPU.
        unsafe {
            let (s, d) = (s.add(i).cast::<__m128i>(), d.add(i).cast::<__m128i>());
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += LINE;
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
    // Streaming stores are weakly ordered: fence them before the slot is
    // handed on (its copy is enqueued by later stores), so that the copy
    // engine reads what was written.
    // SAFETY: `sfence` only orders stores; SSE is part of every x86-64 CPU.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::{SlotStores, copy};

    #[test]
    fn every_offset_and_length_arrives_whole() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for stores in [SlotStores::Cached, SlotStores::NonTemporal] {
            for off in [0, 1, 15, 16, 17, 63, 64, 100] {
                for len in [0, 1, 15, 16, 63, 64, 65, 127, 128, 1000, 2048] {
                    let mut dst = vec![0xAAu8; 2200];
                    let d = &mut dst[off..];
                    copy(d, &src[5..5 + len], stores);
                    assert_eq!(&dst[off..off + len], &src[5..5 + len], "{stores} off {off} len {len}");
                    assert!(dst[..off].iter().all(|&b| b == 0xAA), "{stores}: wrote before the slot");
                    assert!(dst[off + len..].iter().all(|&b| b == 0xAA), "{stores}: wrote past the bytes");
                }
            }
        }
    }

    #[test]
    fn a_short_slot_takes_what_fits() {
        let mut dst = [0u8; 70];
        copy(&mut dst, &[9u8; 200], SlotStores::NonTemporal);
        assert!(dst.iter().all(|&b| b == 9));
    }
}
