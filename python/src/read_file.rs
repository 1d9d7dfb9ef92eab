//! `read_file`: a file range into device memory given by pointer, as a
//! `Streamer` transfer ordered after the consumer's stream and before its
//! later work, with no host wait unless asked; `read_file_many`: many pieces
//! of one file started back to back (the caller orders its stream after
//! them once all are queued), so that the streamer chains them into one pass.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::{Device, DeviceSliceMut, Stream};
use wirespeed_pinned::{MappedFile, StartOptions, Streamer};

use crate::error::err;
use crate::handles::{consumer, device_of};
use crate::inflight::{self, reap};
use crate::report::PyReport;
use crate::streamers::{mapped, parse_strategy, streamer};

/// One `read_file` call: what to read, where to, with which streamer, and how
/// it is ordered with the caller's work.
pub(crate) struct FileRead<'a> {
    /// The file read.
    pub(crate) path: PathBuf,
    /// The range read: `offset .. offset + length`.
    pub(crate) offset: u64,
    pub(crate) length: u64,
    /// The destination: `nbytes` bytes of device memory at `ptr`, on
    /// `device` (`None`: the device the pointer belongs to), owned by `keep`.
    pub(crate) ptr: usize,
    pub(crate) nbytes: usize,
    pub(crate) device: Option<usize>,
    pub(crate) keep: Py<PyAny>,
    /// The streamer's pin budget and strategy (a name `parse_strategy` knows).
    pub(crate) budget: u64,
    pub(crate) strategy: &'a str,
    /// The consumer's stream (a raw handle): the copies run after its work so
    /// far (`None`: no ordering), and, with `order`, its later work after them
    /// (`None`: the legacy default stream's).
    pub(crate) stream: Option<usize>,
    pub(crate) order: bool,
    /// Return once the copies have ended.
    pub(crate) sync: bool,
    /// The streamer reads ahead for the next piece.
    pub(crate) ahead: bool,
}

impl FileRead<'_> {
    /// Starts the transfer (see `read_file`).
    pub(crate) fn start(self, py: Python<'_>) -> PyResult<PyReport> {
        reap();
        let (stream, order, sync) = (self.stream, self.order, self.sync);
        let file = mapped(&self.path)?;
        let (report, _) = self.ready()?.start(py, &file).map_err(err)?;
        if order {
            report.then_on(py, stream)?;
        }
        if sync {
            report.settled(py)?;
        }
        Ok(report)
    }

    /// Checks the read (its destination's size and device, the range, the
    /// consumer's stream) and makes its streamer and its destination's view.
    fn ready(self) -> PyResult<Ready> {
        let strategy = parse_strategy(self.strategy)?;
        let (nbytes, length) = (self.nbytes, self.length);
        if nbytes as u64 != length {
            return Err(err(format!("the destination holds {nbytes} bytes, the range {length}")));
        }
        let end = self.offset.checked_add(length).ok_or_else(|| err("the range overflows"))?;
        let dev = device_of(self.ptr, self.device)?;
        let streamer = streamer(dev.ordinal(), self.budget, strategy, self.ahead)?;
        let after = self.stream.map(|h| consumer(h, dev)).transpose()?;
        // SAFETY: `ptr .. ptr + nbytes` is device memory of `dev` (checked here),
        // owned by `keep`, which is kept alive (in `INFLIGHT`) until the transfer
        // has been observed complete (`Ready::start`). The copies are ordered
        // after the consumer's stream as it is now, and the consumer's later
        // work after them (`Report._then_on`); the package documents that
        // nothing else may touch the memory meanwhile.
        let view = unsafe { DeviceSliceMut::<u8>::from_raw_parts(self.ptr as *mut u8, nbytes, dev) }.map_err(err)?;
        Ok(Ready { range: self.offset..end, view, dev, streamer, after, keep: self.keep })
    }
}

/// A read checked, with its streamer and its destination's view: ready to
/// start.
struct Ready {
    range: Range<u64>,
    view: DeviceSliceMut<'static, u8>,
    dev: Device,
    streamer: Arc<Streamer>,
    /// The consumer's stream, which the copies follow (`None`: nothing).
    after: Option<Stream>,
    keep: Py<PyAny>,
}

impl Ready {
    /// Starts the transfer from `file`, tracked until it has ended; its
    /// report, pending, and the tracked transfer.
    fn start(self, py: Python<'_>, file: &Arc<MappedFile>) -> wirespeed_pinned::Result<(PyReport, inflight::Shared)> {
        let Ready { range, view, dev, streamer: s, after, keep } = self;
        let length = range.end - range.start;
        let options = match &after {
            Some(a) => StartOptions::new().after(a),
            None => StartOptions::new(),
        };
        let transfer = py.detach(|| s.start_with(file, range, view, options))?;
        // SAFETY: the transfer borrows the streamer `s` and the view, whose
        // memory `keep` owns (see `FileRead::ready`).
        let shared = unsafe { inflight::track(transfer, keep, s.clone()) };
        Ok((PyReport::pending(length, dev, shared.clone()), shared))
    }
}

/// Moves file bytes `offset .. offset + length` of `path` to `nbytes` bytes
/// of device memory at `ptr` (owned by `keep`, kept alive until the copies
/// have ended). The copies run after the work on `stream` so far (`None`: no
/// ordering), and work enqueued on `stream` (`None`: the legacy default
/// stream) after this returns runs after them, unless `order` is false
/// (then `Report._then_on` does it later). With `sync`, returns once they
/// have ended. With `ahead`, the kept streamer that reads ahead for the
/// next piece runs it (see `streamers::READ_AHEAD`).
#[pyfunction]
#[pyo3(signature = (path, offset, length, ptr, nbytes, device, stream, budget, strategy, keep, sync, order = true, ahead = true))]
// PyO3 gives each Python parameter a Rust parameter, and the Python signature
// is the package's: this only gathers them into a `FileRead`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_file(
    py: Python<'_>,
    path: PathBuf,
    offset: u64,
    length: u64,
    ptr: usize,
    nbytes: usize,
    device: Option<usize>,
    stream: Option<usize>,
    budget: u64,
    strategy: &str,
    keep: Py<PyAny>,
    sync: bool,
    order: bool,
    ahead: bool,
) -> PyResult<PyReport> {
    FileRead { path, offset, length, ptr, nbytes, device, keep, budget, strategy, stream, order, sync, ahead }.start(py)
}

/// One piece of `read_file_many`, as Python gives it: `(index, offset,
/// length, ptr, nbytes, device, stream, keep)`: the index the caller's
/// messages name it by, then each as `read_file` takes it.
type PieceArgs = (usize, u64, u64, usize, usize, Option<usize>, Option<usize>, Py<PyAny>);

/// Starts one transfer per piece of `path`, in the order given, each as
/// `read_file` with `order=False` and `sync=False` would, queued back to
/// back on the kept streamers (one per device) so that the worker runs them
/// as one pass where it can (pieces of one file that share no byte). Every
/// piece is checked (its destination's size, its range in the file, its
/// device and stream) before any is started: a bad piece starts nothing.
/// The caller then orders its streams after the copies (`Report._then_on`,
/// in the same order). If starting a piece fails, the pieces started before
/// it are waited for (interruptibly) and the error names the piece: nothing
/// of the call is left in flight. Errors name pieces by their `index`.
#[pyfunction]
pub(crate) fn read_file_many(
    py: Python<'_>,
    path: PathBuf,
    pieces: Vec<PieceArgs>,
    budget: u64,
    strategy: &str,
) -> PyResult<Vec<PyReport>> {
    reap();
    parse_strategy(strategy)?;
    let file = mapped(&path)?;
    let mut checked = Vec::with_capacity(pieces.len());
    for (i, offset, length, ptr, nbytes, device, stream, keep) in pieces {
        if nbytes as u64 != length {
            return Err(err(format!("piece {i}: the destination holds {nbytes} bytes, the range {length}")));
        }
        if offset.checked_add(length).is_none_or(|e| e > file.len()) {
            return Err(err(format!(
                "piece {i}: range {offset}..{} is outside the file's {} bytes",
                offset.saturating_add(length),
                file.len()
            )));
        }
        let read = FileRead {
            path: path.clone(),
            offset,
            length,
            ptr,
            nbytes,
            device,
            keep,
            budget,
            strategy,
            stream,
            order: false,
            sync: false,
            ahead: true,
        };
        checked.push((i, read.ready().map_err(|e| prefixed(py, i, e))?));
    }
    let mut reports = Vec::with_capacity(checked.len());
    let mut started = Vec::with_capacity(checked.len());
    for (index, ready) in checked {
        match ready.start(py, &file) {
            Ok((report, shared)) => {
                started.push(shared);
                reports.push(report);
            }
            Err(e) => {
                // Nothing of this call is left in flight: the pieces started
                // before this one end first (their destinations kept alive
                // until then, even if the wait is interrupted).
                for t in &started {
                    inflight::wait(py, t)?;
                }
                return Err(err(format!(
                    "piece {index}: {e} (the {} pieces queued before it were started and have ended)",
                    started.len()
                )));
            }
        }
    }
    Ok(reports)
}

/// `e`, its message prefixed with the piece it is about.
fn prefixed(py: Python<'_>, i: usize, e: PyErr) -> PyErr {
    let message = format!("piece {i}: {}", e.value(py));
    if e.is_instance_of::<PyValueError>(py) { PyValueError::new_err(message) } else { err(message) }
}
