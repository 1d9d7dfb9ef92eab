//! Transfers queued back to back, run as one pass.
//!
//! A pass has a ramp at each end: at the start the first window is being
//! registered while the ring alone copies, at the end the ring alone copies
//! the last windows' worth, and then the worker waits for the last copies
//! before it starts the next transfer's agents. Transfers queued one after
//! the other (the Python batch iterator's spans, a loader's slabs, a
//! shuffle's pieces) would pay both ramps each time. So when the worker runs
//! a transfer, the pass takes the transfers queued behind it as it goes
//! ([`Feed`]): once the agents have claimed the current one, they go on with
//! the next, the window agent from its front while the ring agents finish
//! the one before, and the copy engine never waits between them.
//!
//! The pass is planned for the run of transfers queued when it starts, as
//! `Auto` would plan one range of their total length ([`chain_len`]):
//! pieces that would each fit the budget, and be registered whole one by
//! one, stream through windows and the ring together when their total does
//! not.
//!
//! A queued transfer joins the running pass when it reads the same mapping,
//! shares no byte with the ranges the pass has taken (it may lie before
//! them or after, with gaps: each has its own destination, and the sink
//! finds a piece's transfer by its file offset), and no earlier writer still
//! holds its destination. What it must follow (`StartOptions::after`) does not end the
//! chain: when that has completed there is nothing to wait for; otherwise
//! its range waits behind a [`Gate`] until every copy of the transfers before
//! it is enqueued, and then the streamer's stream waits for it on the device
//! (so that no copy of theirs waits for it too) and the gate opens. A
//! transfer that cannot join ends the chain, and runs in the next pass as it
//! would have. Each transfer keeps its own handle: its event is recorded
//! once its last copy is enqueued
//! ([`Transfer::then_on`](super::Transfer::then_on)), its destination
//! released then, and its [`Report`] given once its copies completed, while
//! the pass goes on with the next. If the pass fails, the transfers it had
//! written to fail with it; those it had not written to yet run again on
//! their own.
//!
//! A program that reads sequential pieces one at a time queues the next
//! only once the last has its copies enqueued, when the pass has ended. With
//! [`StreamConfig::read_ahead`](super::StreamConfig::read_ahead), a ring
//! pass that finds nothing queued once it has claimed its transfers goes on
//! with the bytes that follow the last one ([`Ahead`]): its threads fill
//! slots with them and hold them (`Feed::settle`) until a transfer that
//! starts there takes them, as if it had been queued all along, or until
//! they are dropped (anything else queued, a thread waiting to take the
//! streamer, the pass failing, the time running out).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{DetachedSliceMut, Event, EventOptions, Stream};

use super::claims::{Fed, Feed, Gate, Settled};
use super::config::CopyStreams;
use super::ctx::{TAIL_SPIN, wait_tail};
use super::queue::{JobQueue, Next};
use super::report::{Breakdown, Report, WindowContext};
use super::shared::Shared;
use super::sink::{Sink, Slicer};
use super::spans::Spans;
use super::stats::PassStats;
use super::stream_set::StreamSet;
use super::transfer::{Job, TransferState};
use crate::budget::PeakWatch;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::strategy::Strategy;
use crate::util::process_cpu_seconds;

/// One transfer of a chained pass.
struct Segment {
    range: Range<u64>,
    /// The index of its destination's stream.
    stream: usize,
    /// Its destination, until its last copy is enqueued (then released).
    dst: Option<DetachedSliceMut<u8>>,
    /// Bytes whose copies are not enqueued yet.
    left: u64,
    state: Arc<TransferState>,
    /// When the pass took it up.
    t0: Instant,
    cpu0: f64,
    /// The pass's counts when it took this transfer up.
    registrations0: u64,
    stats0: Breakdown,
    watch: PeakWatch,
    /// Its handle was told how it ended (or it went back to the queue).
    finished: bool,
    chained: bool,
    /// What it must follow, until the streamer's stream waits for it (or
    /// it has completed).
    after: Option<Event>,
    /// Its range waits behind it until that wait is enqueued.
    gate: Option<Arc<Gate>>,
    /// Why enqueueing that wait failed: none of its copies may be enqueued.
    blocked: Option<String>,
}

impl Segment {
    fn new(job: Job, chained: bool, budget: &crate::PinBudget, counts0: (u64, Breakdown)) -> Segment {
        let (registrations0, stats0) = counts0;
        let Job { file: _, range, dst, stream, after, state } = job;
        Segment {
            left: range.end - range.start,
            range,
            stream,
            dst: Some(dst),
            state,
            t0: Instant::now(),
            cpu0: process_cpu_seconds(),
            registrations0,
            stats0,
            watch: budget.watch(),
            finished: false,
            chained,
            after,
            gate: None,
            blocked: None,
        }
    }

    fn finish(&mut self, result: Result<Report>) {
        self.finished = true;
        self.state.finish(result);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if !self.finished {
            // Only on a panic of the worker itself: never leave a handle waiting.
            self.state.finish(Err(Error::WorkerPanicked { message: "the pass running the transfer ended".into() }));
        }
    }
}

/// The transfers of a pass, in the order it took them, and the index of
/// each by its range; and the bytes read ahead after them.
#[derive(Default)]
struct Segments {
    list: Vec<Segment>,
    by_range: Spans<usize>,
    ahead: Option<Ahead>,
}

/// Bytes read ahead of their transfer ([`StreamConfig::read_ahead`]): the
/// range that follows the pass's last transfer, filled while the pass waits
/// for a transfer to take it.
///
/// [`StreamConfig::read_ahead`]: super::StreamConfig::read_ahead
struct Ahead {
    range: Range<u64>,
    /// When it is dropped if no transfer has taken it: the read-ahead's time
    /// after the pass's transfers have all their copies enqueued.
    until: Instant,
    state: AheadState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AheadState {
    /// No transfer has taken it yet: its parts wait, filled.
    Waiting,
    /// Transfer `index` took it; `rest` is the part of that transfer's
    /// range after it, until given to the claims.
    Taken { index: usize, rest: Option<Range<u64>> },
    /// None will: its parts are dropped, and the pass reads ahead no more.
    Dropped,
}

/// What a part read ahead waits for before it may be copied.
enum Wait {
    /// A transfer to take the bytes read ahead, of this range.
    Transfer(Range<u64>),
    /// The gate of the transfer that took them.
    Gate(Arc<Gate>),
}

/// How long the wait for a transfer to take bytes read ahead lasts before
/// it looks again at whether the pass is over or the streamer is wanted.
const AHEAD_LOOK: Duration = Duration::from_micros(200);

impl Segments {
    /// Adds `seg`, whose range the caller made sure overlaps none here
    /// (else its pieces would find no transfer, and fail the pass).
    fn push(&mut self, seg: Segment) {
        self.by_range.insert(seg.range.clone(), self.list.len());
        self.list.push(seg);
    }

    /// The index of the transfer whose range holds `off`.
    fn find(&self, off: u64) -> Option<usize> {
        self.by_range.find(off).copied()
    }

    /// Whether `range` shares a byte with bytes read ahead and dropped: the
    /// claims still hold their parts, which the agents drop, so a transfer
    /// over them cannot join the pass.
    fn over_dropped(&self, range: &Range<u64>) -> bool {
        self.ahead
            .as_ref()
            .is_some_and(|a| a.state == AheadState::Dropped && a.range.start < range.end && range.start < a.range.end)
    }
}

/// What the pass and its sink share: the transfers taken so far, and where
/// more come from.
pub(super) struct Chain<'q> {
    file: Arc<MappedFile>,
    queue: &'q Mutex<JobQueue>,
    /// The streamer's streams (a gated transfer's wait goes on its own).
    streams: &'q [Stream],
    budget: &'q crate::PinBudget,
    segments: Mutex<Segments>,
    /// The job taken from the queue that could not join: it runs next.
    leftover: Mutex<Option<Job>>,
    /// The pass's strategy, window context and counters, once it began.
    pass: OnceLock<(Strategy, WindowContext, Arc<PassStats>)>,
    /// How long bytes read ahead wait for their transfer (zero: none are).
    read_ahead: Duration,
    /// Threads waiting to take the streamer: bytes read ahead are dropped
    /// rather than keep them waiting.
    entering: &'q AtomicUsize,
    /// Told (with `segments`) when bytes read ahead are taken or dropped.
    changed: Condvar,
}

impl Chain<'_> {
    /// The pass's registrations and breakdown so far.
    fn counts(&self) -> (u64, Breakdown) {
        self.pass.get().map_or((0, Breakdown::default()), |(_, _, s)| (s.registrations(), s.snapshot()))
    }

    /// Whether `job` can join the pass now (its range sharing no byte with
    /// the pass's is checked as it is added).
    fn joins(&self, job: &Job) -> bool {
        Arc::ptr_eq(&job.file, &self.file) && job.range.start < job.range.end && job.dst.is_settled()
    }

    /// Starts reading ahead, when the pass may: reading ahead is on, the
    /// pass streams through the ring (from the mapping), it has not dropped
    /// bytes read ahead before, and no transfer of it waits for what it must
    /// follow (its filled parts would hold slots meanwhile). The range
    /// follows the pass's last transfer: as long as that one, within half
    /// the ring's slots (the other half keeps the pass's own parts going)
    /// and the file.
    fn read_ahead(&self, segments: &mut Segments) -> Option<Range<u64>> {
        if self.read_ahead.is_zero() {
            return None;
        }
        let Some((Strategy::Ring { slots, slot, .. }, _, _)) = self.pass.get() else { return None };
        let again = segments.ahead.as_ref().is_none_or(|a| matches!(a.state, AheadState::Taken { rest: None, .. }));
        if !again || segments.list.iter().any(|s| s.gate.as_ref().is_some_and(|g| !g.is_open())) {
            return None;
        }
        let last = segments.list.last()?.range.clone();
        let most = (*slots as u64 / 2).saturating_mul(*slot as u64);
        let end = last.end.saturating_add((last.end - last.start).min(most)).min(self.file.len());
        let range = last.end..end;
        if range.start >= range.end || segments.by_range.overlaps(&range) {
            return None;
        }
        let now = Instant::now();
        let until = now.checked_add(self.read_ahead).unwrap_or(now);
        segments.ahead = Some(Ahead { range: range.clone(), until, state: AheadState::Waiting });
        Some(range)
    }

    /// Waits, while bytes read ahead (those of `which`, or whichever) wait
    /// for their transfer, until one takes them or none will. The first
    /// transfer queued takes them when it starts where they do, reaches at
    /// least their end, and can join the pass; anything else queued, a
    /// thread waiting to take the streamer, `stop`, the time running out or
    /// the queue closing drops them. Several threads may wait at once: each
    /// looks at the queue for a short slice at a time, and returns as soon
    /// as the bytes it waits for are taken or dropped (a thread holding a
    /// part of earlier bytes read ahead must not wait for later ones).
    fn resolve(&self, stop: &dyn Fn() -> bool, which: Option<&Range<u64>>) {
        loop {
            let (range, until) = {
                let mut g = lock(&self.segments);
                let segments = &mut *g;
                // The time runs from when the pass's transfers have all their
                // copies enqueued: no transfer can come before (a caller
                // ordering its work after the last one waits for that).
                let enqueuing = segments.list.iter().any(|s| s.left > 0);
                match segments.ahead.as_mut() {
                    Some(a) if a.state == AheadState::Waiting && which.is_none_or(|w| *w == a.range) => {
                        if enqueuing {
                            a.until = Instant::now().checked_add(self.read_ahead).unwrap_or(a.until);
                        }
                        (a.range.clone(), a.until)
                    }
                    _ => return,
                }
            };
            let now = Instant::now();
            let give_up = now >= until || stop() || self.entering.load(Ordering::SeqCst) > 0;
            let most = if give_up { Duration::ZERO } else { (until - now).min(AHEAD_LOOK) };
            // One thread watches the queue; the others wait to be told what
            // became of the bytes (each would otherwise wait its own turn at
            // the queue, a slice each, after they were taken).
            let mut queue = match self.queue.try_lock() {
                Ok(q) => q,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    let segments = lock(&self.segments);
                    if segments.ahead.as_ref().is_some_and(|a| a.state == AheadState::Waiting && a.range == range) {
                        let _ = self.changed.wait_timeout(segments, AHEAD_LOOK);
                    }
                    continue;
                }
            };
            let next = queue.take_if_within(most, |job| {
                self.joins(job)
                    && job.range.start == range.start
                    && job.range.end >= range.end
                    && !lock(&self.segments).by_range.overlaps(&job.range)
            });
            drop(queue);
            let mut segments = lock(&self.segments);
            let still = segments.ahead.as_ref().is_some_and(|a| a.state == AheadState::Waiting && a.range == range);
            match next {
                Next::Taken(job) if still => {
                    self.take_ahead(&mut segments, *job);
                    self.changed.notify_all();
                    return;
                }
                Next::Taken(job) => {
                    // Taken or dropped meanwhile by another thread: the
                    // transfer comes next, as any queued one.
                    drop(segments);
                    lock(self.queue).put_back(vec![*job]);
                }
                Next::Nothing if !give_up => {}
                Next::Nothing | Next::Other | Next::Closed => {
                    if let Some(a) = segments.ahead.as_mut().filter(|_| still) {
                        a.state = AheadState::Dropped;
                        self.changed.notify_all();
                    }
                    return;
                }
            }
        }
    }

    /// `job` takes the bytes read ahead: it joins the pass (what it must
    /// follow ordered as for any transfer joining it), and the part of its
    /// range after them is given to the claims next.
    fn take_ahead(&self, segments: &mut Segments, job: Job) {
        let Some(ahead) = segments.ahead.as_ref() else { return };
        let rest = (ahead.range.end < job.range.end).then_some(ahead.range.end..job.range.end);
        let (index, _) = self.join(segments, job);
        if let Some(a) = segments.ahead.as_mut() {
            a.state = AheadState::Taken { index, rest };
        }
    }

    /// `job` joins the pass as a chained transfer: what it must follow is
    /// nothing to wait for once it has completed; else its range waits
    /// behind a gate (see `open_ready`). Its index and that gate.
    fn join(&self, segments: &mut Segments, job: Job) -> (usize, Option<Arc<Gate>>) {
        let mut seg = Segment::new(job, true, self.budget, self.counts());
        if seg.after.as_ref().is_some_and(|ev| ev.query().unwrap_or(false)) {
            seg.after = None;
        }
        seg.gate = seg.after.is_some().then(|| Arc::new(Gate::default()));
        let gate = seg.gate.clone();
        let index = segments.list.len();
        segments.push(seg);
        open_ready(&mut segments.list, self.streams);
        (index, gate)
    }

    /// The rest of the transfer that took the bytes read ahead, with its
    /// gate, once: what the pass claims next.
    fn rest_of_ahead(&self) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
        let mut g = lock(&self.segments);
        let segments = &mut *g;
        match segments.ahead.as_mut().map(|a| &mut a.state) {
            Some(AheadState::Taken { index, rest }) => {
                let gate = segments.list.get(*index).and_then(|s| s.gate.clone());
                rest.take().map(|r| (r, gate))
            }
            _ => None,
        }
    }
}

impl Feed for Chain<'_> {
    fn next_range(&self, stop: &dyn Fn() -> bool) -> Option<(Range<u64>, Option<Arc<Gate>>)> {
        // Bytes read ahead are taken or dropped first; the rest of the
        // transfer that took them comes next.
        self.resolve(stop, None);
        if let Some(rest) = self.rest_of_ahead() {
            return Some(rest);
        }
        let mut leftover = lock(&self.leftover);
        if leftover.is_some() {
            return None;
        }
        let Some(job) = lock(self.queue).try_next() else {
            drop(leftover);
            return self.read_ahead(&mut lock(&self.segments)).map(|r| (r, None));
        };
        let mut segments = lock(&self.segments);
        if !self.joins(&job) || segments.by_range.overlaps(&job.range) || segments.over_dropped(&job.range) {
            *leftover = Some(job);
            return None;
        }
        let range = job.range.clone();
        let (_, gate) = self.join(&mut segments, job);
        Some((range, gate))
    }

    fn settle(&self, part: &Range<u64>, stop: &dyn Fn() -> bool) -> Settled {
        // Whether the part was filled before its transfer came.
        let mut early = false;
        loop {
            let wait = {
                let segments = lock(&self.segments);
                let ahead = segments.ahead.as_ref().filter(|a| a.range.contains(&part.start));
                match ahead.map(|a| (&a.state, &a.range)) {
                    Some((AheadState::Waiting, range)) => Wait::Transfer(range.clone()),
                    Some((AheadState::Dropped, _)) => return Settled::Drop,
                    _ => {
                        // A transfer's part: copied once what it must
                        // follow is ordered (its gate open).
                        let seg = segments.find(part.start).and_then(|i| segments.list.get(i));
                        match seg.and_then(|s| s.gate.clone()).filter(|g| !g.is_open()) {
                            Some(gate) => Wait::Gate(gate),
                            None if early => return Settled::ReadAhead,
                            None => return Settled::Copy,
                        }
                    }
                }
            };
            match wait {
                Wait::Transfer(range) => {
                    early = true;
                    self.resolve(stop, Some(&range));
                }
                Wait::Gate(gate) => {
                    if !gate.wait(AHEAD_LOOK) && stop() {
                        return Settled::Drop;
                    }
                }
            }
        }
    }

    fn dropped(&self, part: &Range<u64>) -> bool {
        let segments = lock(&self.segments);
        segments.ahead.as_ref().is_some_and(|a| a.range.contains(&part.start) && a.state == AheadState::Dropped)
    }

    fn unreadable(&self, part: &Range<u64>) -> bool {
        let mut segments = lock(&self.segments);
        match segments.ahead.as_mut().filter(|a| a.range.contains(&part.start)) {
            Some(a) if a.state == AheadState::Waiting => {
                a.state = AheadState::Dropped;
                self.changed.notify_all();
                true
            }
            Some(a) => a.state == AheadState::Dropped,
            None => false,
        }
    }
}

/// Opens the gates whose transfers may start now: those with every copy of
/// the transfers before them enqueued. For each, the streamer's stream first
/// waits on the device for what the transfer must follow (unless that has
/// completed); then none of the earlier transfers' copies waits for it. A
/// wait that cannot be enqueued blocks the transfer's copies instead (its
/// gate opens, and its pieces fail the pass).
fn open_ready(segments: &mut [Segment], streams: &[Stream]) {
    for seg in segments.iter_mut() {
        if let Some(gate) = seg.gate.as_ref().filter(|g| !g.is_open()) {
            if let Some(ev) = &seg.after {
                let done = ev.query().unwrap_or(false);
                let waited = match streams.get(seg.stream) {
                    _ if done => Ok(()),
                    Some(stream) => stream.wait_event(ev).map_err(|e| e.to_string()),
                    None => Err("no stream".to_string()),
                };
                match waited {
                    Ok(()) => seg.after = None,
                    Err(e) => seg.blocked = Some(e),
                }
            }
            gate.open();
        }
        if seg.left > 0 {
            return; // the transfers after it must wait for its copies
        }
    }
}

/// A transfer's last copy is enqueued: wait for `event`, then report.
pub(super) struct Landed {
    index: usize,
    event: Event,
}

/// The sink of a chained pass: each piece goes to the destination of the
/// transfer whose range holds it.
pub(super) struct ChainSink<'c, 'q> {
    chain: &'c Chain<'q>,
}

impl Sink for ChainSink<'_, '_> {
    type Msg = Landed;
    const SILENT: bool = false;

    fn streams_for(&self, off: u64, _len: u64) -> StreamSet {
        let segments = lock(&self.chain.segments);
        segments.find(off).and_then(|i| segments.list.get(i)).map_or(StreamSet::EMPTY, |s| StreamSet::one(s.stream))
    }

    fn put(&mut self, streams: &[Stream], src: &dyn Slicer, off: u64, len: usize, out: &mut Vec<Landed>) -> Result<()> {
        let mut segments = lock(&self.chain.segments);
        let index = segments.find(off).ok_or_else(|| Error::invalid("chain", format!("no transfer holds {off}")))?;
        let seg = segments.list.get_mut(index).ok_or_else(|| Error::invalid("chain", "no such transfer"))?;
        if off + len as u64 > seg.range.end {
            return Err(Error::invalid("chain", "a piece crosses the end of its transfer"));
        }
        if let Some(e) = &seg.blocked {
            let message = format!("its copies could not be ordered after `StartOptions::after`: {e}");
            return Err(Error::TransferFailed { message });
        }
        let stream = streams.get(seg.stream).ok_or_else(|| Error::invalid("chain", "no stream"))?;
        let dst = seg.dst.as_mut().ok_or_else(|| Error::invalid("chain", "the transfer was already written"))?;
        let at = (off - seg.range.start) as usize;
        let piece = src.slice(0..len)?;
        stream.copy_to_device(&piece, &mut dst.slice_mut(at..at + len)?)?.detach();
        seg.left = seg.left.saturating_sub(len as u64);
        if seg.left == 0 {
            // Every copy of this transfer is enqueued, on this one stream, before these.
            seg.state.enqueued(Some(stream))?;
            let event = Event::new(&stream.device(), EventOptions::new().blocking_sync(true))?;
            stream.record(&event)?;
            seg.dst = None; // released: its owner now knows every copy
            out.push(Landed { index, event });
            open_ready(&mut segments.list, self.chain.streams);
        }
        Ok(())
    }

    fn begin(&mut self, strategy: Strategy, windows: &WindowContext, stats: &Arc<PassStats>) {
        let _ = self.chain.pass.set((strategy, windows.clone(), Arc::clone(stats)));
    }
}

/// Whether `job` runs as the first transfer of a chained pass, and the
/// bytes that pass is planned for: `job`'s and those of the transfers
/// queued behind it that it could take ([`JobQueue::queued_run`]), when the
/// plan for that many bytes streams through windows or the ring
/// (`Shared::chain_plan`). Not with what needs a pass to itself (verifying,
/// a progress callback counting one range) or with copy streams per agent.
pub(super) fn chain_len(shared: &Shared, job: &Job, queue: &Mutex<JobQueue>) -> Option<u64> {
    let c = &shared.config;
    if c.verify || c.progress.is_some() || c.copy_streams != CopyStreams::One {
        return None;
    }
    let len = job.range.end - job.range.start;
    let total = || len.saturating_add(lock(queue).queued_run(&job.file, &job.range));
    shared.chain_plan(&job.file, &job.range, total)
}

/// Runs `job` as the first transfer of a pass that takes the transfers
/// queued behind it from `queue` as it goes; answers the jobs to run next
/// (taken from the queue but not run), in order.
pub(super) fn run_chain(shared: &Shared, job: Job, queue: &Mutex<JobQueue>, plan_len: u64) -> Vec<Job> {
    let mut job = job;
    job.dst.settle();
    let chain = Chain {
        file: Arc::clone(&job.file),
        queue,
        streams: &shared.streams,
        budget: &shared.config.budget,
        segments: Mutex::new(Segments::default()),
        leftover: Mutex::new(None),
        pass: OnceLock::new(),
        read_ahead: shared.config.read_ahead,
        entering: &shared.entering,
        changed: Condvar::new(),
    };
    let range = job.range.clone();
    let after = job.after.take();
    lock(&chain.segments).push(Segment::new(job, false, &shared.config.budget, (0, Breakdown::default())));
    let res = chain_pass(shared, &chain, range, after.as_ref(), plan_len);
    drop(after);

    let mut segments = std::mem::take(&mut lock(&chain.segments).list);
    let mut next = Vec::new();
    let mut err = res.err();
    for seg in &mut segments {
        if seg.finished {
            continue;
        }
        let untouched = seg.left == seg.range.end - seg.range.start;
        match (seg.dst.take(), err.take()) {
            // Not written to: it runs again on its own.
            (Some(dst), e) if untouched && seg.chained => {
                err = e;
                seg.finished = true;
                let (file, range, stream) = (Arc::clone(&chain.file), seg.range.clone(), seg.stream);
                // What it must follow, unless the stream already waits for it.
                let after = seg.after.take();
                next.push(Job { file, range, dst, stream, after, state: Arc::clone(&seg.state) });
            }
            (_, Some(e)) => {
                let message = e.to_string();
                seg.finish(Err(e));
                err = Some(Error::TransferFailed {
                    message: format!("an earlier transfer of its pass failed: {message}"),
                });
            }
            (_, None) => {
                let message = "its pass ended before its copies were".to_string();
                seg.finish(Err(Error::TransferFailed { message }));
            }
        }
    }
    next.extend(lock(&chain.leftover).take());
    next
}

/// The pass: the first transfer's checks and ordering, then the run, fed
/// by `chain`, reporting each transfer as its copies complete.
fn chain_pass(
    shared: &Shared,
    chain: &Chain<'_>,
    range: Range<u64>,
    after: Option<&Event>,
    plan_len: u64,
) -> Result<()> {
    let (_owner, mut st) = shared.enter("Streamer::start")?;
    let stream = lock(&chain.segments).list.first().map(|s| s.stream).unwrap_or(0);
    if let Some(ev) = after {
        shared.streams.get(stream).ok_or_else(|| Error::invalid("chain", "no stream"))?.wait_event(ev)?;
    }
    let sink = ChainSink { chain };
    let on_landed = |Landed { index, event }: Landed| -> Result<()> {
        wait_tail(&event, TAIL_SPIN)?;
        let (strategy, windows) = match chain.pass.get() {
            Some((s, w, _)) => (*s, w.clone()),
            None => return Err(Error::invalid("chain", "a transfer landed before its pass began")),
        };
        let (registrations, stats) = chain.counts();
        let mut segments = lock(&chain.segments);
        let seg = segments.list.get_mut(index).ok_or_else(|| Error::invalid("chain", "no such transfer"))?;
        let report = Report {
            strategy,
            bytes: seg.range.end - seg.range.start,
            seconds: seg.t0.elapsed().as_secs_f64(),
            cpu_seconds: (process_cpu_seconds() - seg.cpu0).max(0.0),
            peak_pinned: seg.watch.peak(),
            registrations: registrations.saturating_sub(seg.registrations0),
            verified: None,
            windows,
            chained: seg.chained,
            breakdown: stats.since(&seg.stats0),
        };
        seg.finish(Ok(report));
        Ok(())
    };
    let fed = Fed { feed: chain, len: plan_len };
    let res = shared.run_fed(&mut st, &Arc::clone(&chain.file), range, sink, on_landed, Some(fed));
    // The streamer remembers every transfer of the pass as streamed (the
    // first one `run_fed` noted).
    for seg in lock(&chain.segments).list.iter().skip(1) {
        st.recent.note(&chain.file, &seg.range);
    }
    res.map(|_| ())
}
