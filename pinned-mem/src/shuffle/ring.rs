//! [`Way::Ring`](super::Way::Ring): CPU threads gather each batch's records
//! into the pinned ring's slots, which are copied to the batch.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use wirespeed_cuda::{DetachedSliceMut, Device, DeviceSliceMut, Stream};

use super::config::LoaderConfig;
use super::records::Records;
use crate::error::{Error, Result};
use crate::hint::prefetch;
use crate::ring::PinnedRing;

/// Bytes of a slot of the ring.
const SLOT_BYTES: u64 = 4 << 20;

/// A run of records of one array, and the part of the batch it goes to.
type Run = (Vec<u64>, DetachedSliceMut<u8>);

/// A thread's share of a batch: runs of one array's records.
struct Share {
    records: Records,
    runs: Vec<Run>,
}

/// One gathering thread: it lives as long as the loader, so that a batch
/// costs no thread start.
struct Gatherer {
    shares: Option<mpsc::Sender<Share>>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct RingGather {
    ring: Arc<PinnedRing>,
    gatherers: Vec<Gatherer>,
    /// Each share's outcome, in the order they end.
    done: mpsc::Receiver<Result<()>>,
}

impl RingGather {
    pub(crate) fn new(device: &Device, arrays: &[Records], config: &LoaderConfig) -> Result<RingGather> {
        let widest = arrays.iter().map(Records::record_bytes).max().unwrap_or(1);
        let budget = config.pin_budget.available();
        // Two slots per thread, each of SLOT_BYTES or what the budget allows,
        // at least one record; fewer threads when the budget holds fewer slots.
        let page = crate::util::page_size();
        // (A slot may draw a page more from the budget, to align it.)
        let fit = |threads: u64| ((budget / (2 * threads)).saturating_sub(page) / page * page).min(SLOT_BYTES);
        let threads = (1..=config.ring_threads.clamp(1, 256) as u64).rev().find(|&t| fit(t) >= widest).ok_or_else(|| {
            Error::invalid(
                "Loader (ring)",
                format!("a pin budget of {budget} bytes holds no two slots of a {widest}-byte record: raise the pin budget"),
            )
        })?;
        let slot = usize::try_from(fit(threads) / widest * widest)
            .map_err(|_| Error::invalid("Loader (ring)", "a record larger than memory"))?;
        let threads = threads as usize;
        device.make_current()?;
        let ring = Arc::new(PinnedRing::new(2 * threads, slot, &config.pin_budget)?);
        let path = arrays.first().map(|a| a.file().path().to_path_buf()).unwrap_or_default();
        let (done_tx, done) = mpsc::channel();
        let mut gather = RingGather { ring, gatherers: Vec::with_capacity(threads), done };
        for i in 0..threads {
            let stream = Stream::new(device)?;
            let (tx, rx) = mpsc::channel::<Share>();
            let (ring, done_tx) = (Arc::clone(&gather.ring), done_tx.clone());
            let thread = std::thread::Builder::new()
                .name(format!("wirespeed-gather-{i}"))
                .spawn(move || {
                    for share in rx {
                        let r = std::panic::catch_unwind(AssertUnwindSafe(|| gather_share(&ring, share, &stream)))
                            .unwrap_or_else(|_| Err(Error::WorkerPanicked { message: "a ring gather thread".into() }));
                        if done_tx.send(r).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::io("starting a gather thread for", path.clone(), e))?;
            gather.gatherers.push(Gatherer { shares: Some(tx), thread: Some(thread) });
        }
        Ok(gather)
    }

    /// Gathers `records` of each array into its destination: the batch is
    /// cut into runs of records of a slot at most, one or more per thread,
    /// shared among the threads; returns once every run's copy is enqueued.
    pub(crate) fn gather(
        &self,
        arrays: &[Records],
        records: &[u64],
        dsts: &mut [DeviceSliceMut<'_, u8>],
    ) -> Result<()> {
        let threads = self.gatherers.len().max(1);
        let mut shares: Vec<Share> = Vec::with_capacity(threads * arrays.len());
        for (a, dst) in arrays.iter().zip(dsts.iter_mut()) {
            let rec = a.record_bytes() as usize;
            // Runs of a slot at most, and at least as many as threads, so
            // that every thread gathers a part of even a small batch.
            let per_thread = records.len().div_ceil(threads);
            let per_run = (self.ring.slot_bytes() / rec).min(per_thread).max(1);
            let first = shares.len();
            shares.extend((0..threads).map(|_| Share { records: a.clone(), runs: Vec::new() }));
            // Each run's part of the destination, detached: the threads write
            // them at once, and each slot's copy is fenced by its own event.
            for (i, part) in records.chunks(per_run).enumerate() {
                let at = i * per_run * rec;
                let run = (part.to_vec(), dst.slice_mut(at..at + part.len() * rec)?.detach());
                shares[first + i % threads].runs.push(run);
            }
        }
        let mut sent = 0;
        let mut first = Ok(());
        for (i, share) in shares.into_iter().filter(|s| !s.runs.is_empty()).enumerate() {
            match self.gatherers[i % threads].shares.as_ref().map(|tx| tx.send(share)) {
                Some(Ok(())) => sent += 1,
                _ => first = first.and(Err(Error::WorkerPanicked { message: "a ring gather thread ended".into() })),
            }
        }
        for _ in 0..sent {
            let r = self.done.recv().unwrap_or_else(|_| Err(Error::WorkerPanicked { message: "ring gather".into() }));
            first = first.and(r);
        }
        first
    }
}

impl Drop for RingGather {
    fn drop(&mut self) {
        for g in &mut self.gatherers {
            drop(g.shares.take()); // its thread's loop ends
        }
        for g in &mut self.gatherers {
            if let Some(t) = g.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Records ahead of the one being copied whose first bytes are prefetched.
const AHEAD: usize = 4;

/// Gathers a share's runs, each into a slot of the ring, and enqueues each
/// slot's copy to its part of the batch on `stream`. The records a few ahead
/// are prefetched (their first line, and the first of their next page), so
/// that the page walks and misses of scattered records overlap the copies.
fn gather_share(ring: &PinnedRing, share: Share, stream: &Stream) -> Result<()> {
    let a = &share.records;
    let bytes = a.file().as_bytes();
    let rec = a.record_bytes() as usize;
    let page = crate::util::page_size() as usize;
    for (part, mut dst) in share.runs {
        let full = ring.acquire()?.fill_with(|buf| {
            for (k, &r) in part.iter().enumerate() {
                if let Some(&ahead) = part.get(k + AHEAD) {
                    let at = a.range(ahead).start as usize;
                    prefetch(bytes, at);
                    let last = at + rec - 1;
                    if last / page != at / page {
                        prefetch(bytes, last / page * page);
                    }
                }
                let at = a.range(r).start as usize;
                buf[k * rec..(k + 1) * rec].copy_from_slice(&bytes[at..at + rec]);
            }
            Ok(part.len() * rec)
        })?;
        drop(full.copy_to_device(stream, &mut dst.slice_mut(..)?)?);
    }
    Ok(())
}
