//! The parts of a pass not claimed yet ([`Claims`]): the agents take them
//! from the front or from the back of the range, and a [`Feed`] adds the
//! ranges of the transfers queued behind the first one to a running pass.

use std::ops::Range;
use std::sync::Mutex;

use wirespeed_cuda::locks::lock;

/// Where a running pass gets more ranges to stream (the transfers queued
/// behind the first one: `chain.rs`).
pub(super) trait Feed: Sync {
    /// The next range of the pass, starting at or after `end` (the end of
    /// the last one), ready to be claimed; `None` when there is none now (the
    /// pass then takes no more).
    fn next_range(&self, end: u64) -> Option<Range<u64>>;
}

/// The parts of the pass not claimed yet: the window agent takes from the
/// front, hybrid ring agents from the back. Claims end on multiples of their
/// size (absolute file offsets), so windows never share a page and direct
/// reads stay aligned.
///
/// A pass streams one range, or several, one after the other (a chained
/// pass: [`Feed`]). Each range is claimed from both ends like a lone one;
/// the front moves to the next range once fewer bytes are left than it
/// leaves (`front_leaving`), the back once nothing is left, and a claimer
/// that reaches the last range asks the feed for another. Once the feed has
/// none, it is asked no more: a range arriving later waits for the next pass
/// (a range is never added once the claimers that would take its end have
/// stopped).
pub(super) struct Claims<'f> {
    cursor: Mutex<Cursors>,
    feed: Option<&'f dyn Feed>,
}

struct Cursors {
    /// The unclaimed part of each range of the pass, in order.
    parts: Vec<Range<u64>>,
    /// The parts the front and the back claim from.
    front: usize,
    back: usize,
    /// The feed has had nothing once: no range is added any more.
    closed: bool,
    /// Where the last range of the pass ends (its part's end moves back as
    /// the back claims it, so the part cannot tell).
    end: u64,
}

/// Which claimer's cursor.
#[derive(Clone, Copy)]
enum Side {
    Front,
    Back,
}

impl Cursors {
    /// Moves `side`'s cursor to the next range (asking the feed for one
    /// when it is on the last); false when there is none.
    fn advance(&mut self, side: Side, feed: Option<&dyn Feed>) -> bool {
        let at = match side {
            Side::Front => self.front,
            Side::Back => self.back,
        };
        if at + 1 >= self.parts.len() && !self.more(feed) {
            return false;
        }
        match side {
            Side::Front => self.front += 1,
            Side::Back => self.back += 1,
        }
        true
    }

    /// Adds the feed's next range, if there is one and the pass still takes one.
    fn more(&mut self, feed: Option<&dyn Feed>) -> bool {
        if self.closed {
            return false;
        }
        match feed.and_then(|f| f.next_range(self.end)) {
            Some(r) if r.start >= self.end && r.start < r.end => {
                self.end = r.end;
                self.parts.push(r);
                true
            }
            _ => {
                self.closed = true;
                false
            }
        }
    }
}

impl<'f> Claims<'f> {
    /// The claims of a pass over `range`, and of the ranges `feed` adds.
    pub(super) fn new(range: Range<u64>, feed: Option<&'f dyn Feed>) -> Claims<'f> {
        let (end, closed) = (range.end, feed.is_none());
        Claims { cursor: Mutex::new(Cursors { parts: vec![range], front: 0, back: 0, closed, end }), feed }
    }

    /// The next part from the front, ending on a multiple of `size` (or at
    /// the range's end); `None` once nothing is left.
    pub(super) fn front(&self, size: u64) -> Option<Range<u64>> {
        self.front_leaving(size, 0)
    }

    /// As [`Claims::front`], but none from a range once fewer than `leave`
    /// bytes are left in it (the front then moves on to the next range).
    pub(super) fn front_leaving(&self, size: u64, leave: u64) -> Option<Range<u64>> {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            let p = c.parts.get_mut(c.front)?;
            if p.start < p.end && p.end - p.start >= leave {
                let end = ((p.start / size).saturating_add(1)).saturating_mul(size).min(p.end);
                let r = p.start..end;
                p.start = end;
                return Some(r);
            }
            if !c.advance(Side::Front, self.feed) {
                return None;
            }
        }
    }

    /// The next part from the back, starting on a multiple of `size` (or at
    /// the range's start); `None` once nothing is left.
    pub(super) fn back(&self, size: u64) -> Option<Range<u64>> {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            let p = c.parts.get_mut(c.back)?;
            if p.start < p.end {
                let start = ((p.end - 1) / size * size).max(p.start);
                let r = start..p.end;
                p.end = start;
                return Some(r);
            }
            if !c.advance(Side::Back, self.feed) {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn claims_meet_in_the_middle_on_boundaries() {
        let c = Claims::new(100..10_000, None);
        assert_eq!(c.front(4096), Some(100..4096));
        assert_eq!(c.back(1000), Some(9000..10_000));
        assert_eq!(c.back(1000), Some(8000..9000));
        assert_eq!(c.front(4096), Some(4096..8000));
        assert_eq!(c.front(4096), None);
        assert_eq!(c.back(1000), None);
    }

    #[test]
    fn front_claims_leave_the_end() {
        let c = Claims::new(0..10_000, None);
        assert_eq!(c.front_leaving(1000, 3000), Some(0..1000));
        assert_eq!(c.back(1000), Some(9000..10_000));
        assert_eq!(c.front_leaving(4000, 3000), Some(1000..4000));
        assert_eq!(c.front_leaving(1000, 5001), None, "5000 left, fewer than asked");
        assert_eq!(c.front(1000), Some(4000..5000), "plain claims still take it");
    }

    /// A feed of fixed ranges, counting how often it was asked.
    struct Ranges(Mutex<Vec<Range<u64>>>, AtomicU64);

    impl Feed for Ranges {
        fn next_range(&self, _end: u64) -> Option<Range<u64>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let mut v = lock(&self.0);
            if v.is_empty() { None } else { Some(v.remove(0)) }
        }
    }

    #[test]
    fn a_fed_pass_claims_each_range_from_both_ends_in_turn() {
        let feed = Ranges(Mutex::new(vec![1000..2000, 2500..3000]), AtomicU64::new(0));
        let c = Claims::new(0..1000, Some(&feed));
        assert_eq!(c.front_leaving(300, 400), Some(0..300));
        assert_eq!(c.back(100), Some(900..1000));
        assert_eq!(c.front_leaving(300, 400), Some(300..600));
        // 300 left, fewer than it leaves: the front moves on to the next range.
        assert_eq!(c.front_leaving(300, 400), Some(1000..1200));
        assert_eq!(c.back(100), Some(800..900), "the back finishes the first range");
        assert_eq!(c.back(250), Some(750..800));
        assert_eq!(c.back(250), Some(600..750));
        assert_eq!(c.back(100), Some(1900..2000), "then takes the next one's end");
        assert_eq!(feed.1.load(Ordering::Relaxed), 1);
        assert_eq!(c.front_leaving(300, 500), Some(1200..1500));
        assert_eq!(c.back(1000), Some(1500..1900), "cut at the range's start");
        assert_eq!(c.front(1000), Some(2500..3000), "the third range");
        assert_eq!(c.back(100), None);
        assert_eq!(c.front(1000), None);
        // The feed had nothing once: it is not asked again.
        let asked = feed.1.load(Ordering::Relaxed);
        lock(&feed.0).push(4000..5000);
        assert_eq!(c.back(100), None);
        assert_eq!(feed.1.load(Ordering::Relaxed), asked);
    }

    /// A feed that answers one range, whatever it is asked, noting the end
    /// it was asked for.
    struct Once(Mutex<Option<Range<u64>>>, Mutex<Vec<u64>>);

    impl Feed for Once {
        fn next_range(&self, end: u64) -> Option<Range<u64>> {
            lock(&self.1).push(end);
            let next = lock(&self.0).take()?;
            (next.start >= end).then_some(next)
        }
    }

    /// The feed is asked for a range after the end of the last range, not
    /// after the part of it the back has not claimed yet: a queued transfer
    /// overlapping the end of the one before once joined the pass, and its
    /// pieces went to the earlier transfer's destination ("a piece crosses
    /// the end of its transfer", found by the randomized test).
    #[test]
    fn the_feed_is_asked_after_the_last_range_not_after_its_unclaimed_part() {
        let feed = Once(Mutex::new(Some(700..2000)), Mutex::new(Vec::new()));
        let c = Claims::new(0..1000, Some(&feed));
        assert_eq!(c.back(300), Some(900..1000));
        assert_eq!(c.back(300), Some(600..900));
        assert_eq!(c.front(1000), Some(0..600));
        assert_eq!(c.front(1000), None, "700..2000 overlaps 0..1000: it does not join");
        assert_eq!(*lock(&feed.1), [1000]);
        assert_eq!(c.back(300), None);
    }

    #[test]
    fn a_range_behind_the_last_one_is_not_taken() {
        let feed = Ranges(Mutex::new(std::iter::once(0..10).collect()), AtomicU64::new(0));
        let c = Claims::new(100..200, Some(&feed));
        assert_eq!(c.front(1000), Some(100..200));
        assert_eq!(c.front(1000), None);
        assert_eq!(c.back(1000), None);
    }

    #[test]
    fn claims_cover_everything_once() {
        let c = Claims::new(7..1_000_003, None);
        let mut parts = Vec::new();
        let mut flip = false;
        loop {
            flip = !flip;
            let r = if flip { c.front(65536) } else { c.back(10_000) };
            match r {
                Some(r) => parts.push(r),
                None => break,
            }
        }
        parts.sort_by_key(|r| r.start);
        assert_eq!(parts[0].start, 7);
        for w in parts.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert_eq!(parts.last().map(|r| r.end), Some(1_000_003));
    }
}
