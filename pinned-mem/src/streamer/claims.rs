//! The parts of a pass not claimed yet ([`Claims`]): the agents take them
//! from the front or from the back of the range, and a [`Feed`] adds the
//! ranges of the transfers queued behind the first one to a running pass,
//! each open at once or behind a [`Gate`].

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wirespeed_cuda::locks::lock;

use crate::strategy::Strategy;

/// Where a running pass gets more ranges to stream (the transfers queued
/// behind the first one: `chain.rs`).
pub(super) trait Feed: Sync {
    /// The next range of the pass, starting at or after `end` (the end of
    /// the last one), and the gate it waits behind, if any; `None` when
    /// there is none now (the pass then takes no more).
    fn next_range(&self, end: u64) -> Option<(Range<u64>, Option<Arc<Gate>>)>;
}

/// Whether passes of `strategy` take ranges added while they run: those
/// that stream through windows or the ring, not a whole registration.
pub(super) fn feeds(strategy: Strategy) -> bool {
    matches!(
        strategy,
        Strategy::Windows { .. } | Strategy::Ring { .. } | Strategy::Hybrid { .. } | Strategy::Direct { .. }
    )
}

/// A feed, and the bytes the pass it feeds is planned for (its first range
/// and those queued behind it when it starts).
#[derive(Clone, Copy)]
pub(super) struct Fed<'f> {
    pub(super) feed: &'f dyn Feed,
    pub(super) len: u64,
}

/// Holds a range of a pass back until it is opened: no part of it is
/// claimed before (a chained transfer whose copies must wait on the device
/// for something, which the pass may enqueue only once the transfers before
/// it have all their copies enqueued).
#[derive(Default)]
pub(super) struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    /// Opens the gate: its range may be claimed.
    pub(super) fn open(&self) {
        *lock(&self.open) = true;
        self.opened.notify_all();
    }

    /// Whether it is open.
    pub(super) fn is_open(&self) -> bool {
        *lock(&self.open)
    }

    /// Waits until it is open or `most` has passed; whether it is open.
    pub(super) fn wait(&self, most: Duration) -> bool {
        let g = lock(&self.open);
        let (g, _) = self.opened.wait_timeout_while(g, most, |open| !*open).unwrap_or_else(|p| p.into_inner());
        *g
    }
}

/// What a claimer gets.
pub(super) enum Claim {
    /// A part to stream.
    Part(Range<u64>),
    /// Nothing now: the next range waits behind this gate.
    Wait(Arc<Gate>),
    /// Nothing left.
    Done,
}

/// The parts of the pass not claimed yet: the window agent takes from the
/// front, hybrid ring agents from the back. Claims end on multiples of their
/// size (absolute file offsets), so windows never share a page and direct
/// reads stay aligned.
///
/// A pass streams one range, or several, one after the other (a chained
/// pass: [`Feed`]). Each range is claimed from both ends like a lone one,
/// but for what the front leaves (`front_leaving`): the last bytes of the
/// pass, not of each range. Each claimer moves to the next range once
/// nothing is left in its own, and a claimer that reaches the last range, or
/// a front nearer than it leaves to the pass's known end, asks the feed for
/// another. Once the feed has
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
    /// The gate of each range, if any.
    gates: Vec<Option<Arc<Gate>>>,
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

    /// The unclaimed bytes of the front's range and the ranges after it,
    /// counted up to `enough`: while fewer, the feed is asked for more.
    /// (The ranges before the back's are empty, so this is what is left.)
    fn left_from_front(&mut self, enough: u64, feed: Option<&dyn Feed>) -> u64 {
        let mut n = 0u64;
        let mut i = self.front;
        loop {
            while let Some(p) = self.parts.get(i) {
                n = n.saturating_add(p.end.saturating_sub(p.start));
                i += 1;
                if n >= enough {
                    return n;
                }
            }
            if !self.more(feed) {
                return n;
            }
        }
    }

    /// Adds the feed's next range, if there is one and the pass still takes one.
    fn more(&mut self, feed: Option<&dyn Feed>) -> bool {
        if self.closed {
            return false;
        }
        match feed.and_then(|f| f.next_range(self.end)) {
            Some((r, gate)) if r.start >= self.end && r.start < r.end => {
                self.end = r.end;
                self.parts.push(r);
                self.gates.push(gate);
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
        let cursors = Cursors { parts: vec![range], gates: vec![None], front: 0, back: 0, closed, end };
        Claims { cursor: Mutex::new(cursors), feed }
    }

    /// The next part from the front, ending on a multiple of `size` (or at
    /// the range's end); `None` once nothing is left. A range behind a
    /// closed gate is waited for (outside the lock), unless `stop` says the
    /// pass is over.
    pub(super) fn front(&self, size: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        self.front_leaving(size, 0, stop)
    }

    /// As [`Claims::front`], but none once fewer than `leave` bytes are left
    /// in the pass: in this range and the ones after it, those the feed adds
    /// included (it is asked for more before the front gives up). A pass of
    /// many small ranges (a shuffle's blocks, queued pieces) is claimed from
    /// the front all along but for its last `leave` bytes.
    pub(super) fn front_leaving(&self, size: u64, leave: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        waiting(stop, || self.try_front(size, leave))
    }

    /// The next part from the back, starting on a multiple of `size` (or at
    /// the range's start); `None` once nothing is left. Gates as for
    /// [`Claims::front`].
    pub(super) fn back(&self, size: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        waiting(stop, || self.try_back(size))
    }

    /// One try of [`Claims::front_leaving`].
    fn try_front(&self, size: u64, leave: u64) -> Claim {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            let here = c.parts.get(c.front).map(|p| p.end.saturating_sub(p.start));
            let Some(here) = here else { return Claim::Done };
            if here > 0 && c.left_from_front(leave, self.feed) >= leave {
                if let Some(gate) = closed(&c.gates, c.front) {
                    return Claim::Wait(gate);
                }
                let Some(p) = c.parts.get_mut(c.front) else { return Claim::Done };
                let end = ((p.start / size).saturating_add(1)).saturating_mul(size).min(p.end);
                let r = p.start..end;
                p.start = end;
                return Claim::Part(r);
            }
            if !c.advance(Side::Front, self.feed) {
                return Claim::Done;
            }
        }
    }

    /// One try of [`Claims::back`].
    fn try_back(&self, size: u64) -> Claim {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            let Some(p) = c.parts.get_mut(c.back) else { return Claim::Done };
            if p.start < p.end {
                if let Some(gate) = closed(&c.gates, c.back) {
                    return Claim::Wait(gate);
                }
                let start = ((p.end - 1) / size * size).max(p.start);
                let r = start..p.end;
                p.end = start;
                return Claim::Part(r);
            }
            if !c.advance(Side::Back, self.feed) {
                return Claim::Done;
            }
        }
    }
}

/// How long a claimer waits at a gate before it looks at `stop` again.
const GATE_LOOK: Duration = Duration::from_millis(1);

/// Tries `claim` until it gives a part or nothing is left, waiting at the
/// gates it meets (outside the claims' lock, so that the parts before them
/// can still be claimed); `None` also once `stop` says so.
fn waiting(stop: &dyn Fn() -> bool, claim: impl Fn() -> Claim) -> Option<Range<u64>> {
    loop {
        match claim() {
            Claim::Part(r) => return Some(r),
            Claim::Done => return None,
            Claim::Wait(gate) => {
                while !gate.wait(GATE_LOOK) {
                    if stop() {
                        return None;
                    }
                }
            }
        }
    }
}

/// The gate of range `i` of `gates`, if it is closed.
fn closed(gates: &[Option<Arc<Gate>>], i: usize) -> Option<Arc<Gate>> {
    gates.get(i).and_then(Option::as_ref).filter(|g| !g.is_open()).cloned()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A pass that never stops.
    const GO: fn() -> bool = || false;

    #[test]
    fn claims_meet_in_the_middle_on_boundaries() {
        let c = Claims::new(100..10_000, None);
        assert_eq!(c.front(4096, &GO), Some(100..4096));
        assert_eq!(c.back(1000, &GO), Some(9000..10_000));
        assert_eq!(c.back(1000, &GO), Some(8000..9000));
        assert_eq!(c.front(4096, &GO), Some(4096..8000));
        assert_eq!(c.front(4096, &GO), None);
        assert_eq!(c.back(1000, &GO), None);
    }

    #[test]
    fn front_claims_leave_the_end() {
        let c = Claims::new(0..10_000, None);
        assert_eq!(c.front_leaving(1000, 3000, &GO), Some(0..1000));
        assert_eq!(c.back(1000, &GO), Some(9000..10_000));
        assert_eq!(c.front_leaving(4000, 3000, &GO), Some(1000..4000));
        assert_eq!(c.front_leaving(1000, 5001, &GO), None, "5000 left, fewer than asked");
        assert_eq!(c.front(1000, &GO), Some(4000..5000), "plain claims still take it");
    }

    /// A feed of fixed ranges, counting how often it was asked.
    struct Ranges(Mutex<Vec<Range<u64>>>, AtomicU64);

    impl Feed for Ranges {
        fn next_range(&self, _end: u64) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let mut v = lock(&self.0);
            if v.is_empty() { None } else { Some((v.remove(0), None)) }
        }
    }

    #[test]
    fn a_fed_pass_claims_each_range_from_both_ends_in_turn() {
        let feed = Ranges(Mutex::new(vec![1000..2000, 2500..3000]), AtomicU64::new(0));
        let c = Claims::new(0..1000, Some(&feed));
        assert_eq!(c.front_leaving(300, 400, &GO), Some(0..300));
        assert_eq!(c.back(100, &GO), Some(900..1000));
        assert_eq!(c.front_leaving(300, 400, &GO), Some(300..600));
        // 300 left here, fewer than it leaves, but the pass goes on: the
        // feed is asked, and the front takes the rest of this range.
        assert_eq!(c.front_leaving(300, 400, &GO), Some(600..900));
        assert_eq!(feed.1.load(Ordering::Relaxed), 1);
        assert_eq!(c.back(100, &GO), Some(1900..2000), "the back takes the next one's end");
        assert_eq!(c.front_leaving(300, 500, &GO), Some(1000..1200));
        assert_eq!(c.back(250, &GO), Some(1750..1900));
        assert_eq!(c.back(250, &GO), Some(1500..1750));
        // 300 left in this range and 500 after it: the front claims on.
        assert_eq!(c.front_leaving(300, 500, &GO), Some(1200..1500));
        // The last range alone is left: fewer than 501 bytes, the front stops.
        assert_eq!(c.front_leaving(300, 501, &GO), None);
        assert_eq!(c.front(1000, &GO), Some(2500..3000), "plain claims still take it");
        assert_eq!(c.back(100, &GO), None);
        assert_eq!(c.front(1000, &GO), None);
        // The feed had nothing once: it is not asked again.
        let asked = feed.1.load(Ordering::Relaxed);
        lock(&feed.0).push(4000..5000);
        assert_eq!(c.back(100, &GO), None);
        assert_eq!(feed.1.load(Ordering::Relaxed), asked);
    }

    /// Many ranges, each smaller than what the front leaves (a shuffle's
    /// blocks): the front claims all but the pass's last bytes. It once
    /// skipped every range smaller than that, and a pass of 64 MiB pieces
    /// ran through the ring alone.
    #[test]
    fn the_front_leaves_the_end_of_the_pass_not_of_each_small_range() {
        let feed = Ranges(Mutex::new((1..10).map(|i| i * 1000..i * 1000 + 100).collect()), AtomicU64::new(0));
        let c = Claims::new(0..100, Some(&feed));
        let mut front = Vec::new();
        while let Some(r) = c.front_leaving(64, 250, &GO) {
            front.push(r);
        }
        assert_eq!(front.first(), Some(&(0..64)));
        // Every range but the last two (200 bytes, fewer than 250) was
        // claimed by the front, whole.
        assert_eq!(front.last(), Some(&(7040..7100)));
        assert_eq!(front.iter().map(|r| r.end - r.start).sum::<u64>(), 800);
        let mut back = Vec::new();
        while let Some(r) = c.back(1000, &GO) {
            back.push(r);
        }
        assert_eq!(back, [8000..8100, 9000..9100]);
    }

    /// A feed that answers one range, whatever it is asked, noting the end
    /// it was asked for.
    struct Once(Mutex<Option<Range<u64>>>, Mutex<Vec<u64>>);

    impl Feed for Once {
        fn next_range(&self, end: u64) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
            lock(&self.1).push(end);
            let next = lock(&self.0).take()?;
            (next.start >= end).then_some((next, None))
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
        assert_eq!(c.back(300, &GO), Some(900..1000));
        assert_eq!(c.back(300, &GO), Some(600..900));
        assert_eq!(c.front(1000, &GO), Some(0..600));
        assert_eq!(c.front(1000, &GO), None, "700..2000 overlaps 0..1000: it does not join");
        assert_eq!(*lock(&feed.1), [1000]);
        assert_eq!(c.back(300, &GO), None);
    }

    #[test]
    fn a_range_behind_the_last_one_is_not_taken() {
        let feed = Ranges(Mutex::new(std::iter::once(0..10).collect()), AtomicU64::new(0));
        let c = Claims::new(100..200, Some(&feed));
        assert_eq!(c.front(1000, &GO), Some(100..200));
        assert_eq!(c.front(1000, &GO), None);
        assert_eq!(c.back(1000, &GO), None);
    }

    #[test]
    fn claims_cover_everything_once() {
        let c = Claims::new(7..1_000_003, None);
        let mut parts = Vec::new();
        let mut flip = false;
        loop {
            flip = !flip;
            let r = if flip { c.front(65536, &GO) } else { c.back(10_000, &GO) };
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

    /// A feed of one range behind a gate.
    struct Gated(Mutex<Option<Range<u64>>>, Arc<Gate>);

    impl Feed for Gated {
        fn next_range(&self, _end: u64) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
            lock(&self.0).take().map(|r| (r, Some(self.1.clone())))
        }
    }

    #[test]
    fn a_gated_range_waits_for_its_gate_and_the_range_before_does_not() {
        let gate = Arc::new(Gate::default());
        let feed = Gated(Mutex::new(Some(1000..2000)), gate.clone());
        let c = Claims::new(0..1000, Some(&feed));
        assert_eq!(c.front_leaving(300, 500, &GO), Some(0..300));
        assert_eq!(c.front_leaving(300, 500, &GO), Some(300..600));
        // 400 left and the gated range after it: the front claims on.
        assert_eq!(c.front_leaving(300, 500, &GO), Some(600..900));
        assert_eq!(c.back(250, &GO), Some(900..1000), "the back finishes the range before the gate");
        // Then both meet the closed gate.
        assert!(matches!(c.try_front(300, 500), Claim::Wait(_)));
        let stop = || true;
        assert_eq!(c.front_leaving(300, 500, &stop), None, "a stopped pass waits no more");
        assert!(matches!(c.try_back(250), Claim::Wait(_)));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| c.front_leaving(300, 500, &GO));
            gate.open();
            assert_eq!(waiter.join().unwrap(), Some(1000..1200));
        });
        assert_eq!(c.back(1000, &GO), Some(1200..2000));
        assert_eq!(c.front(1000, &GO), None);
    }
}
