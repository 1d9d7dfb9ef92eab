//! What every agent of a pass works with ([`Crew`]).

use std::ops::Range;
use std::sync::RwLock;
use std::sync::mpsc::SyncSender;

use crate::streamer::claims::{Claims, Settled};
use crate::streamer::ctx::Ctx;
use crate::streamer::sink::Sink;

/// What every agent of a pass works with: the pass's context, the claims it
/// takes parts of the range from, the sink its copies go through, and its
/// end of the channel to the calling thread. Each agent holds a crew of its
/// own (a clone): the calling thread stops reading messages once every
/// agent has ended and dropped its crew.
pub(in crate::streamer) struct Crew<'p, S: Sink> {
    pub(in crate::streamer) ctx: &'p Ctx<'p>,
    pub(in crate::streamer) claims: &'p Claims<'p>,
    pub(in crate::streamer) sink: &'p RwLock<S>,
    tx: SyncSender<S::Msg>,
}

impl<'p, S: Sink> Crew<'p, S> {
    /// The crew of a pass, sending its messages on `tx`.
    pub(in crate::streamer) fn new(
        ctx: &'p Ctx<'p>,
        claims: &'p Claims<'p>,
        sink: &'p RwLock<S>,
        tx: SyncSender<S::Msg>,
    ) -> Crew<'p, S> {
        Crew { ctx, claims, sink, tx }
    }

    /// The next part from the front of the claims (see `Claims::front`),
    /// waiting at a gate until it opens or the pass fails.
    pub(in crate::streamer) fn front(&self, size: u64) -> Option<Range<u64>> {
        self.claims.front(size, &|| self.ctx.aborted())
    }

    /// As [`Crew::front`], leaving a range's last `leave` bytes to the back.
    pub(in crate::streamer) fn front_leaving(&self, size: u64, leave: u64) -> Option<Range<u64>> {
        self.claims.front_leaving(size, leave, &|| self.ctx.aborted())
    }

    /// The next part from the back of the claims, gates as for [`Crew::front`].
    pub(in crate::streamer) fn back(&self, size: u64) -> Option<Range<u64>> {
        self.claims.back(size, &|| self.ctx.aborted())
    }

    /// Waits until `part` (filled) may be copied (see `Feed::settle`).
    pub(in crate::streamer) fn settle(&self, part: &Range<u64>) -> Settled {
        self.claims.feed().map_or(Settled::Copy, |f| f.settle(part, &|| self.ctx.aborted()))
    }

    /// Whether `part` was read ahead for nothing: it need not be filled.
    pub(in crate::streamer) fn dropped(&self, part: &Range<u64>) -> bool {
        self.claims.feed().is_some_and(|f| f.dropped(part))
    }

    /// `part` could not be filled: true when it was being read ahead (then
    /// dropped, and the pass goes on), false when the pass fails.
    pub(in crate::streamer) fn unreadable(&self, part: &Range<u64>) -> bool {
        self.claims.feed().is_some_and(|f| f.unreadable(part))
    }

    /// Sends the messages in `out` to the calling thread, emptying it; false
    /// once the calling thread has stopped reading them (the agent then stops).
    pub(in crate::streamer) fn send(&self, out: &mut Vec<S::Msg>) -> bool {
        for m in out.drain(..) {
            if self.tx.send(m).is_err() {
                return false;
            }
        }
        true
    }
}

impl<S: Sink> Clone for Crew<'_, S> {
    fn clone(&self) -> Self {
        Crew { ctx: self.ctx, claims: self.claims, sink: self.sink, tx: self.tx.clone() }
    }
}
