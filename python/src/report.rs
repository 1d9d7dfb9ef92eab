//! `wirespeed.Report`: a transfer's report, its byte count at once and the
//! rest settled when first read (waiting, interruptibly, for the transfer).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use wirespeed_cuda::Device;
use wirespeed_cuda::locks::lock;

use crate::error::err;
use crate::handles::consumer;
use crate::inflight::{self, SLICE, Shared};
use crate::summary::Summary;

/// The report of a transfer: `bytes` at once; the rest once it has ended
/// (reading them waits for it, interruptibly).
#[pyclass(name = "Report", module = "wirespeed", frozen)]
pub(crate) struct PyReport {
    bytes: u64,
    /// The destination's device (for `_then_on`).
    device: Option<Device>,
    inner: ReportState,
}

enum ReportState {
    Done(Summary),
    Pending(Shared),
}

impl PyReport {
    /// The report of a transfer in flight to `device`.
    pub(crate) fn pending(bytes: u64, device: Device, transfer: Shared) -> PyReport {
        PyReport { bytes, device: Some(device), inner: ReportState::Pending(transfer) }
    }

    /// The report of a transfer that has ended.
    pub(crate) fn finished(device: Device, summary: Summary) -> PyReport {
        PyReport { bytes: summary.bytes, device: Some(device), inner: ReportState::Done(summary) }
    }

    /// Makes work enqueued on `stream` (`None`: the legacy default stream)
    /// from now on wait for the transfer's copies; waits (interruptibly) until
    /// they are all enqueued.
    pub(crate) fn then_on(&self, py: Python<'_>, stream: Option<usize>) -> PyResult<()> {
        let (ReportState::Pending(shared), Some(dev)) = (&self.inner, self.device) else { return Ok(()) };
        let then = consumer(stream.unwrap_or(0), dev)?;
        // Interruptibly: on KeyboardInterrupt the transfer goes on, its
        // destination kept alive (in `INFLIGHT`) until it has ended.
        let _waiting = inflight::Waiting::enter();
        loop {
            let ordered = py.detach(|| lock(shared).then_on(&then, SLICE));
            if ordered.map_err(err)? {
                return Ok(());
            }
            py.check_signals()?;
        }
    }

    /// The summary, once the transfer has ended (waiting, interruptibly).
    pub(crate) fn settled(&self, py: Python<'_>) -> PyResult<Summary> {
        match &self.inner {
            ReportState::Done(r) => Ok(r.clone()),
            ReportState::Pending(t) => {
                inflight::wait(py, t)?;
                match &lock(t).result {
                    Some(Ok(r)) => Ok(r.clone()),
                    Some(Err(e)) => Err(err(e)),
                    None => Err(err("the transfer's result is gone")),
                }
            }
        }
    }
}

#[pymethods]
impl PyReport {
    /// Makes work enqueued on the stream `stream` (a raw handle; `None`: the
    /// legacy default stream) from now on wait for the transfer's copies, on
    /// the device. Waits (interruptibly) until they are all enqueued.
    #[pyo3(signature = (stream = None))]
    fn _then_on(&self, py: Python<'_>, stream: Option<usize>) -> PyResult<()> {
        self.then_on(py, stream)
    }
    /// Bytes moved.
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes
    }
    /// True once the transfer has ended (never blocks).
    #[getter]
    fn done(&self) -> bool {
        match &self.inner {
            ReportState::Done(_) => true,
            ReportState::Pending(t) => t.try_lock().map(|mut g| g.poll(Duration::ZERO)).unwrap_or(false),
        }
    }
    /// Waits for the transfer; raises `wirespeed.Error` if it failed.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        self.settled(py).map(|_| ())
    }
    /// Wall seconds of the transfer (waits for it).
    #[getter]
    fn seconds(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.settled(py)?.seconds)
    }
    /// Decimal GB/s (waits for it).
    #[getter]
    fn gbps(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.settled(py)?.gbps())
    }
    /// Process CPU seconds per decimal GB (waits for it).
    #[getter]
    fn cpu_s_per_gb(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.settled(py)?.cpu_per_gb())
    }
    /// The strategy used, as text (waits for it).
    #[getter]
    fn strategy(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.settled(py)?.strategy)
    }
    /// `cudaHostRegister` calls the transfer made: 0 when it ran from what
    /// the streamer kept (waits for it).
    #[getter]
    fn registrations(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.settled(py)?.registrations)
    }
    /// True when the transfer ran in the same pass as the one queued before
    /// it (the batch iterator's spans do when the next is queued in time):
    /// no pause between them (waits for it).
    #[getter]
    fn chained(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.settled(py)?.chained)
    }
    /// Where the streamer's agents spent their time, to tell what bounded the
    /// transfer: a dict of `in_place_bytes` and `ring_bytes` (the range's
    /// bytes copied from registered file pages, and through the pinned ring),
    /// and seconds summed over the threads that spent them:
    /// `register_seconds`, `unregister_seconds`, `window_wait_seconds`,
    /// `fill_seconds`, `slot_wait_seconds`, `setup_seconds` (allocating the
    /// ring and making the registration context: a streamer's first transfer);
    /// `reserve_threads`, the ring threads auto kept in reserve that
    /// joined (the copy engine had room); `read_ahead_bytes`, ring bytes
    /// filled before their call came (read ahead after the piece before),
    /// and `read_ahead_dropped_bytes`, filled ahead for nothing;
    /// empty for a host array (waits for it).
    #[getter]
    fn breakdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(b) = self.settled(py)?.breakdown {
            d.set_item("in_place_bytes", b.in_place_bytes)?;
            d.set_item("ring_bytes", b.ring_bytes)?;
            d.set_item("register_seconds", b.register_seconds)?;
            d.set_item("unregister_seconds", b.unregister_seconds)?;
            d.set_item("window_wait_seconds", b.window_wait_seconds)?;
            d.set_item("fill_seconds", b.fill_seconds)?;
            d.set_item("slot_wait_seconds", b.slot_wait_seconds)?;
            d.set_item("setup_seconds", b.setup_seconds)?;
            d.set_item("reserve_threads", b.reserve_threads)?;
            d.set_item("read_ahead_bytes", b.read_ahead_bytes)?;
            d.set_item("read_ahead_dropped_bytes", b.read_ahead_dropped_bytes)?;
        }
        Ok(d)
    }
    /// The most bytes the streamer had pinned at once during the transfer,
    /// its kept ring and registrations included (waits for it).
    #[getter]
    fn peak_pinned(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.settled(py)?.peak_pinned)
    }
    fn __str__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.settled(py)?.text)
    }
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("<wirespeed.Report {}>", self.__str__(py)?))
    }
}
