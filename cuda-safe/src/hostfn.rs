//! Where the closures of [`Stream::launch_host_fn`](crate::Stream::launch_host_fn) run.
//!
//! CUDA runs a host function on one of its own threads, and forbids CUDA calls
//! there: a closure that drops the last owner of a buffer would wait (in the
//! buffer's `Drop`) for the stream from inside the stream's own callback, and
//! never return. So the callback only hands the closure to a library thread
//! (this module's pool) and waits until it is done: the stream's later work
//! still runs after the closure, as the docs promise.
//!
//! One exception keeps that deadlock-free. A closure that calls into this crate
//! (any CUDA call, or waiting for a fence's spin lock) may be about to wait for
//! work queued after it on its own stream, which waits for the closure: so the
//! closure first *releases* its stream (the callback returns, later work goes
//! on), and from then on runs alongside it. A closure that never touches CUDA
//! (the common case: signal a channel, bump a counter) keeps the stream held
//! until it returns.
//!
//! The pool starts a thread whenever no idle one is left (a released closure
//! may still run while the stream's next callback needs a thread), and an idle
//! thread exits after [`IDLE`].

use crate::locks::lock;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long an idle pool thread waits for work before it exits.
const IDLE: Duration = Duration::from_secs(10);

/// Opened when the closure returns or releases its stream; the CUDA callback
/// waits for it.
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *lock(&self.open) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = lock(&self.open);
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

thread_local! {
    /// The gate of the closure running on this pool thread, while it still
    /// holds its stream.
    static HELD: RefCell<Option<Arc<Gate>>> = const { RefCell::new(None) };
    /// Whether `HELD` may hold a gate: a plain flag (no destructor, so reading
    /// it is one load), which every CUDA call of the crate checks first.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// Lets the stream whose closure runs on this thread go on (see the module
/// docs). Called before every CUDA call of this crate; a no-op elsewhere, and
/// there one thread-local load.
#[inline]
pub(crate) fn release() {
    if HOLDING.get() {
        release_held();
    }
}

/// Locks `m`, also when a panic poisoned it ([`crate::locks::lock`]), after
/// [`release`]: whoever holds `m` may be waiting for the stream whose host
/// function runs on this thread.
pub(crate) fn release_and_lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    release();
    crate::locks::lock(m)
}

#[cold]
#[inline(never)]
fn release_held() {
    HOLDING.set(false);
    // `try_with`: also called from destructors during thread teardown.
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut()
            && let Some(gate) = h.take()
        {
            gate.open();
        }
    });
}

type Job = (Box<dyn FnOnce() + Send>, Arc<Gate>);

// The pool: plain statics (no lazy initialization), a queue and its condition
// variable.
static QUEUE: Mutex<VecDeque<Job>> = Mutex::new(VecDeque::new());
static QUEUED: Condvar = Condvar::new();
/// Idle pool threads that no job has claimed yet.
static UNCLAIMED: AtomicUsize = AtomicUsize::new(0);

fn lock_queue() -> MutexGuard<'static, VecDeque<Job>> {
    lock(&QUEUE)
}

fn worker() {
    let mut queue = lock_queue();
    loop {
        if let Some((f, gate)) = queue.pop_front() {
            drop(queue);
            HELD.with(|h| *h.borrow_mut() = Some(gate));
            HOLDING.set(true);
            // A panic must not end the thread (or reach the runtime).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            release();
            UNCLAIMED.fetch_add(1, Ordering::AcqRel);
            queue = lock_queue();
            continue;
        }
        let (q, waited) = QUEUED.wait_timeout(queue, IDLE).unwrap_or_else(PoisonError::into_inner);
        queue = q;
        // Exit only if no job claimed this thread meanwhile: claims and exits
        // take from the same count, so every claimed job keeps a thread for it.
        if waited.timed_out()
            && queue.is_empty()
            && UNCLAIMED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
        {
            return;
        }
    }
}

/// Runs `f` on a pool thread and returns once it returned or released its
/// stream. Called from the CUDA callback. If no thread can be started, runs
/// `f` here (as CUDA would).
pub(crate) fn run(f: Box<dyn FnOnce() + Send>) {
    let gate = Arc::new(Gate { open: Mutex::new(false), cv: Condvar::new() });
    let claimed = UNCLAIMED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
    if !claimed && std::thread::Builder::new().name("wirespeed-host-fn".into()).spawn(worker).is_err() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        return;
    }
    lock_queue().push_back((f, gate.clone()));
    QUEUED.notify_one();
    gate.wait();
}
