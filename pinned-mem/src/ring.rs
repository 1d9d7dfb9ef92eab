//! The pinned ring: K slots of pinned memory allocated once and reused.
//!
//! A slot moves through three types, and only forward:
//!
//! ```text
//!   PinnedRing::acquire ─► FreeSlot ──fill──► FullSlot ──copy_to_device/submit──► InFlightSlot
//!          ▲                  (host writes)     (host reads)                        (no access)
//!          └─────────────── back to the ring; free again only after its events completed ◄──┘
//! ```
//!
//! A [`FreeSlot`] is the only way to write a slot, and the ring hands one out
//! only for a slot whose last copies are known complete (their [`Event`]s
//! synchronized). [`InFlightSlot`] gives no access to the memory at all.
//! Dropping any of them returns the slot to the ring (an in-flight one to the
//! in-flight queue). Forgetting one loses the slot (the ring has one fewer) and,
//! since each handle holds the ring's shared state, keeps the whole ring (its K
//! pinned slots and its budget reservation) alive for the rest of the process,
//! and with it every [`Stream`] its events were recorded on (an in-flight slot
//! keeps the events of its copies, and each event keeps its stream: the
//! stream's handle, its device memory for the queue and, on a real GPU, its
//! place in the context, until the process exits). Memory safety never
//! depends on it, since each slot is a
//! [`PinnedBuffer`](wirespeed_cuda::PinnedBuffer) whose fence makes host access wait
//! for the device anyway.
//!
//! ```compile_fail
//! # fn f(ring: &wirespeed_pinned::PinnedRing, stream: &wirespeed_cuda::Stream, dst: &mut wirespeed_cuda::DeviceBuffer<u8>) -> wirespeed_pinned::Result<()> {
//! let full = ring.acquire()?.fill(0..16)?;
//! let in_flight = full.copy_to_device(stream, dst)?;
//! full.data()?; // error: the slot moved into the copy; only the in-flight handle is left
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use wirespeed_cuda::{Device, DeviceSink, Event, EventOptions, PinnedBuffer, PinnedFlags, PinnedSlice, Stream};

use crate::budget::{PinBudget, Reservation};
use crate::error::{Error, Result};
use crate::util::page_size;

use wirespeed_cuda::locks::lock;

/// K pinned slots of `slot_bytes`, allocated once (`cudaHostAlloc`, portable)
/// and drawn from a [`PinBudget`]; producer threads fill free slots, a stream
/// copies full ones, and a slot is free again only once its copy's event has
/// completed. Cloning gives another handle to the same ring.
///
/// Every slot handle ([`FreeSlot`], [`FullSlot`], [`InFlightSlot`]) holds the
/// ring's shared state: forgetting one (`mem::forget`) keeps the whole ring
/// (its pinned slots and its budget reservation) alive for the rest of the
/// process, whatever happens to the `PinnedRing` handles, and with it every
/// [`Stream`] that the slots' events were recorded on (see the module docs).
/// Never unsound: nothing is freed under a copy.
///
/// ```no_run
/// use wirespeed_pinned::{PinBudget, PinnedRing};
/// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
/// # fn main() -> wirespeed_pinned::Result<()> {
/// let dev = Device::get(0)?;
/// let stream = Stream::new(&dev)?;
/// let ring = PinnedRing::new(4, 1 << 20, &PinBudget::new(64 << 20))?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 16 << 20)?;
/// for i in 0..16 {
///     let full = ring.acquire()?.fill_with(|buf| { buf.fill(i as u8); Ok(buf.len()) })?;
///     let mut part = dst.slice_mut(i << 20..(i + 1) << 20)?;
///     drop(full.copy_to_device(&stream, &mut part)?); // back to the ring, reused once copied
/// }
/// ring.drain()?;
/// assert_eq!(ring.allocations(), 4); // never more than the slots
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PinnedRing {
    inner: Arc<RingInner>,
}

struct RingInner {
    slots: usize,
    slot_bytes: usize,
    allocations: AtomicU64,
    state: Mutex<RingState>,
    returned: Condvar,
    reservation: Reservation,
    /// The budget for the alignment slack of slots that needed it (see `alloc_slot`).
    slack: Vec<Reservation>,
}

#[derive(Default)]
struct RingState {
    free: Vec<Slot>,
    in_flight: VecDeque<Slot>,
}

struct Slot {
    index: usize,
    /// The pinned block; the slot is its `slot_bytes` from `off` (page-aligned).
    buf: PinnedBuffer<u8>,
    off: usize,
    /// Events made on demand, one per device and concurrent use; kept for reuse.
    events: Vec<(Device, Event)>,
    /// Indices into `events` recorded after the copies now in flight.
    recorded: Vec<usize>,
    /// Bytes of the last submitted copy, not yet reported complete.
    unreported: u64,
}

/// One slot's pinned block and the offset of its page-aligned start.
/// `cudaHostAlloc` does not promise page alignment (small blocks come from a
/// pool, aligned to a few hundred bytes), and `O_DIRECT` reads need it. A block
/// that is not aligned is given back and one `page - 1` bytes larger is taken
/// instead (from then on for every slot: `*pad`), its slack drawn from `budget`
/// into `slack`, and the slot starts at its first page boundary.
fn alloc_slot(
    bytes: usize,
    budget: &PinBudget,
    slack: &mut Vec<Reservation>,
    pad: &mut bool,
) -> Result<(PinnedBuffer<u8>, usize)> {
    let page = page_size() as usize;
    let flags = PinnedFlags { portable: true, ..Default::default() };
    if !*pad {
        let buf = PinnedBuffer::<u8>::with_flags(bytes, flags)?;
        if buf.as_ptr().align_offset(page) == 0 {
            return Ok((buf, 0));
        }
        drop(buf);
        *pad = true;
    }
    let padded = bytes
        .checked_add(page - 1)
        .ok_or_else(|| Error::invalid("PinnedRing::new", "slot_bytes + a page overflows"))?;
    slack.push(budget.reserve((page - 1) as u64)?);
    let buf = PinnedBuffer::<u8>::with_flags(padded, flags)?;
    let off = buf.as_ptr().align_offset(page);
    debug_assert!(off < page);
    Ok((buf, off))
}

impl Slot {
    /// Waits for the copies in flight: their events, then the buffer's fence
    /// (immediate after the events; the fallback when an event could not be recorded).
    fn wait(&mut self) -> Result<u64> {
        for &i in &self.recorded {
            if let Some((_, ev)) = self.events.get(i) {
                ev.synchronize()?;
            }
        }
        self.recorded.clear();
        self.buf.as_mut_slice()?;
        Ok(std::mem::take(&mut self.unreported))
    }

    fn is_complete(&self) -> Result<bool> {
        for &i in &self.recorded {
            if let Some((_, ev)) = self.events.get(i)
                && !ev.query()?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records one event per stream (after the copies given to it).
    fn record(&mut self, streams: &[&Stream]) -> Result<()> {
        self.recorded.clear();
        let mut first_err = None;
        for s in streams {
            let dev = s.device();
            let idx = match (0..self.events.len()).find(|i| self.events[*i].0 == dev && !self.recorded.contains(i)) {
                Some(i) => i,
                None => match Event::new(&dev, EventOptions { timing: false, blocking_sync: true }) {
                    Ok(e) => {
                        self.events.push((dev, e));
                        self.events.len() - 1
                    }
                    Err(e) => {
                        first_err.get_or_insert(e.into());
                        continue;
                    }
                },
            };
            match s.record(&self.events[idx].1) {
                Ok(()) => self.recorded.push(idx),
                Err(e) => {
                    first_err.get_or_insert(e.into());
                }
            }
        }
        // Streams without an event are still covered: the buffer's fence
        // records every copy, and `wait` ends with it.
        first_err.map_or(Ok(()), Err)
    }
}

impl std::fmt::Debug for PinnedRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.inner.state);
        f.debug_struct("PinnedRing")
            .field("slots", &self.inner.slots)
            .field("slot_bytes", &self.inner.slot_bytes)
            .field("free", &st.free.len())
            .field("in_flight", &st.in_flight.len())
            .finish()
    }
}

impl PinnedRing {
    /// Allocates `slots` pinned slots of `slot_bytes` each (portable: usable by
    /// every device), drawing `slots * slot_bytes` from `budget`. This is the
    /// ring's only allocation. Each slot starts on a page boundary (fit for
    /// `O_DIRECT`): where `cudaHostAlloc` hands out a block that does not (small
    /// sizes on a real GPU), each slot's block is a page larger, and that slack
    /// is drawn from `budget` too.
    ///
    /// ```no_run
    /// let ring = wirespeed_pinned::PinnedRing::new(8, 16 << 20, &wirespeed_pinned::PinBudget::new(1 << 30))?;
    /// assert_eq!((ring.slots(), ring.slot_bytes()), (8, 16 << 20));
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero sizes, [`Error::BudgetExceeded`], and
    /// `cudaHostAlloc`'s error. On error nothing stays allocated or drawn.
    pub fn new(slots: usize, slot_bytes: usize, budget: &PinBudget) -> Result<PinnedRing> {
        if slots == 0 || slot_bytes == 0 {
            return Err(Error::invalid(
                "PinnedRing::new",
                format!("{slots} slots of {slot_bytes} bytes: both must be > 0"),
            ));
        }
        let total = (slots as u64)
            .checked_mul(slot_bytes as u64)
            .ok_or_else(|| Error::invalid("PinnedRing::new", "slots * slot_bytes overflows"))?;
        let reservation = budget.reserve(total)?;
        let allocations = AtomicU64::new(0);
        let mut free = Vec::with_capacity(slots);
        let (mut slack, mut pad) = (Vec::new(), false);
        for index in 0..slots {
            let (buf, off) = alloc_slot(slot_bytes, budget, &mut slack, &mut pad)?;
            allocations.fetch_add(1, Ordering::Relaxed);
            free.push(Slot { index, buf, off, events: Vec::new(), recorded: Vec::new(), unreported: 0 });
        }
        free.reverse(); // hand out slot 0 first
        Ok(PinnedRing {
            inner: Arc::new(RingInner {
                slots,
                slot_bytes,
                allocations,
                state: Mutex::new(RingState { free, in_flight: VecDeque::with_capacity(slots) }),
                returned: Condvar::new(),
                reservation,
                slack,
            }),
        })
    }

    /// The number of slots.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.slots(), 3);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// The size of each slot in bytes.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.slot_bytes(), 4096);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn slot_bytes(&self) -> usize {
        self.inner.slot_bytes
    }

    /// Bytes this ring draws from its budget: `slots * slot_bytes`, plus the
    /// alignment slack of slots whose block `cudaHostAlloc` did not page-align
    /// (see [`PinnedRing::new`]).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 1 << 20, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert!(ring.pinned_bytes() >= 3 << 20);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn pinned_bytes(&self) -> u64 {
        self.inner.reservation.bytes() + self.inner.slack.iter().map(Reservation::bytes).sum::<u64>()
    }

    /// Pinned allocations this ring has made: equal to [`PinnedRing::slots`]
    /// after start-up, and it never grows.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.allocations(), 3);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn allocations(&self) -> u64 {
        self.inner.allocations.load(Ordering::Relaxed)
    }

    /// Slots free now (not counting in-flight ones whose copies may have finished).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let s = ring.acquire()?;
    /// assert_eq!(ring.free_slots(), 2);
    /// # drop(s); Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn free_slots(&self) -> usize {
        lock(&self.inner.state).free.len()
    }

    /// Slots whose copies were submitted and not yet waited for.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.in_flight_slots(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn in_flight_slots(&self) -> usize {
        lock(&self.inner.state).in_flight.len()
    }

    /// A free slot: a never-used or completed one at once, else the oldest
    /// in-flight slot once its copies completed (waiting on its events, without
    /// spinning), else it blocks until another thread gives a slot back.
    ///
    /// A thread holding every slot of the ring and asking for one more waits
    /// forever: use [`PinnedRing::try_acquire`] or [`PinnedRing::acquire_timeout`] then.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(2, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut slot = ring.acquire()?;
    /// slot.as_mut_slice()?[0] = 1;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// CUDA's error while waiting for a copy (the slot then stays in flight).
    pub fn acquire(&self) -> Result<FreeSlot> {
        self.acquire_until(None).and_then(|s| s.ok_or_else(|| Error::invalid("PinnedRing::acquire", "no slot")))
    }

    /// A free slot if one is free or in flight now, else `None` (never blocks on
    /// other threads; may wait for the oldest in-flight copy).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let a = ring.try_acquire()?.expect("one slot");
    /// assert!(ring.try_acquire()?.is_none());
    /// # drop(a); Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRing::acquire`].
    pub fn try_acquire(&self) -> Result<Option<FreeSlot>> {
        self.acquire_until(Some(Instant::now()))
    }

    /// As [`PinnedRing::acquire`], giving up with `None` after `timeout`.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let _a = ring.acquire()?;
    /// assert!(ring.acquire_timeout(std::time::Duration::from_millis(1))?.is_none());
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRing::acquire`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<FreeSlot>> {
        self.acquire_until(Some(Instant::now() + timeout))
    }

    fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<FreeSlot>> {
        let mut st = lock(&self.inner.state);
        loop {
            if let Some(slot) = st.free.pop() {
                return Ok(Some(FreeSlot::new(slot, &self.inner, 0)));
            }
            if let Some(mut slot) = st.in_flight.pop_front() {
                drop(st);
                return match slot.wait() {
                    Ok(done) => Ok(Some(FreeSlot::new(slot, &self.inner, done))),
                    Err(e) => {
                        self.inner.put_back_in_flight(slot, true);
                        Err(e)
                    }
                };
            }
            st = match deadline {
                None => self.inner.returned.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    self.inner.returned.wait_timeout(st, d - now).unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
            };
        }
    }

    /// Waits for every in-flight slot's copies and makes them free; returns the
    /// bytes of those copies (for progress accounting).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// ring.drain()?;
    /// assert_eq!(ring.in_flight_slots(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// CUDA's error while waiting; the slots not yet waited for stay in flight.
    pub fn drain(&self) -> Result<u64> {
        let mut done = 0;
        loop {
            let Some(mut slot) = lock(&self.inner.state).in_flight.pop_front() else { return Ok(done) };
            match slot.wait() {
                Ok(n) => {
                    done += n;
                    self.inner.put_free(slot);
                }
                Err(e) => {
                    self.inner.put_back_in_flight(slot, true);
                    return Err(e);
                }
            }
        }
    }
}

impl RingInner {
    fn put_free(&self, slot: Slot) {
        lock(&self.state).free.push(slot);
        self.returned.notify_one();
    }

    fn put_back_in_flight(&self, slot: Slot, front: bool) {
        {
            let mut st = lock(&self.state);
            if front {
                st.in_flight.push_front(slot);
            } else {
                st.in_flight.push_back(slot);
            }
        }
        self.returned.notify_one();
    }
}

/// A slot nobody uses: its last copies completed. The only way to write a slot.
/// Dropping it returns it to the ring's free list. Forgetting it loses the slot
/// and keeps the whole ring alive for the rest of the process (its slots, its
/// budget reservation, and the streams its slots' events were recorded on).
///
/// ```no_run
/// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// let full = ring.acquire()?.fill_with(|buf| { buf[..3].copy_from_slice(b"abc"); Ok(3) })?;
/// assert_eq!(full.data()?, b"abc");
/// # Ok::<(), wirespeed_pinned::Error>(())
/// ```
pub struct FreeSlot {
    slot: Option<Slot>,
    ring: Arc<RingInner>,
    completed: u64,
}

impl std::fmt::Debug for FreeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreeSlot").field("index", &self.index()).finish()
    }
}

impl FreeSlot {
    fn new(slot: Slot, ring: &Arc<RingInner>, completed: u64) -> FreeSlot {
        FreeSlot { slot: Some(slot), ring: Arc::clone(ring), completed }
    }

    fn take(&mut self) -> Result<Slot> {
        self.slot.take().ok_or_else(|| Error::invalid("FreeSlot", "the slot was already used"))
    }

    /// Which slot of the ring this is (0-based).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.index(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn index(&self) -> usize {
        self.slot.as_ref().map_or(usize::MAX, |s| s.index)
    }

    /// The slot's size in bytes.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.capacity(), 4096);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.ring.slot_bytes
    }

    /// Bytes of this slot's previous copy whose completion was observed in
    /// handing it out (0 when none): for progress accounting.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.completed_bytes(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn completed_bytes(&self) -> u64 {
        self.completed
    }

    /// The whole slot, writable (page-aligned: fit for `O_DIRECT` reads).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut s = ring.acquire()?;
    /// s.as_mut_slice()?.fill(7);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// CUDA's error if the buffer's fence had to wait (never after the ring's own wait).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        let n = self.ring.slot_bytes;
        match self.slot.as_mut() {
            Some(s) => Ok(&mut s.buf.as_mut_slice()?[s.off..s.off + n]),
            None => Err(Error::invalid("FreeSlot::as_mut_slice", "the slot was already used")),
        }
    }

    /// Marks bytes `data` of the slot as the content to copy.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut s = ring.acquire()?;
    /// s.as_mut_slice()?[..4].copy_from_slice(b"data");
    /// let full = s.fill(0..4)?;
    /// assert_eq!(full.len(), 4);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is not inside the slot.
    pub fn fill(mut self, data: Range<usize>) -> Result<FullSlot> {
        if data.start > data.end || data.end > self.ring.slot_bytes {
            return Err(Error::invalid(
                "FreeSlot::fill",
                format!("{data:?} is not inside a slot of {} bytes", self.ring.slot_bytes),
            ));
        }
        let slot = self.take()?;
        Ok(FullSlot { slot: Some(slot), ring: Arc::clone(&self.ring), data })
    }

    /// Fills the slot with `f`, which returns how many bytes (from the start) it wrote.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let full = ring.acquire()?.fill_with(|b| { b.fill(1); Ok(b.len()) })?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// `f`'s error (the slot goes back to the ring), or a length past the slot.
    pub fn fill_with(mut self, f: impl FnOnce(&mut [u8]) -> Result<usize>) -> Result<FullSlot> {
        let n = f(self.as_mut_slice()?)?;
        self.fill(0..n)
    }

    /// Copies `src` (e.g. part of a mapping) into the slot.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let file = unsafe { wirespeed_pinned::MappedFile::open("/data/train.bin") }?;
    /// let full = ring.acquire()?.copy_from(&file.as_bytes()[..4096])?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `src` is larger than the slot.
    pub fn copy_from(self, src: &[u8]) -> Result<FullSlot> {
        self.fill_with(|buf| match buf.get_mut(..src.len()) {
            Some(dst) => {
                dst.copy_from_slice(src);
                Ok(src.len())
            }
            None => Err(Error::invalid(
                "FreeSlot::copy_from",
                format!("{} bytes do not fit a slot of {}", src.len(), buf.len()),
            )),
        })
    }

    /// Reads `len` bytes of `file` at `offset` into the slot (`pread`).
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let file = unsafe { wirespeed_pinned::MappedFile::open("/data/train.bin") }?;
    /// let full = ring.acquire()?.read_from(&file, 0, 4096)?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::FileChanged`] when the file is shorter now, or a
    /// length past the slot.
    pub fn read_from(self, file: &crate::MappedFile, offset: u64, len: usize) -> Result<FullSlot> {
        use std::os::unix::fs::FileExt;
        self.fill_with(|buf| {
            let cap = buf.len();
            let dst = buf.get_mut(..len).ok_or_else(|| {
                Error::invalid("FreeSlot::read_from", format!("{len} bytes do not fit a slot of {cap}"))
            })?;
            file.file().read_exact_at(dst, offset).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::FileChanged {
                        path: file.path().to_path_buf(),
                        message: format!("it ended before byte {}", offset + len as u64),
                    }
                } else {
                    Error::io("pread", file.path(), e)
                }
            })?;
            Ok(len)
        })
    }
}

impl Drop for FreeSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.ring.put_free(slot);
        }
    }
}

/// A filled slot: the host may read it; the device gets it through
/// [`FullSlot::copy_to_device`] or [`FullSlot::submit`], which consume it.
/// Dropping it unused returns it to the free list. Forgetting it loses the slot
/// and keeps the whole ring alive for the rest of the process (its slots, its
/// budget reservation, and the streams its slots' events were recorded on).
///
/// ```no_run
/// # use wirespeed_cuda::*;
/// # fn main() -> wirespeed_pinned::Result<()> {
/// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
/// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 3)?;
/// let full = ring.acquire()?.copy_from(b"abc")?;
/// let in_flight = full.copy_to_device(&stream, &mut dst)?;
/// let free_again = in_flight.wait()?;
/// # drop(free_again); Ok(()) }
/// ```
pub struct FullSlot {
    slot: Option<Slot>,
    ring: Arc<RingInner>,
    data: Range<usize>,
}

impl std::fmt::Debug for FullSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullSlot").field("data", &self.data).finish()
    }
}

/// The filled bytes of a slot, as copy sources, inside [`FullSlot::submit`].
pub struct SlotSource<'a> {
    buf: &'a PinnedBuffer<u8>,
    data: Range<usize>,
}

impl SlotSource<'_> {
    /// The filled length.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when nothing was filled.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Filled bytes `r` (relative to the filled data) as a copy source.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>> {
        if r.start > r.end || r.end > self.data.len() {
            return Err(Error::invalid("SlotSource::slice", format!("{r:?} outside {} filled bytes", self.data.len())));
        }
        Ok(self.buf.slice(self.data.start + r.start..self.data.start + r.end)?)
    }

    /// All the filled bytes as a copy source.
    ///
    /// # Errors
    /// As [`SlotSource::slice`] (never in practice).
    pub fn all(&self) -> Result<PinnedSlice<'_, u8>> {
        self.slice(0..self.data.len())
    }
}

impl FullSlot {
    /// The number of filled bytes.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.copy_from(b"ab")?.len(), 2);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when nothing was filled.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert!(ring.acquire()?.fill(0..0)?.is_empty());
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The filled bytes, for the host to read.
    ///
    /// ```no_run
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.acquire()?.copy_from(b"ab")?.data()?, b"ab");
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// CUDA's error if the buffer's fence had to wait (never in practice).
    pub fn data(&self) -> Result<&[u8]> {
        match &self.slot {
            Some(s) => Ok(&s.buf.as_slice()?[s.off + self.data.start..s.off + self.data.end]),
            None => Err(Error::invalid("FullSlot::data", "the slot was already submitted")),
        }
    }

    /// Copies the filled bytes to `dst` (same length) on `stream`, records the
    /// slot's event after it, and hands the slot over as in flight.
    ///
    /// ```no_run
    /// # use wirespeed_cuda::*;
    /// # fn main() -> wirespeed_pinned::Result<()> {
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// drop(ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error, or a length or device mismatch. The slot still goes back
    /// to the ring as in flight (free once whatever was enqueued completed).
    pub fn copy_to_device(self, stream: &Stream, dst: &mut (impl DeviceSink<u8> + ?Sized)) -> Result<InFlightSlot> {
        self.submit(&[stream], |src| {
            stream.copy_to_device(&src.all()?, dst)?.detach();
            Ok(())
        })
    }

    /// Lets `enqueue` give the filled bytes to copies on `streams` (to several
    /// devices, or split into parts), then records one of the slot's events on
    /// each of `streams` and hands the slot over as in flight. Copies must go
    /// only to `streams` for the ring to wait on them precisely (others are still
    /// safe: the slot's fence covers every copy).
    ///
    /// ```no_run
    /// # use wirespeed_cuda::*;
    /// # fn main() -> wirespeed_pinned::Result<()> {
    /// # let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    /// # let (s0, s1) = (Stream::new(&d0)?, Stream::new(&d1)?);
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let (mut a, mut b) = (DeviceBuffer::<u8>::new(&d0, 2)?, DeviceBuffer::<u8>::new(&d1, 2)?);
    /// let full = ring.acquire()?.copy_from(b"ab")?;
    /// let in_flight = full.submit(&[&s0, &s1], |src| {
    ///     s0.copy_to_device(&src.all()?, &mut a)?.detach();
    ///     s1.copy_to_device(&src.all()?, &mut b)?.detach();
    ///     Ok(())
    /// })?;
    /// # drop(in_flight); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `enqueue`'s error or CUDA's error recording the events; the slot still
    /// goes back to the ring as in flight.
    pub fn submit(
        mut self,
        streams: &[&Stream],
        enqueue: impl FnOnce(&SlotSource<'_>) -> Result<()>,
    ) -> Result<InFlightSlot> {
        // From here on the slot is in flight, held as such: if `enqueue`
        // panics, unwinding drops the holder, which gives the slot back to the
        // ring as in flight (its fence covers whatever was enqueued), instead
        // of losing it.
        let mut in_flight = InFlightSlot { slot: self.slot.take(), ring: Arc::clone(&self.ring) };
        let Some(slot) = in_flight.slot.as_mut() else {
            return Err(Error::invalid("FullSlot::submit", "the slot was already submitted"));
        };
        let data = slot.off + self.data.start..slot.off + self.data.end;
        let res = enqueue(&SlotSource { buf: &slot.buf, data });
        // Recorded even when `enqueue` failed part-way: whatever it enqueued is covered.
        let rec = slot.record(streams);
        // Progress to report once the copies complete: none if they failed.
        slot.unreported = if res.is_ok() { self.data.len() as u64 } else { 0 };
        res?;
        rec?;
        Ok(in_flight)
    }
}

impl Drop for FullSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.ring.put_free(slot);
        }
    }
}

/// A slot whose copies were submitted: no access to its memory. Dropping it
/// returns it to the ring's in-flight queue, from which it is handed out again
/// only after its events completed; [`InFlightSlot::wait`] does that now.
///
/// Forgetting it (`mem::forget`) loses the slot, never soundness: its memory is
/// never freed (the copy may still read it), and the whole ring stays alive for
/// the rest of the process: its slots, its budget reservation, and the streams
/// its slots' events were recorded on (each event keeps its stream: the handle,
/// and on a GPU its place in the context).
pub struct InFlightSlot {
    slot: Option<Slot>,
    ring: Arc<RingInner>,
}

impl std::fmt::Debug for InFlightSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightSlot").field("index", &self.slot.as_ref().map(|s| s.index)).finish()
    }
}

impl InFlightSlot {
    /// True when its copies completed (asks the events, does not wait).
    ///
    /// ```no_run
    /// # use wirespeed_cuda::*;
    /// # fn main() -> wirespeed_pinned::Result<()> {
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// let f = ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?;
    /// while !f.is_complete()? {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error.
    pub fn is_complete(&self) -> Result<bool> {
        self.slot.as_ref().map_or(Ok(true), Slot::is_complete)
    }

    /// Waits for its copies (on its events, without spinning) and returns the
    /// slot free.
    ///
    /// ```no_run
    /// # use wirespeed_cuda::*;
    /// # fn main() -> wirespeed_pinned::Result<()> {
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// let free = ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?.wait()?;
    /// assert_eq!(free.completed_bytes(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error; the slot then goes back to the in-flight queue.
    pub fn wait(mut self) -> Result<FreeSlot> {
        let Some(mut slot) = self.slot.take() else {
            return Err(Error::invalid("InFlightSlot::wait", "no slot"));
        };
        match slot.wait() {
            Ok(done) => Ok(FreeSlot::new(slot, &self.ring, done)),
            Err(e) => {
                self.ring.put_back_in_flight(slot, true);
                Err(e)
            }
        }
    }
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.ring.put_back_in_flight(slot, false);
        }
    }
}
