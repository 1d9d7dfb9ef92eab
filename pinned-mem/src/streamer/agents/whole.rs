//! The whole-file agent ([`Strategy::WholeFile`](crate::Strategy::WholeFile)):
//! one agent that copies from the registration of the whole file (or of the
//! range, when the file does not fit) that the streamer keeps, so that later
//! passes cost no registration (`Shared::whole` makes it). It claims the
//! range from the front in pieces and enqueues their copies; a pass into
//! device buffers runs it on the calling thread.

use super::crew::Crew;
use super::in_flight::{Pinned, Queue};
use crate::error::Result;
use crate::range::PinnedRange;
use crate::streamer::sink::Sink;

/// Copies from the kept registration are enqueued in pieces of this size, so
/// that progress and chunking see them.
pub(in crate::streamer) const PIECE: u64 = 64 << 20;

/// Pieces in flight at once.
pub(in crate::streamer) const PIECE_IN_FLIGHT: usize = 4;

/// Claims pieces from the front and enqueues their copies from `reg`, which
/// holds the whole range; returns when the range is claimed, the transfer
/// failed, or the calling thread stopped reading the sink's messages.
pub(in crate::streamer) fn whole_agent<S: Sink>(crew: Crew<'_, S>, reg: &PinnedRange) -> Result<()> {
    let mut queue = Queue::new(crew.ctx, PIECE_IN_FLIGHT);
    let res = copy_pieces(&crew, reg, &mut queue);
    queue.finish(crew.ctx, res)
}

/// The agent's loop: claims a piece, makes room in the queue (a piece has
/// nothing to unregister: the oldest retires alone), and enqueues its copies.
fn copy_pieces<S: Sink>(crew: &Crew<'_, S>, reg: &PinnedRange, queue: &mut Queue) -> Result<()> {
    let mut out = Vec::new();
    while !crew.ctx.aborted() {
        let Some(r) = crew.front(PIECE) else { break };
        if queue.is_full() {
            queue.retire_batch(crew.ctx, 1)?;
        }
        if !queue.put(crew, r, Pinned::Within(reg), &mut out)? {
            break; // the caller stopped
        }
    }
    Ok(())
}
