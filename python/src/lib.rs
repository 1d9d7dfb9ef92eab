//! The native part of the Python package `wirespeed` (`wirespeed._native`).
//!
//! The package's Python layer (python/wirespeed/__init__.py) works out what
//! the user's objects are (a torch tensor, an object with
//! `__cuda_array_interface__`, an `np.memmap`, a path, a host buffer) and
//! calls the functions here with plain values: device pointers, byte counts,
//! stream handles, paths. This crate does the transfers through
//! `wirespeed-pinned` and `wirespeed-cuda`:
//!
//! * `read_file`: a file range into device memory given by pointer, as a
//!   `Streamer` transfer ordered after the consumer's stream and before its
//!   later work, with no host wait unless asked; the transfer and the Python
//!   object that owns the destination are kept in a module-wide list until
//!   the transfer has ended, so that nothing frees the destination under a
//!   DMA, whatever the caller drops or interrupts;
//! * `read_host`: host memory (any buffer) into device memory, through a
//!   pinned bounce buffer;
//! * [`Registration`]: a host buffer registered in place (`cudaHostRegister`);
//! * [`DeviceArray`]: device memory owned by the library, or a view of part
//!   of it, exposing `__cuda_array_interface__` (for callers without torch,
//!   `batches`' spans, and the tests);
//! * [`PyReport`]: a transfer's report, settled when first read;
//! * `pinned_bytes`: what the package holds pinned now;
//! * `_emulator_*`: the emulated runtime's counters, delay and injected
//!   faults, for the tests (builds with the feature `emulator`).
//!
//! Every wait releases the GIL and waits in slices of [`SLICE`], checking for
//! signals between them, so Ctrl-C interrupts it with `KeyboardInterrupt`.

// Everything here is private to the extension module (its API is Python's):
// these docs are for its readers, and link to private items.
#![allow(rustdoc::private_intra_doc_links)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Event, EventOptions, HostMemory, HostRegistration};
use wirespeed_cuda::{PinnedBuffer, RegisterFlags, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, Report, StartOptions, Strategy, StreamConfig, Streamer, Transfer};

pyo3::create_exception!(
    wirespeed,
    Error,
    PyRuntimeError,
    "An error of the CUDA runtime or of the library (bad range, budget exceeded, ...)."
);

/// The size of each of `read_host`'s two bounce buffers.
const CHUNK: usize = 16 << 20;

/// How long one wait lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(20);

/// The error as a Python `wirespeed.Error`.
fn err(e: impl std::fmt::Display) -> PyErr {
    Error::new_err(e.to_string())
}

use wirespeed_cuda::locks::lock;

// ------------------------------------------------------------------ runtime

/// Set once the emulated runtime was chosen: the runtime search is skipped.
static EMULATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Chooses the CUDA runtime before its first use: a `libcudart.so.13` or
/// `.so.12` the process has already loaded (PyTorch's, when torch was
/// imported first), else the first of `candidates` that exists (the Python
/// layer lists the copies next to torch and in the nvidia wheels), else the
/// loader's own search. Nothing is chosen when `CUDA_SYS_RUNTIME` is set, the
/// emulator is in use, or the runtime is already loaded. Answers the path set.
#[pyfunction]
fn _configure_runtime(candidates: Vec<String>) -> Option<String> {
    if EMULATED.load(std::sync::atomic::Ordering::Relaxed)
        || std::env::var_os(wirespeed_cuda_sys::RUNTIME_PATH_ENV).is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    let loaded = ["libcudart.so.13", "libcudart.so.12"].into_iter().find(|name| {
        let c = std::ffi::CString::new(*name).unwrap_or_default();
        // SAFETY: a valid C string; RTLD_NOLOAD only looks the library up
        // among those loaded (running no initializer), and the reference it
        // took is given back at once.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if h.is_null() {
                false
            } else {
                libc::dlclose(h);
                true
            }
        }
    });
    let chosen = match loaded {
        Some(name) => name.to_string(),
        None => candidates.into_iter().find(|c| std::path::Path::new(c).is_file())?,
    };
    // SAFETY: a CUDA runtime the process already loaded under this name, or a
    // libcudart shipped with torch or NVIDIA's runtime wheels.
    unsafe { wirespeed_cuda_sys::set_runtime_path(chosen.clone()) }.ok().map(|()| chosen)
}

/// The path of the CUDA runtime in use (loading it if needed).
#[pyfunction]
fn runtime_path() -> PyResult<String> {
    Ok(wirespeed_cuda_sys::runtime().map_err(err)?.path().to_string())
}

/// Makes the emulated CUDA runtime (a host-only stand-in, for tests without a
/// GPU) the one used; call it before anything else of the package.
#[pyfunction]
fn _use_emulator() -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::install().map_err(err)?;
        EMULATED.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    Err(err("this build of wirespeed has no emulator (build it with the cargo feature `emulator`)"))
}

/// The number of CUDA devices.
#[pyfunction]
fn device_count() -> PyResult<usize> {
    Device::count().map_err(err)
}

// ------------------------------------------------------------------ caches

/// The streamers, one per (device, budget, strategy), kept for the process
/// so that repeated calls reuse their pinned ring and registrations.
type StreamerKey = (usize, u64, Strategy);
static STREAMERS: Mutex<Option<HashMap<StreamerKey, Arc<Streamer>>>> = Mutex::new(None);

/// Files opened, by path, with what identified them when opened.
type FileKey = (u64, u64, u64, i64, i64);
type Files = HashMap<PathBuf, (FileKey, Arc<MappedFile>)>;
static FILES: Mutex<Option<Files>> = Mutex::new(None);

fn parse_strategy(s: &str) -> PyResult<Strategy> {
    const MIB: usize = 1 << 20;
    Ok(match s {
        "auto" => Strategy::Auto,
        "whole-file" | "whole" => Strategy::WholeFile,
        "windows" => Strategy::Windows { window: 64 * MIB, in_flight: 4 },
        "ring" => Strategy::Ring { slots: 8, slot: 4 * MIB, threads: 4 },
        "hybrid" => Strategy::Hybrid { window: 64 * MIB, slot: 4 * MIB, threads: 4 },
        "direct" => Strategy::Direct { slots: 8, slot: 4 * MIB, threads: 4 },
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown strategy {s:?}: use auto, whole-file, windows, ring, hybrid or direct"
            )));
        }
    })
}

fn streamer(device: usize, budget: u64, strategy: Strategy) -> PyResult<Arc<Streamer>> {
    let mut g = lock(&STREAMERS);
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(s) = map.get(&(device, budget, strategy)) {
        return Ok(s.clone());
    }
    let dev = Device::get(device).map_err(err)?;
    let s = Arc::new(Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(budget))).map_err(err)?);
    map.insert((device, budget, strategy), s.clone());
    Ok(s)
}

fn mapped(path: &PathBuf) -> PyResult<Arc<MappedFile>> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
    let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
    let mut g = lock(&FILES);
    let map = g.get_or_insert_with(HashMap::new);
    if let Some((k, f)) = map.get(path)
        && *k == key
    {
        return Ok(f.clone());
    }
    // SAFETY: the package documents that a file being read must not be
    // written or truncated meanwhile (the library's contract); a file that
    // changed since it was opened is opened anew.
    let f = unsafe { MappedFile::open(path) }.map_err(err)?;
    map.insert(path.clone(), (key, f.clone()));
    Ok(f)
}

/// Drops the cached streamers (their pinned ring and registrations), mapped
/// files and bounce buffers, after waiting for every transfer in flight.
#[pyfunction]
fn release(py: Python<'_>) -> PyResult<()> {
    drain(py)?;
    let streamers = lock(&STREAMERS).take();
    let files = lock(&FILES).take();
    let bounces = std::mem::take(&mut *lock(&BOUNCES));
    py.detach(move || {
        drop(streamers);
        drop(files);
        drop(bounces);
    });
    Ok(())
}

/// Host bytes the package holds pinned now: what the cached streamers pin
/// (drawn from their budgets: the ring, registered windows and kept file
/// registrations, those of transfers in flight included), `read_host`'s
/// bounce buffers, and the live `_Registration`s (rounded out to pages).
#[pyfunction]
fn pinned_bytes() -> u64 {
    let streamers: u64 = lock(&STREAMERS).as_ref().map_or(0, |m| m.values().map(|s| s.config().budget.used()).sum());
    let bounces: u64 = lock(&BOUNCES).values().map(|b| b.slots.iter().map(|s| s.len() as u64).sum::<u64>()).sum();
    streamers + bounces + REGISTERED.load(std::sync::atomic::Ordering::Relaxed)
}

// ------------------------------------------------------------------ transfers in flight

/// A transfer started by `read_file`, with what it needs kept alive.
struct Inflight {
    /// The transfer; `None` once its result was taken.
    transfer: Option<Transfer<'static>>,
    result: Option<Result<Report, String>>,
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
    fn poll(&mut self, slice: Duration) -> bool {
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

type Shared = Arc<Mutex<Inflight>>;

/// Transfers that may not have ended, kept until they have.
static INFLIGHT: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

/// Forgets the transfers that have ended (releasing their destinations);
/// never waits.
#[pyfunction]
fn _reap() {
    reap();
}

/// Forgets the transfers that have ended (releasing their destinations).
fn reap() {
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

/// Waits for every transfer in flight (run at exit, and by `release`).
#[pyfunction]
fn drain(py: Python<'_>) -> PyResult<()> {
    loop {
        let all: Vec<Shared> = lock(&INFLIGHT).clone();
        if all.is_empty() {
            return Ok(());
        }
        for t in all {
            while !py.detach(|| lock(&t).poll(SLICE)) {
                py.check_signals()?;
            }
        }
        reap();
    }
}

/// The report of a transfer: `bytes` at once; the rest once it has ended
/// (reading them waits for it, interruptibly).
#[pyclass(name = "Report", module = "wirespeed", frozen)]
struct PyReport {
    bytes: u64,
    /// The destination's device (for `_then_on`).
    device: Option<Device>,
    inner: ReportState,
}

enum ReportState {
    Done(Summary),
    Pending(Shared),
}

/// What a finished transfer reports to Python: the library's [`Report`], or
/// the host-array path's own figures.
#[derive(Clone)]
struct Summary {
    strategy: String,
    bytes: u64,
    seconds: f64,
    cpu_seconds: f64,
    /// `cudaHostRegister` calls the transfer made.
    registrations: u64,
    /// The most bytes pinned at once meanwhile.
    peak_pinned: u64,
    /// It ran in the pass of the transfer queued before it.
    chained: bool,
    /// Where the streamer's agents spent their time (none for the host-array path).
    breakdown: Option<wirespeed_pinned::Breakdown>,
    text: String,
}

impl Summary {
    fn gbps(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }

    fn cpu_per_gb(&self) -> f64 {
        if self.bytes > 0 { self.cpu_seconds / (self.bytes as f64 / 1e9) } else { 0.0 }
    }
}

impl From<&Report> for Summary {
    fn from(r: &Report) -> Summary {
        Summary {
            strategy: r.strategy.to_string(),
            bytes: r.bytes,
            seconds: r.seconds,
            cpu_seconds: r.cpu_seconds,
            registrations: r.registrations,
            peak_pinned: r.peak_pinned,
            chained: r.chained,
            breakdown: Some(r.breakdown),
            text: r.to_string(),
        }
    }
}

impl PyReport {
    fn then_on(&self, py: Python<'_>, stream: Option<usize>) -> PyResult<()> {
        let (ReportState::Pending(shared), Some(dev)) = (&self.inner, self.device) else { return Ok(()) };
        let then = consumer(stream.unwrap_or(0), dev)?;
        // Interruptibly: on KeyboardInterrupt the transfer goes on, its
        // destination kept alive (in `INFLIGHT`) until it has ended.
        loop {
            let ordered = py.detach(|| {
                let g = lock(shared);
                match &g.transfer {
                    Some(t) => t.then_on_timeout(&then, SLICE),
                    None => match &g.result {
                        Some(Err(e)) => Err(wirespeed_pinned::Error::TransferFailed { message: e.clone() }),
                        _ => Ok(true),
                    },
                }
            });
            if ordered.map_err(err)? {
                return Ok(());
            }
            py.check_signals()?;
        }
    }

    fn settled(&self, py: Python<'_>) -> PyResult<Summary> {
        match &self.inner {
            ReportState::Done(r) => Ok(r.clone()),
            ReportState::Pending(t) => {
                while !py.detach(|| lock(t).poll(SLICE)) {
                    py.check_signals()?;
                }
                match &lock(t).result {
                    Some(Ok(r)) => Ok(Summary::from(r)),
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
    /// and `reserve_threads`, the ring threads auto kept in reserve that
    /// joined (the copy engine had room);
    /// empty for a host array copied through bounce buffers (waits for it).
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

/// A stream of the consumer's, by raw handle (0: the legacy default stream).
fn consumer(handle: usize, device: Device) -> PyResult<Stream> {
    // SAFETY: the handle is the consumer's current stream (from torch or the
    // `__cuda_array_interface__`), live while the call uses it; not owned.
    unsafe { Stream::from_raw(handle as wirespeed_cuda_sys::cudaStream_t, device, false) }.map_err(err)
}

/// The device of `ptr` (which must be device memory).
fn device_of(ptr: usize, device: Option<usize>) -> PyResult<Device> {
    let ordinal = match device {
        Some(d) => d,
        None => {
            let kind = wirespeed_cuda::pointer_kind(ptr as *const std::ffi::c_void).map_err(err)?;
            kind.device_memory().ok_or_else(|| PyValueError::new_err(format!("{ptr:#x} is not CUDA device memory")))?
        }
    };
    Device::get(ordinal).map_err(err)
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
#[allow(clippy::too_many_arguments)]
fn read_file(
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
    reap();
    let strategy = parse_strategy(strategy)?;
    if nbytes as u64 != length {
        return Err(err(format!("the destination holds {nbytes} bytes, the range {length}")));
    }
    let end = offset.checked_add(length).ok_or_else(|| err("the range overflows"))?;
    let dev = device_of(ptr, device)?;
    let file = mapped(&path)?;
    let s = streamer(dev.ordinal(), budget, strategy)?;
    let after = stream.map(|h| consumer(h, dev)).transpose()?;
    // SAFETY: `ptr .. ptr + nbytes` is device memory of `dev` (checked here),
    // owned by `keep`, which is kept alive (in `INFLIGHT`) until the transfer
    // has been observed complete. The copies are ordered after the consumer's
    // stream as it is now, and the consumer's later work after them
    // (`then_on` below); the package documents that nothing else may touch
    // the memory meanwhile.
    let view = unsafe { DeviceSliceMut::<u8>::from_raw_parts(ptr as *mut u8, nbytes, dev) }.map_err(err)?;
    let options = match &after {
        Some(a) => StartOptions::new().after(a),
        None => StartOptions::new(),
    };
    let transfer = py.detach(|| s.start_with(&file, offset..end, view, options)).map_err(err)?;
    // SAFETY: the transfer borrows the streamer, which `Inflight` keeps alive
    // (an `Arc`, dropped after the transfer), and a view of raw device
    // memory whose lifetime is ours to choose (see above).
    let transfer: Transfer<'static> = unsafe { std::mem::transmute::<Transfer<'_>, Transfer<'static>>(transfer) };
    let shared: Shared =
        Arc::new(Mutex::new(Inflight { transfer: Some(transfer), result: None, keep: Some(keep), streamer: Some(s) }));
    lock(&INFLIGHT).push(shared.clone());
    let report = PyReport { bytes: length, device: Some(dev), inner: ReportState::Pending(shared) };
    if order {
        report.then_on(py, stream)?;
    }
    if sync {
        report.settled(py)?;
    }
    Ok(report)
}

/// Process CPU seconds so far.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Copies the host buffer `src` (any object with the buffer protocol, C
/// contiguous) to `nbytes` bytes of device memory at `ptr`, through the CPU
/// and two pinned bounce buffers of [`CHUNK`] bytes (kept per device for
/// later calls), ordered as `read_file`; returns once the copies have ended.
#[pyfunction]
#[pyo3(signature = (src, ptr, nbytes, device, stream))]
fn read_host(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    ptr: usize,
    nbytes: usize,
    device: Option<usize>,
    stream: Option<usize>,
) -> PyResult<PyReport> {
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
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut bounces = lock(&BOUNCES);
    let bounce = match bounces.entry(dev.ordinal()) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => e.insert(Bounce {
            stream: Stream::new(&dev).map_err(err)?,
            slots: [PinnedBuffer::<u8>::new(CHUNK).map_err(err)?, PinnedBuffer::<u8>::new(CHUNK).map_err(err)?],
        }),
    };
    let Bounce { stream: ours, slots } = bounce;
    if let Some(h) = stream {
        let ev = Event::new(&dev, EventOptions::default()).map_err(err)?;
        consumer(h, dev)?.record(&ev).map_err(err)?;
        ours.wait_event(&ev).map_err(err)?;
    }
    // SAFETY: as in `read_file`; here the copies are waited for before this
    // returns (the bounce buffers' drop waits for them), and `src` outlives it.
    let mut view = unsafe { DeviceSliceMut::<u8>::from_raw_parts(ptr as *mut u8, nbytes, dev) }.map_err(err)?;
    let chunk = CHUNK;
    let src_ptr = buf.buf_ptr() as usize;
    let mut off = 0;
    let mut i = 0;
    while off < nbytes {
        let n = chunk.min(nbytes - off);
        let slot = &mut slots[i % 2];
        py.detach(|| -> wirespeed_cuda::Result<()> {
            // SAFETY: `buf` holds the exporter's buffer (C-contiguous,
            // `nbytes` long) for the whole call; `off + n <= nbytes`.
            let from = unsafe { std::slice::from_raw_parts((src_ptr + off) as *const u8, n) };
            slot.as_mut_slice()?[..n].copy_from_slice(from);
            ours.copy_to_device(&slot.slice(..n)?, &mut view.slice_mut(off..off + n)?)?.detach();
            Ok(())
        })
        .map_err(err)?;
        py.check_signals()?;
        off += n;
        i += 1;
    }
    let done = Event::new(&dev, EventOptions::default()).map_err(err)?;
    ours.record(&done).map_err(err)?;
    then.wait_event(&done).map_err(err)?;
    // Waits for the last copies (the slots' next user would wait for them
    // anyway; this also makes the report's time the copies' time).
    py.detach(|| ours.synchronize()).map_err(err)?;
    drop(bounces);
    let (seconds, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    let strategy = "host array through two pinned bounce buffers".to_string();
    let text = format!(
        "{strategy}: {nbytes} bytes in {seconds:.3} s ({:.2} GB/s), {:.3} CPU s/GB",
        if seconds > 0.0 { nbytes as f64 / seconds / 1e9 } else { 0.0 },
        if nbytes > 0 { cpu / (nbytes as f64 / 1e9) } else { 0.0 }
    );
    let report = Summary {
        strategy,
        bytes: nbytes as u64,
        seconds,
        cpu_seconds: cpu,
        registrations: 0,
        peak_pinned: 2 * CHUNK as u64,
        chained: false,
        breakdown: None,
        text,
    };
    Ok(PyReport { bytes: nbytes as u64, device: Some(dev), inner: ReportState::Done(report) })
}

/// A stream and two pinned bounce buffers of `read_host`, per device.
struct Bounce {
    stream: Stream,
    slots: [PinnedBuffer<u8>; 2],
}

/// The bounce buffers, kept for the process (one user at a time).
static BOUNCES: Mutex<BTreeMap<usize, Bounce>> = Mutex::new(BTreeMap::new());

// ------------------------------------------------------------------ registration in place

/// A Python buffer, held (so its exporter keeps the memory) while registered.
struct PyMem {
    ptr: usize,
    len: usize,
    buf: PyBuffer<u8>,
}

// SAFETY: the held buffer export keeps the exporter's memory alive and in
// place (a bytearray cannot resize while exported; a numpy array keeps its
// data); the package documents that the memory must not be freed (a torch
// tensor resized, a memmap closed) nor written while registered.
unsafe impl HostMemory for PyMem {
    fn as_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A host buffer registered in place with CUDA (`cudaHostRegister`,
/// portable), until `close()`.
#[pyclass(name = "_Registration", module = "wirespeed")]
struct Registration {
    reg: Option<HostRegistration<PyMem>>,
    nbytes: usize,
    /// The pages registered (`nbytes` rounded out to pages), counted in
    /// [`REGISTERED`] while `reg` is there.
    pages: u64,
    read_only: bool,
}

/// Bytes of the live [`Registration`]s, rounded out to pages.
static REGISTERED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for Registration {
    /// A registration dropped without `close()` (its object collected) is
    /// unregistered by `reg`'s own drop, after its fence.
    fn drop(&mut self) {
        if self.reg.is_some() {
            REGISTERED.fetch_sub(self.pages, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[pymethods]
impl Registration {
    /// Registers the buffer of `obj` (C-contiguous, not empty); `read_only`
    /// for memory the device may only read (required for read-only mappings).
    #[new]
    fn new(py: Python<'_>, obj: &Bound<'_, PyAny>, read_only: bool) -> PyResult<Self> {
        let buf = PyBuffer::<u8>::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("the buffer is not C-contiguous"));
        }
        if buf.readonly() && !read_only {
            return Err(PyValueError::new_err("the buffer is read-only: register it with read_only=True"));
        }
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        if len == 0 {
            return Err(PyValueError::new_err("cannot register an empty buffer"));
        }
        let mem = PyMem { ptr, len, buf };
        let flags = RegisterFlags { portable: true, mapped: false, read_only };
        let reg = py.detach(|| HostRegistration::try_new(mem, flags));
        match reg {
            Ok(reg) => {
                // SAFETY: sysconf has no preconditions.
                let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
                let (start, end) = (ptr as u64, ptr as u64 + len as u64);
                let pages = end.div_ceil(page) * page - start / page * page;
                REGISTERED.fetch_add(pages, std::sync::atomic::Ordering::Relaxed);
                Ok(Registration { reg: Some(reg), nbytes: len, pages, read_only })
            }
            Err((e, mem)) => {
                drop(mem.buf);
                Err(err(e))
            }
        }
    }

    /// Bytes registered.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Registered read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }

    /// True until `close()`.
    #[getter]
    fn registered(&self) -> bool {
        self.reg.is_some()
    }

    /// Waits for all work on every device (copies of other libraries from
    /// the memory are not tracked), then unregisters and releases the buffer.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(reg) = self.reg.take() else { return Ok(()) };
        REGISTERED.fetch_sub(self.pages, std::sync::atomic::Ordering::Relaxed);
        let mem = py.detach(|| -> wirespeed_cuda::Result<PyMem> {
            for d in Device::all()? {
                d.synchronize()?;
            }
            reg.into_inner()
        });
        let mem = mem.map_err(err)?;
        drop(mem.buf);
        Ok(())
    }
}

// ------------------------------------------------------------------ device memory of the library

/// Device memory allocated by the library, or a part of it (`_view`),
/// exposing `__cuda_array_interface__` (version 3, no stream: work on it is
/// ordered through the legacy default stream). Views share the allocation,
/// which is freed when the last of them goes.
#[pyclass(name = "_DeviceArray", module = "wirespeed", frozen)]
struct DeviceArray {
    buf: Arc<DeviceBuffer<u8>>,
    /// Where this array starts in `buf`.
    offset: usize,
    typestr: String,
    shape: Vec<usize>,
}

/// The bytes of `typestr` x `shape`, checked against `nbytes`.
fn described_bytes(typestr: &str, shape: &[usize], nbytes: usize) -> PyResult<()> {
    let itemsize: usize = typestr.get(2..).and_then(|s| s.parse().ok()).unwrap_or(0);
    let n = shape.iter().try_fold(itemsize, |acc, &d| acc.checked_mul(d));
    if itemsize == 0 || n != Some(nbytes) {
        return Err(PyValueError::new_err(format!("{typestr:?} x {shape:?} is not {nbytes} bytes")));
    }
    Ok(())
}

#[pymethods]
impl DeviceArray {
    /// `nbytes` bytes (uninitialized) on `device`; `typestr` and `shape`
    /// (default: bytes) only describe them to consumers.
    #[new]
    #[pyo3(signature = (nbytes, device = 0, typestr = "|u1".to_string(), shape = None))]
    fn new(py: Python<'_>, nbytes: usize, device: usize, typestr: String, shape: Option<Vec<usize>>) -> PyResult<Self> {
        let shape = shape.unwrap_or_else(|| vec![nbytes]);
        described_bytes(&typestr, &shape, nbytes)?;
        let dev = Device::get(device).map_err(err)?;
        let buf = py.detach(|| DeviceBuffer::<u8>::new(&dev, nbytes.max(1))).map_err(err)?;
        Ok(DeviceArray { buf: Arc::new(buf), offset: 0, typestr, shape })
    }

    /// `nbytes` bytes of this array from byte `offset`, described as
    /// `typestr` x `shape` (default: bytes), sharing its memory.
    #[pyo3(signature = (offset, nbytes, typestr = "|u1".to_string(), shape = None))]
    fn _view(&self, offset: usize, nbytes: usize, typestr: String, shape: Option<Vec<usize>>) -> PyResult<Self> {
        let shape = shape.unwrap_or_else(|| vec![nbytes]);
        described_bytes(&typestr, &shape, nbytes)?;
        if offset.checked_add(nbytes).is_none_or(|end| end > self.nbytes()) {
            return Err(PyValueError::new_err(format!(
                "bytes {offset}..{offset}+{nbytes} are outside the array's {}",
                self.nbytes()
            )));
        }
        Ok(DeviceArray { buf: self.buf.clone(), offset: self.offset + offset, typestr, shape })
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.typestr.get(2..).and_then(|s| s.parse().ok()).unwrap_or(1)
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.buf.device().ordinal()
    }

    /// The device address.
    #[getter]
    fn ptr(&self) -> usize {
        self.buf.as_raw_ptr() as usize + self.offset
    }

    /// The CUDA array interface.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", &self.typestr)?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// The bytes, read back after all work on the device has ended.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (off, n) = (self.offset, self.nbytes());
        let v = py
            .detach(|| -> wirespeed_cuda::Result<Vec<u8>> {
                let dev = self.buf.device();
                dev.synchronize()?;
                if off == 0 && n == self.buf.len() {
                    return self.buf.to_vec();
                }
                if n == 0 {
                    return Ok(Vec::new());
                }
                // A part: through a pinned buffer of its size, not the whole allocation.
                let stream = Stream::new(&dev)?;
                let mut host = PinnedBuffer::<u8>::new(n)?;
                stream.copy_to_host(&self.buf.slice(off..off + n)?, &mut host)?.wait()?;
                Ok(host.as_slice()?.to_vec())
            })
            .map_err(err)?;
        Ok(PyBytes::new(py, &v))
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
}

// ------------------------------------------------------------------ the emulator's controls (tests)

/// The error of an emulator control in a build without the emulator.
#[cfg(not(feature = "emulator"))]
fn no_emulator() -> PyErr {
    err("this build of wirespeed has no emulator (build it with the cargo feature `emulator`)")
}

/// The emulated runtime's counters (live allocations, registrations,
/// streams, events, contexts; totals of operations and bytes copied), and
/// `calls`: the calls so far of each function named in `functions`.
#[pyfunction]
#[pyo3(signature = (functions = Vec::new()))]
fn _emulator_counters<'py>(py: Python<'py>, functions: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
    #[cfg(feature = "emulator")]
    {
        let ctl = wirespeed_cuda_sys::emulator::controls().map_err(err)?;
        let c = ctl.counters();
        let d = PyDict::new(py);
        d.set_item("device_allocs", c.device_allocs)?;
        d.set_item("device_bytes", c.device_bytes)?;
        d.set_item("pinned_allocs", c.pinned_allocs)?;
        d.set_item("pinned_bytes", c.pinned_bytes)?;
        d.set_item("registrations", c.registrations)?;
        d.set_item("registered_bytes", c.registered_bytes)?;
        d.set_item("streams", c.streams)?;
        d.set_item("events", c.events)?;
        d.set_item("ops_executed", c.ops_executed)?;
        d.set_item("bytes_copied", c.bytes_copied)?;
        d.set_item("contexts", c.contexts)?;
        d.set_item("unregister_violations", c.unregister_violations)?;
        let calls = PyDict::new(py);
        for f in functions {
            let n = ctl.call_count(&f).ok_or_else(|| PyValueError::new_err(format!("unknown function {f:?}")))?;
            calls.set_item(f, n)?;
        }
        d.set_item("calls", calls)?;
        Ok(d)
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = (py, functions);
        Err(no_emulator())
    }
}

/// Makes every stream operation enqueued from now on wait `us` microseconds
/// before it runs (emulator only): slow copies, for tests of ordering and
/// of interrupts.
#[pyfunction]
fn _emulator_set_delay_us(us: u32) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::controls().map_err(err)?.set_delay_us(us);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = us;
        Err(no_emulator())
    }
}

/// `True`: the emulated streams start no further operation until
/// `_emulator_hold(False)` or `_emulator_reset()` (emulator only): work that
/// provably does not finish, for tests of interrupts.
#[pyfunction]
fn _emulator_hold(on: bool) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::controls().map_err(err)?.hold(on);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = on;
        Err(no_emulator())
    }
}

/// Makes the `nth` call from now (1-based) of the runtime function
/// `function` fail with the CUDA error `error` (not 0); `sticky`: every
/// later call too, until `_emulator_reset()` (emulator only).
#[pyfunction]
#[pyo3(signature = (function, nth, error, sticky = false))]
fn _emulator_inject_fault(function: &str, nth: u32, error: u32, sticky: bool) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        if wirespeed_cuda_sys::emulator::controls().map_err(err)?.inject_fault(function, nth, error, sticky) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("cannot inject error {error} into {function:?}")))
        }
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = (function, nth, error, sticky);
        Err(no_emulator())
    }
}

/// Clears pending injected faults and sticky errors, and the delay (emulator only).
#[pyfunction]
fn _emulator_reset() -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        let ctl = wirespeed_cuda_sys::emulator::controls().map_err(err)?;
        ctl.reset();
        ctl.set_delay_us(0);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    Err(no_emulator())
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_class::<PyReport>()?;
    m.add_class::<Registration>()?;
    m.add_class::<DeviceArray>()?;
    m.add_function(wrap_pyfunction!(_configure_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_path, m)?)?;
    m.add_function(wrap_pyfunction!(_use_emulator, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(read_file, m)?)?;
    m.add_function(wrap_pyfunction!(read_host, m)?)?;
    m.add_function(wrap_pyfunction!(release, m)?)?;
    m.add_function(wrap_pyfunction!(drain, m)?)?;
    m.add_function(wrap_pyfunction!(_reap, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_emulator_counters, m)?)?;
    m.add_function(wrap_pyfunction!(_emulator_set_delay_us, m)?)?;
    m.add_function(wrap_pyfunction!(_emulator_hold, m)?)?;
    m.add_function(wrap_pyfunction!(_emulator_inject_fault, m)?)?;
    m.add_function(wrap_pyfunction!(_emulator_reset, m)?)?;
    Ok(())
}
