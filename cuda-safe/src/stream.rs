//! Streams, events, fences and pending operations.
//!
//! Every stream counts the operations it was given (`submitted`) and remembers
//! how far it is known to have finished (`completed`). A [`Fence`] inside each
//! buffer records, per stream, the last operation that read or wrote it. That
//! is enough to (a) make host access and `Drop` wait for exactly the streams
//! that still use a buffer, and (b) make an operation on one stream wait for
//! another stream's use of the same buffer, with an event recorded only then.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::raw::{self, Queue};
use crate::sync::{SpinGuard, SpinLock};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use wirespeed_cuda_sys::{Api, cudaEvent_t, cudaStream_t};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    crate::hostfn::release(); // see hostfn: a holder may wait for this thread's stream
    crate::locks::lock(m)
}

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
    fn is_done(&self, seq: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= seq
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
    fn order_after(&self, other: &StreamInner, seq: u64) -> Result<()> {
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
    fn submit(&self, enqueue: impl FnOnce(Queue) -> Result<()>) -> Result<u64> {
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
struct Use {
    stream: Arc<StreamInner>,
    seq: u64,
}

/// The device addresses `[start, end)` an operation touches (host addresses
/// for host memory, where no hold is ever taken).
pub(crate) type Span = std::ops::Range<usize>;

/// The addresses of `len` values of `T` from `ptr`.
#[inline]
pub(crate) fn span_of<T>(ptr: *const T, len: usize) -> Span {
    let start = ptr as usize;
    start..start.wrapping_add(len.wrapping_mul(size_of::<T>()))
}

#[inline]
fn overlaps(a: &Span, b: &Span) -> bool {
    a.start < b.end && b.start < a.end
}

/// The uses of one buffer. The first reading stream is kept inline (the
/// per-copy path then touches no heap memory); more go to `more_reads`, which
/// is empty whenever `read` is `None`. `holds` are the writers that took part
/// of the buffer out of its borrow ([`crate::DetachedSliceMut`]); it is empty
/// unless the buffer was detached, so the per-copy path only checks that.
#[derive(Default, Clone)]
pub(crate) struct FenceState {
    write: Option<Use>,
    read: Option<Use>,
    more_reads: Vec<Use>,
    holds: Vec<Arc<Hold>>,
}

/// A writer that took `span` of a buffer out of its owner's borrow (a
/// [`crate::DetachedSliceMut`]): it enqueues its work later, from any thread,
/// with a fence of its own, and then releases the hold with that fence's
/// record. Until the release, the owner's fence cannot know what the writer
/// enqueued, so everything that needs to be ordered after the span's users
/// (host access, `Drop`, operations on the span through the buffer) first
/// waits for the release. That wait is what makes leaking the writer's handle
/// harmless: it can never let the owner free or read memory that a copy the
/// writer has still to enqueue will write.
pub(crate) struct Hold {
    span: Span,
    /// `None` while held; what the holder's fence recorded, once released.
    released: Mutex<Option<FenceState>>,
    cv: Condvar,
}

impl Hold {
    pub(crate) fn new(span: Span) -> Hold {
        Hold { span, released: Mutex::new(None), cv: Condvar::new() }
    }

    fn is_released(&self) -> bool {
        lock(&self.released).is_some()
    }

    /// What the holder recorded, once released (`None` while held).
    fn published(&self) -> Option<FenceState> {
        lock(&self.released).clone()
    }

    /// Blocks until released; answers what the holder recorded.
    fn wait_released(&self) -> FenceState {
        let mut g = lock(&self.released);
        loop {
            if let Some(s) = &*g {
                return s.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn release(&self, record: FenceState) {
        *lock(&self.released) = Some(record);
        self.cv.notify_all();
    }
}

/// Every use that the released `holds` stand for (their records, and the
/// holds those name, transitively), with only writes unless `with_reads`; one
/// entry per stream (its latest). A hold not released yet is waited for when
/// `block`, else the answer is `None`.
fn collect_uses(holds: Vec<Arc<Hold>>, with_reads: bool, block: bool) -> Option<Vec<Use>> {
    let mut out: Vec<Use> = Vec::new();
    let mut add = |u: &Use| match out.iter_mut().find(|x| Arc::ptr_eq(&x.stream, &u.stream)) {
        Some(x) => x.seq = x.seq.max(u.seq),
        None => out.push(u.clone()),
    };
    let mut todo = holds;
    let mut seen: Vec<*const Hold> = Vec::new();
    while let Some(h) = todo.pop() {
        if seen.contains(&Arc::as_ptr(&h)) {
            continue;
        }
        seen.push(Arc::as_ptr(&h));
        let record = if block { h.wait_released() } else { h.published()? };
        record.write.iter().for_each(&mut add);
        if with_reads {
            record.reads().for_each(&mut add);
        }
        todo.extend(record.holds);
    }
    Some(out)
}

/// The record of which stream operations still use a buffer. Every buffer owns
/// one; host access and `Drop` wait on it, and operations on other streams are
/// ordered after it. It is what keeps the crate sound when values are leaked:
/// nothing relies on a guard's `Drop` running.
#[derive(Default)]
pub struct Fence {
    state: SpinLock<FenceState>,
    /// On the fence of a part of a buffer ([`crate::DeviceSliceMut::split_at_mut`]):
    /// the buffer's own fence, where the part's uses are recorded instead
    /// (both parts share it). Only the view holding this fence can reach it,
    /// and that view borrows the buffer, fence included, for as long as it lives.
    part_of: Option<NonNull<Fence>>,
}

// SAFETY: the state is behind a lock (as `SpinLock` is Send and Sync), and
// `part_of` is only read, as a shared reference to a `Fence` (itself Sync)
// that outlives this one (see the field).
unsafe impl Send for Fence {}
// SAFETY: as above.
unsafe impl Sync for Fence {}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.target().state.lock();
        f.debug_struct("Fence")
            .field("writes", &s.write.is_some())
            .field("reads", &s.reads().count())
            .field("holds", &s.holds.len())
            .finish()
    }
}

impl Fence {
    /// The fence of a part of the buffer whose fence is `whole`: it records
    /// into `whole`. The caller keeps `whole` borrowed while the part lives.
    pub(crate) fn part_of(whole: &Fence) -> Fence {
        Fence { state: SpinLock::default(), part_of: Some(NonNull::from(whole.target())) }
    }

    /// The fence that records: this one, or the buffer's for a part.
    #[inline]
    pub(crate) fn target(&self) -> &Fence {
        match self.part_of {
            None => self,
            // SAFETY: set by `part_of` from a live fence that the view holding
            // `self` keeps borrowed for as long as it lives (see the field); it
            // is never itself a part (`part_of` resolves it first).
            Some(p) => unsafe { p.as_ref() },
        }
    }

    /// Blocks until no stream writes the buffer any more (host reads may go on).
    pub(crate) fn wait_writes(&self) -> Result<()> {
        let this = self.target();
        let w = this.state.lock().write.clone();
        if let Some(u) = w {
            u.stream.wait_for(u.seq)?;
            let mut s = this.state.lock();
            if s.write.as_ref().is_some_and(|x| Arc::ptr_eq(&x.stream, &u.stream) && x.seq <= u.seq) {
                s.write = None;
            }
        }
        this.wait_holds()
    }

    /// Blocks until no stream uses the buffer at all.
    pub(crate) fn wait_all(&self) -> Result<()> {
        let this = self.target();
        this.wait_writes()?;
        let reads = this.state.lock().take_reads();
        for (i, u) in reads.iter().enumerate() {
            if let Err(e) = u.stream.wait_for(u.seq) {
                let mut s = this.state.lock();
                for u in &reads[i..] {
                    s.note_read_slow(&u.stream, u.seq); // keeps a newer read of the stream
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Blocks until every detached writer of the buffer has released its hold
    /// and what it enqueued has finished; then forgets those holds.
    fn wait_holds(&self) -> Result<()> {
        let holds = {
            let s = self.state.lock();
            if s.holds.is_empty() {
                return Ok(());
            }
            s.holds.clone()
        };
        for u in collect_uses(holds.clone(), true, true).unwrap_or_default() {
            u.stream.wait_for(u.seq)?;
        }
        self.state.lock().holds.retain(|h| !holds.iter().any(|x| Arc::ptr_eq(x, h)));
        Ok(())
    }

    /// True when no stream uses the buffer (by what is known without asking
    /// CUDA), and no detached writer of it may still enqueue work.
    pub fn is_idle(&self) -> bool {
        let s = self.target().state.lock();
        s.write.as_ref().is_none_or(|u| u.stream.is_done(u.seq))
            && s.reads().all(|u| u.stream.is_done(u.seq))
            && (s.holds.is_empty() || s.holds_idle())
    }

    /// A use that `on` must be ordered after: on another stream, not known done.
    #[inline]
    fn pending_elsewhere(u: &Use, on: &StreamInner) -> bool {
        !std::ptr::eq(&*u.stream, on) && !u.stream.is_done(u.seq)
    }

    /// Takes a hold on `span` for a writer that will enqueue its work later,
    /// from any thread ([`crate::DetachedSliceMut`]): records the hold here and
    /// answers it with the writer's own fence, which starts with every use of
    /// the buffer so far that the writer must be ordered after.
    pub(crate) fn hold(&mut self, span: Span) -> (Fence, Arc<Hold>) {
        let hold = Arc::new(Hold::new(span.clone()));
        let start = {
            let mut s = self.target().state.lock();
            if !s.holds.is_empty() {
                s.holds.retain(|h| !FenceState::hold_idle(h)); // released and finished: nothing to keep
            }
            let start = FenceState {
                write: s.write.clone(),
                read: s.read.clone(),
                more_reads: s.more_reads.clone(),
                holds: s.holds.iter().filter(|h| overlaps(&h.span, &span)).cloned().collect(),
            };
            s.holds.push(hold.clone());
            start
        };
        let mut own = Fence::default();
        *own.state.get_mut() = start;
        (own, hold)
    }

    /// A fence for one more writer of this (exclusively owned) fence's
    /// memory, not ordered against the other writers made so: it starts with
    /// every use recorded here (so its first operation follows them), and is
    /// handed back with [`Fence::absorb`] ([`crate::Lanes`]).
    pub(crate) fn fork(&mut self) -> Fence {
        let start = self.state.get_mut().clone();
        let mut own = Fence::default();
        *own.state.get_mut() = start;
        own
    }

    /// Takes back a fence made by [`Fence::fork`]: what was recorded in it
    /// becomes a released hold on `span` here, so that everything ordered
    /// after this fence (host access, `Drop`, other streams, the owner's
    /// fence once this one is released into it) is ordered after it too. No
    /// call to CUDA, no wait.
    pub(crate) fn absorb(&mut self, mut lane: Fence, span: Span) {
        let record = std::mem::take(lane.state.get_mut());
        if record.write.is_none() && record.read.is_none() && record.holds.is_empty() {
            return; // it recorded nothing (and started from nothing)
        }
        let hold = Arc::new(Hold::new(span));
        hold.release(record);
        let s = self.state.get_mut();
        s.holds.retain(|h| !FenceState::hold_idle(h));
        s.holds.push(hold);
    }

    /// Hands this fence's record to `hold` (releasing it) and forgets it.
    pub(crate) fn release_into(&mut self, hold: &Hold) {
        hold.release(std::mem::take(self.state.get_mut()));
    }

    /// Blocks until every earlier writer that this fence must follow has
    /// released its hold (their work is then known, and ordering after it
    /// never waits on the host).
    pub(crate) fn settle(&mut self) {
        self.state.get_mut().settle(&(0..usize::MAX));
    }

    /// True when [`Fence::settle`] would return at once.
    pub(crate) fn is_settled(&self) -> bool {
        self.state.lock().unreleased(&(0..usize::MAX)).is_empty()
    }

    /// Locks the state for an operation on `span`, first waiting (unlocked)
    /// for the writers holding part of `span` to release it.
    #[inline]
    fn lock_settled(&self, span: &Span) -> SpinGuard<'_, FenceState> {
        let g = self.state.lock();
        if g.holds.is_empty() {
            return g;
        }
        self.lock_settled_slow(g, span)
    }

    #[cold]
    #[inline(never)]
    fn lock_settled_slow<'a>(&'a self, mut g: SpinGuard<'a, FenceState>, span: &Span) -> SpinGuard<'a, FenceState> {
        loop {
            let waiting = g.unreleased(span);
            if waiting.is_empty() {
                return g;
            }
            drop(g);
            waiting.iter().for_each(|h| drop(h.wait_released()));
            g = self.state.lock();
        }
    }
}

impl FenceState {
    fn reads(&self) -> impl Iterator<Item = &Use> {
        self.read.iter().chain(self.more_reads.iter())
    }

    fn take_reads(&mut self) -> Vec<Use> {
        let mut all = std::mem::take(&mut self.more_reads);
        all.extend(self.read.take());
        all
    }

    /// The holds on `span` not released yet.
    #[inline]
    fn unreleased(&self, span: &Span) -> Vec<Arc<Hold>> {
        if self.holds.is_empty() {
            return Vec::new();
        }
        self.unreleased_slow(span)
    }

    #[cold]
    #[inline(never)]
    fn unreleased_slow(&self, span: &Span) -> Vec<Arc<Hold>> {
        self.holds.iter().filter(|h| overlaps(&h.span, span) && !h.is_released()).cloned().collect()
    }

    /// Waits (no lock is held: `self` is exclusively borrowed) until the
    /// holds on `span` are released.
    #[cold]
    #[inline(never)]
    fn settle(&mut self, span: &Span) {
        for h in self.unreleased(span) {
            drop(h.wait_released());
        }
    }

    /// True when `h` was released and what it recorded has finished.
    fn hold_idle(h: &Arc<Hold>) -> bool {
        collect_uses(vec![h.clone()], true, false).is_some_and(|u| u.iter().all(|u| u.stream.is_done(u.seq)))
    }

    fn holds_idle(&self) -> bool {
        self.holds.iter().all(FenceState::hold_idle)
    }

    /// Orders `on` after the holds on `span` (their writes only, unless
    /// `with_reads`), which are released (see [`Fence::lock_settled`]).
    /// First forgets the holds released whose work has finished, so that the
    /// operations after a detached writer take this slow path only until it
    /// is known done.
    #[cold]
    #[inline(never)]
    fn order_holds(&mut self, on: &StreamInner, span: &Span, with_reads: bool) -> Result<()> {
        self.holds.retain(|h| !FenceState::hold_idle(h));
        let held: Vec<_> = self.holds.iter().filter(|h| overlaps(&h.span, span)).cloned().collect();
        for u in collect_uses(held, with_reads, true).unwrap_or_default() {
            if Fence::pending_elsewhere(&u, on) {
                on.order_after(&u.stream, u.seq)?;
            }
        }
        Ok(())
    }

    // The per-copy path: these are inline, with the rare cases out of line.

    /// Orders `on` after the last write (for an operation reading `span`).
    #[inline]
    fn order_read(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        if !self.holds.is_empty() {
            self.order_holds(on, span, false)?;
        }
        match &self.write {
            Some(u) if Fence::pending_elsewhere(u, on) => on.order_after(&u.stream, u.seq),
            _ => Ok(()),
        }
    }

    /// Orders `on` after every use (for an operation writing `span`).
    #[inline]
    fn order_write(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        match &self.write {
            Some(u) if Fence::pending_elsewhere(u, on) => self.order_write_slow(on, span),
            _ if self.read.is_some() || !self.holds.is_empty() => self.order_write_slow(on, span),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn order_write_slow(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        for u in self.write.iter().chain(self.reads()) {
            if Fence::pending_elsewhere(u, on) {
                on.order_after(&u.stream, u.seq)?;
            }
        }
        if !self.holds.is_empty() {
            self.order_holds(on, span, true)?;
        }
        Ok(())
    }

    /// Records a read by operation `seq` of `stream`.
    #[inline]
    fn note_read(&mut self, stream: &Arc<StreamInner>, seq: u64) {
        match &mut self.read {
            Some(u) if Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            _ => self.note_read_slow(stream, seq),
        }
    }

    #[cold]
    #[inline(never)]
    fn note_read_slow(&mut self, stream: &Arc<StreamInner>, seq: u64) {
        if let Some(u) = self.read.iter_mut().chain(self.more_reads.iter_mut()).find(|u| Arc::ptr_eq(&u.stream, stream))
        {
            u.seq = u.seq.max(seq); // (also puts back reads `wait_all` took)
            return;
        }
        let mut kept = self.take_reads();
        kept.retain(|u| !u.stream.is_done(u.seq));
        kept.push(Use { stream: stream.clone(), seq });
        // The newest reader goes inline: the next copy from it takes the fast path.
        self.read = kept.pop();
        self.more_reads = kept;
    }

    /// Records a write of `span` by operation `seq` of `stream` (it follows
    /// every earlier use, and the holds on `span`).
    #[inline]
    fn note_write(&mut self, stream: &Arc<StreamInner>, seq: u64, span: &Span) {
        match &mut self.write {
            Some(u) if self.read.is_none() && self.holds.is_empty() && Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            _ => self.note_write_slow(stream, seq, span),
        }
    }

    #[cold]
    #[inline(never)]
    fn note_write_slow(&mut self, stream: &Arc<StreamInner>, seq: u64, span: &Span) {
        self.read = None;
        self.more_reads.clear();
        // The holds on `span` were released and ordered before this write,
        // which stands for them from now on; others stay.
        self.holds.retain(|h| !overlaps(&h.span, span));
        match &mut self.write {
            Some(u) if Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            w => *w = Some(Use { stream: stream.clone(), seq }),
        }
    }
}

/// Options for [`Stream::with_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// A non-blocking stream does not synchronize with the legacy default stream
    /// (recommended: the default for [`Stream::new`]).
    pub non_blocking: bool,
    /// Priority; lower numbers are higher priority. See [`Device::stream_priority_range`].
    pub priority: i32,
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

    /// Enqueues one operation reading `read` (a buffer's fence and the span
    /// read, if any) and writing `write` (likewise): orders it after other
    /// streams' conflicting uses, runs `enqueue`, then records the uses.
    /// Returns the pending operation, borrowing for `'a`.
    ///
    /// This is the per-copy hot path. The written buffer is exclusively
    /// borrowed by the caller, so its fence is reached through `&mut` without
    /// locking; the read buffer's fence is locked once, across the enqueue (so
    /// its record cannot interleave with another thread's copy from the same
    /// buffer). Locks are taken in one order (read, then the streams' `cross`
    /// events), and a written fence is never locked by anyone else meanwhile,
    /// so no cycle can form. A part of a buffer ([`crate::DeviceSliceMut::split_at_mut`])
    /// records into the buffer's fence, shared with the other part: that case
    /// is [`Stream::enqueue_into_part`]. No lock is held while waiting for a
    /// detached writer to release its hold.
    #[inline]
    pub(crate) fn enqueue<'a>(
        &'a self,
        read: Option<(&Fence, Span)>,
        write: (&mut Fence, Span),
        enqueue: impl FnOnce(Queue) -> Result<()>,
    ) -> Result<Pending<'a>> {
        let on = &self.inner;
        on.device.ensure_current()?;
        let (write, wspan) = write;
        if write.part_of.is_some() {
            return self.enqueue_into_part(read, write.target(), wspan, enqueue);
        }
        let w = write.state.get_mut();
        if !w.holds.is_empty() {
            w.settle(&wspan);
        }
        let mut r = read.map(|(f, span)| (f.target().lock_settled(&span), span));
        if let Some((r, span)) = &mut r {
            r.order_read(on, span)?;
        }
        w.order_write(on, &wspan)?;
        let seq = on.submit(enqueue)?;
        if let Some((r, _)) = &mut r {
            r.note_read(on, seq);
        }
        w.note_write(on, seq, &wspan);
        Ok(Pending { stream: on, seq, _borrows: PhantomData })
    }

    /// [`Stream::enqueue`] writing a part of a buffer whose fence, `write`, the
    /// other part shares: it is locked too. When the read fence is another
    /// one, the two are locked in address order (two threads copying between
    /// parts of two buffers in opposite directions cannot deadlock); when it is
    /// the same (a copy from one part to the other), it is locked once.
    #[cold]
    #[inline(never)]
    fn enqueue_into_part<'a>(
        &'a self,
        read: Option<(&Fence, Span)>,
        write: &Fence,
        wspan: Span,
        enqueue: impl FnOnce(Queue) -> Result<()>,
    ) -> Result<Pending<'a>> {
        let on = &self.inner;
        let read = read.map(|(f, span)| (f.target(), span));
        let other = read.as_ref().map(|(f, _)| *f).filter(|f| !std::ptr::eq(*f, write));
        loop {
            let (mut w, mut r) = match other {
                None => (write.state.lock(), None),
                Some(f) if (f as *const Fence) < (write as *const Fence) => {
                    let r = f.state.lock();
                    (write.state.lock(), Some(r))
                }
                Some(f) => {
                    let w = write.state.lock();
                    let r = f.state.lock();
                    (w, Some(r))
                }
            };
            // Any hold on either span still held: wait for it unlocked, then again.
            let mut waiting = w.unreleased(&wspan);
            if let Some((_, span)) = &read {
                waiting.extend(r.as_deref().unwrap_or(&*w).unreleased(span));
            }
            if !waiting.is_empty() {
                drop(r);
                drop(w);
                waiting.iter().for_each(|h| drop(h.wait_released()));
                continue;
            }
            if let Some((_, span)) = &read {
                match r.as_deref_mut() {
                    Some(r) => r.order_read(on, span)?,
                    None => w.order_read(on, span)?,
                }
            }
            w.order_write(on, &wspan)?;
            let seq = on.submit(enqueue)?;
            if read.is_some() {
                match r.as_deref_mut() {
                    Some(r) => r.note_read(on, seq),
                    None => w.note_read(on, seq), // the same fence: the write below supersedes it
                }
            }
            w.note_write(on, seq, &wspan);
            return Ok(Pending { stream: on, seq, _borrows: PhantomData });
        }
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

impl Pending<'_> {
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

/// Options for [`Event::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventOptions {
    /// Measure time ([`Event::elapsed_ms`]); off makes record and wait cheaper.
    pub timing: bool,
    /// `synchronize` sleeps instead of spinning.
    pub blocking_sync: bool,
}

/// A CUDA event: a point in a stream's work that the host or other streams can wait for.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, Event, EventOptions, Stream};
/// let dev = Device::get(0)?;
/// let s = Stream::new(&dev)?;
/// let (a, b) = (Event::new(&dev, EventOptions { timing: true, ..Default::default() })?, Event::new(&dev, EventOptions { timing: true, ..Default::default() })?);
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
