//! One operation that uses any number of buffers (a kernel launch): the
//! fences' enqueue generalized from one read and one write
//! ([`Stream::enqueue`]) to a list of reads and writes.

use super::{Fence, FenceState, Span};
use crate::error::Result;
use crate::raw::Queue;
use crate::stream::{Pending, Stream};
use crate::sync::SpinGuard;

/// How an operation uses a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// It reads the span: ordered after other streams' writes.
    Read,
    /// It writes the span: ordered after other streams' reads and writes.
    Write,
    /// It needs what the fence guards to stay alive until it completes (the
    /// library of a launched kernel), without reading or writing memory: it
    /// is recorded as a read, and ordered after nothing.
    Keep,
}

/// One use of a buffer by an operation: its fence, the span, and how.
pub(crate) struct FenceUse<'f> {
    pub(crate) fence: &'f Fence,
    pub(crate) span: Span,
    pub(crate) access: Access,
}

impl Stream {
    /// Enqueues one operation that makes `uses` (any number, in any order):
    /// orders it after other streams' conflicting uses, runs `enqueue`, then
    /// records the uses. Returns the pending operation, borrowing for `'a`.
    ///
    /// The distinct fences that record the uses (a part of a buffer records
    /// into the buffer's fence: two parts, or one buffer read twice, share
    /// one) are locked together, in address order, across the enqueue, as
    /// [`Stream::enqueue_into_part`] locks its two: two threads locking
    /// overlapping sets of fences take them in the same order and cannot
    /// deadlock, and no other thread's record can interleave. A fence locked
    /// here that another thread holds `&mut` is impossible (the caller
    /// borrows every buffer for `'a`). As in `enqueue`, no lock is held while
    /// waiting for a detached writer to release its hold: all are dropped,
    /// the holds waited for, and the locking starts again.
    ///
    /// The fences of [`Access::Keep`] uses are not locked with the others:
    /// each is locked alone after the enqueue and records the operation as a
    /// read, keeping the stream's latest operation (a maximum, so records of
    /// two threads cannot go backwards). Waiting for that record then waits
    /// for every operation of the stream up to it, this one included.
    ///
    /// Not the per-copy path: [`Stream::enqueue`] stays as it is, and this
    /// allocates a few small vectors.
    pub(crate) fn enqueue_many<'a>(
        &'a self,
        uses: &[FenceUse<'_>],
        enqueue: impl FnOnce(Queue) -> Result<()>,
    ) -> Result<Pending<'a>> {
        let on = self.inner();
        on.ensure_current()?;
        let (fences, slot) = locking_order(uses);
        loop {
            let mut locked: Vec<SpinGuard<'_, FenceState>> = fences.iter().map(|f| f.state.lock()).collect();
            let mut waiting = Vec::new();
            for (u, &i) in uses.iter().zip(&slot) {
                if let Some(i) = i {
                    waiting.extend(locked[i].unreleased(&u.span));
                }
            }
            if !waiting.is_empty() {
                drop(locked);
                waiting.iter().for_each(|h| drop(h.wait_released()));
                continue;
            }
            for (u, &i) in uses.iter().zip(&slot) {
                match (i, u.access) {
                    (Some(i), Access::Read) => locked[i].order_read(on, &u.span)?,
                    (Some(i), Access::Write) => locked[i].order_write(on, &u.span)?,
                    _ => {}
                }
            }
            let seq = on.submit(enqueue)?;
            // Reads first: a write to a fence that is also read (parts of one
            // buffer) then supersedes the read, as in `enqueue_into_part`.
            for (u, &i) in uses.iter().zip(&slot) {
                if let (Some(i), Access::Read) = (i, u.access) {
                    locked[i].note_read(on, seq);
                }
            }
            for (u, &i) in uses.iter().zip(&slot) {
                if let (Some(i), Access::Write) = (i, u.access) {
                    locked[i].note_write(on, seq, &u.span);
                }
            }
            drop(locked);
            for u in uses.iter().filter(|u| u.access == Access::Keep) {
                u.fence.target().state.lock().note_read_slow(on, seq);
            }
            return Ok(Pending::new(on, seq));
        }
    }
}

/// The distinct fences that record `uses` other than [`Access::Keep`], in
/// address order, and for each use the index of its fence among them.
fn locking_order<'f>(uses: &[FenceUse<'f>]) -> (Vec<&'f Fence>, Vec<Option<usize>>) {
    let mut fences: Vec<&'f Fence> =
        uses.iter().filter(|u| u.access != Access::Keep).map(|u| u.fence.target()).collect();
    fences.sort_by_key(|f| std::ptr::from_ref::<Fence>(f) as usize);
    fences.dedup_by(|a, b| std::ptr::eq(*a, *b));
    let slot = uses
        .iter()
        .map(|u| {
            let target = u.fence.target();
            (u.access != Access::Keep).then(|| fences.iter().position(|f| std::ptr::eq(*f, target))).flatten()
        })
        .collect();
    (fences, slot)
}

#[cfg(test)]
mod tests {
    use super::{Access, FenceUse, locking_order};
    use crate::fence::Fence;

    #[test]
    fn fences_are_locked_once_each_in_address_order() {
        let (a, b) = (Fence::default(), Fence::default());
        let part = Fence::part_of(&a);
        let (lo, hi) = if (&raw const a) < (&raw const b) { (&a, &b) } else { (&b, &a) };
        let uses = [
            FenceUse { fence: hi, span: 0..8, access: Access::Read },
            FenceUse { fence: &part, span: 8..16, access: Access::Write },
            FenceUse { fence: lo, span: 0..8, access: Access::Read },
            FenceUse { fence: &a, span: 16..24, access: Access::Keep },
            FenceUse { fence: &a, span: 0..8, access: Access::Write },
        ];
        let (fences, slot) = locking_order(&uses);
        assert_eq!(fences.len(), 2);
        assert!(std::ptr::eq(fences[0], lo) && std::ptr::eq(fences[1], hi));
        let index = |f: &Fence| usize::from(!std::ptr::eq(f, lo));
        assert_eq!(slot, [Some(1), Some(index(&a)), Some(0), None, Some(index(&a))]);
    }
}
