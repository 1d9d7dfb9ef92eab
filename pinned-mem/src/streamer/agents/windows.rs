//! The window agent ([`Strategy::Windows`], and the front of
//! [`Strategy::Hybrid`]): one thread that claims windows from the front of
//! the range, registers each in place, enqueues its copies, and unregisters
//! it once they completed: window i+1 is registered while window i copies.
//!
//! Windows are registered in a second CUDA context of the device when one can
//! be made (`Shared::window_context`, the registration context): in the
//! primary context `cudaHostUnregister` waits for every copy in flight on the
//! device, and registering or unregistering stalls other threads' copies; in
//! a second context neither happens, and copies issued in the primary context
//! from memory registered there (portable) run at the line rate. The driver
//! then waits for nobody: a window is unregistered only after the events of
//! every copy that reads it completed, which [`PinnedRange`]'s registration
//! enforces (its release waits on the fence every copy records into).
//!
//! One thread registers: the driver registers one call at a time for the
//! whole device, so more registering threads, a context per thread, or
//! unregistering on a thread of its own would go no faster, and the extra
//! windows would only hold more memory pinned. The agent's rate is the
//! device's registering rate.
//!
//! [`Strategy::Windows`]: crate::Strategy::Windows
//! [`Strategy::Hybrid`]: crate::Strategy::Hybrid

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::crew::Crew;
use super::in_flight::{Pinned, Queue};
use crate::error::Result;
use crate::range::PinnedRange;
use crate::streamer::ctx::Ctx;
use crate::streamer::sink::Sink;
use crate::streamer::stats::Step;
use crate::util::{align_down, align_up, page_size};

/// The windows of a pass.
#[derive(Debug, Clone, Copy)]
pub(in crate::streamer) struct Windows {
    /// Bytes per window.
    pub(in crate::streamer) window: u64,
    /// Windows registered at once.
    pub(in crate::streamer) in_flight: usize,
    /// Claim none once fewer than this many bytes are left in a range (the
    /// hybrid's ring agents take those).
    pub(in crate::streamer) leave: u64,
}

/// Claims windows from the front, registers them, enqueues their copies,
/// and retires each once its copies completed; returns when the range is
/// claimed, the transfer failed, or the calling thread stopped reading the
/// sink's messages.
pub(in crate::streamer) fn window_agent<S: Sink>(crew: Crew<'_, S>, windows: Windows) -> Result<()> {
    let mut queue = Queue::new(crew.ctx, windows.in_flight.max(1));
    let res = claim_windows(&crew, windows, &mut queue);
    queue.finish(crew.ctx, res)
}

/// The agent's loop: claims a window, makes room in the queue, registers
/// the window, and enqueues its copies.
fn claim_windows<S: Sink>(crew: &Crew<'_, S>, windows: Windows, queue: &mut Queue) -> Result<()> {
    let ctx = crew.ctx;
    // In a second context unregistering waits for nothing else: a window
    // whose copies are done retires at once, so that few are left to
    // unregister (the tail of the pass) once the range is claimed, and when
    // the queue is full the oldest retires alone. In the primary context
    // `cudaHostUnregister` waits for every copy in flight on the device, so
    // retiring one window per new window would drain the queue each time:
    // there a full queue retires all at once, one drain per batch.
    let second = ctx.window_ctx.is_some();
    let mut out = Vec::new();
    // The part of the last claim after a live registration's edge: the agent
    // streams it next itself (given back to the claims, it could be left
    // there by ring agents that had already found them empty and stopped).
    let mut rest: Option<Range<u64>> = None;
    while !ctx.aborted() {
        if second {
            queue.retire_done(ctx)?;
        }
        let r = match rest.take() {
            Some(r) => r,
            None => {
                let Some(r) = crew.front_leaving(windows.window, windows.leave) else { break };
                r
            }
        };
        if queue.is_full() {
            let batch = if second { 1 } else { queue.len() };
            queue.retire_batch(ctx, batch)?;
        }
        let (now, later) = fit_to_live(ctx, r);
        rest = later;
        let reg = register(ctx, now.clone())?;
        if !queue.put(crew, now, Pinned::Own(reg), &mut out)? {
            return Ok(()); // the caller stopped
        }
    }
    Ok(())
}

/// A window to stream now, and the rest of its claim to stream next.
type Cut = (Range<u64>, Option<Range<u64>>);

/// Cuts window `r` at the edges of a live registration of the same pages (a
/// caller's own [`PinnedRange`], say): answers the window to stream now and
/// the rest of `r`, if any, to stream next. A window then lies either wholly
/// inside it (and shares it, registering nothing) or wholly outside it (and
/// shares no page with it), never across its edge, which CUDA would refuse.
fn fit_to_live(ctx: &Ctx<'_>, r: Range<u64>) -> Cut {
    let page = page_size();
    let pages = align_down(r.start, page)..align_up(r.end, page);
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
fn register(ctx: &Ctx<'_>, r: Range<u64>) -> Result<PinnedRange> {
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
