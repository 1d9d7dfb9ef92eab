//! Streams, events and pending operations.
//!
//! Every stream counts the operations it was given (`submitted`) and remembers
//! how far it is known to have finished (`completed`): an operation is named
//! by its stream and number (a [`Use`]). The fences of the buffers
//! ([`crate::fence`]) record such uses, and wait for or order after them
//! through the methods here.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::raw::{self, Queue};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wirespeed_cuda_sys::{Api, cudaEvent_t, cudaStream_t};

use crate::hostfn::release_and_lock as lock;

// The fields a copy reads come first, and the whole fits one cache line
// (64-byte aligned: a copy touches one line of it, after the driver's call
// may have evicted it).
#[repr(C, align(64))]
pub(crate) struct StreamInner {
    raw: cudaStream_t,
    /// The runtime's function table, fetched once for the per-copy path.
    api: &'static Api,
    /// Operations enqueued so far; an operation's number is the value after it.
    submitted: AtomicU64,
    device: Device,
    owned: bool,
    /// Every operation numbered up to this is known to have finished.
    completed: AtomicU64,
    /// An event re-recorded whenever another stream must wait for this one.
    cross: Mutex<Option<cudaEvent_t>>,
}

const _: () = assert!(std::mem::size_of::<StreamInner>() == 64, "StreamInner should fill one cache line");

// SAFETY: CUDA stream and event handles may be used from any host thread; the
// mutable state is atomics and a mutex.
unsafe impl Send for StreamInner {}
// SAFETY: as above.
unsafe impl Sync for StreamInner {}

impl StreamInner {
    #[inline]
    pub(crate) fn is_done(&self, seq: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= seq
    }

    /// Makes the stream's device current on the calling thread.
    #[inline]
    pub(crate) fn ensure_current(&self) -> Result<()> {
        self.device.ensure_current()
    }

    /// Blocks until operation `seq` has finished.
    pub(crate) fn wait_for(&self, seq: u64) -> Result<()> {
        if self.is_done(seq) {
            return Ok(());
        }
        let target = self.submitted.load(Ordering::Acquire);
        self.device.ensure_current()?;
        // SAFETY: `raw` is live while `self` is.
        unsafe { raw::stream_synchronize(self.raw) }?;
        self.completed.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// Makes later work on `self` wait for operation `seq` of `other`.
    /// Rare (buffers shared between streams), so out of the per-copy path.
    #[cold]
    #[inline(never)]
    pub(crate) fn order_after(&self, other: &StreamInner, seq: u64) -> Result<()> {
        if std::ptr::eq(self, other) || other.is_done(seq) {
            return Ok(()); // a stream runs its work in order
        }
        let mut cross = lock(&other.cross);
        other.device.ensure_current()?;
        let ev = match *cross {
            Some(e) => e,
            None => {
                let e = raw::event_create(wirespeed_cuda_sys::cudaEventDisableTiming)?;
                *cross = Some(e);
                e
            }
        };
        // SAFETY: `ev` and both streams are live; `ev` belongs to other's device.
        unsafe { raw::event_record(ev, other.raw) }?;
        self.device.ensure_current()?;
        // SAFETY: as above; CUDA allows waiting on an event of another device.
        unsafe { raw::stream_wait_event(self.raw, ev) }
    }

    /// Runs `enqueue` (one CUDA call on this stream; its device is current) and numbers it.
    ///
    /// The number is taken after the call, so every operation numbered up to a
    /// value read from `submitted` was enqueued before that read. (Two threads
    /// may number their operations in the other order than CUDA queued them;
    /// nothing relies on the order, only on that rule.)
    #[inline]
    pub(crate) fn submit(&self, enqueue: impl FnOnce(Queue) -> Result<()>) -> Result<u64> {
        enqueue(Queue { api: self.api, stream: self.raw })?;
        Ok(self.submitted.fetch_add(1, Ordering::AcqRel) + 1)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let _ = self.device.ensure_current();
        if let Some(e) = lock(&self.cross).take() {
            // SAFETY: the event is ours and no longer used.
            let _ = unsafe { raw::event_destroy(e) };
        }
        if self.owned {
            // SAFETY: the stream is ours; nothing refers to it any more (fences
            // hold this Arc). CUDA finishes queued work before releasing it.
            let _ = unsafe { raw::stream_destroy(self.raw) };
        }
    }
}

/// One use of a buffer by a stream: operation `seq` of `stream`.
#[derive(Clone)]
pub(crate) struct Use {
    pub(crate) stream: Arc<StreamInner>,
    pub(crate) seq: u64,
}

/// Options for [`Stream::with_options`]: blocking, priority 0 by default.
///
/// The struct may gain fields in a minor release, so outside this crate it is
/// built from `Default` (or `new`) and the builder methods, not with a struct
/// literal; its fields stay public for reading.
///
/// ```
/// use wirespeed_cuda::StreamOptions;
/// let o = StreamOptions::new().non_blocking(true).priority(-1);
/// assert!(o.non_blocking);
/// assert_eq!(o.priority, -1);
/// assert_eq!(StreamOptions::new(), StreamOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StreamOptions {
    /// A non-blocking stream does not synchronize with the legacy default stream
    /// (recommended: the default for [`Stream::new`]).
    pub non_blocking: bool,
    /// Priority; lower numbers are higher priority. See [`Device::stream_priority_range`].
    pub priority: i32,
}

impl StreamOptions {
    /// The default options: a blocking stream of priority 0.
    pub const fn new() -> StreamOptions {
        StreamOptions { non_blocking: false, priority: 0 }
    }

    /// With [`StreamOptions::non_blocking`](StreamOptions#structfield.non_blocking) set to `on`.
    pub const fn non_blocking(mut self, on: bool) -> Self {
        self.non_blocking = on;
        self
    }

    /// With [`StreamOptions::priority`](StreamOptions#structfield.priority) set to `priority`.
    pub const fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

/// A CUDA stream: work given to it runs in order, asynchronously to the host.
///
/// Cloning gives another handle to the same stream. A `Stream` may be sent to
/// and shared between threads; it makes its device current for every call.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
/// let dev = Device::get(0)?;
/// let stream = Stream::new(&dev)?;
/// let mut host = PinnedBuffer::<f32>::new(1 << 20)?;
/// host.as_mut_slice()?.fill(1.5);
/// let mut on_gpu = DeviceBuffer::<f32>::new(&dev, 1 << 20)?;
/// let copy = stream.copy_to_device(&host, &mut on_gpu)?; // asynchronous
/// copy.wait()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("raw", &self.inner.raw).field("device", &self.inner.device).finish()
    }
}

impl Stream {
    /// A new non-blocking stream on `device` with default priority.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn new(device: &Device) -> Result<Stream> {
        Stream::with_options(device, StreamOptions { non_blocking: true, priority: 0 })
    }

    /// A new stream with explicit options.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn with_options(device: &Device, options: StreamOptions) -> Result<Stream> {
        device.ensure_current()?;
        let flags = if options.non_blocking {
            wirespeed_cuda_sys::cudaStreamNonBlocking
        } else {
            wirespeed_cuda_sys::cudaStreamDefault
        };
        let api = raw::api()?;
        let raw = raw::stream_create(flags, options.priority)?;
        Ok(Stream::wrap(raw, api, *device, true))
    }

    /// The state the fences record uses of ([`crate::fence`]).
    #[inline]
    pub(crate) fn inner(&self) -> &Arc<StreamInner> {
        &self.inner
    }

    fn wrap(raw: cudaStream_t, api: &'static Api, device: Device, owned: bool) -> Stream {
        Stream {
            inner: Arc::new(StreamInner {
                raw,
                api,
                device,
                owned,
                submitted: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                cross: Mutex::new(None),
            }),
        }
    }

    /// Wraps a stream made elsewhere (another crate, or the legacy stream as
    /// null). With `owned`, it is destroyed when the last handle goes.
    ///
    /// # Safety
    /// `raw` is a live stream of `device` (or null) and stays live while this
    /// value or a buffer used on it exists; with `owned`, nothing else destroys it.
    ///
    /// # Errors
    /// [`Error::Load`] when this crate cannot load the runtime (it makes its
    /// calls through [`wirespeed_cuda_sys::runtime`], whoever made the stream).
    pub unsafe fn from_raw(raw: cudaStream_t, device: Device, owned: bool) -> Result<Stream> {
        Ok(Stream::wrap(raw, raw::api()?, device, owned))
    }

    /// The raw handle, for calls this crate does not wrap. Work enqueued through
    /// it is not tracked by the fences of this crate's buffers.
    pub fn as_raw(&self) -> cudaStream_t {
        self.inner.raw
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Blocks until all work given so far has finished.
    ///
    /// # Errors
    /// The runtime's error, including errors of earlier asynchronous work.
    pub fn synchronize(&self) -> Result<()> {
        let target = self.inner.submitted.load(Ordering::Acquire);
        self.inner.device.ensure_current()?;
        // SAFETY: the stream is live while `self` is.
        unsafe { raw::stream_synchronize(self.inner.raw) }?;
        self.inner.completed.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// True when all work given so far has finished.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn query(&self) -> Result<bool> {
        let target = self.inner.submitted.load(Ordering::Acquire);
        // SAFETY: the stream is live while `self` is.
        let idle = unsafe { raw::stream_query(self.inner.raw) }?;
        if idle {
            self.inner.completed.fetch_max(target, Ordering::AcqRel);
        }
        Ok(idle)
    }

    /// Makes later work on this stream wait for the latest record of `event`.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.inner.device.ensure_current()?;
        // SAFETY: both handles are live while borrowed.
        unsafe { raw::stream_wait_event(self.inner.raw, event.raw) }
    }

    /// Records `event` here: it completes when the work given so far has.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an event of another device; the runtime's error.
    pub fn record(&self, event: &Event) -> Result<()> {
        if event.device != self.inner.device {
            return Err(Error::invalid("Stream::record", "the event belongs to another device"));
        }
        self.inner.device.ensure_current()?;
        // Held across the record, so that what it notes is the record CUDA
        // has as the latest (two threads recording one event could otherwise
        // note them in the other order); a new generation tells a waiting
        // `synchronize` that the record it waits for may not be the one it saw.
        let mut rec = lock(&event.recorded);
        rec.generation += 1;
        rec.last = None;
        // Every operation numbered up to `before` was enqueued before the
        // record (see `submit`), so the event completing proves them done. The
        // record's own number could not prove that: another thread may number
        // its operation first and enqueue it after the record.
        let before = self.inner.submitted.load(Ordering::Acquire);
        // SAFETY: both handles are live and of the same device.
        unsafe { raw::event_record(event.raw, self.inner.raw) }?;
        rec.last = Some(Use { stream: self.inner.clone(), seq: before });
        Ok(())
    }

    /// Runs `f` once the work given so far has finished, in stream order: the
    /// stream's later work waits until `f` returns. If the context is lost
    /// before it runs, `f` is leaked, not run.
    ///
    /// `f` runs on a library thread, not on the runtime's callback thread
    /// (where CUDA calls are forbidden), so it may use this crate, e.g. drop
    /// the last owner of a buffer that later work on this very stream uses.
    /// Its first CUDA call (any call of this crate) then *releases* the
    /// stream: the later work goes on without waiting for the rest of `f`,
    /// since `f` may be about to wait for that work (holding the stream back
    /// meanwhile would deadlock). A panic in `f` is caught and ends only `f`.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let stream = wirespeed_cuda::Stream::new(&wirespeed_cuda::Device::get(0)?)?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// stream.launch_host_fn(move || { let _ = tx.send("done"); })?;
    /// assert_eq!(rx.recv().unwrap(), "done");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The runtime's error; `f` is then dropped without running.
    pub fn launch_host_fn<F: FnOnce() + Send + 'static>(&self, f: F) -> Result<()> {
        unsafe extern "C" fn trampoline<F: FnOnce() + Send + 'static>(data: *mut c_void) {
            // SAFETY: `data` is the `Box<F>` leaked below, handed over exactly once.
            let f = unsafe { Box::from_raw(data.cast::<F>()) };
            // On a library thread; returns once `f` returned or released the
            // stream. A panic must not unwind into the runtime's C thread.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crate::hostfn::run(f)));
        }
        self.inner.device.ensure_current()?;
        let data = Box::into_raw(Box::new(f)).cast::<c_void>();
        let res = self.inner.submit(|q| {
            // SAFETY: the trampoline takes back the box once; F is Send + 'static.
            unsafe { raw::launch_host_func(q.stream, trampoline::<F>, data) }
        });
        if res.is_err() {
            // SAFETY: the runtime refused the call, so it never took `data`.
            drop(unsafe { Box::from_raw(data.cast::<F>()) });
        }
        res.map(|_| ())
    }
}

/// An operation given to a stream: [`Pending::wait`] blocks until it finished.
///
/// It borrows the buffers the operation uses, and the stream, for `'a`, so the
/// compiler rejects touching the buffers from the host meanwhile. Dropping or
/// leaking it does *not* wait and is always sound: each buffer's fence still
/// makes host access and `Drop` wait for the operation, and orders other
/// streams after it.
#[must_use = "an operation runs asynchronously: wait() for it, or drop it to keep the buffers fenced"]
pub struct Pending<'a> {
    stream: &'a StreamInner,
    seq: u64,
    _borrows: PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("seq", &self.seq).finish()
    }
}

impl<'a> Pending<'a> {
    /// Operation `seq` of `stream`, borrowing what it uses for `'a`.
    #[inline]
    pub(crate) fn new(stream: &'a StreamInner, seq: u64) -> Self {
        Pending { stream, seq, _borrows: PhantomData }
    }

    /// Blocks until the operation (and all earlier work of its stream) finished.
    ///
    /// # Errors
    /// The runtime's error, e.g. from earlier asynchronous work.
    pub fn wait(self) -> Result<()> {
        self.stream.wait_for(self.seq)
    }

    /// True when the operation is known to have finished (asks the stream when
    /// not yet known).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn is_complete(&self) -> Result<bool> {
        if self.stream.is_done(self.seq) {
            return Ok(true);
        }
        let target = self.stream.submitted.load(Ordering::Acquire);
        // SAFETY: the stream is live while it is borrowed.
        let idle = unsafe { raw::stream_query(self.stream.raw) }?;
        if idle {
            self.stream.completed.fetch_max(target, Ordering::AcqRel);
        }
        Ok(idle)
    }

    /// Ends the borrow without waiting, to give the same buffers more work in
    /// stream order. The fences still guard them.
    pub fn detach(self) {}
}

/// Options for [`Event::new`]: no timing, spinning waits by default.
///
/// The struct may gain fields in a minor release, so outside this crate it is
/// built from `Default` (or `new`) and the builder methods, not with a struct
/// literal; its fields stay public for reading.
///
/// ```
/// use wirespeed_cuda::EventOptions;
/// let o = EventOptions::new().timing(true).blocking_sync(true);
/// assert!(o.timing && o.blocking_sync);
/// assert_eq!(EventOptions::new(), EventOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EventOptions {
    /// Measure time ([`Event::elapsed_ms`]); off makes record and wait cheaper.
    pub timing: bool,
    /// `synchronize` sleeps instead of spinning.
    pub blocking_sync: bool,
}

impl EventOptions {
    /// The default options: no timing, `synchronize` spins.
    pub const fn new() -> EventOptions {
        EventOptions { timing: false, blocking_sync: false }
    }

    /// With [`EventOptions::timing`](EventOptions#structfield.timing) set to `on`.
    pub const fn timing(mut self, on: bool) -> Self {
        self.timing = on;
        self
    }

    /// With [`EventOptions::blocking_sync`](EventOptions#structfield.blocking_sync) set to `on`.
    pub const fn blocking_sync(mut self, on: bool) -> Self {
        self.blocking_sync = on;
        self
    }
}

/// A CUDA event: a point in a stream's work that the host or other streams can wait for.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, Event, EventOptions, Stream};
/// let dev = Device::get(0)?;
/// let s = Stream::new(&dev)?;
/// let (a, b) = (Event::new(&dev, EventOptions::new().timing(true))?, Event::new(&dev, EventOptions::new().timing(true))?);
/// s.record(&a)?;
/// // ... work ...
/// s.record(&b)?;
/// b.synchronize()?;
/// println!("{} ms", b.elapsed_ms(&a)?);
/// # Ok(()) }
/// ```
pub struct Event {
    raw: cudaEvent_t,
    device: Device,
    recorded: Mutex<Recorded>,
}

/// What an event's latest record proves once it completed.
#[derive(Default)]
struct Recorded {
    /// Bumped by every record.
    generation: u64,
    /// The stream and the operations the latest record follows.
    last: Option<Use>,
}

// SAFETY: event handles may be used from any host thread; state is behind a mutex.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).field("device", &self.device).finish()
    }
}

impl Event {
    /// A new event on `device`.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn new(device: &Device, options: EventOptions) -> Result<Event> {
        device.ensure_current()?;
        let mut flags = 0;
        if !options.timing {
            flags |= wirespeed_cuda_sys::cudaEventDisableTiming;
        }
        if options.blocking_sync {
            flags |= wirespeed_cuda_sys::cudaEventBlockingSync;
        }
        let raw = raw::event_create(flags)?;
        Ok(Event { raw, device: *device, recorded: Mutex::new(Recorded::default()) })
    }

    /// The raw handle.
    pub fn as_raw(&self) -> cudaEvent_t {
        self.raw
    }

    /// True when the latest record has completed (or it was never recorded).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is.
        unsafe { raw::event_query(self.raw) }
    }

    /// Blocks until the latest record has completed.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn synchronize(&self) -> Result<()> {
        let (generation, last) = {
            let rec = lock(&self.recorded);
            (rec.generation, rec.last.clone())
        };
        // SAFETY: the handle is live while `self` is.
        unsafe { raw::event_synchronize(self.raw) }?;
        // The record seen above is the one CUDA waited for only if no record
        // came since (CUDA waits for the latest at the time of the call).
        // Otherwise nothing is concluded: later waits ask the streams again.
        if let Some(u) = last
            && lock(&self.recorded).generation == generation
        {
            u.stream.completed.fetch_max(u.seq, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Milliseconds from `start` to this event; both must have completed and
    /// have timing on.
    ///
    /// # Errors
    /// The runtime's error (`cudaErrorNotReady`, `cudaErrorInvalidResourceHandle`).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        // SAFETY: both handles are live while borrowed.
        unsafe { raw::event_elapsed(start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.device.ensure_current();
        // SAFETY: the handle is ours; CUDA allows destroying an event whose
        // record is still pending.
        let _ = unsafe { raw::event_destroy(self.raw) };
    }
}
