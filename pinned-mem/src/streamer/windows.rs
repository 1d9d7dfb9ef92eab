//! The window agent: one thread (or the calling thread, for a lone
//! whole-file pass) that claims windows from the front of the range and makes
//! them pinned in place, registering each (sliding windows, the hybrid) or
//! taking a piece of the kept whole-file registration, enqueues their copies,
//! and retires each once its events completed: register window i+1 while
//! window i copies.
//!
//! Windows are registered in a second CUDA context of the device when one can
//! be made (`Shared::window_context`). Measured on an H200 (driver 580): in
//! the primary context `cudaHostUnregister` waits for every copy in flight on
//! the device, and registering or unregistering stalls other threads' copies,
//! so windows alone stop at 25-30 GB/s; in a second context neither happens,
//! and copies issued in the primary context from memory registered there
//! (portable) run at the line rate. The driver then no longer waits for
//! anyone: a window is unregistered only after the events of every copy that
//! reads it completed, which [`PinnedRange`]'s registration enforces (its
//! release waits on the fence every copy records into).
//!
//! One thread registers. Measured on the H200 (a 4 GiB page-cached file, a
//! 512 MiB budget, the hybrid of 111 MiB windows and a 4-thread ring, two
//! rounds in one call): with two threads registering windows side by side,
//! sharing the windows in flight, the hybrid reached 0.80-0.83 of the line
//! rate where one reached 0.85-0.87, three 0.77-0.78, and two with a 2-thread
//! ring 0.65: registering does not go faster with more threads, and the
//! extra windows only hold more memory pinned. Nor does unregistering on a
//! thread of its own (a third of the window thread's time when windows
//! stream alone): tried on a start where windows alone reached 0.30 of the
//! line rate, the unregistering took five times longer beside the
//! registering (20 ms to 100 ms per 4 GiB pass of the hybrid) and the hybrid
//! was no faster (0.65-0.69 against 0.68-0.71 inline, alternating runs): the
//! driver runs one at a time.
//!
//! Nor does a context per registering thread: measured with the driver API
//! alone (`bench/probes/register_cost.py`, 128 MiB windows of a 4 GiB
//! page-cached file), one thread registered and unregistered the 4 GiB at
//! 32-46 GB/s, two threads with a context each 34-37, four 34: the driver
//! serializes registrations device-wide. Flags (`PORTABLE`, `DEVICEMAP`) and
//! the context (primary or created) change nothing; 4 KiB pages cost twice
//! what 2 MiB folios do; copies in flight on the device slow it by about a
//! third. The window agent's rate is the device's registering rate.

use std::collections::VecDeque;
use std::sync::RwLock;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use wirespeed_cuda::{Event, EventOptions};

use super::claims::Claims;
use super::ctx::{Ctx, tail_spin, wait_tail};
use super::sink::{RangePart, Sink};
use super::stats::Step;
use super::stream_set::StreamSet;
use super::whole::{PIECE, PIECE_IN_FLIGHT};
use crate::error::{Error, Result};
use crate::range::PinnedRange;
use wirespeed_cuda::locks::{lock, read, write};

/// Where the window agent's pinned bytes come from.
#[derive(Clone, Copy)]
pub(super) enum WindowSrc<'a> {
    /// Register each window, `in_flight` at once; claim none once fewer
    /// than `leave` bytes are left (the hybrid's ring agents take those).
    Register { window: u64, in_flight: usize, leave: u64 },
    /// Pieces of a registration made beforehand (cached whole file).
    Whole { reg: &'a PinnedRange },
}

impl WindowSrc<'_> {
    /// Bytes per claim: a window, or a piece of the whole-file registration.
    fn size(self) -> u64 {
        match self {
            WindowSrc::Register { window, .. } => window,
            WindowSrc::Whole { .. } => PIECE,
        }
    }

    /// Windows (or pieces) in flight at once.
    fn in_flight(self) -> usize {
        match self {
            WindowSrc::Register { in_flight, .. } => in_flight.max(1),
            WindowSrc::Whole { .. } => PIECE_IN_FLIGHT,
        }
    }
}

/// A window whose copies are enqueued.
struct InFlightWindow {
    /// Its registration, unregistered when it retires (none for a piece of
    /// the cached whole-file registration).
    reg: Option<PinnedRange>,
    /// The set of events recorded after its copies.
    set: usize,
    /// The streams those events were recorded on.
    recorded: StreamSet,
    /// Bytes that count as progress once its events completed.
    len: u64,
}

/// Claims windows from the front, pins them (or takes them from the cached
/// registration), enqueues their copies, and retires each once its events
/// completed: register window i+1 while window i copies.
pub(super) fn window_agent<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    src: WindowSrc<'_>,
    sink: &RwLock<S>,
    tx: &SyncSender<S::Msg>,
) -> Result<()> {
    let mut queue = Queue::new(ctx, src.in_flight());
    let result = claim_windows(ctx, claims, src, sink, tx, &mut queue);
    let res = queue.retire_all(ctx, result);
    queue.keep_events(ctx);
    res
}

/// The agent's loop: claims a window, makes room in the queue, pins the
/// window, enqueues its copies and records its events, until the range is
/// claimed, the transfer fails or the caller stops reading messages.
fn claim_windows<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    src: WindowSrc<'_>,
    sink: &RwLock<S>,
    tx: &SyncSender<S::Msg>,
    queue: &mut Queue,
) -> Result<()> {
    let mut out = Vec::new();
    // The part of the last claim after a live registration's edge: the agent
    // streams it next itself (given back to the claims, it could be left
    // there by ring agents that had already found them empty and stopped).
    let mut rest: Option<std::ops::Range<u64>> = None;
    while !ctx.aborted() {
        let leave = match src {
            WindowSrc::Register { leave, .. } => leave,
            WindowSrc::Whole { .. } => 0,
        };
        if matches!(src, WindowSrc::Register { .. }) && ctx.window_ctx.is_some() {
            // In a second context unregistering waits for nothing else: a
            // window whose copies are done retires now, so that few are left
            // to unregister when the range is claimed (at the end of a pass
            // those unregisters are the tail: 107 MiB take about 3 ms).
            queue.retire_done(ctx)?;
        }
        let r = match rest.take() {
            Some(r) => r,
            None => {
                let Some(r) = claims.front_leaving(src.size(), leave) else { break };
                r
            }
        };
        if queue.is_full() {
            // In the primary context `cudaHostUnregister` waits for every copy
            // in flight on the device (measured on the H200), so retiring one
            // window per new window would drain the queue each time: there
            // registered windows are retired all at once when they fill the
            // budget, one drain per batch. In a second context, and for
            // pieces of a cached registration (nothing to unregister), the
            // oldest retires alone.
            let batch = match src {
                WindowSrc::Register { .. } if ctx.window_ctx.is_none() => queue.windows.len(),
                _ => 1,
            };
            queue.retire_batch(ctx, batch)?;
        }
        let r = match src {
            WindowSrc::Register { .. } => {
                let (now, later) = fit_to_live(ctx, r);
                rest = later;
                now
            }
            WindowSrc::Whole { .. } => r,
        };
        let len = r.end - r.start;
        let own = match src {
            WindowSrc::Register { .. } => Some(register(ctx, r.clone())?),
            WindowSrc::Whole { .. } => None,
        };
        let part = match (src, &own) {
            (WindowSrc::Register { .. }, Some(reg)) => RangePart { range: reg, base: 0 },
            (WindowSrc::Register { .. }, None) => return Err(Error::invalid("window", "no registration")),
            (WindowSrc::Whole { reg }, _) => RangePart { range: reg, base: (r.start - reg.range().start) as usize },
        };
        let put = if ctx.lanes {
            // Lane 0 is the window agent's, on the streamer's streams.
            let s = read(sink);
            let to = s.streams_for(r.start, len);
            s.put_lane(0, ctx.streams, &part, r.start, len as usize).map(|()| to)
        } else {
            let mut s = write(sink);
            let to = s.streams_for(r.start, len);
            s.put(ctx.streams, &part, r.start, len as usize, &mut out).map(|()| to)
        };
        // An inline agent's channel has no reader (see `run_inline`).
        debug_assert!(!S::SILENT || out.is_empty(), "a SILENT sink sent a message");
        let to = match &put {
            Ok(to) => *to,
            Err(_) => StreamSet::first(ctx.streams.len()), // cover whatever was enqueued
        };
        let (set, recorded, rec_err) = queue.record(ctx, to);
        // A piece whose copies failed is not progress (its events still cover
        // whatever was enqueued).
        let landed = if put.is_ok() { len } else { 0 };
        ctx.stats.in_place_bytes.fetch_add(landed, Ordering::Relaxed);
        queue.windows.push_back(InFlightWindow { reg: own, set, recorded, len: landed });
        put?;
        if let Some(e) = rec_err {
            return Err(e.into());
        }
        for m in out.drain(..) {
            if tx.send(m).is_err() {
                return Ok(()); // the caller stopped
            }
        }
    }
    Ok(())
}

/// A window to stream now, and the rest of its claim to stream next.
type Cut = (std::ops::Range<u64>, Option<std::ops::Range<u64>>);

/// Cuts window `r` at the edges of a live registration of the same pages (a
/// caller's own [`PinnedRange`], say): answers the window to stream now and
/// the rest of `r`, if any, to stream next. A window then lies either wholly
/// inside it (and shares it, registering nothing) or wholly outside it (and
/// shares no page with it), never across its edge, which CUDA would refuse.
fn fit_to_live(ctx: &Ctx<'_>, r: std::ops::Range<u64>) -> Cut {
    let page = crate::util::page_size();
    let pages = crate::util::align_down(r.start, page)..crate::util::align_up(r.end, page);
    let Some(live) = ctx.file.registry.first_live_overlap(&pages) else { return (r, None) };
    let cut = if live.start <= pages.start {
        live.end.min(r.end) // r starts inside: its part inside that registration
    } else {
        live.start // r starts before it: up to its first page
    };
    if cut > r.start && cut < r.end {
        return (r.start..cut, Some(cut..r.end));
    }
    (r, None)
}

/// Registers window `r` (on the streamer's device unless portable), counting
/// a fresh registration.
fn register(ctx: &Ctx<'_>, r: std::ops::Range<u64>) -> Result<PinnedRange> {
    if !ctx.portable && ctx.window_ctx.is_none() {
        ctx.device0.make_current()?;
    }
    let (reg, fresh) = ctx
        .stats
        .time(Step::Register, || PinnedRange::create_in(ctx.window_ctx.as_ref(), ctx.file, r, ctx.opts, ctx.budget))?;
    if fresh {
        ctx.stats.registrations.fetch_add(1, Ordering::Relaxed);
    }
    Ok(reg)
}

/// The windows in flight, oldest first, and the sets of events (one per
/// stream) recorded after their copies, used round-robin.
struct Queue {
    events: Vec<Vec<Option<Event>>>,
    windows: VecDeque<InFlightWindow>,
    next_set: usize,
}

impl Queue {
    /// Room for `in_flight` windows, with events taken from the streamer's
    /// pool (missing ones are created when first recorded).
    fn new(ctx: &Ctx<'_>, in_flight: usize) -> Queue {
        let events = {
            let mut pool = lock(ctx.window_events);
            (0..in_flight)
                .map(|_| (0..ctx.streams.len()).map(|i| pool.get_mut(i).and_then(Vec::pop)).collect())
                .collect()
        };
        Queue { events, windows: VecDeque::with_capacity(in_flight), next_set: 0 }
    }

    fn is_full(&self) -> bool {
        self.windows.len() >= self.events.len()
    }

    /// Records the next set's events on the streams `to`, creating the
    /// missing ones. Answers the set, the streams recorded on, and the first
    /// error (the other streams are still recorded).
    fn record(&mut self, ctx: &Ctx<'_>, to: StreamSet) -> (usize, StreamSet, Option<wirespeed_cuda::Error>) {
        let set = self.next_set;
        self.next_set = (self.next_set + 1) % self.events.len();
        let mut recorded = StreamSet::EMPTY;
        let mut rec_err = None;
        for (i, stream) in ctx.streams.iter().enumerate() {
            if !to.contains(i) {
                continue;
            }
            let slot = &mut self.events[set][i];
            if slot.is_none() {
                match Event::new(&stream.device(), EventOptions { timing: false, blocking_sync: true }) {
                    Ok(e) => *slot = Some(e),
                    Err(e) => {
                        rec_err.get_or_insert(e);
                        continue;
                    }
                }
            }
            if let Some(ev) = slot {
                match stream.record(ev) {
                    Ok(()) => recorded = recorded.with(i),
                    Err(e) => {
                        rec_err.get_or_insert(e);
                    }
                }
            }
        }
        (set, recorded, rec_err)
    }

    /// Retires the `n` oldest windows, stopping at the first error.
    fn retire_batch(&mut self, ctx: &Ctx<'_>, n: usize) -> Result<()> {
        for _ in 0..n {
            if let Some(w) = self.windows.pop_front() {
                retire(ctx, w, &self.events, false)?;
            }
        }
        Ok(())
    }

    /// Retires the oldest windows whose copies have completed (asking CUDA,
    /// never waiting), stopping at the first that has not or at an error.
    fn retire_done(&mut self, ctx: &Ctx<'_>) -> Result<()> {
        while let Some(w) = self.windows.front() {
            let mut done = true;
            for (i, ev) in self.events[w.set].iter().enumerate() {
                if w.recorded.contains(i)
                    && let Some(ev) = ev
                    && !ev.query()?
                {
                    done = false;
                    break;
                }
            }
            if !done {
                return Ok(());
            }
            if let Some(w) = self.windows.pop_front() {
                retire(ctx, w, &self.events, false)?;
            }
        }
        Ok(())
    }

    /// Retires every window left, the last one as the tail of the pass:
    /// `res`, or else the first error.
    fn retire_all(&mut self, ctx: &Ctx<'_>, res: Result<()>) -> Result<()> {
        let mut res = res;
        while let Some(w) = self.windows.pop_front() {
            let tail = self.windows.is_empty();
            let r = retire(ctx, w, &self.events, tail);
            res = res.and(r);
        }
        res
    }

    /// Keeps the events for the next pass (re-recording a pending one is fine).
    fn keep_events(self, ctx: &Ctx<'_>) {
        let mut pool = lock(ctx.window_events);
        for set in self.events {
            for (i, ev) in set.into_iter().enumerate() {
                if let (Some(ev), Some(p)) = (ev, pool.get_mut(i)) {
                    p.push(ev);
                }
            }
        }
    }
}

/// Waits for window `w`'s events (polling, for the tail of the pass), counts
/// its bytes as progress if they landed, and unregisters it, reporting the
/// first error.
fn retire(ctx: &Ctx<'_>, w: InFlightWindow, events: &[Vec<Option<Event>>], tail: bool) -> Result<()> {
    let mut res = Ok(());
    for (i, ev) in events[w.set].iter().enumerate() {
        if w.recorded.contains(i)
            && let Some(ev) = ev
            && let Err(e) = ctx
                .stats
                .time(Step::WindowWait, || if tail { wait_tail(ev, tail_spin(w.len)) } else { ev.synchronize() })
        {
            res = res.and(Err(e.into()));
        }
    }
    if res.is_ok() {
        ctx.progress(w.len);
    }
    // Unregister now, reporting errors (it waits on the fence if an event failed).
    if let Some(reg) = w.reg {
        res = res.and(ctx.stats.time(Step::Unregister, || reg.release()));
    }
    res
}
