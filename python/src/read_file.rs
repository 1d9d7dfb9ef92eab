//! `read_file`: a file range into device memory given by pointer, as a
//! `Streamer` transfer ordered after the consumer's stream and before its
//! later work, with no host wait unless asked.

use std::path::PathBuf;

use pyo3::prelude::*;
use wirespeed_cuda::DeviceSliceMut;
use wirespeed_pinned::StartOptions;

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
}

impl FileRead<'_> {
    /// Starts the transfer (see `read_file`).
    pub(crate) fn start(self, py: Python<'_>) -> PyResult<PyReport> {
        reap();
        let strategy = parse_strategy(self.strategy)?;
        let (nbytes, length) = (self.nbytes, self.length);
        if nbytes as u64 != length {
            return Err(err(format!("the destination holds {nbytes} bytes, the range {length}")));
        }
        let end = self.offset.checked_add(length).ok_or_else(|| err("the range overflows"))?;
        let dev = device_of(self.ptr, self.device)?;
        let file = mapped(&self.path)?;
        let s = streamer(dev.ordinal(), self.budget, strategy)?;
        let after = self.stream.map(|h| consumer(h, dev)).transpose()?;
        // SAFETY: `ptr .. ptr + nbytes` is device memory of `dev` (checked here),
        // owned by `keep`, which is kept alive (in `INFLIGHT`) until the transfer
        // has been observed complete. The copies are ordered after the consumer's
        // stream as it is now, and the consumer's later work after them
        // (`then_on` below); the package documents that nothing else may touch
        // the memory meanwhile.
        let view = unsafe { DeviceSliceMut::<u8>::from_raw_parts(self.ptr as *mut u8, nbytes, dev) }.map_err(err)?;
        let options = match &after {
            Some(a) => StartOptions::new().after(a),
            None => StartOptions::new(),
        };
        let transfer = py.detach(|| s.start_with(&file, self.offset..end, view, options)).map_err(err)?;
        // SAFETY: the transfer borrows the streamer `s` and the view above,
        // whose memory `keep` owns (see above).
        let shared = unsafe { inflight::track(transfer, self.keep, s.clone()) };
        let report = PyReport::pending(length, dev, shared);
        if self.order {
            report.then_on(py, self.stream)?;
        }
        if self.sync {
            report.settled(py)?;
        }
        Ok(report)
    }
}

/// Moves file bytes `offset .. offset + length` of `path` to `nbytes` bytes
/// of device memory at `ptr` (owned by `keep`, kept alive until the copies
/// have ended). The copies run after the work on `stream` so far (`None`: no
/// ordering), and work enqueued on `stream` (`None`: the legacy default
/// stream) after this returns runs after them, unless `order` is false
/// (then `Report._then_on` does it later). With `sync`, returns once they
/// have ended.
#[pyfunction]
#[pyo3(signature = (path, offset, length, ptr, nbytes, device, stream, budget, strategy, keep, sync, order = true))]
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
) -> PyResult<PyReport> {
    FileRead { path, offset, length, ptr, nbytes, device, keep, budget, strategy, stream, order, sync }.start(py)
}
