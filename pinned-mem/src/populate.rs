//! Which parts of a mapping have had their page tables populated
//! (`MADV_POPULATE_READ`, see [`MappedFile::populate`]): the streamer's ring
//! threads populate each part of a fresh mapping once, just before they
//! first copy from it, instead of taking a page fault every few pages.
//!
//! [`MappedFile::populate`]: crate::MappedFile::populate

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Parts are tracked, and populated, in granules of this many bytes.
pub(crate) const GRANULE: u64 = 2 << 20;

/// Set once the kernel refused `MADV_POPULATE_READ` (before Linux 5.14):
/// nothing is tried again in this process.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// The granules of one mapping claimed for populating since it was made (or
/// its page tables were dropped): a bit each.
#[derive(Debug)]
pub(crate) struct Populated {
    bits: Vec<AtomicU64>,
}

impl Populated {
    /// None claimed, for a mapping of `map_len` bytes.
    pub(crate) fn new(map_len: u64) -> Populated {
        let words = map_len.div_ceil(GRANULE).div_ceil(64);
        Populated { bits: (0..words).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Claims the granules of `range` that nobody claimed yet, and answers
    /// the bytes to populate now: from the first of them to the end of the
    /// last (granule-aligned, at most `map_len`), or `None` when there are
    /// none (or the kernel lacks the call).
    pub(crate) fn claim(&self, range: &Range<u64>, map_len: u64) -> Option<Range<u64>> {
        let end = range.end.min(map_len);
        if range.start >= end || UNSUPPORTED.load(Ordering::Relaxed) {
            return None;
        }
        let mut span: Option<(u64, u64)> = None;
        for g in range.start / GRANULE..=(end - 1) / GRANULE {
            let Some(word) = self.bits.get((g / 64) as usize) else { break };
            let bit = 1 << (g % 64);
            if word.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                span = Some(span.map_or((g, g), |(first, _)| (first, g)));
            }
        }
        span.map(|(first, last)| first * GRANULE..((last + 1) * GRANULE).min(map_len))
    }

    /// Forgets every claim: the mapping's page tables were dropped.
    pub(crate) fn clear(&self) {
        for w in &self.bits {
            w.store(0, Ordering::Relaxed);
        }
    }
}

/// Remembers that the kernel lacks `MADV_POPULATE_READ`.
pub(crate) fn mark_unsupported() {
    UNSUPPORTED.store(true, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_granule_is_claimed_once() {
        let map_len = 5 * GRANULE + 4096;
        let p = Populated::new(map_len);
        assert_eq!(p.claim(&(10..20), map_len), Some(0..GRANULE));
        assert_eq!(p.claim(&(0..GRANULE), map_len), None, "claimed already");
        // The span runs from the first new granule to the last, whatever lies between.
        assert_eq!(p.claim(&(GRANULE - 1..3 * GRANULE + 1), map_len), Some(GRANULE..4 * GRANULE));
        assert_eq!(p.claim(&(map_len - 1..map_len), map_len), Some(5 * GRANULE..map_len), "clipped");
        assert_eq!(p.claim(&(7..7), map_len), None, "empty");
        p.clear();
        assert_eq!(p.claim(&(0..map_len), map_len), Some(0..map_len));
        assert_eq!(p.claim(&(0..map_len + GRANULE), map_len), None, "nothing past the mapping");
        assert_eq!(p.claim(&(map_len..map_len + GRANULE), map_len), None);
    }
}
