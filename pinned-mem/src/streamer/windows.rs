//! The window agent: one thread (or the calling thread, for a lone
//! whole-file pass) that claims windows from the front of the range and makes
//! them pinned in place, registering each (sliding windows, the hybrid) or
//! taking a piece of the kept whole-file registration, enqueues their copies,
//! and retires each once its events completed: register window i+1 while
//! window i copies.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use wirespeed_cuda::{Event, EventOptions};

use super::lock;
use super::pipeline::{Claims, Ctx, tail_spin, wait_tail};
use super::whole::{PIECE, PIECE_IN_FLIGHT};
use crate::error::{Error, Result};
use crate::range::PinnedRange;
use crate::sink::{RangePart, Sink};

#[derive(Clone, Copy)]
pub(super) enum WindowSrc<'a> {
    /// Register each window, `in_flight` at once.
    Register { window: u64, in_flight: usize },
    /// Pieces of a registration made beforehand (cached whole file).
    Whole { reg: &'a PinnedRange },
}

struct InFlightWindow {
    reg: Option<PinnedRange>,
    set: usize,
    mask: u64,
    len: u64,
}

/// Claims windows from the front, pins them (or takes them from the cached
/// registration), enqueues their copies, and retires each once its events
/// completed: register window i+1 while window i copies.
pub(super) fn window_agent<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    src: WindowSrc<'_>,
    sink: &Mutex<S>,
    tx: &SyncSender<S::Msg>,
) -> Result<()> {
    let (size, in_flight) = match src {
        WindowSrc::Register { window, in_flight } => (window, in_flight.max(1)),
        WindowSrc::Whole { .. } => (PIECE, PIECE_IN_FLIGHT),
    };
    let mut events: Vec<Vec<Option<Event>>> = {
        let mut pool = lock(ctx.window_events);
        (0..in_flight).map(|_| (0..ctx.streams.len()).map(|i| pool.get_mut(i).and_then(Vec::pop)).collect()).collect()
    };
    let mut queue: VecDeque<InFlightWindow> = VecDeque::with_capacity(in_flight);
    let mut next_set = 0;
    let mut out = Vec::new();

    let retire = |w: InFlightWindow, events: &[Vec<Option<Event>>], tail: bool| -> Result<()> {
        let mut res = Ok(());
        for (i, ev) in events[w.set].iter().enumerate() {
            if w.mask & (1 << i) != 0
                && let Some(ev) = ev
                && let Err(e) = if tail { wait_tail(ev, tail_spin(w.len)) } else { ev.synchronize() }
            {
                res = res.and(Err(e.into()));
            }
        }
        if res.is_ok() {
            ctx.progress(w.len);
        }
        // Unregister now, reporting errors (it waits on the fence if an event failed).
        if let Some(reg) = w.reg {
            res = res.and(reg.release());
        }
        res
    };

    let result = (|| -> Result<()> {
        while !ctx.aborted() {
            let Some(r) = claims.front(size) else { break };
            if queue.len() >= in_flight {
                // `cudaHostUnregister` waits for every copy in flight on the
                // device (measured on the H200), so retiring one window per new
                // window would drain the queue each time. Registered windows
                // are retired all at once when they fill the budget: one drain
                // per batch. Pieces of a cached registration (nothing to
                // unregister) retire one at a time.
                let batch = if matches!(src, WindowSrc::Register { .. }) { queue.len() } else { 1 };
                for _ in 0..batch {
                    if let Some(w) = queue.pop_front() {
                        retire(w, &events, false)?;
                    }
                }
            }
            let len = r.end - r.start;
            let own;
            let part = match src {
                WindowSrc::Register { .. } => {
                    if !ctx.portable {
                        ctx.device0.make_current()?;
                    }
                    let (reg, fresh) = PinnedRange::create(ctx.file, r.clone(), ctx.opts, ctx.budget)?;
                    if fresh {
                        ctx.registrations.fetch_add(1, Ordering::Relaxed);
                    }
                    own = Some(reg);
                    match &own {
                        Some(reg) => RangePart { range: reg, base: 0 },
                        None => return Err(Error::invalid("window", "no registration")),
                    }
                }
                WindowSrc::Whole { reg } => {
                    own = None;
                    RangePart { range: reg, base: (r.start - reg.range().start) as usize }
                }
            };
            let put = {
                let mut s = lock(sink);
                let mask = s.streams_for(r.start, len);
                s.put(ctx.streams, &part, r.start, len as usize, &mut out).map(|()| mask)
            };
            // An inline agent's channel has no reader (see `run`).
            debug_assert!(!S::SILENT || out.is_empty(), "a SILENT sink sent a message");
            let mask = match &put {
                Ok(m) => *m,
                Err(_) => u64::MAX >> (64 - ctx.streams.len()), // cover whatever was enqueued
            };
            let set = next_set;
            next_set = (next_set + 1) % in_flight;
            let mut recorded = 0;
            let mut rec_err = None;
            for (i, stream) in ctx.streams.iter().enumerate() {
                if mask & (1 << i) == 0 {
                    continue;
                }
                let slot = &mut events[set][i];
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
                        Ok(()) => recorded |= 1 << i,
                        Err(e) => {
                            rec_err.get_or_insert(e);
                        }
                    }
                }
            }
            // A piece whose copies failed is not progress (its events still cover
            // whatever was enqueued).
            let landed = if put.is_ok() { len } else { 0 };
            queue.push_back(InFlightWindow { reg: own, set, mask: recorded, len: landed });
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
    })();

    let mut res = result;
    while let Some(w) = queue.pop_front() {
        let tail = queue.is_empty();
        let r = retire(w, &events, tail);
        res = res.and(r);
    }
    // Keep the events for the next pass (re-recording a pending one is fine).
    let mut pool = lock(ctx.window_events);
    for set in events {
        for (i, ev) in set.into_iter().enumerate() {
            if let (Some(ev), Some(p)) = (ev, pool.get_mut(i)) {
                p.push(ev);
            }
        }
    }
    res
}
