//! `read_host`: host memory (any buffer) into device memory, one of two
//! ways, ordered as `read_file` (after the consumer's stream so far, and
//! before its later work):
//!
//! * through the pinned ring ([`host_ring`]: `auto` and `ring`): several
//!   threads copy the source into the slots of a pinned ring kept per
//!   device, each slot's copy enqueued once it is full. The call returns
//!   once the source has been read (the copies may still be on their way;
//!   the report waits for them), so the caller may reuse the source at
//!   once, and a next call's pieces are filled while this one's are copied.
//!   It pins only the ring, whatever the source's size, and costs a CPU copy
//!   of every byte;
//! * registered in place (`whole-file`): the source's pages registered
//!   (`cudaHostRegister`, portable), copied from directly, and unregistered
//!   once the copy has completed; the call returns then. No CPU copy, but
//!   registering and unregistering take time per byte of their own, before
//!   and after the copy, one call at a time for the whole device, and the
//!   whole source is pinned meanwhile (within the budget). For a source
//!   registered once and read many times, `wirespeed.pinned` is the way.
//!
//! The ring is `auto`'s choice: its threads fill slots while earlier slots
//! are copied, so the CPU copy overlaps the DMA, where registering a source
//! for one copy runs before and after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::{Device, DeviceSliceMut, Event, EventOptions, Stream};
use wirespeed_pinned::Strategy;

use crate::error::err;
use crate::handles::{consumer, device_of};
use crate::host_ring;
use crate::inflight::{Work, reap, track_work};
use crate::registration::{Registered, pages_of};
use crate::report::PyReport;
use crate::streamers::parse_strategy;
use crate::summary::{Summary, host as summary};

/// Process CPU seconds so far.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// How a host source is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Through the pinned ring.
    Ring,
    /// Registered in place.
    InPlace,
}

/// The way a strategy name gives for a host source.
fn way(strategy: &str) -> PyResult<Way> {
    match parse_strategy(strategy)? {
        Strategy::Auto | Strategy::Ring { .. } => Ok(Way::Ring),
        Strategy::WholeFile => Ok(Way::InPlace),
        _ => Err(PyValueError::new_err(format!(
            "strategy {strategy:?} reads files only: a host source is copied with auto or ring (through the pinned \
             ring) or whole-file (registered in place)"
        ))),
    }
}

/// One `read_host` call, checked: the source, the destination and how the
/// copies are ordered.
struct HostRead {
    buf: PyBuffer<u8>,
    ptr: usize,
    nbytes: usize,
    dev: Device,
    /// The consumer's stream: the copies run after its work so far (when
    /// `after`), and its later work after them.
    then: Stream,
    after: bool,
    keep: Py<PyAny>,
    /// When the call began: (wall, process CPU seconds).
    t0: (Instant, f64),
}

impl HostRead {
    /// Makes `ours` wait for the consumer's work so far (when asked).
    fn order_after(&self, ours: &Stream) -> PyResult<()> {
        if self.after {
            let ev = Event::new(&self.dev, EventOptions::default()).map_err(err)?;
            self.then.record(&ev).map_err(err)?;
            ours.wait_event(&ev).map_err(err)?;
        }
        Ok(())
    }
}

/// Copies the host buffer `src` (any object with the buffer protocol, C
/// contiguous) to `nbytes` bytes of device memory at `ptr` (owned by `keep`,
/// kept alive until the copies have ended), through the pinned ring or
/// registered in place (`strategy`: `auto` and `ring`, or `whole-file`),
/// pinning at most `budget` bytes. Ordered as `read_file`. Returns once the
/// source has been read (registered in place: once the copy has ended), or,
/// with `sync`, once the copies have ended.
#[pyfunction]
#[pyo3(signature = (src, ptr, nbytes, device, stream, budget, strategy, keep, sync))]
// PyO3 gives each Python parameter a Rust parameter, and the Python signature
// is the package's: this only gathers them into a `HostRead`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_host(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    ptr: usize,
    nbytes: usize,
    device: Option<usize>,
    stream: Option<usize>,
    budget: u64,
    strategy: &str,
    keep: Py<PyAny>,
    sync: bool,
) -> PyResult<PyReport> {
    reap();
    let way = way(strategy)?;
    let buf = PyBuffer::<u8>::get(src)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("the source is not C-contiguous"));
    }
    let len = buf.len_bytes();
    if len != nbytes {
        return Err(err(format!("the destination holds {nbytes} bytes, the source {len}")));
    }
    let dev = device_of(ptr, device)?;
    let then = consumer(stream.unwrap_or(0), dev)?;
    let t0 = (Instant::now(), cpu_seconds());
    let read = HostRead { buf, ptr, nbytes, dev, then, after: stream.is_some(), keep, t0 };
    if nbytes == 0 {
        return Ok(PyReport::finished(dev, summary("nothing to copy".into(), 0, 0.0, 0.0, (0, 0))));
    }
    match way {
        Way::Ring => through_ring(py, read, budget, sync),
        Way::InPlace => in_place(py, read, budget),
    }
}

/// Makes now what a first `read_host` with (`device`, `budget`, `strategy`)
/// would make: the device's pinned ring and its threads (`auto` and `ring`;
/// `whole-file` registers each source per call, so there is nothing to make
/// ahead). With `threads`, the rings have that many threads from now on
/// (`None`: one per core, up to 12). Answers the bytes the ring pins (0 for
/// `whole-file`).
#[pyfunction]
#[pyo3(signature = (device, budget, strategy, threads=None))]
pub(crate) fn _prepare_host(
    py: Python<'_>,
    device: usize,
    budget: u64,
    strategy: &str,
    threads: Option<usize>,
) -> PyResult<u64> {
    let way = way(strategy)?;
    let dev = Device::get(device).map_err(err)?;
    host_ring::set_threads(threads).map_err(PyValueError::new_err)?;
    match way {
        Way::Ring => Ok(host_ring::ring(py, dev, budget)?.pinned_bytes()),
        Way::InPlace => Ok(0),
    }
}

/// The source through the device's pinned ring.
fn through_ring(py: Python<'_>, read: HostRead, budget: u64, sync: bool) -> PyResult<PyReport> {
    let ring = host_ring::ring(py, read.dev, budget)?;
    let ours = ring.stream();
    read.order_after(ours)?;
    let timing = EventOptions::new().timing(true);
    let (start, done) = (Event::new(&read.dev, timing).map_err(err)?, Event::new(&read.dev, timing).map_err(err)?);
    ours.record(&start).map_err(err)?;
    let lead = read.t0.0.elapsed().as_secs_f64();
    // SAFETY: `read.buf` holds the exporter's buffer (C-contiguous, `nbytes`
    // long) for this call; `ptr .. ptr + nbytes` is device memory of `dev`
    // (checked), owned by `keep`, which is kept alive (tracked below, also
    // when this fails) until the `done` event, recorded after every copy
    // enqueued, has completed; the package documents that nothing else may
    // touch the memory meanwhile.
    let copied = unsafe { ring.copy(py, read.buf.buf_ptr() as usize, read.ptr, read.nbytes) };
    if let Err(e) = ours.record(&done) {
        // Nothing to track the copies by: wait for them here.
        let _ = py.detach(|| ours.synchronize());
        return Err(err(e));
    }
    let s = ring.shape();
    let strategy =
        format!("host array through the pinned ring ({} x {} bytes, {} threads)", s.slots, s.slot, s.threads);
    let base = summary(strategy, read.nbytes, 0.0, cpu_seconds() - read.t0.1, (0, ring.pinned_bytes()));
    let ordered = read.then.wait_event(&done);
    let work = RingWork { start, done, lead, base, failed: copied.as_ref().err().map(|e| e.to_string()) };
    if Arc::strong_count(&ring) == 1 {
        // The ring was replaced meanwhile: its threads end without the GIL.
        py.detach(move || drop(ring));
    }
    let report = PyReport::pending(read.nbytes as u64, read.dev, track_work(Box::new(work), read.keep));
    copied?;
    ordered.map_err(err)?;
    if sync {
        report.settled(py)?;
    }
    Ok(report)
}

/// The source registered in place, copied, and unregistered once copied.
fn in_place(py: Python<'_>, read: HostRead, budget: u64) -> PyResult<PyReport> {
    let pages = pages_of(read.buf.buf_ptr() as usize, read.nbytes);
    if pages > budget {
        return Err(err(format!(
            "registering the source in place pins {pages} bytes (its pages), more than the budget of {budget}: \
             raise the budget, or copy it through the pinned ring (strategy=\"auto\")"
        )));
    }
    let ours = Stream::new(&read.dev).map_err(err)?;
    read.order_after(&ours)?;
    let read_only = read.buf.readonly();
    let reg = Registered::new(py, read.buf, read_only)?;
    // SAFETY: `ptr .. ptr + nbytes` is device memory of `dev` (checked),
    // owned by `keep`, kept alive (tracked below) until the copy has ended;
    // the package documents that nothing else may touch it meanwhile.
    let mut view =
        unsafe { DeviceSliceMut::<u8>::from_raw_parts(read.ptr as *mut u8, read.nbytes, read.dev) }.map_err(err)?;
    let done = Event::new(&read.dev, EventOptions::default()).map_err(err)?;
    let enqueued = py.detach(|| -> wirespeed_cuda::Result<()> {
        let src = reg.memory().ok_or_else(|| wirespeed_cuda::Error::InvalidArgument {
            call: "read_host",
            message: "the source was unregistered before its copy".into(),
        })?;
        // Recorded in the registration's fence: unregistering waits for it.
        ours.copy_to_device(src, &mut view)?.detach();
        ours.record(&done)?;
        read.then.wait_event(&done)
    });
    let base = summary("host array registered in place".into(), read.nbytes, 0.0, 0.0, (1, pages));
    let work = InPlaceWork { reg: Some(reg), done, _stream: ours, t0: read.t0, base, released: None };
    // Tracked even when enqueueing failed: the registration then goes once
    // whatever was enqueued has ended.
    let report = PyReport::pending(read.nbytes as u64, read.dev, track_work(Box::new(work), read.keep));
    enqueued.map_err(err)?;
    // The source is read until the copy ends: wait for it (interruptibly).
    report.settled(py)?;
    Ok(report)
}

/// Waits at most `slice` for `done` to complete: `Some(Ok)` once it has,
/// `Some(Err)` for the runtime's error.
fn event_done(done: &Event, slice: Duration) -> Option<Result<(), String>> {
    let end = Instant::now() + slice;
    loop {
        match done.query() {
            Ok(true) => return Some(done.synchronize().map_err(|e| e.to_string())),
            Ok(false) => {}
            Err(e) => return Some(Err(e.to_string())),
        }
        let now = Instant::now();
        if now >= end {
            return None;
        }
        std::thread::sleep((end - now).min(Duration::from_micros(200)));
    }
}

/// Copies through the ring, in flight: their report once `done` completed.
struct RingWork {
    /// Recorded on the ring's stream before the first copy and after the last.
    start: Event,
    done: Event,
    /// Wall seconds from the call's start to `start`'s record.
    lead: f64,
    base: Summary,
    /// Why filling the ring failed (the copies enqueued still ran).
    failed: Option<String>,
}

impl Work for RingWork {
    fn poll(&mut self, slice: Duration) -> Option<Result<Summary, String>> {
        event_done(&self.done, slice)?.err().map(Err).or_else(|| {
            if let Some(e) = self.failed.take() {
                return Some(Err(e));
            }
            let copies = self.done.elapsed_ms(&self.start).map_or(0.0, |ms| f64::from(ms) / 1e3);
            let b = &self.base;
            let seconds = self.lead + copies;
            Some(Ok(summary(b.strategy.clone(), b.bytes as usize, seconds, b.cpu_seconds, (0, b.peak_pinned))))
        })
    }

    fn then_on(&self, stream: &Stream, _: Duration) -> Result<bool, String> {
        stream.wait_event(&self.done).map(|()| true).map_err(|e| e.to_string())
    }
}

/// A copy from a source registered in place, in flight: unregistered once
/// `done` completed.
struct InPlaceWork {
    reg: Option<Registered>,
    done: Event,
    /// The stream of the copy (kept until it has ended).
    _stream: Stream,
    t0: (Instant, f64),
    base: Summary,
    /// The source's buffer once unregistered (released with the work).
    released: Option<PyBuffer<u8>>,
}

impl Work for InPlaceWork {
    fn poll(&mut self, slice: Duration) -> Option<Result<Summary, String>> {
        let copied = event_done(&self.done, slice)?;
        // Unregistering waits for every copy from the memory (its fence).
        let unregistered = self.reg.take().map(Registered::unregister).transpose();
        let (seconds, cpu) = (self.t0.0.elapsed().as_secs_f64(), cpu_seconds() - self.t0.1);
        let result = match (copied, unregistered) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(e.to_string()),
            (Ok(()), Ok(buf)) => {
                self.released = buf.flatten();
                let b = &self.base;
                Ok(summary(b.strategy.clone(), b.bytes as usize, seconds, cpu, (1, b.peak_pinned)))
            }
        };
        Some(result)
    }

    fn then_on(&self, stream: &Stream, _: Duration) -> Result<bool, String> {
        stream.wait_event(&self.done).map(|()| true).map_err(|e| e.to_string())
    }
}

/// Host bytes the rings pin now.
pub(crate) fn pinned_bytes() -> u64 {
    host_ring::pinned_bytes()
}

/// The rings, taken out (to be dropped without the GIL).
pub(crate) fn take() -> impl Send {
    host_ring::take()
}
