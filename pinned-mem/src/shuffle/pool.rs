//! [`Way::Pool`](super::Way::Pool): blocks of the files streamed into two
//! halves of a pool in device memory, a group of blocks per half, the next
//! group streaming into one half while batches are drawn from the other.
//!
//! The two halves are two allocations, each with its own fence, and a
//! batch's gather reads only the half of its group (a batch drawing from two
//! groups gathers each group's records apart): a gather reading the half
//! being streamed into would wait for those copies (on the host for the
//! transfers still enqueueing, on the device for the rest), and batches would
//! be drawn no faster than the next group streams.

use std::collections::VecDeque;

use wirespeed_cuda::{Device, DeviceBuffer, DeviceSlice};

use super::plan::{Drawn, Piece, PoolOrder, PoolShape};
use super::records::Records;
use crate::error::{Error, Result};
use crate::streamer::{Outcome, Streamer};

/// Bytes after each half of the pool (and after each resident buffer), so
/// that the gather kernel's aligned 16-byte reads of a slot's last record
/// stay inside the allocation.
pub(crate) const PAD: usize = 16;

/// The pool of every array (same records per slot, each its own two halves).
pub(crate) struct Pool {
    pub shape: PoolShape,
    pub buffers: Vec<[DeviceBuffer<u8>; 2]>,
    /// Groups whose transfers were started and not yet waited for, oldest first.
    queued: VecDeque<(u64, Vec<Outcome>)>,
    /// The epoch whose first group was started ahead, during the last group
    /// of the one before (queued last).
    ahead: Option<u64>,
    /// The next group to start.
    next_group: u64,
    /// Groups whose transfers ended well: a batch may read them.
    landed: [Option<u64>; 2],
    pieces: Vec<Piece>,
    /// The report of a transfer that filled a whole slot (the largest so
    /// far): the latest of an epoch's middle group, once one landed (the
    /// blocks at a pass's end, where its claimers meet, are not typical of
    /// it), else the latest; and how many transfers so far ran chained to
    /// the one before, of how many.
    pub last: Option<crate::streamer::Report>,
    /// `last` is of an epoch's middle group.
    last_mid: bool,
    pub chained: u64,
    pub transfers: u64,
    /// Seconds the host waited for groups to land.
    pub waited: f64,
}

impl Pool {
    /// A pool of `2 * shape.slots` slots of `shape.block_records` records for each array.
    pub(crate) fn new(device: &Device, arrays: &[Records], shape: PoolShape) -> Result<Pool> {
        let mut buffers = Vec::with_capacity(arrays.len());
        for a in arrays {
            let half = slot_bytes(shape, a.record_bytes())
                .checked_mul(shape.slots)
                .and_then(|h| h.checked_add(PAD as u64))
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| Error::invalid("shuffle pool", "the pool's size overflows"))?;
            buffers.push([DeviceBuffer::<u8>::new(device, half)?, DeviceBuffer::<u8>::new(device, half)?]);
        }
        Ok(Pool {
            shape,
            buffers,
            queued: VecDeque::new(),
            ahead: None,
            next_group: 0,
            landed: [None, None],
            pieces: Vec::new(),
            last: None,
            last_mid: false,
            chained: 0,
            transfers: 0,
            waited: 0.0,
        })
    }

    /// Forgets the epoch's groups (a new epoch, or a seek): what was started
    /// still lands, and the fences order the next transfers after it. The
    /// first group of `epoch`, when it was started ahead
    /// ([`Pool::start_next_epoch`]) and the epoch starts at its first batch,
    /// is kept: it goes on streaming.
    pub(crate) fn reset(&mut self, epoch: u64, batch: u64) -> Result<()> {
        let keep = match self.ahead.take() {
            Some(e) if e == epoch && batch == 0 => self.queued.pop_back(),
            _ => None,
        };
        let drained = self.drain();
        self.landed = [None, None];
        self.next_group = u64::from(keep.is_some());
        self.queued.extend(keep);
        drained
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
        self.start_ahead(streamer, arrays, order, groups.start)?;
        let t0 = std::time::Instant::now();
        for g in groups {
            while self.landed[(g % 2) as usize] != Some(g) {
                let Some((q, outcomes)) = self.queued.pop_front() else {
                    return Err(Error::invalid("shuffle pool", format!("group {g} was never streamed")));
                };
                for o in outcomes {
                    let r = o.wait()?;
                    self.transfers += 1;
                    self.chained += u64::from(r.chained);
                    let mid = q == order.groups() / 2;
                    let keep = match &self.last {
                        None => true,
                        Some(l) => r.bytes > l.bytes || (r.bytes == l.bytes && (mid || !self.last_mid)),
                    };
                    if keep {
                        self.last = Some(r);
                        self.last_mid = mid;
                    }
                }
                self.landed[(q % 2) as usize] = Some(q);
            }
        }
        self.waited += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// Starts the groups up to `first + 1` not started yet, once no batch
    /// reads anything before group `first` (whose gathers, if any, are
    /// enqueued): group `first + 1` streams into the half of `first - 1`
    /// while `first` is read. The loader calls it with the next batch's
    /// first group as soon as a batch's gathers are enqueued, so that the
    /// next group is queued while the one before it still streams (and runs
    /// in its pass), not once a batch that reads both had to wait for it.
    pub(crate) fn start_ahead(
        &mut self,
        streamer: &Streamer,
        arrays: &[Records],
        order: &PoolOrder,
        first: u64,
    ) -> Result<()> {
        let until = first.saturating_add(2).min(order.groups());
        while self.next_group < until {
            self.start(streamer, arrays, order, self.next_group)?;
            order.prepare_table(self.next_group);
            self.next_group += 1;
        }
        Ok(())
    }

    /// Whether the next epoch's first group may start ahead
    /// ([`Pool::start_next_epoch`]) now that no batch reads any group of the
    /// current epoch (`order`) but the last: none was started ahead yet,
    /// every group of this one is started, and their number is even, so
    /// that the half the next epoch's first group fills (half 0) is the one
    /// before the last's (with an odd number it is the last's own).
    pub(crate) fn next_epoch_fits(&self, order: &PoolOrder) -> bool {
        self.ahead.is_none() && self.next_group >= order.groups() && order.groups().is_multiple_of(2)
    }

    /// Starts the first group of epoch `epoch` (whose order is `next`) ahead,
    /// where [`Pool::next_epoch_fits`] allows, so that the next epoch's
    /// first batches do not wait for a pool filled from nothing.
    /// [`Pool::reset`] keeps it when that epoch starts at its first batch.
    pub(crate) fn start_next_epoch(
        &mut self,
        streamer: &Streamer,
        arrays: &[Records],
        next: &PoolOrder,
        epoch: u64,
    ) -> Result<()> {
        if next.groups() == 0 {
            return Ok(());
        }
        self.start(streamer, arrays, next, 0)?;
        self.ahead = Some(epoch);
        Ok(())
    }

    /// Starts streaming group `g`'s pieces into its half, in file order (so
    /// that the streamer runs them as one pass), every array in turn.
    fn start(&mut self, streamer: &Streamer, arrays: &[Records], order: &PoolOrder, g: u64) -> Result<()> {
        order.pieces(g, &mut self.pieces);
        // Each piece's slot within the group's half.
        let mut slots: Vec<(u64, Piece)> =
            self.pieces.iter().cloned().enumerate().map(|(i, p)| (i as u64, p)).collect();
        slots.sort_by_key(|(_, p)| p.records.start);
        self.landed[(g % 2) as usize] = None;
        let mut outcomes = Vec::with_capacity(slots.len() * arrays.len());
        for (a, halves) in arrays.iter().zip(self.buffers.iter_mut()) {
            let buf = &mut halves[(g % 2) as usize];
            let rec = a.record_bytes();
            // Each piece's slot, detached one after the other (a slot's span
            // is held until its transfer has ended), queued together.
            let mut pieces = Vec::with_capacity(slots.len());
            for (slot, piece) in &slots {
                let start = (slot * slot_bytes(self.shape, rec)) as usize;
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

    /// The half (0 or 1) of the pool that drawn record `d` lies in.
    pub(crate) fn half_of(&self, d: &Drawn) -> usize {
        usize::from(d.slot >= self.shape.slots)
    }

    /// The byte offset of each drawn record in its half of the pool of an
    /// array of `rec`-byte records.
    pub(crate) fn offsets(&self, rec: u64, drawn: &[Drawn], out: &mut Vec<u64>) {
        let sb = slot_bytes(self.shape, rec);
        out.clear();
        out.extend(drawn.iter().map(|d| (d.slot % self.shape.slots) * sb + d.index * rec));
    }

    /// Half `h` of array `i`'s pool, as a gather reads it.
    pub(crate) fn source(&self, i: usize, h: usize) -> Result<DeviceSlice<'_, u8>> {
        let b = &self.buffers[i][h];
        Ok(b.slice(..b.len() - PAD)?)
    }
}

/// Bytes of a slot of an array of `rec`-byte records.
pub(crate) fn slot_bytes(shape: PoolShape, rec: u64) -> u64 {
    shape.block_records * rec
}
