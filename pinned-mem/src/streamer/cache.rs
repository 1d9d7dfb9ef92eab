//! What the streamer keeps between calls: its whole-file registrations (least
//! recently used first), its ring, how it reads each cold file, the ranges it
//! streamed last, how much they pin, finding and dropping
//! cached registrations (`Shared::make_room` gives them back to make room
//! in the budget).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Weak};

use super::agents::cold::ColdMemo;
use crate::mapping::MappedFile;
use crate::range::PinnedRange;
use crate::ring::PinnedRing;
use crate::util::{align_down, align_up, page_size};

#[derive(Default)]
pub(super) struct State {
    /// Whole-file registrations, least recently used first.
    pub(super) cache: Vec<PinnedRange>,
    pub(super) ring: Option<PinnedRing>,
    /// How each cold file probed so far is read.
    pub(super) cold: ColdMemo,
    /// The ranges streamed last.
    pub(super) recent: Recent,
}

/// The ranges a streamer streamed last, at most [`Recent::KEPT`]: `Auto`
/// registers a lone piece of a file larger than the budget whole only when
/// it was asked for among them (it is read again, so the registration will
/// be used again); the first time, it goes through the ring.
#[derive(Default)]
pub(super) struct Recent {
    ranges: VecDeque<(Weak<MappedFile>, Range<u64>)>,
}

impl Recent {
    /// Ranges remembered.
    const KEPT: usize = 64;

    /// Whether `range` of `file` lies within one of the ranges remembered
    /// that is at most `most` bytes long (a pass over a longer range, the
    /// whole file say, does not make each of its pieces one read again).
    pub(super) fn has(&self, file: &Arc<MappedFile>, range: &Range<u64>, most: u64) -> bool {
        self.ranges.iter().any(|(f, r)| {
            std::ptr::eq(f.as_ptr(), Arc::as_ptr(file))
                && r.start <= range.start
                && range.end <= r.end
                && r.end - r.start <= most
        })
    }

    /// Remembers `range` of `file`, forgetting the oldest beyond
    /// [`Recent::KEPT`].
    pub(super) fn note(&mut self, file: &Arc<MappedFile>, range: &Range<u64>) {
        if self.ranges.len() >= Self::KEPT {
            self.ranges.pop_front();
        }
        self.ranges.push_back((Arc::downgrade(file), range.clone()));
    }
}

pub(super) fn kept(st: &State) -> u64 {
    let cache: u64 =
        st.cache.iter().filter(|r| r.sharers() == 1).map(|r| r.pinned_pages().end - r.pinned_pages().start).sum();
    cache + st.ring.as_ref().map_or(0, PinnedRing::pinned_bytes)
}

/// Gives back the streamer's own cached registrations of `file` that share
/// pages with `range` without containing it: this pass's registrations of
/// those pages would otherwise fail with `Overlap` (a registration cannot grow
/// or be registered twice). Ones a caller also holds stay (the pass then
/// reports the `Overlap`).
pub(super) fn drop_overlapping(st: &mut State, file: &Arc<MappedFile>, range: &Range<u64>) {
    let page = page_size();
    let pages = align_down(range.start, page)..align_up(range.end, page);
    st.cache.retain(|c| {
        let p = c.pinned_pages();
        let overlaps = p.start < pages.end && pages.start < p.end;
        let contains = c.range().start <= range.start && range.end <= c.range().end;
        !(Arc::ptr_eq(c.file(), file) && overlaps && !contains && c.sharers() == 1)
    });
}

pub(super) fn cached(st: &State, file: &Arc<MappedFile>, range: &Range<u64>, portable: bool) -> Option<usize> {
    st.cache.iter().position(|c| {
        Arc::ptr_eq(c.file(), file)
            && c.range().start <= range.start
            && range.end <= c.range().end
            && (c.is_portable() || !portable)
    })
}
