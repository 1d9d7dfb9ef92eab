//! What a ring and its slot handles share: the slots (each a pinned block and
//! the events of its copies), the free list and the in-flight queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, Event, EventOptions, PinnedBuffer, PinnedFlags, Stream};

use crate::budget::{PinBudget, Reservation};
use crate::error::{Error, Result};
use crate::util::{Bytes, MAX_COUNT, MAX_SIZE, page_size};

/// The state shared by a ring's handles and its slot handles.
pub(super) struct RingInner {
    pub(super) slots: usize,
    pub(super) slot_bytes: usize,
    pub(super) allocations: AtomicU64,
    pub(super) state: Mutex<RingState>,
    /// Signalled when a slot comes back (free or in flight).
    pub(super) returned: Condvar,
    pub(super) reservation: Reservation,
    /// The budget for the alignment slack of slots that needed it (see `alloc_slot`).
    pub(super) slack: Vec<Reservation>,
}

#[derive(Default)]
pub(super) struct RingState {
    pub(super) free: Vec<Slot>,
    pub(super) in_flight: VecDeque<Slot>,
}

/// One slot of the ring.
pub(super) struct Slot {
    pub(super) index: usize,
    /// The pinned block; the slot is its `slot_bytes` from `off` (page-aligned).
    pub(super) buf: PinnedBuffer<u8>,
    pub(super) off: usize,
    /// Events made on demand, one per device and concurrent use; kept for reuse.
    events: Vec<(Device, Event)>,
    /// Indices into `events` recorded after the copies now in flight.
    recorded: Vec<usize>,
    /// Bytes of the last submitted copy, not yet reported complete.
    pub(super) unreported: u64,
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
    let flags = PinnedFlags::new().portable(true);
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

impl RingInner {
    /// Allocates `slots` free slots of `slot_bytes`, drawing them from `budget`
    /// (see [`PinnedRing::new`](crate::PinnedRing::new)).
    pub(super) fn new(slots: usize, slot_bytes: usize, budget: &PinBudget) -> Result<RingInner> {
        // Bounded before anything is sized by them (the slots' state) or drawn.
        if slots == 0 || slot_bytes == 0 || slots > MAX_COUNT || slot_bytes > MAX_SIZE {
            return Err(Error::invalid(
                "PinnedRing::new",
                format!(
                    "{slots} slots of {slot_bytes} bytes: give 1 to {MAX_COUNT} slots of 1 byte to {} each",
                    Bytes(MAX_SIZE as u64)
                ),
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
        Ok(RingInner {
            slots,
            slot_bytes,
            allocations,
            state: Mutex::new(RingState { free, in_flight: VecDeque::with_capacity(slots) }),
            returned: Condvar::new(),
            reservation,
            slack,
        })
    }

    pub(super) fn put_free(&self, slot: Slot) {
        lock(&self.state).free.push(slot);
        self.returned.notify_one();
    }

    /// Queues `slot` as in flight: at the `front` when it was the oldest
    /// (waiting for it failed), else at the back.
    pub(super) fn put_back_in_flight(&self, slot: Slot, front: bool) {
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

impl Slot {
    /// Waits for the copies in flight: their events, then the buffer's fence
    /// (immediate after the events; the fallback when an event could not be
    /// recorded). Returns the bytes of those copies.
    pub(super) fn wait(&mut self) -> Result<u64> {
        for &i in &self.recorded {
            if let Some((_, ev)) = self.events.get(i) {
                ev.synchronize()?;
            }
        }
        self.recorded.clear();
        self.buf.as_mut_slice()?;
        Ok(std::mem::take(&mut self.unreported))
    }

    pub(super) fn is_complete(&self) -> Result<bool> {
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
    pub(super) fn record(&mut self, streams: &[&Stream]) -> Result<()> {
        self.recorded.clear();
        let mut first_err = None;
        for s in streams {
            let dev = s.device();
            let idx = match (0..self.events.len()).find(|i| self.events[*i].0 == dev && !self.recorded.contains(i)) {
                Some(i) => i,
                None => match Event::new(&dev, EventOptions::new().blocking_sync(true)) {
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
