//! [`Way::Pool`](super::Way::Pool): blocks of the files streamed into two
//! halves of a pool in device memory, a group of blocks per half, the next
//! group streaming into one half while batches are drawn from the other.

use std::collections::VecDeque;

use wirespeed_cuda::{Device, DeviceBuffer, DeviceSlice};

use super::plan::{Drawn, Piece, PoolOrder, PoolShape};
use super::records::Records;
use crate::error::{Error, Result};
use crate::streamer::{Outcome, Streamer};

/// Bytes after each pool buffer, so that the gather kernel's aligned 16-byte
/// reads of a slot's last record stay inside the allocation.
pub(crate) const PAD: usize = 16;

/// The pool of every array (same records per slot, each its own buffer).
pub(crate) struct Pool {
    pub shape: PoolShape,
    pub buffers: Vec<DeviceBuffer<u8>>,
    /// Groups whose transfers were started and not yet waited for, oldest first.
    queued: VecDeque<(u64, Vec<Outcome>)>,
    /// The next group to start.
    next_group: u64,
    /// Groups whose transfers ended well: a batch may read them.
    landed: [Option<u64>; 2],
    pieces: Vec<Piece>,
    /// The report of the last transfer that landed, and how many of those
    /// so far ran chained to the one before.
    pub last: Option<crate::streamer::Report>,
    pub chained: u64,
    pub transfers: u64,
}

impl Pool {
    /// A pool of `2 * shape.slots` slots of `shape.block_records` records for each array.
    pub(crate) fn new(device: &Device, arrays: &[Records], shape: PoolShape) -> Result<Pool> {
        let mut buffers = Vec::with_capacity(arrays.len());
        for a in arrays {
            let bytes = slot_bytes(shape, a.record_bytes())
                .checked_mul(2 * shape.slots)
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| Error::invalid("shuffle pool", "the pool's size overflows"))?;
            buffers.push(DeviceBuffer::<u8>::new(device, bytes + PAD)?);
        }
        Ok(Pool {
            shape,
            buffers,
            queued: VecDeque::new(),
            next_group: 0,
            landed: [None, None],
            pieces: Vec::new(),
            last: None,
            chained: 0,
            transfers: 0,
        })
    }

    /// Forgets the epoch's groups (a new epoch, or a seek): what was started
    /// still lands, and the fences order the next transfers after it.
    pub(crate) fn reset(&mut self) -> Result<()> {
        self.drain()?;
        self.next_group = 0;
        self.landed = [None, None];
        Ok(())
    }

    /// Waits for every started transfer (at the end of an epoch, and on drop).
    pub(crate) fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some((_, outcomes)) = self.queued.pop_front() {
            for o in outcomes {
                if let Err(e) = o.wait() {
                    first = first.and(Err(e));
                }
            }
        }
        first
    }

    /// Makes the groups a batch reads (`groups`, one or two) readable.
    ///
    /// Batches read groups in order, so once a batch reads nothing before
    /// group `f = groups.start`, no later batch reads group `f - 1`: groups up
    /// to `f + 1` may stream (`f + 1` into the half of `f - 1`, the fences
    /// ordering its copies after the gathers that read that half), the next
    /// one streaming while this one is read. Then it waits for the
    /// transfers of `groups` and reports their errors.
    pub(crate) fn ensure(
        &mut self,
        streamer: &Streamer,
        arrays: &[Records],
        order: &PoolOrder,
        groups: std::ops::Range<u64>,
    ) -> Result<()> {
        let until = (groups.start + 2).min(order.groups());
        while self.next_group < until {
            self.start(streamer, arrays, order, self.next_group)?;
            self.next_group += 1;
        }
        for g in groups {
            while self.landed[(g % 2) as usize] != Some(g) {
                let Some((q, outcomes)) = self.queued.pop_front() else {
                    return Err(Error::invalid("shuffle pool", format!("group {g} was never streamed")));
                };
                for o in outcomes {
                    let r = o.wait()?;
                    self.transfers += 1;
                    self.chained += u64::from(r.chained);
                    self.last = Some(r);
                }
                self.landed[(q % 2) as usize] = Some(q);
            }
        }
        Ok(())
    }

    /// Starts streaming group `g`'s pieces into its half, in file order (so
    /// that the streamer runs them as one pass), every array in turn.
    fn start(&mut self, streamer: &Streamer, arrays: &[Records], order: &PoolOrder, g: u64) -> Result<()> {
        order.pieces(g, &mut self.pieces);
        let mut slots: Vec<(u64, Piece)> =
            self.pieces.iter().cloned().enumerate().map(|(i, p)| ((g % 2) * self.shape.slots + i as u64, p)).collect();
        slots.sort_by_key(|(_, p)| p.records.start);
        self.landed[(g % 2) as usize] = None;
        let mut outcomes = Vec::with_capacity(slots.len() * arrays.len());
        for (a, buf) in arrays.iter().zip(self.buffers.iter_mut()) {
            let sb = slot_bytes(self.shape, a.record_bytes());
            // Each piece's slot, detached one after the other (a slot's span
            // is held until its transfer has ended), queued together.
            let mut pieces = Vec::with_capacity(slots.len());
            for (slot, piece) in &slots {
                let start = (slot * sb) as usize;
                let span = a.span(piece.records.clone());
                let len = (span.end - span.start) as usize;
                pieces.push((span, buf.slice_mut(start..start + len)?.detach()));
            }
            let views: Vec<_> = pieces
                .iter_mut()
                .map(|(span, d)| d.slice_mut(..).map(|v| (span.clone(), v)))
                .collect::<wirespeed_cuda::Result<_>>()?;
            outcomes.extend(streamer.start_many(a.file(), views)?.into_iter().map(|t| t.into_outcome()));
        }
        self.queued.push_back((g, outcomes));
        Ok(())
    }

    /// The byte offset in array `rec`'s pool of each drawn record.
    pub(crate) fn offsets(&self, rec: u64, drawn: &[Drawn], out: &mut Vec<u64>) {
        let sb = slot_bytes(self.shape, rec);
        out.clear();
        out.extend(drawn.iter().map(|d| d.slot * sb + d.index * rec));
    }

    /// Array `i`'s pool, as a gather reads it.
    pub(crate) fn source(&self, i: usize) -> Result<DeviceSlice<'_, u8>> {
        let b = &self.buffers[i];
        Ok(b.slice(..b.len() - PAD)?)
    }
}

/// Bytes of a slot of an array of `rec`-byte records.
pub(crate) fn slot_bytes(shape: PoolShape, rec: u64) -> u64 {
    shape.block_records * rec
}
