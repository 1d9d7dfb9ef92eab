//! [`Way::Ring`](super::Way::Ring): CPU threads gather each batch's records
//! into the pinned ring's slots, which are copied to the batch.

use wirespeed_cuda::{DetachedSliceMut, Device, DeviceSliceMut, Stream};

use super::config::LoaderConfig;
use super::records::Records;
use crate::error::{Error, Result};
use crate::ring::PinnedRing;

/// Bytes of a slot of the ring.
const SLOT_BYTES: u64 = 4 << 20;

pub(crate) struct RingGather {
    ring: PinnedRing,
    /// One stream per thread.
    streams: Vec<Stream>,
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
        let ring = PinnedRing::new(2 * threads, slot, &config.pin_budget)?;
        let streams = (0..threads).map(|_| Stream::new(device)).collect::<wirespeed_cuda::Result<Vec<_>>>()?;
        Ok(RingGather { ring, streams })
    }

    /// Gathers `records` of each array into its destination: the batch is
    /// cut into slot-sized runs of records, shared among the threads.
    pub(crate) fn gather(
        &self,
        arrays: &[Records],
        records: &[u64],
        dsts: &mut [DeviceSliceMut<'_, u8>],
    ) -> Result<()> {
        for (a, dst) in arrays.iter().zip(dsts.iter_mut()) {
            let rec = a.record_bytes() as usize;
            let per_slot = (self.ring.slot_bytes() / rec).max(1);
            // Each run's part of the destination, detached: the threads write
            // them at once, and each thread's handle records what it enqueued.
            let mut chunks = Vec::new();
            for (i, part) in records.chunks(per_slot).enumerate() {
                let at = i * per_slot * rec;
                chunks.push((part, dst.slice_mut(at..at + part.len() * rec)?.detach()));
            }
            let threads = self.streams.len().min(chunks.len()).max(1);
            let mut lanes: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
            for (i, c) in chunks.into_iter().enumerate() {
                lanes[i % threads].push(c);
            }
            std::thread::scope(|s| -> Result<()> {
                let handles: Vec<_> = lanes
                    .into_iter()
                    .zip(&self.streams)
                    .map(|(lane, stream)| s.spawn(move || self.lane(a, lane, stream)))
                    .collect();
                let mut first = Ok(());
                for h in handles {
                    let r = h.join().unwrap_or_else(|_| Err(Error::WorkerPanicked { message: "ring gather".into() }));
                    first = first.and(r);
                }
                first
            })?;
        }
        Ok(())
    }

    fn lane(&self, a: &Records, lane: Vec<(&[u64], DetachedSliceMut<u8>)>, stream: &Stream) -> Result<()> {
        let bytes = a.file().as_bytes();
        let rec = a.record_bytes() as usize;
        for (part, mut dst) in lane {
            let full = self.ring.acquire()?.fill_with(|buf| {
                for (k, &r) in part.iter().enumerate() {
                    let at = a.range(r).start as usize;
                    buf[k * rec..(k + 1) * rec].copy_from_slice(&bytes[at..at + rec]);
                }
                Ok(part.len() * rec)
            })?;
            drop(full.copy_to_device(stream, &mut dst.slice_mut(..)?)?);
        }
        Ok(())
    }
}
