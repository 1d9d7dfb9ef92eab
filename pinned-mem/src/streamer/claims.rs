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
    /// The next range of the pass (it shares no byte with the pass's other
    /// ranges, but may lie before them), and the gate it waits behind, if
    /// any; `None` when there is none now (the pass then takes no more). It
    /// may wait (for a transfer to take bytes read ahead) until `stop` says
    /// the pass is over.
    fn next_range(&self, stop: &dyn Fn() -> bool) -> Option<(Range<u64>, Option<Arc<Gate>>)>;

    /// Waits, before the copies of `part` (filled) are enqueued, until they
    /// may be: at once for a part of a transfer the pass has; for a part
    /// read ahead of its transfer (`chain.rs`), until a transfer takes it
    /// (and what it must follow is ordered), or none will, or `stop` says
    /// the pass is over.
    fn settle(&self, _part: &Range<u64>, _stop: &dyn Fn() -> bool) -> Settled {
        Settled::Copy
    }

    /// Whether `part` was read ahead for a transfer that will not come (it
    /// need not be filled); does not wait.
    fn dropped(&self, _part: &Range<u64>) -> bool {
        false
    }

    /// `part` could not be filled: true when it was being read ahead (the
    /// reading ahead then ends, and the pass goes on without it), false
    /// when the pass fails.
    fn unreadable(&self, _part: &Range<u64>) -> bool {
        false
    }
}

/// What [`Feed::settle`] found for a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// A part of a transfer: copy it.
    Copy,
    /// A part filled before its transfer came, which took it: copy it.
    ReadAhead,
    /// A part read ahead for a transfer that did not come: drop it.
    Drop,
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
/// pass: [`Feed`]). Both claimers start in the first range, from its two
/// ends. Once a claimer has nothing left in its range it moves to the next
/// range that neither is in, asking the feed for one after the last; only
/// when there is none does it join the other's range, from its own end. So
/// in a pass of many ranges each claimer streams whole ranges of its own
/// (a window agent registers a whole small range at once, rather than what
/// the ring left of it), and they meet in the pass's last range. The front
/// claims none of the pass's last `leave` bytes (`front_leaving`). Once the
/// feed has had nothing, it is asked no more: a range arriving later waits
/// for the next pass (a range is never added once the claimers that would
/// take it have stopped).
pub(super) struct Claims<'f> {
    cursor: Mutex<Cursors>,
    feed: Option<&'f dyn Feed>,
}

struct Cursors {
    /// The unclaimed part of each range of the pass, in the order they came.
    /// Every part before the later of the two cursors is empty, but for the
    /// one the other cursor is at.
    parts: Vec<Range<u64>>,
    /// The gate of each range, if any.
    gates: Vec<Option<Arc<Gate>>>,
    /// The parts the front and the back claim from.
    front: usize,
    back: usize,
    /// The feed has had nothing once: no range is added any more.
    closed: bool,
}

/// Which claimer's cursor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Front,
    Back,
}

impl Cursors {
    /// Whether part `i` has bytes left.
    fn has(&self, i: usize) -> bool {
        self.parts.get(i).is_some_and(|p| p.start < p.end)
    }

    /// Moves `side`'s cursor on, its own part being empty: to the first
    /// part with bytes left after both cursors (asking the feed for one
    /// after the last), else to the other's part; false when neither has
    /// bytes left.
    fn advance(&mut self, side: Side, feed: Option<&dyn Feed>, stop: &dyn Fn() -> bool) -> bool {
        let other = match side {
            Side::Front => self.back,
            Side::Back => self.front,
        };
        let mut i = self.front.max(self.back) + 1;
        let to = loop {
            if self.has(i) {
                break i;
            }
            if i + 1 < self.parts.len() {
                i += 1;
            } else if self.more(feed, stop) {
                i = self.parts.len() - 1;
            } else if self.has(other) {
                break other;
            } else {
                return false;
            }
        };
        match side {
            Side::Front => self.front = to,
            Side::Back => self.back = to,
        }
        true
    }

    /// The unclaimed bytes of the pass from the earlier cursor's part on,
    /// counted up to `enough`: while fewer, the feed is asked for more.
    /// (The parts before it are empty, so this is what is left.)
    fn left(&mut self, enough: u64, feed: Option<&dyn Feed>, stop: &dyn Fn() -> bool) -> u64 {
        let mut n = 0u64;
        let mut i = self.front.min(self.back);
        loop {
            while let Some(p) = self.parts.get(i) {
                n = n.saturating_add(p.end.saturating_sub(p.start));
                i += 1;
                if n >= enough {
                    return n;
                }
            }
            if !self.more(feed, stop) {
                return n;
            }
        }
    }

    /// Adds the feed's next range, if there is one and the pass still takes one.
    fn more(&mut self, feed: Option<&dyn Feed>, stop: &dyn Fn() -> bool) -> bool {
        if self.closed {
            return false;
        }
        match feed.and_then(|f| f.next_range(stop)) {
            Some((r, gate)) if r.start < r.end => {
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
        let closed = feed.is_none();
        let cursors = Cursors { parts: vec![range], gates: vec![None], front: 0, back: 0, closed };
        Claims { cursor: Mutex::new(cursors), feed }
    }

    /// What adds ranges to the pass, if anything.
    pub(super) fn feed(&self) -> Option<&'f dyn Feed> {
        self.feed
    }

    /// The next part from the front, ending on a multiple of `size` (or at
    /// the range's end); `None` once nothing is left. A range behind a
    /// closed gate is waited for (outside the lock), unless `stop` says the
    /// pass is over.
    pub(super) fn front(&self, size: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        self.front_leaving(size, 0, stop)
    }

    /// As [`Claims::front`], but none once fewer than `leave` bytes are left
    /// in the pass (those the feed adds included: it is asked for more
    /// before the front gives up). A pass of many small ranges (a shuffle's
    /// blocks, queued pieces) is claimed from the front all along but for
    /// its last `leave` bytes.
    pub(super) fn front_leaving(&self, size: u64, leave: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        waiting(stop, || self.try_front(size, leave, stop))
    }

    /// The next part from the back, starting on a multiple of `size` (or at
    /// the range's start); `None` once nothing is left. Gates as for
    /// [`Claims::front`].
    pub(super) fn back(&self, size: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        waiting(stop, || self.try_back(size, stop))
    }

    /// One try of [`Claims::front_leaving`].
    fn try_front(&self, size: u64, leave: u64, stop: &dyn Fn() -> bool) -> Claim {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            if c.has(c.front) {
                if c.left(leave, self.feed, stop) < leave {
                    return Claim::Done;
                }
                if let Some(gate) = closed(&c.gates, c.front) {
                    return Claim::Wait(gate);
                }
                let Some(p) = c.parts.get_mut(c.front) else { return Claim::Done };
                let end = ((p.start / size).saturating_add(1)).saturating_mul(size).min(p.end);
                let r = p.start..end;
                p.start = end;
                return Claim::Part(r);
            }
            if !c.advance(Side::Front, self.feed, stop) {
                return Claim::Done;
            }
        }
    }

    /// One try of [`Claims::back`].
    fn try_back(&self, size: u64, stop: &dyn Fn() -> bool) -> Claim {
        let mut g = lock(&self.cursor);
        let c = &mut *g;
        loop {
            if c.has(c.back) {
                if let Some(gate) = closed(&c.gates, c.back) {
                    // The front's part, before this one, may have to be
                    // streamed first (its copies open this gate), and the
                    // front may have stopped short of its end: help there.
                    if c.front < c.back && c.has(c.front) {
                        c.back = c.front;
                        continue;
                    }
                    return Claim::Wait(gate);
                }
                let Some(p) = c.parts.get_mut(c.back) else { return Claim::Done };
                let start = ((p.end - 1) / size * size).max(p.start);
                let r = start..p.end;
                p.end = start;
                return Claim::Part(r);
            }
            if !c.advance(Side::Back, self.feed, stop) {
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
        fn next_range(&self, _: &dyn Fn() -> bool) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let mut v = lock(&self.0);
            if v.is_empty() { None } else { Some((v.remove(0), None)) }
        }
    }

    #[test]
    fn a_fed_pass_gives_each_claimer_ranges_of_its_own_and_they_meet_in_the_last() {
        let feed = Ranges(Mutex::new(vec![1000..2000, 2500..3000, 5000..5400]), AtomicU64::new(0));
        let c = Claims::new(0..1000, Some(&feed));
        // Both start in the first range, from its two ends.
        assert_eq!(c.front_leaving(300, 400, &GO), Some(0..300));
        assert_eq!(c.back(100, &GO), Some(900..1000));
        assert_eq!(c.front_leaving(300, 400, &GO), Some(300..600));
        assert_eq!(feed.1.load(Ordering::Relaxed), 0, "600 bytes left: the feed was not asked yet");
        assert_eq!(c.front_leaving(300, 400, &GO), Some(600..900));
        assert_eq!(feed.1.load(Ordering::Relaxed), 1, "300 left, fewer than the front leaves: it was");
        // The first range is claimed: the back moves to the next one, and
        // the front to the one after it, whole ranges each.
        assert_eq!(c.back(250, &GO), Some(1750..2000));
        assert_eq!(c.front_leaving(300, 400, &GO), Some(2500..2700));
        assert_eq!(c.back(250, &GO), Some(1500..1750));
        assert_eq!(c.front_leaving(300, 400, &GO), Some(2700..3000));
        // The front's range is done: it moves past the back's, to the last.
        assert_eq!(c.front_leaving(300, 400, &GO), Some(5000..5100));
        assert_eq!(c.back(250, &GO), Some(1250..1500));
        assert_eq!(c.back(250, &GO), Some(1000..1250));
        // The back's range is done and none is after both: it joins the
        // front's, from its end.
        assert_eq!(c.back(250, &GO), Some(5250..5400));
        // 150 left in the pass, fewer than the front leaves.
        assert_eq!(c.front_leaving(300, 400, &GO), None);
        assert_eq!(c.back(250, &GO), Some(5100..5250));
        assert_eq!(c.back(250, &GO), None);
        assert_eq!(c.front(1000, &GO), None);
        // The feed had nothing once: it is not asked again.
        let asked = feed.1.load(Ordering::Relaxed);
        lock(&feed.0).push(8000..9000);
        assert_eq!(c.back(100, &GO), None);
        assert_eq!(c.front(100, &GO), None);
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
        assert_eq!(back, [9000..9100, 8000..8100], "the last after both, then the front's");
    }

    /// A chained pass takes a range that lies before the ones it has (a
    /// shuffle's next group of blocks): it once took ranges in file order
    /// only, and each group of a shuffle pool streamed as a pass of its own.
    #[test]
    fn a_range_before_the_last_one_is_taken() {
        let feed = Ranges(Mutex::new(vec![0..10, 50..60]), AtomicU64::new(0));
        let c = Claims::new(100..200, Some(&feed));
        assert_eq!(c.front(1000, &GO), Some(100..200));
        assert_eq!(c.front(1000, &GO), Some(0..10));
        assert_eq!(c.back(1000, &GO), Some(50..60));
        assert_eq!(c.front(1000, &GO), None);
        assert_eq!(c.back(1000, &GO), None);
    }

    /// Every byte of every range is claimed once, whichever claimer asks.
    #[test]
    fn fed_claims_cover_every_range_once() {
        let ranges: Vec<Range<u64>> =
            (0..40u64).map(|i| (i * 7919) % 64 * 5000 + 3..(i * 7919) % 64 * 5000 + 4000 + i).collect();
        let feed = Ranges(Mutex::new(ranges[1..].to_vec()), AtomicU64::new(0));
        let c = Claims::new(ranges[0].clone(), Some(&feed));
        let mut got = Vec::new();
        for k in 0u64.. {
            let r = match k % 5 {
                0 | 3 => c.front_leaving(1024, 3000, &GO).or_else(|| c.back(512, &GO)),
                _ => c.back(512, &GO),
            };
            match r {
                Some(r) => got.push(r),
                None => break,
            }
        }
        let mut want = ranges.clone();
        want.sort_by_key(|r| r.start);
        got.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in got {
            match merged.last_mut() {
                Some(m) if m.end == r.start && want.iter().any(|w| w.start <= m.start && r.end <= w.end) => {
                    m.end = r.end
                }
                _ => merged.push(r),
            }
        }
        assert_eq!(merged, want);
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
        fn next_range(&self, _: &dyn Fn() -> bool) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
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
        assert!(matches!(c.try_front(300, 500, &GO), Claim::Wait(_)));
        let stop = || true;
        assert_eq!(c.front_leaving(300, 500, &stop), None, "a stopped pass waits no more");
        assert!(matches!(c.try_back(250, &GO), Claim::Wait(_)));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| c.front_leaving(300, 500, &GO));
            gate.open();
            assert_eq!(waiter.join().unwrap(), Some(1000..1200));
        });
        assert_eq!(c.back(1000, &GO), Some(1200..2000));
        assert_eq!(c.front(1000, &GO), None);
    }
}
