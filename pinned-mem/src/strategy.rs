//! Strategies for moving a file range to the GPU, and how `Auto` picks one.

use std::fmt;

use crate::error::{Error, Result};
use crate::util::{Bytes, MAX_COUNT, MAX_SIZE, MAX_THREADS, page_size};

/// How a [`Streamer`](crate::Streamer) moves bytes. Sizes are in bytes.
///
/// ```
/// use wirespeed_pinned::Strategy;
/// assert_eq!(Strategy::Auto.to_string(), "auto");
/// assert_eq!(Strategy::Windows { window: 256 << 20, in_flight: 3 }.to_string(), "windows 256 MiB x3");
/// assert_eq!(Strategy::Ring { slots: 8, slot: 16 << 20, threads: 4 }.to_string(), "ring 8 x 16 MiB, 4 threads");
/// ```
///
/// New strategies may come in later versions (`#[non_exhaustive]`): a `match`
/// on it needs a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Pick from the budget and the file (see [`Streamer::resolve`](crate::Streamer::resolve)).
    /// When it picks the hybrid, a ring thread also waits in reserve and joins
    /// once the copy engine shows room
    /// ([`StreamConfig::reserve_threads`](crate::StreamConfig::reserve_threads)).
    Auto,
    /// Register the whole range (the whole file when it fits) once, keep the
    /// registration in the streamer, and copy from it: later passes cost no
    /// registration. Needs the range's pages in the budget.
    WholeFile,
    /// Sliding registered windows of `window` bytes: one thread registers the
    /// next windows while the earlier ones copy, up to `in_flight` registered at
    /// once, then unregisters that batch together once its copies completed
    /// (`cudaHostUnregister` waits for all copies in flight, so one drain per
    /// batch instead of per window). Needs `window * in_flight`.
    Windows {
        /// Bytes per window (rounded up to pages).
        window: usize,
        /// Windows registered at once (>= 2 to overlap registering with copying;
        /// more makes fewer drains).
        in_flight: usize,
    },
    /// The pinned ring: `threads` threads `pread` the file into `slots` pinned
    /// slots of `slot` bytes, each copied as soon as filled. Needs `slots * slot`,
    /// and up to a page more per slot ([`Strategy::pinned_bytes`]).
    Ring {
        /// Number of slots.
        slots: usize,
        /// Bytes per slot.
        slot: usize,
        /// Producer threads.
        threads: usize,
    },
    /// Windows and the ring at once: one thread registers windows of `window`
    /// bytes from the front of the range (4 registered at once) while
    /// `threads` ring threads copy slots of `slot` bytes from the back (4 slots
    /// per thread); they meet where their rates put them. Needs
    /// `4 * window + 4 * threads * slot`, and up to a page more per slot.
    Hybrid {
        /// Bytes per window (rounded up to pages).
        window: usize,
        /// Bytes per ring slot.
        slot: usize,
        /// Ring threads (besides the window thread).
        threads: usize,
    },
    /// For files not in the page cache: `threads` threads read with `O_DIRECT`
    /// straight into `slots` aligned pinned slots of `slot` bytes (rounded up to
    /// 4 KiB). Fails with [`Error::DirectUnsupported`] where the file system
    /// refuses `O_DIRECT` (tmpfs). When [`Strategy::Auto`] plans it for a cold
    /// range, it reads each file the way chosen for it: `O_DIRECT`, or
    /// through the page cache with readahead where the file system refuses
    /// `O_DIRECT` or those reads prove clearly faster
    /// ([`Breakdown::buffered_bytes`](crate::Breakdown::buffered_bytes)).
    Direct {
        /// Number of slots.
        slots: usize,
        /// Bytes per slot (rounded up to 4 KiB).
        slot: usize,
        /// Reader threads.
        threads: usize,
    },
}

/// `O_DIRECT` alignment of offsets, lengths and buffers (covers 512 B and 4 KiB sectors).
pub(crate) const DIRECT_ALIGN: u64 = 4096;
/// Windows registered at once by the hybrid (then unregistered together).
pub(crate) const HYBRID_IN_FLIGHT: usize = 4;
/// Windows registered at once when `Auto` picks windows alone.
const WINDOWS_IN_FLIGHT: usize = 4;
/// Ring slots per ring thread in the hybrid (and in the rings `Auto` plans):
/// enough for one being filled while the others copy.
pub(crate) const HYBRID_SLOTS_PER_THREAD: usize = 4;
/// The ring slot `Auto` aims for: small enough to stay in the last-level cache
/// between the fill and the DMA, large enough that a copy runs near the line
/// rate (smaller copies fall short of it).
const AUTO_SLOT: u64 = 4 << 20;
impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |x: usize| Bytes(x as u64);
        let t = |n: usize| if n == 1 { "1 thread".to_string() } else { format!("{n} threads") };
        match *self {
            Strategy::Auto => write!(f, "auto"),
            Strategy::WholeFile => write!(f, "whole-file"),
            Strategy::Windows { window, in_flight } => write!(f, "windows {} x{in_flight}", b(window)),
            Strategy::Ring { slots, slot, threads } => write!(f, "ring {slots} x {}, {}", b(slot), t(threads)),
            Strategy::Hybrid { window, slot, threads } => {
                write!(f, "hybrid {} windows + {} slots, {}", b(window), b(slot), t(threads))
            }
            Strategy::Direct { slots, slot, threads } => write!(f, "direct {slots} x {}, {}", b(slot), t(threads)),
        }
    }
}

impl Strategy {
    /// Pinned bytes the strategy needs at once for a range of `len` bytes
    /// (`None` for `Auto`), at most: each ring slot may take up to a page more
    /// than its size, to start on a page boundary where `cudaHostAlloc` did
    /// not align it (see [`PinnedRing::new`](crate::PinnedRing::new)).
    ///
    /// ```
    /// use wirespeed_pinned::Strategy;
    /// let b = Strategy::Ring { slots: 4, slot: 1 << 20, threads: 2 }.pinned_bytes(1 << 30).unwrap();
    /// assert!(b >= 4 << 20 && b < (4 << 20) + 4 * 65536);
    /// ```
    pub fn pinned_bytes(&self, len: u64) -> Option<u64> {
        self.bytes_pinned(len, true)
    }

    /// The ring the strategy streams through, as (slots, slot bytes): the
    /// ring's and `O_DIRECT`'s own, and [`HYBRID_SLOTS_PER_THREAD`] per ring
    /// thread for the hybrid. `None` for strategies without a ring.
    pub(crate) fn ring_shape(&self) -> Option<(usize, usize)> {
        match *self {
            Strategy::Ring { slots, slot, .. } | Strategy::Direct { slots, slot, .. } => Some((slots, slot)),
            Strategy::Hybrid { slot, threads, .. } => Some((threads.saturating_mul(HYBRID_SLOTS_PER_THREAD), slot)),
            _ => None,
        }
    }

    /// [`Strategy::pinned_bytes`] without the slots' alignment slack: what
    /// the strategy pins where `cudaHostAlloc` page-aligns its blocks (as the
    /// CUDA runtime does for slots of a few MiB). The streamer checks a given
    /// strategy against this; a slot that needs slack the budget cannot
    /// grant then fails as it is allocated, with nothing left pinned.
    pub(crate) fn nominal_bytes(&self, len: u64) -> Option<u64> {
        self.bytes_pinned(len, false)
    }

    fn bytes_pinned(&self, len: u64, slack: bool) -> Option<u64> {
        // In u128, saturating; more than u64 holds reads as u64::MAX, which no
        // budget grants.
        let page = u128::from(page_size());
        let up = |x: u128, a: u128| x.div_ceil(a).saturating_mul(a);
        let n = |x: usize| x as u128;
        let pad = if slack { page - 1 } else { 0 };
        // A ring slot and its alignment slack.
        let slot = |x: usize| n(x).saturating_add(pad);
        let bytes = match *self {
            Strategy::Auto => return None,
            Strategy::WholeFile => up(u128::from(len), page).saturating_add(page),
            Strategy::Windows { window, in_flight } => up(n(window), page).saturating_mul(n(in_flight)),
            Strategy::Ring { slots, slot: s, .. } => n(slots).saturating_mul(slot(s)),
            Strategy::Hybrid { window, slot: s, threads } => up(n(window), page)
                .saturating_mul(n(HYBRID_IN_FLIGHT))
                .saturating_add(n(threads).saturating_mul(n(HYBRID_SLOTS_PER_THREAD)).saturating_mul(slot(s))),
            Strategy::Direct { slots, slot: s, .. } => {
                n(slots).saturating_mul(up(n(s), u128::from(DIRECT_ALIGN)).saturating_add(pad))
            }
        };
        Some(u64::try_from(bytes).unwrap_or(u64::MAX))
    }

    /// Checks the sizes and rounds them as the streamer uses them.
    pub(crate) fn normalized(self) -> Result<Strategy> {
        let page = page_size() as usize;
        let round = |x: usize, a: usize| x.div_ceil(a).saturating_mul(a);
        let bad = |m: String| Err(Error::invalid("Strategy", m));
        if let Strategy::Ring { threads, .. } | Strategy::Hybrid { threads, .. } | Strategy::Direct { threads, .. } =
            self
            && threads > MAX_THREADS
        {
            return bad(format!("{self:?}: at most {MAX_THREADS} threads"));
        }
        if let Strategy::Windows { in_flight: count, .. }
        | Strategy::Ring { slots: count, .. }
        | Strategy::Direct { slots: count, .. } = self
            && count > MAX_COUNT
        {
            return bad(format!("{self:?}: at most {MAX_COUNT} windows in flight or ring slots"));
        }
        let largest = match self {
            Strategy::Auto | Strategy::WholeFile => 0,
            Strategy::Windows { window, .. } => window,
            Strategy::Ring { slot, .. } | Strategy::Direct { slot, .. } => slot,
            Strategy::Hybrid { window, slot, .. } => window.max(slot),
        };
        if largest > MAX_SIZE {
            return bad(format!("{self:?}: windows and slots of at most {} each", Bytes(MAX_SIZE as u64)));
        }
        match self {
            Strategy::Auto | Strategy::WholeFile => Ok(self),
            Strategy::Windows { window, in_flight } => {
                if window == 0 || in_flight == 0 {
                    return bad(format!("{self:?}: window and in_flight must be > 0"));
                }
                Ok(Strategy::Windows { window: round(window, page), in_flight })
            }
            Strategy::Ring { slots, slot, threads } => {
                if slots == 0 || slot == 0 || threads == 0 {
                    return bad(format!("{self:?}: slots, slot and threads must be > 0"));
                }
                Ok(self)
            }
            Strategy::Hybrid { window, slot, threads } => {
                if window == 0 || slot == 0 || threads == 0 {
                    return bad(format!("{self:?}: window, slot and threads must be > 0"));
                }
                Ok(Strategy::Hybrid { window: round(window, page), slot, threads })
            }
            Strategy::Direct { slots, slot, threads } => {
                if slots == 0 || slot == 0 || threads == 0 {
                    return bad(format!("{self:?}: slots, slot and threads must be > 0"));
                }
                Ok(Strategy::Direct { slots, slot: round(slot, DIRECT_ALIGN as usize), threads })
            }
        }
    }
}

const MIB: u64 = 1 << 20;

/// The largest window `Auto` gives the hybrid: larger ones leave the copy
/// engine waiting while they register.
const HYBRID_WINDOW_MAX: u64 = 128 * MIB;

/// What `Auto` picks for a range of `len` bytes with `avail` pinned bytes
/// usable, on a machine of `cpus` CPUs; `cold` when the range is mostly not in
/// the page cache (and `O_DIRECT` may be tried).
///
/// * the range fits: whole-file (registered once, reused across passes);
/// * else, cold: `O_DIRECT` reads into a ring, up to 8 reads in flight;
/// * else, room for four windows of at least 32 MiB beside the ring: the
///   hybrid. Registered windows cost little CPU per byte but run on one
///   thread; ring threads cost more CPU per byte each and add up. Splitting
///   the bytes about evenly between them stays near the line rate at a low
///   CPU cost: 4 ring threads (fewer on small machines) with 4 slots of 4 MiB
///   each, and the rest of the budget to four windows (at most
///   `HYBRID_WINDOW_MAX` each). Where registering is slow, the window thread
///   registers for the whole pass ([`Report::breakdown`]) and more ring
///   threads carry more bytes past it, at the ring's CPU cost per byte
///   (registering cannot be spread over threads: the driver serializes it
///   device-wide, see `streamer/windows.rs`). So a fifth ring thread waits in
///   reserve and joins during the pass once the copy engine shows room
///   (`StreamConfig::reserve_threads`, `streamer/reserve.rs`): where the
///   engine is already the bound it stays asleep, and where registering is
///   fast the pass keeps its CPU cost;
/// * else, room for four windows of at least 16 MiB: windows;
/// * else the ring with what fits (slots of 64 KiB at least), or `None`.
///
/// [`Report::breakdown`]: crate::Report::breakdown
pub(crate) fn plan(len: u64, avail: u64, cpus: usize, cold: bool) -> Option<Strategy> {
    let page = page_size();
    // The range's pages and a page of slack, where that sum has a value.
    if len.checked_next_multiple_of(page).and_then(|p| p.checked_add(page)).is_some_and(|need| need <= avail) {
        return Some(Strategy::WholeFile);
    }
    let floor_pow2 = |x: u64| if x == 0 { 0 } else { 1u64 << (63 - x.leading_zeros()) };
    if cold {
        let threads = cpus.clamp(2, 8);
        let slots = 2 * threads;
        // A page per slot of headroom: its alignment slack (see pinned_bytes).
        let slot = floor_pow2((avail / slots as u64).saturating_sub(page)).min(8 * MIB);
        if slot >= DIRECT_ALIGN * 16 {
            return Some(Strategy::Direct { slots, slot: slot as usize, threads });
        }
    }
    let threads = (cpus / 4).clamp(1, 4);
    let slots = (threads * HYBRID_SLOTS_PER_THREAD) as u64;
    let slot = floor_pow2((avail / 4 / slots).saturating_sub(page)).min(AUTO_SLOT);
    if slot >= MIB {
        // At most a quarter of `avail` (see `slot`).
        let ring = slot.saturating_add(page - 1).saturating_mul(slots);
        let window = (avail.saturating_sub(ring) / HYBRID_IN_FLIGHT as u64 / MIB * MIB).min(HYBRID_WINDOW_MAX);
        if window >= 32 * MIB {
            return Some(Strategy::Hybrid { window: window as usize, slot: slot as usize, threads });
        }
    }
    // Small windows cost more registering time per byte: below 16 MiB the
    // ring is faster.
    let window = (avail / WINDOWS_IN_FLIGHT as u64 / page * page).min(1 << 30);
    if window >= 16 * MIB {
        return Some(Strategy::Windows { window: window as usize, in_flight: WINDOWS_IN_FLIGHT });
    }
    let threads = cpus.clamp(1, 8);
    for slots in [HYBRID_SLOTS_PER_THREAD * threads, 2 * threads, threads, 2] {
        let slot = floor_pow2((avail / slots as u64).saturating_sub(page)).min(AUTO_SLOT);
        if slot >= 64 << 10 {
            return Some(Strategy::Ring { slots, slot: slot as usize, threads: threads.min(slots) });
        }
    }
    None
}

/// The most ring threads `Auto` gives a lone piece ([`plan_lone`]).
const LONE_THREADS: usize = 8;

/// What `Auto` picks for a lone range of a file too large for `avail`, when
/// the range itself fits but was not asked for recently: it is copied once,
/// so registering it whole (then copying it, then unregistering it) costs
/// more than copying it through the ring. The ring has the shape of the
/// hybrid's (which `plan` gives the file's longer passes, so that the
/// streamer keeps one ring for both) and more threads: a piece has no
/// windows beside it, and its threads can start together. A cold range reads
/// with `O_DIRECT` as in [`plan`]; where the budget holds no hybrid, what
/// `plan` picks for a range that does not fit.
pub(crate) fn plan_lone(avail: u64, cpus: usize, cold: bool) -> Option<Strategy> {
    match plan(avail.saturating_add(1), avail, cpus, cold)? {
        Strategy::Hybrid { slot, threads, .. } => Some(Strategy::Ring {
            slots: threads * HYBRID_SLOTS_PER_THREAD,
            slot,
            threads: (cpus / 2).clamp(threads, LONE_THREADS.max(threads)),
        }),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pinned_bytes_saturates() {
        let huge = super::Strategy::Hybrid { window: usize::MAX, slot: usize::MAX, threads: usize::MAX };
        assert_eq!(huge.pinned_bytes(u64::MAX), Some(u64::MAX));
        let huge = super::Strategy::Direct { slots: usize::MAX, slot: usize::MAX, threads: 1 };
        assert_eq!(huge.pinned_bytes(1), Some(u64::MAX));
        assert_eq!(super::Strategy::WholeFile.pinned_bytes(u64::MAX), Some(u64::MAX));
    }

    use super::*;

    #[test]
    fn display_short_names() {
        assert_eq!(Strategy::WholeFile.to_string(), "whole-file");
        assert_eq!(Strategy::Windows { window: 256 << 20, in_flight: 3 }.to_string(), "windows 256 MiB x3");
        assert_eq!(
            Strategy::Hybrid { window: 1 << 30, slot: 16 << 20, threads: 4 }.to_string(),
            "hybrid 1 GiB windows + 16 MiB slots, 4 threads"
        );
        assert_eq!(Strategy::Direct { slots: 8, slot: 8 << 20, threads: 1 }.to_string(), "direct 8 x 8 MiB, 1 thread");
    }

    #[test]
    fn normalize() {
        let p = page_size() as usize;
        assert_eq!(
            Strategy::Windows { window: p + 1, in_flight: 2 }.normalized().unwrap(),
            Strategy::Windows { window: 2 * p, in_flight: 2 }
        );
        assert_eq!(
            Strategy::Direct { slots: 2, slot: 5000, threads: 1 }.normalized().unwrap(),
            Strategy::Direct { slots: 2, slot: 8192, threads: 1 }
        );
        assert!(Strategy::Ring { slots: 0, slot: 1, threads: 1 }.normalized().is_err());
        assert!(Strategy::Hybrid { window: 1, slot: 1, threads: 0 }.normalized().is_err());
        // Sizes that would abort an allocation or overflow are typed errors.
        assert!(Strategy::Windows { window: 4096, in_flight: 1 << 40 }.normalized().is_err());
        assert!(Strategy::Windows { window: usize::MAX, in_flight: 2 }.normalized().is_err());
        assert!(Strategy::Ring { slots: usize::MAX, slot: 4096, threads: 1 }.normalized().is_err());
        assert!(Strategy::Hybrid { window: 1 << 20, slot: usize::MAX, threads: 1 }.normalized().is_err());
        assert!(Strategy::Direct { slots: 2, slot: usize::MAX, threads: 1 }.normalized().is_err());
    }

    #[test]
    fn a_lone_piece_plans_the_hybrids_ring_with_more_threads() {
        let gib = 1u64 << 30;
        // The hybrid's ring (16 slots of 4 MiB for 4 GiB) with half the cores, at most 8.
        assert_eq!(plan_lone(4 * gib, 16, false), Some(Strategy::Ring { slots: 16, slot: 4 << 20, threads: 8 }));
        assert_eq!(plan_lone(4 * gib, 64, false), Some(Strategy::Ring { slots: 16, slot: 4 << 20, threads: 8 }));
        match (plan(4 * gib + 1, 4 * gib, 16, false), plan_lone(4 * gib, 16, false)) {
            (Some(Strategy::Hybrid { slot, threads, .. }), Some(Strategy::Ring { slots, slot: s, .. })) => {
                assert_eq!((slots, s), (threads * HYBRID_SLOTS_PER_THREAD, slot));
            }
            other => panic!("{other:?}"),
        }
        // Never fewer threads than the hybrid's, on a small machine too.
        assert!(matches!(plan_lone(4 * gib, 2, false), Some(Strategy::Ring { threads: 1, .. })));
        // Cold: O_DIRECT, as `plan` reads a cold range.
        assert!(matches!(plan_lone(4 * gib, 16, true), Some(Strategy::Direct { .. })));
        // Small budgets: what `plan` picks for a range that does not fit.
        assert!(matches!(plan_lone(100 * MIB, 2, false), Some(Strategy::Windows { .. })));
        assert_eq!(plan_lone(1000, 2, false), None);
        assert!(plan_lone(u64::MAX, 16, false).is_some());
    }

    #[test]
    fn auto_plans() {
        let gib = 1u64 << 30;
        assert_eq!(plan(gib, 2 * gib, 16, false), Some(Strategy::WholeFile));
        assert_eq!(plan(gib, 2 * gib, 16, true), Some(Strategy::WholeFile));
        match plan(68 * gib, 8 * gib, 16, false) {
            Some(s @ Strategy::Hybrid { window, slot, threads }) => {
                assert_eq!((window, slot, threads), (128 << 20, 4 << 20, 4));
                assert!(s.pinned_bytes(68 * gib).unwrap() <= 8 * gib);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(plan(68 * gib, 8 * gib, 16, true), Some(Strategy::Direct { threads: 8, .. })));
        // 8x the budget at 512 MiB: four windows of 111 MiB and 4 x 4 x 4 MiB
        // of ring (and its alignment slack).
        assert_eq!(
            plan(4 * gib, 512 * MIB, 16, false),
            Some(Strategy::Hybrid { window: 111 << 20, slot: 4 << 20, threads: 4 })
        );
        assert!(matches!(plan(gib, 100 * MIB, 2, false), Some(Strategy::Windows { in_flight: 4, .. })));
        assert!(matches!(plan(gib, 40 * MIB, 2, false), Some(Strategy::Ring { .. })));
        assert!(matches!(plan(gib, 2 * MIB, 2, false), Some(Strategy::Ring { .. })));
        assert_eq!(plan(gib, 1000, 2, false), None);
        // Lengths whose pages (and a page) do not fit in u64 plan within the
        // budget, never whole-file (rounding once wrapped to 0).
        for len in [u64::MAX, u64::MAX - 4095, u64::MAX - page_size(), 1 << 63] {
            for avail in [16 * MIB, u64::MAX] {
                let s = plan(len, avail, 2, false).expect("a plan");
                let fits = len == 1 << 63 && avail == u64::MAX;
                assert_eq!(s == Strategy::WholeFile, fits, "{len} in {avail}: {s}");
                assert!(s.pinned_bytes(len).unwrap() <= avail, "{s} over {avail}");
            }
        }
        for avail in [MIB, 10 * MIB, 100 * MIB, gib, 10 * gib] {
            for cpus in [1, 2, 16, 64] {
                for cold in [false, true] {
                    if let Some(s) = plan(100 * gib, avail, cpus, cold) {
                        assert!(s.pinned_bytes(100 * gib).unwrap() <= avail, "{s} over {avail}");
                        assert!(s.normalized().is_ok());
                    }
                }
            }
        }
    }
}
