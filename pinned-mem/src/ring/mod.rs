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
//! only for a slot whose last copies are known complete (their [`Event`](wirespeed_cuda::Event)s
//! synchronized). [`InFlightSlot`] gives no access to the memory at all.
//! Dropping any of them returns the slot to the ring (an in-flight one to the
//! in-flight queue). Forgetting one loses the slot (the ring has one fewer) and,
//! since each handle holds the ring's shared state, keeps the whole ring (its K
//! pinned slots and its budget reservation) alive for the rest of the process,
//! and with it every [`Stream`](wirespeed_cuda::Stream) its events were recorded on (an in-flight slot
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

mod inner;
mod slots;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wirespeed_cuda::locks::lock;

use crate::budget::{PinBudget, Reservation};
use crate::error::{Error, Result};
use inner::{RingInner, Slot};
pub use slots::{FreeSlot, FullSlot, InFlightSlot, SlotSource};

/// K pinned slots of `slot_bytes`, allocated once (`cudaHostAlloc`, portable)
/// and drawn from a [`PinBudget`]; producer threads fill free slots, a stream
/// copies full ones, and a slot is free again only once its copy's event has
/// completed. Cloning gives another handle to the same ring.
///
/// Every slot handle ([`FreeSlot`], [`FullSlot`], [`InFlightSlot`]) holds the
/// ring's shared state: forgetting one (`mem::forget`) keeps the whole ring
/// (its pinned slots and its budget reservation) alive for the rest of the
/// process, whatever happens to the `PinnedRing` handles, and with it every
/// [`Stream`](wirespeed_cuda::Stream) that the slots' events were recorded on (see the module docs).
/// Never unsound: nothing is freed under a copy.
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// use wirespeed_pinned::{PinBudget, PinnedRing};
/// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
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
/// assert_eq!(dst.to_vec()?[15 << 20], 15);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PinnedRing {
    inner: Arc<RingInner>,
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
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// let ring = wirespeed_pinned::PinnedRing::new(8, 1 << 20, &wirespeed_pinned::PinBudget::new(16 << 20))?;
    /// assert_eq!((ring.slots(), ring.slot_bytes()), (8, 1 << 20));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero sizes, more than 65536 slots or
    /// slots of more than 1 TiB (checked before anything is allocated),
    /// [`Error::BudgetExceeded`], and `cudaHostAlloc`'s error. On error nothing
    /// stays allocated or drawn.
    ///
    /// ```
    /// use wirespeed_pinned::{Error, PinBudget, PinnedRing};
    /// let e = PinnedRing::new(1 << 40, 4096, &PinBudget::unlimited()).unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    /// ```
    pub fn new(slots: usize, slot_bytes: usize, budget: &PinBudget) -> Result<PinnedRing> {
        Ok(PinnedRing { inner: Arc::new(RingInner::new(slots, slot_bytes, budget)?) })
    }

    /// The number of slots.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.slots(), 3);
    /// # Ok(()) }
    /// ```
    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// The size of each slot in bytes.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.slot_bytes(), 4096);
    /// # Ok(()) }
    /// ```
    pub fn slot_bytes(&self) -> usize {
        self.inner.slot_bytes
    }

    /// Bytes this ring draws from its budget: `slots * slot_bytes`, plus the
    /// alignment slack of slots whose block `cudaHostAlloc` did not page-align
    /// (see [`PinnedRing::new`]).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 1 << 20, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert!(ring.pinned_bytes() >= 3 << 20);
    /// # Ok(()) }
    /// ```
    pub fn pinned_bytes(&self) -> u64 {
        self.inner.reservation.bytes() + self.inner.slack.iter().map(Reservation::bytes).sum::<u64>()
    }

    /// Pinned allocations this ring has made: equal to [`PinnedRing::slots`]
    /// after start-up, and it never grows.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.allocations(), 3);
    /// # Ok(()) }
    /// ```
    pub fn allocations(&self) -> u64 {
        self.inner.allocations.load(Ordering::Relaxed)
    }

    /// Slots free now (not counting in-flight ones whose copies may have finished).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let s = ring.acquire()?;
    /// assert_eq!(ring.free_slots(), 2);
    /// # drop(s); Ok(()) }
    /// ```
    pub fn free_slots(&self) -> usize {
        lock(&self.inner.state).free.len()
    }

    /// Slots whose copies were submitted and not yet waited for.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(3, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// assert_eq!(ring.in_flight_slots(), 0);
    /// # Ok(()) }
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
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(2, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let mut slot = ring.acquire()?;
    /// slot.as_mut_slice()?[0] = 1;
    /// # Ok(()) }
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
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let a = ring.try_acquire()?.expect("one slot");
    /// assert!(ring.try_acquire()?.is_none());
    /// # drop(a); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRing::acquire`].
    pub fn try_acquire(&self) -> Result<Option<FreeSlot>> {
        self.acquire_until(Some(Instant::now()))
    }

    /// As [`PinnedRing::acquire`], giving up with `None` after `timeout` (one
    /// past the clock's range, such as `Duration::MAX`, never gives up).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let _a = ring.acquire()?;
    /// assert!(ring.acquire_timeout(std::time::Duration::from_millis(1))?.is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRing::acquire`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<FreeSlot>> {
        // A timeout past the clock's range waits as long as `acquire`.
        self.acquire_until(Instant::now().checked_add(timeout))
    }

    /// A free slot without waiting at all: one that is free, or the oldest in
    /// flight if its copies have completed (its events asked, not waited
    /// for); else `None`. For a thread that must stay responsive (to signals,
    /// say) and leaves waiting for slots to others.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_cuda::*;
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// let in_flight = ring.acquire_if_ready()?.expect("free").copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?;
    /// stream.synchronize()?;
    /// drop(in_flight); // back to the ring, its copy completed
    /// assert!(ring.acquire_if_ready()?.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error asking the events (the slot then stays in flight).
    pub fn acquire_if_ready(&self) -> Result<Option<FreeSlot>> {
        let mut st = lock(&self.inner.state);
        if let Some(slot) = st.free.pop() {
            return Ok(Some(FreeSlot::new(slot, &self.inner, 0)));
        }
        let Some(slot) = st.in_flight.pop_front() else {
            return Ok(None);
        };
        drop(st);
        self.reclaim(slot, |s| if s.is_complete()? { s.wait().map(Some) } else { Ok(None) })
    }

    /// `slot`, the oldest in flight (taken from the queue), free once `done`
    /// answers the bytes of its completed copies; back at the queue's front
    /// when it answers `None` (not completed) or fails.
    fn reclaim(&self, mut slot: Slot, done: impl FnOnce(&mut Slot) -> Result<Option<u64>>) -> Result<Option<FreeSlot>> {
        match done(&mut slot) {
            Ok(Some(bytes)) => Ok(Some(FreeSlot::new(slot, &self.inner, bytes))),
            other => {
                self.inner.put_back_in_flight(slot, true);
                other.map(|_| None)
            }
        }
    }

    fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<FreeSlot>> {
        let mut st = lock(&self.inner.state);
        loop {
            if let Some(slot) = st.free.pop() {
                return Ok(Some(FreeSlot::new(slot, &self.inner, 0)));
            }
            if let Some(slot) = st.in_flight.pop_front() {
                drop(st);
                return self.reclaim(slot, |s| s.wait().map(Some));
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
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let ring = wirespeed_pinned::PinnedRing::new(1, 4096, &wirespeed_pinned::PinBudget::unlimited())?;
    /// # use wirespeed_cuda::*;
    /// # let dev = Device::get(0)?; let stream = Stream::new(&dev)?;
    /// # let mut dst = DeviceBuffer::<u8>::new(&dev, 2)?;
    /// drop(ring.acquire()?.copy_from(b"ab")?.copy_to_device(&stream, &mut dst)?);
    /// assert_eq!(ring.drain()?, 2); // the bytes of the copies waited for
    /// assert_eq!(ring.in_flight_slots(), 0);
    /// # Ok(()) }
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
