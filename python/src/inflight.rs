//! The transfers and copies the package started, each kept with the Python
//! object that owns its destination until it has ended, so that nothing
//! frees the destination under a DMA, whatever the caller drops or
//! interrupts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use wirespeed_cuda::Stream;
use wirespeed_cuda::locks::lock;
use wirespeed_pinned::{Streamer, Transfer};

use crate::summary::Summary;

/// How long one wait lasts before signals are checked.
pub(crate) const SLICE: Duration = Duration::from_millis(20);

/// Work in flight on the devices: a streamer's transfer (`read_file`), or
/// copies from host memory (`read_host`).
pub(crate) trait Work: Send {
    /// Waits at most `slice` for the work to end; its result once it has
    /// (after which it is not polled again).
    fn poll(&mut self, slice: Duration) -> Option<Result<Summary, String>>;

    /// Makes work enqueued on `stream` from now on wait for the work's
    /// copies, waiting at most `timeout` for them all to be enqueued; false
    /// when they were not by then.
    fn then_on(&self, stream: &Stream, timeout: Duration) -> Result<bool, String>;

    /// Blocks until the work has ended.
    fn finish(&mut self) {
        while self.poll(SLICE).is_none() {}
    }
}

/// A streamer's transfer, with the streamer it borrows: dropped after it
/// (fields drop in order).
struct StreamerWork {
    transfer: Option<Transfer<'static>>,
    _streamer: Arc<Streamer>,
}

impl Work for StreamerWork {
    fn poll(&mut self, slice: Duration) -> Option<Result<Summary, String>> {
        if !self.transfer.as_ref()?.wait_timeout(slice) {
            return None;
        }
        let t = self.transfer.take()?;
        Some(t.wait().map(|r| Summary::from(&r)).map_err(|e| e.to_string()))
    }

    fn then_on(&self, stream: &Stream, timeout: Duration) -> Result<bool, String> {
        match &self.transfer {
            Some(t) => t.then_on_timeout(stream, timeout).map_err(|e| e.to_string()),
            None => Ok(true),
        }
    }

    fn finish(&mut self) {
        if let Some(t) = self.transfer.take() {
            let _ = t.wait();
        }
    }
}

/// Work the package started, with what it needs kept alive.
pub(crate) struct Inflight {
    /// The work; `None` once its result was taken (dropping what it kept:
    /// a streamer's transfer no longer keeps the streamer, its pinned ring
    /// and registrations, alive after `release()`).
    work: Option<Box<dyn Work>>,
    pub(crate) result: Option<Result<Summary, String>>,
    /// The Python object owning the destination, released once the work
    /// has ended.
    keep: Option<Py<PyAny>>,
}

impl Inflight {
    /// Takes the result once the work has ended (waiting at most `slice`).
    pub(crate) fn poll(&mut self, slice: Duration) -> bool {
        if let Some(w) = &mut self.work {
            let Some(result) = w.poll(slice) else { return false };
            self.result = Some(result);
            self.work = None;
        }
        true
    }

    /// See [`Work::then_on`]; the error of the work once it has failed.
    pub(crate) fn then_on(&self, stream: &Stream, timeout: Duration) -> Result<bool, String> {
        match (&self.work, &self.result) {
            (Some(w), _) => w.then_on(stream, timeout),
            (None, Some(Err(e))) => Err(e.clone()),
            (None, _) => Ok(true),
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        // The destination's owner (`keep`) must outlive the copies.
        if let Some(w) = &mut self.work {
            w.finish();
        }
    }
}

/// Work in flight, shared by its report and [`INFLIGHT`].
pub(crate) type Shared = Arc<Mutex<Inflight>>;

/// Work that may not have ended, kept until it has.
static INFLIGHT: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

/// Keeps `transfer` (of `streamer`), and `keep`, the owner of its
/// destination, in [`INFLIGHT`] until it has ended.
///
/// # Safety
/// `transfer` borrows nothing but `streamer` and its destination, and the
/// destination stays valid while `keep` lives.
pub(crate) unsafe fn track(transfer: Transfer<'_>, keep: Py<PyAny>, streamer: Arc<Streamer>) -> Shared {
    // SAFETY: the transfer borrows the streamer, which `StreamerWork` keeps
    // alive (an `Arc`, dropped after the transfer), and a view of raw device
    // memory that `keep` keeps valid (the caller's promise), kept as long.
    let transfer: Transfer<'static> = unsafe { std::mem::transmute::<Transfer<'_>, Transfer<'static>>(transfer) };
    track_work(Box::new(StreamerWork { transfer: Some(transfer), _streamer: streamer }), keep)
}

/// Keeps `work`, and `keep`, the owner of its destination, in [`INFLIGHT`]
/// until it has ended.
pub(crate) fn track_work(work: Box<dyn Work>, keep: Py<PyAny>) -> Shared {
    let shared: Shared = Arc::new(Mutex::new(Inflight { work: Some(work), result: None, keep: Some(keep) }));
    lock(&INFLIGHT).push(shared.clone());
    shared
}

/// Forgets the work that has ended (releasing its destinations); never
/// waits.
#[pyfunction]
pub(crate) fn _reap() {
    reap();
}

/// Forgets the work that has ended (releasing its destinations).
pub(crate) fn reap() {
    let mut done = Vec::new();
    lock(&INFLIGHT).retain(|t| match t.try_lock() {
        Ok(mut g) => {
            if g.poll(Duration::ZERO) {
                done.push(g.keep.take());
                false
            } else {
                true
            }
        }
        Err(_) => true,
    });
}

/// Threads inside one of the package's interruptible waits now.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A thread inside an interruptible wait, counted in [`WAITING`] until
/// dropped.
pub(crate) struct Waiting(());

impl Waiting {
    /// Counts the calling thread in until the value is dropped.
    pub(crate) fn enter() -> Waiting {
        WAITING.fetch_add(1, Ordering::SeqCst);
        Waiting(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many threads are inside one of the package's interruptible waits
/// now (for the tests: a signal sent while one is provably waiting).
#[pyfunction]
pub(crate) fn _waits() -> usize {
    WAITING.load(Ordering::SeqCst)
}

/// Waits (interruptibly) until `t` has ended.
pub(crate) fn wait(py: Python<'_>, t: &Shared) -> PyResult<()> {
    let _waiting = Waiting::enter();
    while !py.detach(|| lock(t).poll(SLICE)) {
        py.check_signals()?;
    }
    Ok(())
}

/// Waits for all work in flight (run at exit, and by `release`).
#[pyfunction]
pub(crate) fn drain(py: Python<'_>) -> PyResult<()> {
    loop {
        let all: Vec<Shared> = lock(&INFLIGHT).clone();
        if all.is_empty() {
            return Ok(());
        }
        for t in all {
            wait(py, &t)?;
        }
        reap();
    }
}
