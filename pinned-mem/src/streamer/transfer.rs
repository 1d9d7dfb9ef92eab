//! Transfers that do not block: [`Streamer::start`](super::Streamer::start)
//! queues a [`Job`] for the streamer's worker thread and returns a
//! [`Transfer`] at once. The worker (`worker.rs`) runs the jobs in order,
//! and tells the handle, through a [`TransferState`], when every copy is
//! enqueued (with an event recorded after the last one:
//! [`Transfer::then_on`]) and when the transfer has ended (its [`Report`] or
//! error: [`Transfer::wait`], polling, `.await`).
//!
//! Soundness does not depend on the handle: the job owns the destination as a
//! [`DetachedSliceMut`], whose hold makes the destination's owner wait (to
//! free it, read it, or use it on a stream) until the worker has released it,
//! after the transfer's last copy. The handle owns nothing but its share of
//! the state: dropping or leaking it changes nothing for the transfer.

use std::future::Future;
use std::marker::PhantomData;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use wirespeed_cuda::{DetachedSliceMut, Event, EventOptions, Stream};

use wirespeed_cuda::locks::lock;

use super::report::Report;
use super::shared::Shared;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;

/// Options for [`Streamer::start_with`](super::Streamer::start_with): none by
/// default ([`StartOptions::new`], `Default`), each set by its builder method.
/// The struct may gain options in a minor release; it is only ever built so.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// let mine = wirespeed_cuda::Stream::new(&wirespeed_cuda::Device::get(0)?)?;
/// let options = wirespeed_pinned::StartOptions::new().after(&mine);
/// # let _ = options; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct StartOptions<'s> {
    after: Option<&'s Stream>,
}

impl<'s> StartOptions<'s> {
    /// No options: the transfer's copies are ordered after nothing but the
    /// destination's own earlier uses through this crate and `wirespeed-cuda`.
    ///
    /// ```
    /// let options = wirespeed_pinned::StartOptions::new();
    /// # let _ = options;
    /// ```
    pub fn new() -> StartOptions<'static> {
        StartOptions { after: None }
    }

    /// Orders the transfer's copies after the work given to `stream` so far
    /// (up to the call of `start_with`): an event is recorded on `stream`
    /// then, and the streamer's stream waits for it before the first copy,
    /// on the device, with no host wait. For work these crates do not track
    /// that allocated, cleared or last read the destination: on memory given
    /// through [`DeviceSliceMut::from_raw_parts`](wirespeed_cuda::DeviceSliceMut::from_raw_parts),
    /// or enqueued through raw handles (a kernel, another library's stream,
    /// [`Stream::from_raw`]). Memory the crates allocated needs no `after`:
    /// its fence orders the copies already.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// let mine = wirespeed_cuda::Stream::new(&wirespeed_cuda::Device::get(0)?)?;
    /// let options = wirespeed_pinned::StartOptions::new().after(&mine);
    /// # let _ = options; Ok(()) }
    /// ```
    pub fn after(self, stream: &Stream) -> StartOptions<'_> {
        StartOptions { after: Some(stream) }
    }

    /// The event recorded on the `after` stream now, if there is one.
    pub(super) fn after_event(&self) -> Result<Option<Event>> {
        let Some(s) = self.after else { return Ok(None) };
        let ev = Event::new(&s.device(), EventOptions::default())?;
        s.record(&ev)?;
        Ok(Some(ev))
    }
}

/// A transfer started by [`Streamer::start`](super::Streamer::start): it runs
/// on the streamer's worker thread while this handle is polled, waited for,
/// awaited (it is a [`Future`]), or used to order work on your own streams
/// after it ([`Transfer::then_on`]).
///
/// It borrows the streamer and the destination for as long as it lives, so
/// the compiler rejects touching the destination meanwhile. Dropping or
/// leaking it does *not* stop or wait for the transfer, and is always sound:
/// the destination's owner waits for the transfer before it frees, reads or
/// reuses the memory (or, for memory given through
/// [`DeviceSliceMut::from_raw_parts`](wirespeed_cuda::DeviceSliceMut::from_raw_parts),
/// the caller's contract covers it).
///
/// As a `Future`, it needs no particular runtime: the worker thread wakes the
/// task when the transfer ends. Awaiting it takes the result: a later
/// [`Transfer::wait`] answers [`Error::InvalidArgument`].
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// # let path = std::env::temp_dir().join(format!("wirespeed-doc-transfer-{}", std::process::id()));
/// # std::fs::write(&path, vec![7u8; 1 << 20])?;
/// use wirespeed_cuda::{Device, DeviceBuffer};
/// use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
/// let dev = Device::get(0)?;
/// let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(64 << 20)))?;
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// let transfer = streamer.start(&file, 0..1 << 20, &mut dst)?;
/// while !transfer.is_done() {
///     std::thread::yield_now(); // ... or other work
/// }
/// let report = transfer.wait()?;
/// assert_eq!(report.bytes, 1 << 20);
/// assert_eq!(dst.to_vec()?[12345], 7);
/// # std::fs::remove_file(&path)?; Ok(()) }
/// ```
#[must_use = "a transfer runs in the background: wait() for it, poll it, or drop it to let it run unobserved"]
pub struct Transfer<'a> {
    state: Arc<TransferState>,
    /// To refuse blocking calls from inside the streamer's callbacks.
    streamer: &'a Shared,
    _borrows: PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for Transfer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.status();
        f.debug_struct("Transfer").field("phase", &st.phase).finish()
    }
}

impl<'a> Transfer<'a> {
    pub(super) fn new(state: Arc<TransferState>, streamer: &'a Shared) -> Self {
        Transfer { state, streamer, _borrows: PhantomData }
    }
}

impl Transfer<'_> {
    /// True once the transfer has ended, successfully or not: its copies have
    /// completed (or it failed) and [`Transfer::wait`] will not block. Once
    /// true for a transfer that succeeded, the destination's data is there,
    /// and completion is *observed* in the sense of
    /// [`DeviceSliceMut::from_raw_parts`](wirespeed_cuda::DeviceSliceMut::from_raw_parts).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-is-done-{}", std::process::id()));
    /// # std::fs::write(&path, vec![1u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// let t = streamer.start(&file, 0..4096, &mut dst)?;
    /// while !t.is_done() {
    ///     std::thread::yield_now();
    /// }
    /// t.wait()?; // returns at once
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn is_done(&self) -> bool {
        self.state.status().phase == Phase::Finished
    }

    /// Blocks until the transfer has ended; answers its [`Report`] or error.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-wait-{}", std::process::id()));
    /// # std::fs::write(&path, vec![1u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u32>::new(&dev, 1024)?; // 4096 bytes
    /// let report = streamer.start(&file, 0..4096, &mut dst)?.wait()?;
    /// assert_eq!(dst.to_vec()?[0], 0x0101_0101);
    /// # let _ = report; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Those of [`Streamer::to_device`](super::Streamer::to_device) for the
    /// transfer itself ([`Error::BudgetExceeded`], [`Error::DirectUnsupported`],
    /// [`Error::Cuda`], [`Error::Io`], [`Error::FileChanged`], ...);
    /// [`Error::WorkerPanicked`] when the worker thread panicked running it
    /// (in a progress callback, say); [`Error::InvalidArgument`] when its
    /// result was already taken by awaiting it, or when called from inside a
    /// callback of the same streamer (the transfer would wait for the
    /// callback, and the callback for it).
    pub fn wait(self) -> Result<Report> {
        self.streamer.refuse_inside_callback("Transfer::wait")?;
        let mut st = self.state.status();
        while st.phase != Phase::Finished {
            st = self.state.wait(st);
        }
        st.result.take().unwrap_or_else(|| Err(taken()))
    }

    /// Makes work that you enqueue on `stream` from now on wait for the
    /// transfer's copies, on the device: a kernel launched on `stream` after
    /// this returns reads the landed data, with no host wait for the copies.
    /// `stream` can be any stream (another library's, through
    /// [`Stream::from_raw`]), on any device.
    ///
    /// It blocks until the worker has *enqueued* the transfer's last copy
    /// (that is when the event to wait for exists: the worker pipelines its
    /// copies, so this comes when all but the last few pieces have landed),
    /// then enqueues `cudaStreamWaitEvent` on `stream`. Once the transfer has
    /// ended it enqueues nothing: the copies are known complete. It does not
    /// tell the transfer's outcome when the copies were enqueued but have not
    /// finished: [`Transfer::wait`] (or polling) does.
    ///
    /// Why it waits on the host for the last copy to be enqueued: CUDA orders
    /// work on one stream after another's only through an event recorded
    /// there already (`cudaStreamWaitEvent` waits for the record made before
    /// it), and the transfer's last copies do not exist yet when this is
    /// called. The ways to wait on the device for work enqueued later are a
    /// stream memory operation on a flag (`cuStreamWaitValue32`) or a host
    /// function that blocks until the copies complete; NVIDIA documents both
    /// as able to deadlock when what they wait for is CUDA work not ordered
    /// before them by a dependency CUDA can see (the scheduler may queue the
    /// transfer's copies behind the blocked wait; host functions may not
    /// wait for other CUDA work at all). Here that work is the transfer's
    /// copies, so neither can be used soundly.
    /// [`Transfer::then_on_timeout`] bounds the wait instead, for callers
    /// that must stay responsive.
    ///
    /// The transfer borrows its destination while this handle lives, and
    /// the destination's fence holds it until the transfer has ended: an
    /// operation through the safe API on a buffer the crates allocated waits
    /// on the host for that end. For work on the destination with no host
    /// wait at all, as below, give the transfer memory through
    /// [`DeviceSliceMut::from_raw_parts`](wirespeed_cuda::DeviceSliceMut::from_raw_parts)
    /// and use the same memory on `stream` through your own handles.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-then-on-{}", std::process::id()));
    /// # std::fs::write(&path, vec![3u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
    /// # let dev = Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mine = Stream::new(&dev)?; // a stream of your runtime
    /// let landing = DeviceBuffer::<u8>::zeroed(&dev, 1 << 16)?; // memory your runtime owns
    /// // SAFETY: device memory of `dev`, alive until the end; only the
    /// // transfer, then work ordered after it on `mine`, touch it.
    /// let dst = unsafe { DeviceSliceMut::from_raw_parts(landing.as_raw_ptr(), 1 << 16, dev) }?;
    /// let t = streamer.start(&file, 0..1 << 16, dst)?;
    /// t.then_on(&mine)?;
    /// // ... launch a kernel on `mine` reading `landing`; here, a copy back:
    /// // SAFETY: as above; this copy runs on `mine`, after the transfer.
    /// let src = unsafe { DeviceSliceMut::from_raw_parts(landing.as_raw_ptr(), 1 << 16, dev) }?;
    /// let mut out = wirespeed_cuda::PinnedBuffer::<u8>::new(1 << 16)?;
    /// mine.copy_to_host(&src, &mut out)?.wait()?;
    /// assert!(out.as_slice()?.iter().all(|&b| b == 3));
    /// t.wait()?;
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::TransferFailed`] when the transfer failed before its copies
    /// were all enqueued; [`Error::InvalidArgument`] from inside a callback of
    /// the same streamer (it would wait for itself); CUDA's error from
    /// `cudaStreamWaitEvent`.
    pub fn then_on(&self, stream: &Stream) -> Result<()> {
        self.then_on_within(stream, None).map(|_| ())
    }

    /// [`Transfer::then_on`], waiting at most `timeout` for the worker to
    /// enqueue the last copy: `Ok(false)` when it has not by then (nothing
    /// was enqueued on `stream`; call again), `Ok(true)` once done as
    /// `then_on` does it. For callers that must stay responsive while they
    /// wait (to check for a signal between slices, say).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-then-on-timeout-{}", std::process::id()));
    /// # std::fs::write(&path, vec![3u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mine = wirespeed_cuda::Stream::new(&dev)?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// let t = streamer.start(&file, 0..4096, &mut dst)?;
    /// while !t.then_on_timeout(&mine, std::time::Duration::from_millis(50))? {
    ///     // ... check for an interrupt ...
    /// }
    /// # t.wait()?; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Transfer::then_on`].
    pub fn then_on_timeout(&self, stream: &Stream, timeout: Duration) -> Result<bool> {
        // A timeout past the clock's range waits as long as `then_on`.
        self.then_on_within(stream, Instant::now().checked_add(timeout))
    }

    /// Blocks until the transfer has ended or `timeout` has passed; true when
    /// it has ended ([`Transfer::wait`] then answers at once).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-wait-timeout-{}", std::process::id()));
    /// # std::fs::write(&path, vec![3u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// let t = streamer.start(&file, 0..4096, &mut dst)?;
    /// while !t.wait_timeout(std::time::Duration::from_millis(50)) {
    ///     // ... check for an interrupt ...
    /// }
    /// t.wait()?; // returns at once
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        // A timeout past the clock's range waits as long as `wait`.
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.state.status();
        while st.phase != Phase::Finished {
            let Some(deadline) = deadline else {
                st = self.state.wait(st);
                continue;
            };
            match self.state.wait_until(st, deadline) {
                Some(g) => st = g,
                None => return false,
            }
        }
        true
    }

    fn then_on_within(&self, stream: &Stream, deadline: Option<Instant>) -> Result<bool> {
        self.streamer.refuse_inside_callback("Transfer::then_on")?;
        let mut st = self.state.status();
        loop {
            match st.phase {
                Phase::Queued => match deadline {
                    None => st = self.state.wait(st),
                    Some(d) => match self.state.wait_until(st, d) {
                        Some(g) => st = g,
                        None => return Ok(false),
                    },
                },
                Phase::Enqueued => {
                    if let Some(ev) = &st.event {
                        stream.wait_event(ev)?;
                    }
                    return Ok(true);
                }
                Phase::Finished => {
                    return match &st.failed {
                        Some(message) => Err(Error::TransferFailed { message: message.clone() }),
                        None => Ok(true),
                    };
                }
            }
        }
    }
}

fn taken() -> Error {
    Error::invalid("Transfer::wait", "the result was already taken by awaiting the transfer")
}

impl Future for Transfer<'_> {
    type Output = Result<Report>;

    /// Ready with [`Transfer::wait`]'s answer once the transfer has ended;
    /// until then the worker thread keeps the latest waker and wakes it then.
    /// Any executor will do; here, none:
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-poll-{}", std::process::id()));
    /// # std::fs::write(&path, vec![5u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// use std::future::Future;
    /// use std::task::{Context, Poll, Waker};
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// let mut transfer = std::pin::pin!(streamer.start(&file, 0..4096, &mut dst)?);
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let report = loop {
    ///     if let Poll::Ready(r) = transfer.as_mut().poll(&mut cx) {
    ///         break r?;
    ///     }
    ///     std::thread::yield_now(); // (an executor would sleep until woken)
    /// };
    /// assert_eq!(report.bytes, 4096);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.state.status();
        if st.phase == Phase::Finished {
            return Poll::Ready(st.result.take().unwrap_or_else(|| Err(taken())));
        }
        match &mut st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// A transfer's outcome, kept by a user inside this crate after the
/// [`Transfer`] handle (and its borrows) is let go: the destination's fence
/// orders the memory's later uses, this tells whether the copies succeeded.
pub(crate) struct Outcome(Arc<TransferState>);

impl<'a> Transfer<'a> {
    /// Lets go of the handle, keeping its outcome.
    pub(crate) fn into_outcome(self) -> Outcome {
        Outcome(self.state.clone())
    }
}

impl Outcome {
    /// Waits for the transfer to end; its report, or its error (once: a
    /// second call answers [`Error::InvalidArgument`]).
    pub(crate) fn wait(&self) -> Result<Report> {
        let mut st = self.0.status();
        while st.phase != Phase::Finished {
            st = self.0.wait(st);
        }
        st.result.take().unwrap_or_else(|| Err(taken()))
    }
}

/// Where a transfer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Queued or running; copies still to enqueue.
    Queued,
    /// Every copy enqueued, `event` recorded after the last one.
    Enqueued,
    /// Ended: `result` is set (until taken).
    Finished,
}

struct Status {
    phase: Phase,
    /// Recorded on the destination's stream after the last copy (dropped once
    /// the transfer has ended: then nothing needs to wait for it).
    event: Option<Event>,
    result: Option<Result<Report>>,
    /// The error's text, kept for `then_on` after `result` was taken.
    failed: Option<String>,
    waker: Option<Waker>,
}

/// What a [`Transfer`] handle and the worker share.
pub(super) struct TransferState {
    status: Mutex<Status>,
    changed: Condvar,
}

impl Default for TransferState {
    fn default() -> Self {
        let status = Status { phase: Phase::Queued, event: None, result: None, failed: None, waker: None };
        TransferState { status: Mutex::new(status), changed: Condvar::new() }
    }
}

impl TransferState {
    fn status(&self) -> MutexGuard<'_, Status> {
        lock(&self.status)
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Status>) -> MutexGuard<'a, Status> {
        self.changed.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// As `wait`, up to `deadline`: `None` once it has passed.
    fn wait_until<'a>(&self, g: MutexGuard<'a, Status>, deadline: Instant) -> Option<MutexGuard<'a, Status>> {
        let left = deadline.checked_duration_since(Instant::now())?;
        let (g, _) = self.changed.wait_timeout(g, left).unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(g)
    }

    /// Every copy is enqueued on `stream`: records the event `then_on` waits for.
    pub(super) fn enqueued(&self, stream: Option<&Stream>) -> Result<()> {
        let stream = stream.ok_or_else(|| Error::invalid("Transfer", "no stream"))?;
        let ev = Event::new(&stream.device(), EventOptions::default())?;
        stream.record(&ev)?;
        let mut st = self.status();
        st.event = Some(ev);
        st.phase = Phase::Enqueued;
        drop(st);
        self.changed.notify_all();
        Ok(())
    }

    /// The transfer has ended with `result`.
    pub(super) fn finish(&self, result: Result<Report>) {
        let mut st = self.status();
        if st.phase == Phase::Finished {
            return;
        }
        st.failed = result.as_ref().err().map(ToString::to_string);
        st.result = Some(result);
        st.phase = Phase::Finished;
        let event = st.event.take();
        let waker = st.waker.take();
        drop(st);
        self.changed.notify_all();
        drop(event);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A transfer queued for the worker thread.
pub(super) struct Job {
    pub(super) file: Arc<MappedFile>,
    pub(super) range: Range<u64>,
    /// The destination, as bytes, detached from the caller's borrow: its hold
    /// is released when the job ends (or is dropped unrun).
    pub(super) dst: DetachedSliceMut<u8>,
    /// The index of the destination's stream.
    pub(super) stream: usize,
    /// Recorded on the caller's stream at the start: waited for before the first copy.
    pub(super) after: Option<Event>,
    pub(super) state: Arc<TransferState>,
}
