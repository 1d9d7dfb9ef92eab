//! rows-ring-mt's copy: rows copied by several threads through one shared
//! `PinnedRing`, with a reserve thread that joins them when they are the
//! bound, as `auto`'s hybrid keeps one.
//!
//! Each ring thread takes the next row, copies it into a free slot (one
//! whose last copy's event completed: the ring decides) and enqueues the
//! slot's copy to the row's place. The reserve sleeps beside them and looks
//! every [`LOOK`] at the share of their time they spent waiting for free
//! slots: below [`ROOM`] the copy engine keeps up with them and has room
//! for more (they are the bound: the memcpy), and it joins as one more ring
//! thread. Where they wait longer, the copy engine is the bound, and one
//! more thread would only cost CPU. The first look comes once the threads
//! have gone round the ring (its slots start free), and a wait is counted
//! when it ends.

use crate::util::{Fatal, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use wirespeed_cuda::{DeviceBuffer, Stream};
use wirespeed_pinned::PinnedRing;

use super::ROW_BYTES;

/// The share of the ring threads' time waiting for free slots below which
/// the reserve joins (as `StreamConfig::reserve_room`'s default).
pub const ROOM: f64 = 0.10;

/// The span each look measures.
const LOOK: Duration = Duration::from_millis(10);

/// How often the reserve checks, while it sleeps, whether the rows are all taken.
const NAP: Duration = Duration::from_millis(1);

/// What one copy of the rows did: whether the reserve joined, and the share
/// of the ring threads' time they waited for free slots.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass {
    pub reserve_joined: bool,
    pub slot_wait_share: f64,
}

/// The rows, the ring and where the threads are.
struct Rows<'a> {
    ring: &'a PinnedRing,
    stream: &'a Stream,
    host: &'a [u8],
    dst: Mutex<&'a mut DeviceBuffer<u8>>,
    rows: usize,
    /// The next row to take.
    next: AtomicUsize,
    /// A thread failed: the others stop.
    stop: AtomicBool,
    /// Nanoseconds the threads spent waiting for free slots, and rows they
    /// enqueued.
    waited_ns: AtomicU64,
    done: AtomicU64,
}

impl Rows<'_> {
    /// Row `i`: into a free slot, and the slot's copy to its place enqueued.
    fn one(&self, i: usize) -> Result<()> {
        let range = i * ROW_BYTES..(i + 1) * ROW_BYTES;
        let t = Instant::now();
        let slot = self.ring.acquire()?;
        self.waited_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let full = slot.copy_from(&self.host[range.clone()])?;
        let mut d = self.dst.lock().unwrap_or_else(PoisonError::into_inner);
        drop(full.copy_to_device(self.stream, &mut d.slice_mut(range)?)?); // back to the ring, free once copied
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A ring thread: rows until none is left (or another thread failed).
    fn ring_thread(&self) -> Result<()> {
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.rows {
                break;
            }
            if let Err(e) = self.one(i) {
                self.stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Rows are left to take, and no thread failed.
    fn open(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && self.next.load(Ordering::Relaxed) < self.rows
    }

    /// Sleeps `span` in naps; false once no row is left to take.
    fn nap(&self, span: Duration) -> bool {
        let end = Instant::now() + span;
        while Instant::now() < end {
            if !self.open() {
                return false;
            }
            std::thread::sleep(NAP);
        }
        self.open()
    }

    /// The reserve: once the ring threads have gone round the ring, looks
    /// every [`LOOK`] until the `planned` ring threads
    /// waited for free slots less than [`ROOM`] of their time while rows
    /// were enqueued, then joins as a ring thread. Answers whether it joined.
    fn reserve(&self, planned: usize) -> Result<bool> {
        // The slots start free: the threads wait for none until they have
        // gone round the ring once.
        while self.done.load(Ordering::Relaxed) < self.ring.slots() as u64 {
            if !self.nap(NAP) {
                return Ok(false);
            }
        }
        let snapshot = || (Instant::now(), self.waited_ns.load(Ordering::Relaxed), self.done.load(Ordering::Relaxed));
        let mut before = snapshot();
        loop {
            if !self.nap(LOOK) {
                return Ok(false);
            }
            let now = snapshot();
            let thread_seconds = now.0.duration_since(before.0).as_secs_f64() * planned.max(1) as f64;
            let waited = (now.1 - before.1) as f64 / 1e9;
            if has_room(now.2 > before.2, waited, thread_seconds) {
                break;
            }
            before = now;
        }
        self.ring_thread()?;
        Ok(true)
    }
}

/// Whether the ring threads left the copy engine room: they enqueued rows
/// over a span of `thread_seconds` (its length times the threads) while
/// waiting for free slots less than [`ROOM`] of it.
fn has_room(moved: bool, waited: f64, thread_seconds: f64) -> bool {
    moved && waited < ROOM * thread_seconds
}

/// Copies `rows` rows of `host` to their places in `dst` with `threads`
/// ring threads and a reserve thread through `ring`, their copies on
/// `stream` (one thread at a time enqueues: the destination is shared);
/// then waits for every copy.
pub fn ring_rows(
    ring: &PinnedRing,
    stream: &Stream,
    host: &[u8],
    dst: &mut DeviceBuffer<u8>,
    rows: usize,
    threads: usize,
) -> Result<Pass> {
    let x = Rows {
        ring,
        stream,
        host,
        dst: Mutex::new(dst),
        rows,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        waited_ns: AtomicU64::new(0),
        done: AtomicU64::new(0),
    };
    let planned = threads.max(1);
    let t0 = Instant::now();
    let (results, joined) = std::thread::scope(|s| {
        let ring_threads: Vec<_> = (0..planned).map(|_| s.spawn(|| x.ring_thread())).collect();
        let reserve = s.spawn(|| x.reserve(planned));
        let panicked = || Err(Fatal::Run("a row thread panicked".into()));
        let results: Vec<Result<()>> =
            ring_threads.into_iter().map(|h| h.join().unwrap_or_else(|_| panicked())).collect();
        (results, reserve.join().unwrap_or_else(|_| panicked().map(|()| false)))
    });
    let wall = t0.elapsed().as_secs_f64() * planned as f64;
    let drained = ring.drain();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let reserve_joined = joined?;
    drained?;
    stream.synchronize()?;
    let slot_wait_share = x.waited_ns.load(Ordering::Relaxed) as f64 / 1e9 / wall.max(1e-12);
    Ok(Pass { reserve_joined, slot_wait_share })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_joins_when_the_threads_seldom_wait_for_slots() {
        // 8 threads over 10 ms: 80 ms of thread time.
        assert!(has_room(true, 0.004, 0.080), "5 %: the memcpy is the bound");
        assert!(!has_room(true, 0.012, 0.080), "15 %: the copy engine is the bound");
        assert!(!has_room(false, 0.0, 0.080), "no row enqueued: nothing to judge by");
    }
}
