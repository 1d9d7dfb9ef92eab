//! The transfers `read_file` started, each kept with the Python object that
//! owns its destination until it has ended, so that nothing frees the
//! destination under a DMA, whatever the caller drops or interrupts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use wirespeed_cuda::locks::lock;
use wirespeed_pinned::{Report, Streamer, Transfer};

/// How long one wait lasts before signals are checked.
pub(crate) const SLICE: Duration = Duration::from_millis(20);

/// A transfer started by `read_file`, with what it needs kept alive.
pub(crate) struct Inflight {
    /// The transfer; `None` once its result was taken.
    pub(crate) transfer: Option<Transfer<'static>>,
    pub(crate) result: Option<Result<Report, String>>,
    /// The Python object owning the destination, released once the transfer
    /// has ended.
    keep: Option<Py<PyAny>>,
    /// The streamer `transfer` borrows: dropped after it (fields drop in
    /// order), and as soon as its result is taken, so that a `Report` the
    /// caller keeps does not keep the streamer (its pinned ring and
    /// registrations) alive after `release()`.
    streamer: Option<Arc<Streamer>>,
}

impl Inflight {
    /// Takes the result once the transfer has ended (waiting at most `slice`).
    pub(crate) fn poll(&mut self, slice: Duration) -> bool {
        if let Some(t) = &self.transfer {
            if !t.wait_timeout(slice) {
                return false;
            }
            if let Some(t) = self.transfer.take() {
                self.result = Some(t.wait().map_err(|e| e.to_string()));
            }
            // The transfer, which borrowed it, is gone.
            self.streamer = None;
        }
        true
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        // The destination's owner (`keep`) must outlive the copies.
        if let Some(t) = self.transfer.take() {
            let _ = t.wait();
        }
    }
}

/// A transfer in flight, shared by its report and [`INFLIGHT`].
pub(crate) type Shared = Arc<Mutex<Inflight>>;

/// Transfers that may not have ended, kept until they have.
static INFLIGHT: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

/// Keeps `transfer` (of `streamer`), and `keep`, the owner of its
/// destination, in [`INFLIGHT`] until it has ended.
///
/// # Safety
/// `transfer` borrows nothing but `streamer` and its destination, and the
/// destination stays valid while `keep` lives.
pub(crate) unsafe fn track(transfer: Transfer<'_>, keep: Py<PyAny>, streamer: Arc<Streamer>) -> Shared {
    // SAFETY: the transfer borrows the streamer, which `Inflight` keeps alive
    // (an `Arc`, dropped after the transfer), and a view of raw device
    // memory that `keep` keeps valid (the caller's promise), kept as long.
    let transfer: Transfer<'static> = unsafe { std::mem::transmute::<Transfer<'_>, Transfer<'static>>(transfer) };
    let shared: Shared = Arc::new(Mutex::new(Inflight {
        transfer: Some(transfer),
        result: None,
        keep: Some(keep),
        streamer: Some(streamer),
    }));
    lock(&INFLIGHT).push(shared.clone());
    shared
}

/// Forgets the transfers that have ended (releasing their destinations);
/// never waits.
#[pyfunction]
pub(crate) fn _reap() {
    reap();
}

/// Forgets the transfers that have ended (releasing their destinations).
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

/// Waits (interruptibly) until `t` has ended.
pub(crate) fn wait(py: Python<'_>, t: &Shared) -> PyResult<()> {
    while !py.detach(|| lock(t).poll(SLICE)) {
        py.check_signals()?;
    }
    Ok(())
}

/// Waits for every transfer in flight (run at exit, and by `release`).
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
