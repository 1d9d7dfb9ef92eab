//! Whole file ([`Strategy::WholeFile`](crate::Strategy::WholeFile)): one
//! registration of the whole file (or of the range, when the file does not
//! fit), kept by the streamer so later passes cost no registration; the window
//! agent copies from it in pieces.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Shared;
use super::cache::{State, cached, kept};
use super::stats::{PassStats, Step};
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinnedRange;
use crate::util::{align_down, align_up, page_size};

/// Copies from a cached whole-file registration are enqueued in pieces of this
/// size (as fast as one copy, and progress and chunking see them).
pub(super) const PIECE: u64 = 64 << 20;
/// Events in flight for whole-file pieces.
pub(super) const PIECE_IN_FLIGHT: usize = 4;

impl Shared {
    /// The cached registration for `range`, made (whole file if it fits) when missing.
    pub(super) fn whole(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        stats: &PassStats,
    ) -> Result<usize> {
        if let Some(i) = cached(st, file, range, self.portable) {
            // As a fresh registration would: refuse a file truncated since
            // (its lost pages would fault, or copy stale bytes).
            file.check_has(range.end)?;
            let r = st.cache.remove(i);
            st.cache.push(r);
            return Ok(st.cache.len() - 1);
        }
        let page = page_size();
        let pages = |r: &Range<u64>| align_up(r.end, page) - align_down(r.start, page);
        let all = 0..file.len();
        let whole_file = pages(&all) <= self.usable(kept(st));
        let target = if whole_file { all } else { range.clone() };
        self.make_room(st, pages(&target), false, None);
        self.device_for_registration()?;
        // In the second context when there is one, as windows are: dropping
        // the registration later (to make room) then waits only for its own
        // copies, not for every copy in flight on the device.
        let (regctx, _) = stats.time(Step::Setup, || self.window_context());
        let create = |r: Range<u64>| PinnedRange::create_in(regctx.as_ref(), file, r, self.opts(), &self.config.budget);
        let (reg, fresh) = stats.time(Step::Register, || match create(target) {
            // A range of the file is registered elsewhere: register just what is asked.
            Err(Error::Overlap { .. }) if whole_file => create(range.clone()),
            r => r,
        })?;
        if fresh {
            stats.registrations.fetch_add(1, Ordering::Relaxed);
        }
        st.cache.push(reg);
        Ok(st.cache.len() - 1)
    }
}
