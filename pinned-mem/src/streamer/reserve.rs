//! Reserve ring agents: threads of `Auto`'s hybrid that sleep beside the
//! ring and join it once the copy engine shows room.
//!
//! The hybrid is two halves that are both CPU work: one window thread
//! registering (the driver registers one call at a time for the whole
//! device, so a second registering thread goes no faster) and ring threads
//! filling slots with `memcpy`. Measured on an H200 host, across machine
//! starts, the pass ran at about the window thread's registering rate plus
//! the ring threads' filling rates, and how fast a start registers is what
//! varied most (21-28 GB/s in the hybrid): where it was slow the copy engine
//! had room (the ring's threads waited for free slots 1-8 % of their time,
//! against 13-15 % on starts that reached 0.90 of the line rate), and a fifth
//! ring thread lifted the rate: from 0.75-0.83 to 0.90-0.91 of the line rate
//! as a fixed fifth thread on such starts, and as this reserve, alternating
//! with auto without it in one call, from 0.71 to 0.76-0.77 (4 GiB file, 512
//! MiB budget) and from 0.77 to 0.86 (40 GiB, 4 GiB) at the same CPU per
//! byte.
//! Where the engine is already the bound, another ring thread only takes bytes
//! from the windows at a higher CPU cost per byte. So the reserve looks before
//! it joins: every [`LOOK`], the share of the ring threads' time spent waiting
//! for free slots over that span; below `StreamConfig::reserve_room` (0.10 by
//! default), the copy engine keeps up with them and has room for more, and
//! it joins.

use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use super::claims::Claims;
use super::ctx::Ctx;
use super::report::Breakdown;
use super::ring::{AgentLane, Fill, ring_agent};
use super::sink::Sink;
use crate::error::Result;
use crate::ring::PinnedRing;

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
pub(super) struct Running(AtomicUsize);

impl Running {
    /// Counts a ring agent in until the guard is dropped (also when the agent
    /// panics: its thread unwinds through the guard).
    pub(super) fn enter(&self) -> RunningGuard<'_> {
        self.0.fetch_add(1, Ordering::SeqCst);
        RunningGuard(self)
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// See [`Running::enter`].
pub(super) struct RunningGuard<'a>(&'a Running);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a reserve agent runs with once it joins: the ring's agents' own.
pub(super) struct Joining<'a> {
    pub(super) ring: &'a PinnedRing,
    pub(super) fill: Fill<'a>,
    pub(super) slot: u64,
    /// The ring threads of the plan (the ones the share is counted over).
    pub(super) threads: usize,
    /// `StreamConfig::reserve_room`.
    pub(super) room: f64,
    pub(super) lane: AgentLane<'a>,
}

/// Watches the pass and joins the ring once the copy engine shows room;
/// returns when the pass has nothing left for it (or failed).
pub(super) fn reserve_agent<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    running: &Running,
    j: Joining<'_>,
    sink: &RwLock<S>,
    tx: &SyncSender<S::Msg>,
) -> Result<()> {
    if !nap(ctx, running, WARM_UP) {
        return Ok(());
    }
    let mut before = (Instant::now(), ctx.stats.snapshot());
    loop {
        if !nap(ctx, running, LOOK) {
            return Ok(());
        }
        let now = (Instant::now(), ctx.stats.snapshot());
        let span = now.0.duration_since(before.0).as_secs_f64() * j.threads.max(1) as f64;
        if has_room(&now.1.since(&before.1), span, j.room) {
            break;
        }
        before = now;
    }
    ctx.stats.reserve_joined.fetch_add(1, Ordering::Relaxed);
    let _counted = running.enter();
    ring_agent(ctx, claims, j.ring, j.fill, j.slot, true, j.lane, sink, tx)
}

/// Whether the ring moved bytes over a span of `thread_seconds` (its length
/// times the ring's threads) while its threads waited for free slots less
/// than `room` of that time; a `room` of 1 or more always (as
/// `StreamConfig::reserve_room` documents: a wait is counted when it ends, so
/// one that began before the span can exceed it, and a slow copy engine can
/// leave a span without a filled slot).
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
