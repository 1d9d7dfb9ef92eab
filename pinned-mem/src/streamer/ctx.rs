//! What the agents of one transfer share ([`Ctx`]: the first failure, the
//! abort flag, progress and its callback), the channel on which they send
//! messages to the calling thread, and the waits at the tail of a pass.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, Event, RegistrationContext, Stream};

use super::stats::PassStats;
use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinOptions;

thread_local! {
    /// The streamers whose progress callbacks this thread is inside, innermost
    /// last (a callback may run another streamer, whose callback runs here too).
    static IN_CALLBACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside a progress callback of the streamer `id`
/// ([`Ctx::streamer`]).
pub(super) fn inside_callback(id: usize) -> bool {
    IN_CALLBACK.with(|c| c.borrow().contains(&id))
}

/// What the agents of one transfer share.
pub(super) struct Ctx<'a> {
    pub(super) file: &'a Arc<MappedFile>,
    pub(super) streams: &'a [Stream],
    pub(super) opts: PinOptions,
    pub(super) portable: bool,
    pub(super) device0: Device,
    pub(super) budget: &'a PinBudget,
    pub(super) abort: AtomicBool,
    pub(super) error: Mutex<Option<Error>>,
    /// What the agents did so far: registrations, bytes, timed steps
    /// (shared with a chained pass's sink).
    pub(super) stats: Arc<PassStats>,
    pub(super) done: AtomicU64,
    pub(super) total: u64,
    pub(super) progress: Option<&'a (dyn Fn(u64, u64) + Send + Sync)>,
    pub(super) window_events: &'a Mutex<Vec<Vec<Event>>>,
    /// The identity of the streamer running the transfer (`Shared::id`).
    pub(super) streamer: usize,
    /// The second context sliding windows are registered in, if any.
    pub(super) window_ctx: Option<Arc<RegistrationContext>>,
    /// The sink's lanes are open: agents put through them (the window
    /// agent through lane 0), ring agents on streams of their own.
    pub(super) lanes: bool,
}

impl Ctx<'_> {
    /// Records the first error and tells every agent to stop.
    pub(super) fn fail(&self, e: Error) {
        lock(&self.error).get_or_insert(e);
        self.abort.store(true, Ordering::Release);
    }

    /// Records `r`'s error, if any, as [`Ctx::fail`] does.
    pub(super) fn outcome(&self, r: Result<()>) {
        if let Err(e) = r {
            self.fail(e);
        }
    }

    /// True once the transfer has failed: the agents stop claiming.
    pub(super) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Counts `bytes` as landed and calls the progress callback, on whichever
    /// thread landed them. A panic in the callback is this transfer's error
    /// ([`Error::WorkerPanicked`]); the callback calling back into this
    /// streamer gets [`Error::InvalidArgument`] (see `Shared::enter`).
    pub(super) fn progress(&self, bytes: u64) {
        if bytes == 0 || self.aborted() {
            return; // nothing landed, or the transfer has failed: no progress to tell
        }
        let done = self.done.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if let Some(p) = self.progress {
            IN_CALLBACK.with(|c| c.borrow_mut().push(self.streamer));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p(done.min(self.total), self.total)));
            IN_CALLBACK.with(|c| c.borrow_mut().pop());
            if let Err(panic) = r {
                self.fail(Error::WorkerPanicked { message: panic_message(panic.as_ref()) });
            }
        }
    }
}

/// The channel on which the agents send their messages to the calling thread.
pub(super) fn channel<M>(ctx: &Ctx<'_>) -> (SyncSender<M>, Receiver<M>) {
    sync_channel(2 * ctx.streams.len() + 2)
}

/// The text of a caught panic's payload.
pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// How long the tail of a pass polls its last event before sleeping on it: a
/// blocking-sync event wakes its waiter late, a fixed cost on every pass.
pub(super) const TAIL_SPIN: Duration = Duration::from_micros(300);

/// The last piece of a pass is polled for as long as it takes to copy at this
/// rate (a low one: a slower copy outlasts the polling and is slept on).
const TAIL_POLL_RATE: f64 = 20e9;
/// The longest the last piece is polled for.
const TAIL_SPIN_MAX: Duration = Duration::from_millis(10);

/// How long to poll for the last `bytes` of a pass: [`TAIL_SPIN`] plus their
/// copy time at [`TAIL_POLL_RATE`], at most [`TAIL_SPIN_MAX`]. Polling one
/// core for the last piece, once per pass, saves the pass the sleeping
/// wake-up's latency, a fixed cost that shows most on passes over a kept
/// registration.
pub(super) fn tail_spin(bytes: u64) -> Duration {
    let copy = Duration::from_secs_f64(bytes as f64 / TAIL_POLL_RATE);
    (TAIL_SPIN + copy).min(TAIL_SPIN_MAX)
}

/// Waits for `ev`, polling it for `spin` before sleeping on it. Used only for
/// the last waits of a pass, where nothing else hides the wake-up.
pub(super) fn wait_tail(ev: &Event, spin: Duration) -> wirespeed_cuda::Result<()> {
    let t = Instant::now();
    while t.elapsed() < spin {
        if ev.query()? {
            return ev.synchronize(); // at once; it also notes the streams' progress
        }
        std::hint::spin_loop();
    }
    ev.synchronize()
}
