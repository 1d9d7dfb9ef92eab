//! The pinned pieces an in-place agent (whole file, windows) has enqueued the
//! copies of, oldest first ([`Queue`]), and the events recorded after those
//! copies: a piece retires once its events completed, counted as progress
//! then, and unregistered if it is a window of its own.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;

use wirespeed_cuda::locks::{lock, read, write};
use wirespeed_cuda::{Event, EventOptions};

use super::crew::Crew;
use crate::error::Result;
use crate::range::PinnedRange;
use crate::streamer::ctx::{Ctx, tail_spin, wait_tail};
use crate::streamer::sink::{RangePart, Sink};
use crate::streamer::stats::Step;
use crate::streamer::stream_set::StreamSet;

/// Where a piece's pinned bytes are.
pub(in crate::streamer) enum Pinned<'r> {
    /// A registration of the piece alone (a window), unregistered when the
    /// piece retires.
    Own(PinnedRange),
    /// Inside a registration the streamer keeps (the whole file).
    Within(&'r PinnedRange),
}

/// A piece whose copies are enqueued.
struct InFlight {
    /// Its registration, unregistered when it retires (none for a piece of
    /// the kept whole-file registration).
    reg: Option<PinnedRange>,
    /// The set of events recorded after its copies.
    set: usize,
    /// The streams those events were recorded on.
    recorded: StreamSet,
    /// Bytes that count as progress once its events completed.
    len: u64,
}

/// The pieces in flight, oldest first, and the sets of events (one per
/// stream) recorded after their copies, used round-robin.
pub(in crate::streamer) struct Queue {
    events: Vec<Vec<Option<Event>>>,
    pieces: VecDeque<InFlight>,
    next_set: usize,
}

impl Queue {
    /// Room for `in_flight` pieces, with events taken from the streamer's
    /// pool (missing ones are created when first recorded).
    pub(in crate::streamer) fn new(ctx: &Ctx<'_>, in_flight: usize) -> Queue {
        let mut pool = lock(ctx.window_events);
        let events = (0..in_flight)
            .map(|_| (0..ctx.streams.len()).map(|i| pool.get_mut(i).and_then(Vec::pop)).collect())
            .collect();
        Queue { events, pieces: VecDeque::with_capacity(in_flight), next_set: 0 }
    }

    /// True when `in_flight` pieces are queued: one must retire first.
    pub(in crate::streamer) fn is_full(&self) -> bool {
        self.pieces.len() >= self.events.len()
    }

    /// The pieces queued.
    pub(in crate::streamer) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Enqueues the copies of bytes `r` of the file, pinned in `pinned`,
    /// through the crew's sink (lane 0 while the sink's lanes are open),
    /// records the next set of events after them and queues the piece, then
    /// sends the sink's messages (`out`); false once the calling thread has
    /// stopped reading them.
    pub(in crate::streamer) fn put<S: Sink>(
        &mut self,
        crew: &Crew<'_, S>,
        r: Range<u64>,
        pinned: Pinned<'_>,
        out: &mut Vec<S::Msg>,
    ) -> Result<bool> {
        let ctx = crew.ctx;
        let len = r.end - r.start;
        let part = match &pinned {
            Pinned::Own(reg) => RangePart { range: reg, base: 0 },
            Pinned::Within(reg) => RangePart { range: reg, base: (r.start - reg.range().start) as usize },
        };
        let put = if ctx.lanes {
            // Lane 0 is the in-place agent's, on the streamer's streams.
            let s = read(crew.sink);
            let to = s.streams_for(r.start, len);
            s.put_lane(0, ctx.streams, &part, r.start, len as usize).map(|()| to)
        } else {
            let mut s = write(crew.sink);
            let to = s.streams_for(r.start, len);
            s.put(ctx.streams, &part, r.start, len as usize, out).map(|()| to)
        };
        // An inline agent's channel has no reader (see `run_inline`).
        debug_assert!(!S::SILENT || out.is_empty(), "a SILENT sink sent a message");
        let to = match &put {
            Ok(to) => *to,
            Err(_) => StreamSet::first(ctx.streams.len()), // cover whatever was enqueued
        };
        let (set, recorded, rec_err) = self.record(ctx, to);
        // A piece whose copies failed is not progress (its events still cover
        // whatever was enqueued).
        let landed = if put.is_ok() { len } else { 0 };
        ctx.stats.in_place_bytes.fetch_add(landed, Ordering::Relaxed);
        let reg = match pinned {
            Pinned::Own(reg) => Some(reg),
            Pinned::Within(_) => None,
        };
        self.pieces.push_back(InFlight { reg, set, recorded, len: landed });
        put?;
        if let Some(e) = rec_err {
            return Err(e.into());
        }
        Ok(crew.send(out))
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
                match Event::new(&stream.device(), EventOptions::new().blocking_sync(true)) {
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

    /// Retires the `n` oldest pieces, stopping at the first error.
    pub(in crate::streamer) fn retire_batch(&mut self, ctx: &Ctx<'_>, n: usize) -> Result<()> {
        for _ in 0..n {
            if let Some(w) = self.pieces.pop_front() {
                retire(ctx, w, &self.events, false)?;
            }
        }
        Ok(())
    }

    /// Retires the oldest pieces whose copies have completed (asking CUDA,
    /// never waiting), stopping at the first that has not or at an error.
    pub(in crate::streamer) fn retire_done(&mut self, ctx: &Ctx<'_>) -> Result<()> {
        while let Some(w) = self.pieces.front() {
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
            if let Some(w) = self.pieces.pop_front() {
                retire(ctx, w, &self.events, false)?;
            }
        }
        Ok(())
    }

    /// Ends the agent's pass: retires every piece left, the last one as the
    /// tail of the pass, and gives the events back to the streamer's pool
    /// for the next pass (re-recording a pending one is fine). Answers `res`,
    /// or else the first error.
    pub(in crate::streamer) fn finish(mut self, ctx: &Ctx<'_>, res: Result<()>) -> Result<()> {
        let mut res = res;
        while let Some(w) = self.pieces.pop_front() {
            let tail = self.pieces.is_empty();
            let r = retire(ctx, w, &self.events, tail);
            res = res.and(r);
        }
        let mut pool = lock(ctx.window_events);
        for set in self.events {
            for (i, ev) in set.into_iter().enumerate() {
                if let (Some(ev), Some(p)) = (ev, pool.get_mut(i)) {
                    p.push(ev);
                }
            }
        }
        res
    }
}

/// Waits for piece `w`'s events (polling, for the tail of the pass), counts
/// its bytes as progress if they landed, and unregisters it if it is a
/// window of its own, reporting the first error.
fn retire(ctx: &Ctx<'_>, w: InFlight, events: &[Vec<Option<Event>>], tail: bool) -> Result<()> {
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
