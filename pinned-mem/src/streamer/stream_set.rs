//! A set of the streamer's streams, by index ([`StreamSet`]): the streams a
//! piece's copies go to, and those an event was recorded on.

use wirespeed_cuda::Stream;

/// A set of stream indices (`0..64`: a streamer has at most 64 devices, one
/// stream each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct StreamSet(u64);

impl StreamSet {
    /// No stream.
    pub(super) const EMPTY: StreamSet = StreamSet(0);

    /// Stream `i` alone.
    pub(super) fn one(i: usize) -> StreamSet {
        StreamSet::EMPTY.with(i)
    }

    /// The first `n` streams (all of a streamer's `n`).
    pub(super) fn first(n: usize) -> StreamSet {
        StreamSet(if n >= 64 { u64::MAX } else { (1 << n) - 1 })
    }

    /// This set and stream `i` (an index past 63 adds nothing).
    pub(super) fn with(self, i: usize) -> StreamSet {
        StreamSet(self.0 | bit(i))
    }

    /// Whether stream `i` is in the set.
    pub(super) fn contains(self, i: usize) -> bool {
        self.0 & bit(i) != 0
    }

    /// The streams of `streams` whose indices are in the set, in order.
    pub(super) fn pick(self, streams: &[Stream]) -> Vec<&Stream> {
        streams.iter().enumerate().filter(|(i, _)| self.contains(*i)).map(|(_, s)| s).collect()
    }
}

/// The bit of index `i`; none past 63.
fn bit(i: usize) -> u64 {
    u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)).unwrap_or(0)
}

impl FromIterator<usize> for StreamSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> StreamSet {
        iter.into_iter().fold(StreamSet::EMPTY, StreamSet::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_of_indices() {
        let s: StreamSet = [0, 3, 3].into_iter().collect();
        assert!(s.contains(0) && s.contains(3) && !s.contains(1) && !s.contains(64));
        assert_eq!(s, StreamSet::one(0).with(3));
        assert_eq!(StreamSet::first(3), StreamSet::one(0).with(1).with(2));
        assert!(StreamSet::first(64).contains(63));
        assert_eq!(StreamSet::first(0), StreamSet::EMPTY);
    }
}
