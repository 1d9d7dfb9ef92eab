//! Ring agents: N threads that claim slot-sized parts of the range, copy them
//! from the mapping into a free slot of the streamer's pinned ring (or read
//! them with `O_DIRECT`, see [`direct`](super::direct)) and copy the slot to
//! the devices. They run the ring and direct strategies, and the back half of
//! the hybrid.
//!
//! Slots are small (a few MiB) so that a slot just written is still in the
//! CPU's last-level cache when the DMA reads it: measured on an H200 host,
//! 4 MiB slots filled by `memcpy` from the page-cached mapping reached 0.94 of
//! the line rate with 8 threads, where 16 MiB slots filled by `pread` reached
//! 0.75 at three times the CPU time. Two alternatives measured worse on the
//! same machine, in one run each against plain `memcpy` into 4 MiB slots:
//! non-temporal stores (bypassing the cache) filled 4.6 GB/s a thread
//! against 5.6-6.5, the ring alone falling from 0.78-0.89 of the line rate to
//! 0.64; and the hybrid with 8 MiB slots (a deeper ring, smaller windows)
//! reached 0.62-0.64 where 4 MiB slots reached 0.72-0.79.

use std::fs::File;
use std::sync::RwLock;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use super::claims::Claims;
use super::ctx::Ctx;
use super::direct::direct_read;
use super::sink::Sink;
use super::stats::Step;
use crate::error::Result;
use crate::ring::PinnedRing;
use wirespeed_cuda::locks::{read, write};

/// How a ring agent fills a slot.
#[derive(Clone, Copy)]
pub(super) enum Fill<'a> {
    /// `memcpy` from the mapping (page cache), after checking that the file
    /// still has those bytes (a truncated file is [`Error::FileChanged`], not
    /// a `SIGBUS`).
    ///
    /// [`Error::FileChanged`]: crate::Error::FileChanged
    Copy,
    /// `pread` from an `O_DIRECT` descriptor into aligned slots.
    Direct(&'a File),
}

/// Which streams a ring agent copies on: lane `lane` of the sink on streams
/// of its own, or the streamer's streams (through the sink's lock).
#[derive(Clone, Copy)]
pub(super) enum AgentLane<'a> {
    Own { lane: usize, streams: &'a [wirespeed_cuda::Stream] },
    Shared,
}

/// Claims slot-sized parts, reads each into a free ring slot and copies it.
#[allow(clippy::too_many_arguments)]
pub(super) fn ring_agent<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    ring: &PinnedRing,
    fill: Fill<'_>,
    slot_size: u64,
    from_back: bool,
    lane: AgentLane<'_>,
    sink: &RwLock<S>,
    tx: &SyncSender<S::Msg>,
) -> Result<()> {
    let mut out = Vec::new();
    while !ctx.aborted() {
        let claimed = if from_back { claims.back(slot_size) } else { claims.front(slot_size) };
        let Some(r) = claimed else { break };
        let len = (r.end - r.start) as usize;
        let slot = ctx.stats.time(Step::SlotWait, || ring.acquire())?;
        ctx.progress(slot.completed_bytes());
        let full = ctx.stats.time(Step::Fill, || match fill {
            Fill::Copy => {
                ctx.file.check_has(r.end)?;
                let bytes = ctx.file.as_bytes();
                let part = bytes.get(r.start as usize..r.end as usize).ok_or_else(|| {
                    crate::Error::invalid("ring agent", format!("{r:?} is outside the mapping ({} bytes)", bytes.len()))
                })?;
                Ok(slot.copy_from(part)?)
            }
            Fill::Direct(f) => direct_read(slot, f, ctx.file, r.clone()),
        })?;
        let to = read(sink).streams_for(r.start, len as u64);
        let in_flight = match lane {
            AgentLane::Own { lane, streams } => {
                full.submit(&to.pick(streams), |src| read(sink).put_lane(lane, streams, src, r.start, len))?
            }
            AgentLane::Shared => {
                full.submit(&to.pick(ctx.streams), |src| write(sink).put(ctx.streams, src, r.start, len, &mut out))?
            }
        };
        ctx.stats.ring_bytes.fetch_add(len as u64, Ordering::Relaxed);
        drop(in_flight); // back to the ring, free again once its copies completed
        for m in out.drain(..) {
            if tx.send(m).is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}
