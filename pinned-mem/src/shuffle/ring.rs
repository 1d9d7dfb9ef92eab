//! [`Way::Ring`](super::Way::Ring): CPU threads gather batches' records into
//! pinned slots ahead of the caller, and each batch's slots are copied to it.
//!
//! Each thread owns a ring of up to four slots and works through the batches
//! it is asked for, in order: for each, it computes the records of its share
//! of the batch's positions (the epoch's permutation, as [`FullOrder`] gives
//! them), copies them into its slots (several arrays' records packed into one
//! slot where they fit) and hands each filled slot to the loader. The loader
//! asks for the batch it hands out and up to three after it (the next epoch's
//! first ones at an epoch's end), so the threads gather while the caller is
//! elsewhere; [`RingGather::gather`] then only takes the batch's filled slots
//! and enqueues their copies. A slot is filled again only once its copy
//! completed (the ring waits on the slot's event), so a thread keeps a slot
//! more than the batches it is asked for ahead: it fills the next batch's
//! while the last one handed out still copies. A slot holds a thread's share
//! of a batch (at most 4 MiB, or one record where records are wider), so the
//! slots cost little pinned memory.
//!
//! Work asked for belongs to a generation: when the loader hands out another
//! batch than the one asked for first (a seek, another epoch, a retry after
//! an error), the generation moves on, the threads drop what they were
//! asked for before, and the slots they filled for it go back to their rings
//! uncopied.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use wirespeed_cuda::{Device, DeviceSliceMut, Stream};

use super::config::LoaderConfig;
use super::order::Sharding;
use super::plan::FullOrder;
use super::records::Records;
use crate::error::{Error, Result};
use crate::hint::prefetch;
use crate::ring::{FreeSlot, FullSlot, PinnedRing};

/// Bytes of a slot of the ring.
const SLOT_BYTES: u64 = 4 << 20;

/// Slots of each thread's ring, where the pin budget holds them.
const SLOTS: usize = 4;

/// Slots of each thread's ring on a small pin budget: one being filled while
/// one copies.
const LEAST_SLOTS: usize = 2;

/// Batches asked for past the one being handed out, at most: one slot fewer
/// than a thread's, so the next batch's share has a slot while the batch
/// handed out last still copies.
const DEPTH: usize = SLOTS - 1;

/// A batch of an epoch: what the threads are asked to gather.
type Batch = (u64, u64);

/// A batch to gather, of generation `generation`.
#[derive(Clone, Copy)]
struct Job {
    generation: u64,
    batch: Batch,
    order: FullOrder,
}

/// Records of one array in a filled slot: `count` records from position
/// `first` of the batch, at byte `at` of the slot.
struct Part {
    array: usize,
    first: usize,
    count: usize,
    at: usize,
}

/// What a thread hands the loader about a batch.
enum What {
    /// A filled slot and what it holds.
    Slot(FullSlot, Vec<Part>),
    /// Every slot of the thread's share was handed over.
    Done,
    /// The share could not be gathered.
    Failed(Error),
}

struct Message {
    generation: u64,
    batch: Batch,
    what: What,
}

/// One gathering thread: it lives as long as the loader, so that a batch
/// costs no thread start.
struct Gatherer {
    jobs: Option<mpsc::Sender<Job>>,
    filled: mpsc::Receiver<Message>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct RingGather {
    gatherers: Vec<Gatherer>,
    /// The generation the loader takes slots of; the threads drop older work.
    generation: u64,
    current: Arc<AtomicU64>,
    /// Batches asked for in this generation and not taken yet, in order.
    asked: VecDeque<Batch>,
    /// Batches asked for past the one being handed out.
    depth: usize,
    cut: Sharding,
    seed: u64,
    shuffle: bool,
}

impl RingGather {
    pub(crate) fn new(device: &Device, arrays: &[Records], cut: Sharding, config: &LoaderConfig) -> Result<RingGather> {
        let widest = arrays.iter().map(Records::record_bytes).max().unwrap_or(1);
        let packed = arrays.iter().map(Records::record_bytes).fold(0u64, u64::saturating_add);
        let budget = config.pin_budget.available();
        // The most threads (at most `ring_threads`) whose LEAST_SLOTS slots
        // hold a record; each slot a thread's share of a batch (all arrays
        // packed), at most SLOT_BYTES, or what the budget allows; and up to
        // SLOTS slots where the budget holds more of that size.
        let page = crate::util::page_size();
        let share_bytes = |threads: u64| cut.batch_size().div_ceil(threads).max(1).saturating_mul(packed);
        // A slot holds at least one record, however wide.
        let most = SLOT_BYTES.max(widest.div_ceil(page).saturating_mul(page));
        // (A slot may draw a page more from the budget, to align it.)
        let fit = |threads: u64, slots: u64| {
            ((budget / slots.saturating_mul(threads)).saturating_sub(page) / page * page)
                .min(most)
                .min(share_bytes(threads))
        };
        let (threads, slots) = (1..=config.ring_threads.clamp(1, 256) as u64)
            .rev()
            .find(|&t| fit(t, LEAST_SLOTS as u64) >= widest)
            .map(|t| {
                let most = (LEAST_SLOTS..=SLOTS).rev().find(|&s| fit(t, s as u64) == fit(t, LEAST_SLOTS as u64));
                (t, most.unwrap_or(LEAST_SLOTS))
            })
            .ok_or_else(|| {
                Error::invalid(
                    "Loader (ring)",
                    format!(
                        "a pin budget of {budget} bytes holds no two slots of a {widest}-byte record: raise the pin budget"
                    ),
                )
            })?;
        let bytes = fit(threads, slots as u64);
        // A whole share in one slot, else as many of the widest records as fit.
        let bytes = if bytes == share_bytes(threads) { bytes } else { bytes / widest * widest };
        let slot =
            usize::try_from(bytes).map_err(|_| Error::invalid("Loader (ring)", "a record larger than memory"))?;
        let threads = threads as usize;
        device.make_current()?;
        // Every ring first: an allocation that fails leaves no thread behind.
        let rings =
            (0..threads).map(|_| PinnedRing::new(slots, slot, &config.pin_budget)).collect::<Result<Vec<_>>>()?;
        let share = cut.batch_size().div_ceil(threads as u64) as usize;
        // Batches whose shares fit the slots but one (kept for the copy in flight).
        let depth = ((slots - 1) / slots_of(arrays, share, slot).max(1)).clamp(1, DEPTH);
        let path = arrays.first().map(|a| a.file().path().to_path_buf()).unwrap_or_default();
        let current = Arc::new(AtomicU64::new(0));
        let mut gather = RingGather {
            gatherers: Vec::with_capacity(threads),
            generation: 0,
            current: Arc::clone(&current),
            asked: VecDeque::new(),
            depth,
            cut,
            seed: config.seed,
            shuffle: config.shuffle,
        };
        for (i, ring) in rings.into_iter().enumerate() {
            let (jobs, jobs_rx) = mpsc::channel::<Job>();
            let (filled_tx, filled) = mpsc::channel::<Message>();
            let worker =
                Worker { index: i, threads, ring, arrays: arrays.to_vec(), cut, current: Arc::clone(&current) };
            let thread = std::thread::Builder::new()
                .name(format!("wirespeed-gather-{i}"))
                .spawn(move || worker.run(&jobs_rx, &filled_tx))
                .map_err(|e| Error::io("starting a gather thread for", path.clone(), e))?;
            gather.gatherers.push(Gatherer { jobs: Some(jobs), filled, thread: Some(thread) });
        }
        Ok(gather)
    }

    /// Keeps what was gathered ahead if batch `batch` of epoch `epoch` is
    /// the next asked for; else drops it (the order changed under it).
    pub(crate) fn seek(&mut self, epoch: u64, batch: u64) {
        if self.asked.front() != Some(&(epoch, batch)) {
            self.discard();
        }
    }

    /// Drops every batch asked for: the threads leave them, and their slots
    /// go back to the threads' rings without a copy.
    fn discard(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.current.store(self.generation, Ordering::Release);
        self.asked.clear();
        for g in &self.gatherers {
            while g.filled.try_recv().is_ok() {}
        }
    }

    /// Asks every thread for its share of `batch`.
    fn ask(&mut self, batch: Batch) {
        let order = FullOrder::new(self.cut, self.seed, batch.0, self.shuffle);
        let job = Job { generation: self.generation, batch, order };
        for g in &self.gatherers {
            // A thread that ended is found when its share is taken.
            if let Some(tx) = &g.jobs {
                let _ = tx.send(job);
            }
        }
        self.asked.push_back(batch);
    }

    /// The batch after `b`: the next of its epoch, or the next epoch's first.
    fn after(&self, (epoch, b): Batch) -> Option<Batch> {
        if b + 1 < self.cut.batches() {
            Some((epoch, b + 1))
        } else if self.cut.batches() > 0 {
            epoch.checked_add(1).map(|e| (e, 0))
        } else {
            None
        }
    }

    /// Copies batch `b` of epoch `epoch` (as the loader's order gives it) into
    /// `dsts` on `stream`: takes the slots the threads filled for it (asking
    /// for it first if it was not asked for), enqueues each slot's copy into
    /// its part of the batch, and asks for the batches after it. On an error
    /// whatever was asked for is dropped.
    pub(crate) fn gather(
        &mut self,
        stream: &Stream,
        arrays: &[Records],
        epoch: u64,
        b: u64,
        dsts: &mut [DeviceSliceMut<'_, u8>],
    ) -> Result<()> {
        if self.asked.front() != Some(&(epoch, b)) {
            self.discard();
            self.ask((epoch, b));
        }
        if let Err(e) = self.take(stream, arrays, (epoch, b), dsts) {
            self.discard();
            return Err(e);
        }
        self.asked.pop_front();
        let mut last = self.asked.back().copied().unwrap_or((epoch, b));
        while self.asked.len() < self.depth {
            let Some(next) = self.after(last) else { break };
            self.ask(next);
            last = next;
        }
        Ok(())
    }

    fn take(
        &self,
        stream: &Stream,
        arrays: &[Records],
        batch: Batch,
        dsts: &mut [DeviceSliceMut<'_, u8>],
    ) -> Result<()> {
        let ended = || Error::WorkerPanicked { message: "a ring gather thread ended: make a new loader".into() };
        for g in &self.gatherers {
            loop {
                let m = g.filled.recv().map_err(|_| ended())?;
                if m.generation != self.generation || m.batch != batch {
                    continue; // dropped work: its slot goes back uncopied
                }
                match m.what {
                    What::Slot(full, parts) => {
                        // The in-flight slot goes back to its ring, reused once copied.
                        drop(full.submit(&[stream], |src| {
                            for p in &parts {
                                let rec = arrays.get(p.array).map_or(0, |a| a.record_bytes() as usize);
                                let (len, at) = (p.count * rec, p.first * rec);
                                let dst = dsts
                                    .get_mut(p.array)
                                    .ok_or_else(|| Error::invalid("Loader (ring)", "no destination"))?;
                                stream
                                    .copy_to_device(&src.slice(p.at..p.at + len)?, &mut dst.slice_mut(at..at + len)?)?
                                    .detach();
                            }
                            Ok(())
                        })?);
                    }
                    What::Done => break,
                    What::Failed(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

impl Drop for RingGather {
    fn drop(&mut self) {
        self.current.store(self.generation.wrapping_add(1), Ordering::Release); // the threads leave their work
        for g in &mut self.gatherers {
            drop(g.jobs.take()); // its thread's loop ends
        }
        for g in &mut self.gatherers {
            // Drops the slots it filled (a thread may wait for them) until it ends.
            while g.filled.recv().is_ok() {}
            if let Some(t) = g.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Slots a thread's share of `share` records fills, the arrays packed.
fn slots_of(arrays: &[Records], share: usize, slot: usize) -> usize {
    let (mut slots, mut used) = (1, 0);
    for a in arrays {
        let rec = a.record_bytes() as usize;
        let mut left = share;
        while left > 0 && rec > 0 && rec <= slot {
            let room = (slot - used) / rec;
            if room == 0 {
                slots += 1;
                used = 0;
                continue;
            }
            let take = room.min(left);
            used += take * rec;
            left -= take;
        }
    }
    slots
}

/// What a gathering thread holds.
struct Worker {
    index: usize,
    threads: usize,
    ring: PinnedRing,
    arrays: Vec<Records>,
    cut: Sharding,
    current: Arc<AtomicU64>,
}

/// A slot being filled, and what it holds so far.
struct Filling {
    slot: FreeSlot,
    parts: Vec<Part>,
    used: usize,
}

impl Worker {
    fn run(&self, jobs: &mpsc::Receiver<Job>, filled: &mpsc::Sender<Message>) {
        let mut records = Vec::new();
        for job in jobs {
            if job.generation != self.current.load(Ordering::Acquire) {
                continue;
            }
            let what = match std::panic::catch_unwind(AssertUnwindSafe(|| self.gather(&job, &mut records, filled))) {
                Ok(Ok(true)) => What::Done,
                Ok(Ok(false)) => continue, // left, or the loader is gone
                Ok(Err(e)) => What::Failed(e),
                Err(_) => What::Failed(Error::WorkerPanicked { message: "a ring gather thread".into() }),
            };
            if filled.send(Message { generation: job.generation, batch: job.batch, what }).is_err() {
                break;
            }
        }
    }

    /// Gathers this thread's share of the job's batch (its positions
    /// `index * share .. (index + 1) * share`) into slots, handing each over
    /// once filled. Returns false when the job was dropped on the way.
    fn gather(&self, job: &Job, records: &mut Vec<u64>, filled: &mpsc::Sender<Message>) -> Result<bool> {
        let positions = self.cut.batch(job.batch.1);
        let n = (positions.end - positions.start) as usize;
        let share = n.div_ceil(self.threads.max(1));
        let (lo, hi) = ((self.index * share).min(n), ((self.index + 1) * share).min(n));
        let (first, perm) = job.order.kernel_params(job.batch.1);
        records.clear();
        records.extend((first + lo as u64..first + hi as u64).map(|p| perm.at(self.cut.unpad(p))));
        let send = |f: Filling| -> Result<bool> {
            let full = f.slot.fill(0..f.used)?;
            let m = Message { generation: job.generation, batch: job.batch, what: What::Slot(full, f.parts) };
            Ok(filled.send(m).is_ok())
        };
        let cap = self.ring.slot_bytes();
        let mut cur: Option<Filling> = None;
        for (array, a) in self.arrays.iter().enumerate() {
            let rec = a.record_bytes() as usize;
            let mut k = 0;
            while k < records.len() {
                let mut f = match cur.take() {
                    Some(f) => f,
                    None => {
                        if job.generation != self.current.load(Ordering::Acquire) {
                            return Ok(false);
                        }
                        Filling { slot: self.ring.acquire()?, parts: Vec::new(), used: 0 }
                    }
                };
                let room = (cap - f.used) / rec.max(1);
                if room == 0 {
                    if f.used == 0 {
                        return Err(Error::invalid(
                            "Loader (ring)",
                            format!("a {rec}-byte record in a {cap}-byte slot"),
                        ));
                    }
                    if !send(f)? {
                        return Ok(false);
                    }
                    continue;
                }
                let take = room.min(records.len() - k);
                let buf = &mut f.slot.as_mut_slice()?[f.used..f.used + take * rec];
                copy_records(a, &records[k..], take, buf)?;
                f.parts.push(Part { array, first: lo + k, count: take, at: f.used });
                f.used += take * rec;
                k += take;
                cur = Some(f);
            }
        }
        match cur {
            Some(f) => send(f),
            None => Ok(true),
        }
    }
}

/// Records ahead of the one being copied whose first bytes are prefetched.
const AHEAD: usize = 4;

/// Copies the first `take` of `records` of `a` into `buf`, one after the
/// other. The records a few ahead (past `take` too: the next slot's) are
/// prefetched (their first line, and the first of their next page), so that
/// the page walks and misses of scattered records overlap the copies.
fn copy_records(a: &Records, records: &[u64], take: usize, buf: &mut [u8]) -> Result<()> {
    let bytes = a.file().as_bytes();
    let rec = a.record_bytes() as usize;
    let page = crate::util::page_size() as usize;
    for (k, (&r, out)) in records.iter().zip(buf.chunks_exact_mut(rec)).take(take).enumerate() {
        if let Some(&ahead) = records.get(k + AHEAD) {
            let at = a.range(ahead).start as usize;
            prefetch(bytes, at);
            let last = at + rec - 1;
            if last / page != at / page {
                prefetch(bytes, last / page * page);
            }
        }
        let at = a.range(r).start as usize;
        let src = bytes.get(at..at + rec).ok_or_else(|| Error::FileChanged {
            path: a.file().path().to_path_buf(),
            message: format!("record {r} lies past its end"),
        })?;
        out.copy_from_slice(src);
    }
    Ok(())
}
