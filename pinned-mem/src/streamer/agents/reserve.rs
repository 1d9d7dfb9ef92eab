//! The reserve ring thread of `Auto`'s hybrid: it sleeps beside the ring and
//! joins it as one more ring agent once the copy engine shows room.
//!
//! The hybrid is two halves that are both CPU work: one window thread
//! registering (the driver registers one call at a time for the whole
//! device, so a second registering thread goes no faster) and ring threads
//! filling slots. The pass runs at about the window thread's registering
//! rate plus the ring threads' filling rates, and where registering is slow
//! the copy engine has room that one more ring thread fills, at the ring's
//! CPU cost per byte. Where the copy engine is already the bound, another
//! ring thread only takes bytes from the windows at a higher CPU cost per
//! byte. So the reserve looks before it joins: every [`LOOK`], the share of
//! the ring threads' time spent waiting for free slots over that span; below
//! [`Reserve::room`] (`StreamConfig::reserve_room`) the copy engine keeps up
//! with them and has room for more, and it joins.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::crew::Crew;
use super::ring::{RingAgent, ring_agent};
use crate::error::Result;
use crate::streamer::ctx::Ctx;
use crate::streamer::report::Breakdown;
use crate::streamer::sink::Sink;

/// The reserve of a pass: how many reserve threads run beside the ring's,
/// and the share of their time the ring's threads may have waited for free
/// slots for one to join ([`StreamConfig::reserve_threads`] and
/// [`StreamConfig::reserve_room`] for `Auto`'s hybrid; no thread otherwise).
///
/// [`StreamConfig::reserve_threads`]: crate::StreamConfig::reserve_threads
/// [`StreamConfig::reserve_room`]: crate::StreamConfig::reserve_room
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::streamer) struct Reserve {
    pub(in crate::streamer) threads: usize,
    pub(in crate::streamer) room: f64,
}

/// One reserve thread.
pub(in crate::streamer) struct ReserveAgent<'a> {
    /// The ring agent it runs as once it joins (claiming from the back).
    pub(in crate::streamer) ring: RingAgent<'a>,
    /// The ring threads of the plan, over which the share is counted.
    pub(in crate::streamer) planned: usize,
    /// The pass's [`Reserve`].
    pub(in crate::streamer) reserve: Reserve,
    /// The ring agents still running.
    pub(in crate::streamer) running: &'a Running,
}

/// How long the reserve waits before its first look: the ring's slots start
/// free, so its threads do not wait for any until they have gone round once.
const WARM_UP: Duration = Duration::from_millis(10);

/// The span each look measures.
const LOOK: Duration = Duration::from_millis(10);

/// How often the reserve checks, while it sleeps, whether the pass ended.
const NAP: Duration = Duration::from_millis(1);

/// The ring agents of a pass still running: the reserve stops watching once
/// none is (they stop when nothing is left to claim, or the pass failed).
#[derive(Default)]
pub(in crate::streamer) struct Running(AtomicUsize);

impl Running {
    /// Counts a ring agent in until the guard is dropped (also when the agent
    /// panics: its thread unwinds through the guard).
    pub(in crate::streamer) fn enter(&self) -> RunningGuard<'_> {
        self.0.fetch_add(1, Ordering::SeqCst);
        RunningGuard(self)
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// See [`Running::enter`].
pub(in crate::streamer) struct RunningGuard<'a>(&'a Running);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Watches the pass and joins the ring once the copy engine shows room;
/// returns when the pass has nothing left for it (or failed).
pub(in crate::streamer) fn reserve_agent<S: Sink>(crew: Crew<'_, S>, agent: ReserveAgent<'_>) -> Result<()> {
    let (ctx, running) = (crew.ctx, agent.running);
    // A room of 1 or more joins whatever a look would see: at once.
    let at_once = agent.reserve.room >= 1.0;
    if !at_once && !nap(ctx, running, WARM_UP) {
        return Ok(());
    }
    if !at_once && !watch(ctx, &agent) {
        return Ok(());
    }
    ctx.stats.reserve_joined.fetch_add(1, Ordering::Relaxed);
    let _counted = running.enter();
    ring_agent(crew, RingAgent { from_back: true, ..agent.ring })
}

/// Looks at the pass every [`LOOK`] until the copy engine shows room (true)
/// or the ring's agents have all stopped or the pass failed (false).
fn watch(ctx: &Ctx<'_>, agent: &ReserveAgent<'_>) -> bool {
    let mut before = (Instant::now(), ctx.stats.snapshot());
    loop {
        if !nap(ctx, agent.running, LOOK) {
            return false;
        }
        let now = (Instant::now(), ctx.stats.snapshot());
        let span = now.0.duration_since(before.0).as_secs_f64() * agent.planned.max(1) as f64;
        if has_room(&now.1.since(&before.1), span, agent.reserve.room) {
            return true;
        }
        before = now;
    }
}

/// Whether the ring moved bytes over a span of `thread_seconds` (its length
/// times the ring's threads) while its threads waited for free slots less
/// than `room` of that time; a `room` of 1 or more always (as
/// [`StreamConfig::reserve_room`](crate::StreamConfig::reserve_room)
/// documents: a wait is counted when it ends, so one that began before the
/// span can exceed it, and a slow copy engine can leave a span without a
/// filled slot).
fn has_room(d: &Breakdown, thread_seconds: f64, room: f64) -> bool {
    room >= 1.0 || (d.ring_bytes > 0 && d.slot_wait_seconds < room * thread_seconds)
}

/// Sleeps `span` in naps; false once the ring's agents have all stopped or
/// the pass failed.
fn nap(ctx: &Ctx<'_>, running: &Running, span: Duration) -> bool {
    let end = Instant::now() + span;
    loop {
        if ctx.aborted() || !running.any() {
            return false;
        }
        if Instant::now() >= end {
            return true;
        }
        std::thread::sleep(NAP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_a_share_of_the_ring_threads_time() {
        let mut d = Breakdown { ring_bytes: 4 << 20, ..Breakdown::default() };
        // 4 threads over 10 ms: 40 ms of thread time; 3 ms waiting is 7.5 %.
        d.slot_wait_seconds = 0.003;
        assert!(has_room(&d, 0.040, 0.10));
        d.slot_wait_seconds = 0.006; // 15 %: the copy engine is the bound
        assert!(!has_room(&d, 0.040, 0.10));
        assert!(has_room(&d, 0.040, 1.0), "1 joins at the first look");
        assert!(!has_room(&Breakdown { slot_wait_seconds: 0.0, ..d }, 0.040, 0.0), "0 never joins");
        assert!(!has_room(&Breakdown::default(), 0.040, 0.5), "a ring that moved nothing");
        // A wait that began before the span is counted whole when it ends.
        let long_wait = Breakdown { slot_wait_seconds: 0.050, ..d };
        assert!(!has_room(&long_wait, 0.010, 0.9));
        assert!(has_room(&long_wait, 0.010, 1.0), "1 joins whatever the span saw");
        assert!(has_room(&Breakdown::default(), 0.040, 1.0), "also where no slot was filled");
    }
}
