//! Byte ranges that do not overlap, each with a value, found by offset
//! ([`Spans`]): the transfers of a chained pass, in whatever order they were
//! queued.

use std::collections::BTreeMap;
use std::ops::Range;

/// Ranges that share no byte, each with a value: a range is added only if it
/// overlaps none of those already here, and an offset finds the range
/// holding it.
#[derive(Debug)]
pub(super) struct Spans<T> {
    /// Each range's end and value, by its start.
    by_start: BTreeMap<u64, (u64, T)>,
}

impl<T> Default for Spans<T> {
    fn default() -> Self {
        Spans { by_start: BTreeMap::new() }
    }
}

impl<T> Spans<T> {
    /// Whether `r` shares a byte with a range here (an empty `r` shares none).
    pub(super) fn overlaps(&self, r: &Range<u64>) -> bool {
        if r.start >= r.end {
            return false;
        }
        // The last range starting before `r` ends is the only one that can.
        self.by_start.range(..r.end).next_back().is_some_and(|(_, (end, _))| *end > r.start)
    }

    /// Adds `r` with `value`, unless it is empty or overlaps a range here;
    /// whether it was added.
    pub(super) fn insert(&mut self, r: Range<u64>, value: T) -> bool {
        if r.start >= r.end || self.overlaps(&r) {
            return false;
        }
        self.by_start.insert(r.start, (r.end, value));
        true
    }

    /// The value of the range holding `off`, if any.
    pub(super) fn find(&self, off: u64) -> Option<&T> {
        let (_, (end, value)) = self.by_start.range(..=off).next_back()?;
        (off < *end).then_some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_in_any_order_that_share_no_byte() {
        let mut s = Spans::default();
        assert!(s.insert(100..200, 'a'));
        assert!(s.insert(0..50, 'b'), "before the first: fine");
        assert!(s.insert(200..300, 'c'), "touching: fine");
        assert!(!s.insert(150..160, 'x'), "inside one");
        assert!(!s.insert(40..60, 'x'), "across an end");
        assert!(!s.insert(0..1000, 'x'), "around them");
        assert!(!s.insert(70..70, 'x'), "empty");
        assert!(s.insert(50..100, 'd'), "the gap, exactly");
        assert_eq!(
            [0, 49, 50, 99, 100, 199, 200, 299].map(|o| s.find(o).copied()),
            [Some('b'), Some('b'), Some('d'), Some('d'), Some('a'), Some('a'), Some('c'), Some('c')]
        );
        assert_eq!(s.find(300), None);
        assert!(!s.overlaps(&(300..400)));
        assert!(s.overlaps(&(299..400)));
    }
}
