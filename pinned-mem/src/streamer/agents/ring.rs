//! Ring agents ([`Strategy::Ring`], and the back of [`Strategy::Hybrid`];
//! [`Strategy::Direct`] with `direct.rs`): the pinned ring's producer
//! threads. Each claims slot-sized parts of the range, fills a free slot of
//! the streamer's ring with one (`memcpy` from the mapping, or `O_DIRECT`
//! reads), and enqueues the slot's copies to the devices; the slot is free
//! again once they completed.
//!
//! Slots are small (a few MiB) so that a slot just written is still in the
//! CPU's last-level cache when the DMA reads it.
//!
//! A part read ahead of its transfer (`StreamConfig::read_ahead`) is filled
//! like any other, then held until a transfer takes it (its copies are then
//! enqueued as any part's) or dropped unread (the slot goes back free).
//!
//! [`Strategy::Ring`]: crate::Strategy::Ring
//! [`Strategy::Hybrid`]: crate::Strategy::Hybrid
//! [`Strategy::Direct`]: crate::Strategy::Direct

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::Ordering;

use wirespeed_cuda::Stream;
use wirespeed_cuda::locks::{read, write};

use super::cold::{ColdReads, Way};
use super::crew::Crew;
use super::direct::direct_read;
use crate::error::{Error, Result};
use crate::ring::{FreeSlot, FullSlot, InFlightSlot, PinnedRing};
use crate::streamer::claims::Settled;
use crate::streamer::ctx::Ctx;
use crate::streamer::sink::Sink;
use crate::streamer::stats::Step;

/// How a ring agent fills a slot.
#[derive(Clone, Copy)]
pub(in crate::streamer) enum Fill<'a> {
    /// `memcpy` from the mapping (page cache), after checking that the file
    /// still has those bytes (a truncated file is [`Error::FileChanged`], not
    /// a `SIGBUS`) and populating the page tables of a part copied for the
    /// first time.
    Copy,
    /// `pread` from an `O_DIRECT` descriptor into aligned slots.
    Direct(&'a File),
    /// `Auto`'s reads of a cold file: `O_DIRECT`, or buffered with
    /// readahead, as chosen for the file.
    Cold(&'a ColdReads),
}

/// Which streams a ring agent copies on.
#[derive(Clone, Copy)]
pub(in crate::streamer) enum Lane<'a> {
    /// Lane `lane` of the sink, on streams of its own (one per device).
    Own { lane: usize, streams: &'a [Stream] },
    /// The streamer's streams, through the sink's lock.
    Shared,
}

/// One ring agent.
#[derive(Clone, Copy)]
pub(in crate::streamer) struct RingAgent<'a> {
    /// The streamer's ring.
    pub(in crate::streamer) ring: &'a PinnedRing,
    pub(in crate::streamer) fill: Fill<'a>,
    /// Bytes per claim (at most a slot).
    pub(in crate::streamer) slot: u64,
    /// Claims from the back of the range (the hybrid), else from the front.
    pub(in crate::streamer) from_back: bool,
    pub(in crate::streamer) lane: Lane<'a>,
}

/// Claims slot-sized parts, fills a free ring slot with each and enqueues
/// its copies; returns when the range is claimed, the transfer failed, or
/// the calling thread stopped reading the sink's messages.
pub(in crate::streamer) fn ring_agent<S: Sink>(crew: Crew<'_, S>, agent: RingAgent<'_>) -> Result<()> {
    let ctx = crew.ctx;
    let mut out = Vec::new();
    while !ctx.aborted() {
        let claimed = if agent.from_back { crew.back(agent.slot) } else { crew.front(agent.slot) };
        let Some(r) = claimed else { break };
        if crew.dropped(&r) {
            continue; // read ahead for a transfer that did not come
        }
        let slot = ctx.stats.time(Step::SlotWait, || agent.ring.acquire())?;
        ctx.progress(slot.completed_bytes());
        let full = match ctx.stats.time(Step::Fill, || fill(ctx, agent.fill, slot, &r)) {
            Ok(full) => full,
            Err(_) if crew.unreadable(&r) => continue, // only read ahead: nobody asked for it
            Err(e) => return Err(e),
        };
        let bytes = r.end - r.start;
        match crew.settle(&r) {
            Settled::Copy => {}
            Settled::ReadAhead => {
                ctx.stats.read_ahead_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Settled::Drop => {
                ctx.stats.read_ahead_dropped.fetch_add(bytes, Ordering::Relaxed);
                continue; // the slot goes back to the ring, unread
            }
        }
        let in_flight = submit(&crew, agent.lane, full, &r, &mut out)?;
        ctx.stats.ring_bytes.fetch_add(bytes, Ordering::Relaxed);
        drop(in_flight); // back to the ring, free again once its copies completed
        if !crew.send(&mut out) {
            return Ok(()); // the caller stopped
        }
    }
    Ok(())
}

/// Fills `slot` with bytes `r` of the file, as `how` says.
fn fill(ctx: &Ctx<'_>, how: Fill<'_>, slot: FreeSlot, r: &Range<u64>) -> Result<FullSlot> {
    match how {
        Fill::Copy => {
            ctx.file.check_has(r.end)?;
            // A fresh mapping's first copy of a part: its page tables at once,
            // not a page fault every few pages (see `MappedFile`).
            ctx.file.populate_fresh(r.clone());
            let bytes = ctx.file.as_bytes();
            let part = bytes.get(r.start as usize..r.end as usize).ok_or_else(|| {
                Error::invalid("ring agent", format!("{r:?} is outside the mapping ({} bytes)", bytes.len()))
            })?;
            Ok(slot.copy_from(part)?)
        }
        Fill::Direct(f) => direct_read(slot, f, ctx.file, r.clone()),
        Fill::Cold(c) => {
            let (full, way) = c.read(slot, ctx.file, r.clone())?;
            if way == Way::Buffered {
                ctx.stats.buffered_bytes.fetch_add(r.end - r.start, Ordering::Relaxed);
            }
            Ok(full)
        }
    }
}

/// Enqueues the copies of `full` (bytes `r` of the file) on `lane`'s streams
/// to those the sink names, through the sink.
fn submit<S: Sink>(
    crew: &Crew<'_, S>,
    lane: Lane<'_>,
    full: FullSlot,
    r: &Range<u64>,
    out: &mut Vec<S::Msg>,
) -> Result<InFlightSlot> {
    let (ctx, sink) = (crew.ctx, crew.sink);
    let len = (r.end - r.start) as usize;
    let to = read(sink).streams_for(r.start, len as u64);
    Ok(match lane {
        Lane::Own { lane, streams } => {
            full.submit(&to.pick(streams), |src| read(sink).put_lane(lane, streams, src, r.start, len))?
        }
        Lane::Shared => {
            full.submit(&to.pick(ctx.streams), |src| write(sink).put(ctx.streams, src, r.start, len, out))?
        }
    })
}
