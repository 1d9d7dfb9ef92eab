//! Fences: the record, in every buffer, of the stream operations that still
//! use it.
//!
//! Every stream counts the operations it was given and remembers how far it
//! is known to have finished (see [`crate::stream`]). A [`Fence`] inside each
//! buffer records, per stream, the last operation that read or wrote it. That
//! is enough to (a) make host access and `Drop` wait for exactly the streams
//! that still use a buffer, and (b) make an operation on one stream wait for
//! another stream's use of the same buffer, with an event recorded only then
//! ([`Stream::enqueue`]; an operation on any number of buffers, a kernel
//! launch, goes through [`many`]). Writers that took part of a buffer out of its borrow
//! ([`crate::DetachedSliceMut`]) leave a [`Hold`] in its fence until they hand
//! over their own record.

use crate::error::Result;
use crate::hostfn::release_and_lock as lock;
use crate::raw::Queue;
use crate::stream::{Pending, Stream, StreamInner, Use};
use crate::sync::{SpinGuard, SpinLock};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};

mod many;
pub(crate) use many::{Access, FenceUse};

/// The device addresses `[start, end)` an operation touches (host addresses
/// for host memory, where no hold is ever taken).
pub(crate) type Span = std::ops::Range<usize>;

/// The addresses of `len` values of `T` from `ptr`.
#[inline]
pub(crate) fn span_of<T>(ptr: *const T, len: usize) -> Span {
    let start = ptr as usize;
    start..start.wrapping_add(len.wrapping_mul(size_of::<T>()))
}

#[inline]
fn overlaps(a: &Span, b: &Span) -> bool {
    a.start < b.end && b.start < a.end
}

/// The uses of one buffer. The first reading stream is kept inline (the
/// per-copy path then touches no heap memory); more go to `more_reads`, which
/// is empty whenever `read` is `None`. `holds` are the writers that took part
/// of the buffer out of its borrow ([`crate::DetachedSliceMut`]); it is empty
/// unless the buffer was detached, so the per-copy path only checks that.
#[derive(Default, Clone)]
pub(crate) struct FenceState {
    write: Option<Use>,
    read: Option<Use>,
    more_reads: Vec<Use>,
    holds: Vec<Arc<Hold>>,
}

/// A writer that took `span` of a buffer out of its owner's borrow (a
/// [`crate::DetachedSliceMut`]): it enqueues its work later, from any thread,
/// with a fence of its own, and then releases the hold with that fence's
/// record. Until the release, the owner's fence cannot know what the writer
/// enqueued, so everything that needs to be ordered after the span's users
/// (host access, `Drop`, operations on the span through the buffer) first
/// waits for the release. That wait is what makes leaking the writer's handle
/// harmless: it can never let the owner free or read memory that a copy the
/// writer has still to enqueue will write.
pub(crate) struct Hold {
    span: Span,
    /// `None` while held; what the holder's fence recorded, once released.
    released: Mutex<Option<FenceState>>,
    cv: Condvar,
}

impl Hold {
    pub(crate) fn new(span: Span) -> Hold {
        Hold { span, released: Mutex::new(None), cv: Condvar::new() }
    }

    fn is_released(&self) -> bool {
        lock(&self.released).is_some()
    }

    /// What the holder recorded, once released (`None` while held).
    fn published(&self) -> Option<FenceState> {
        lock(&self.released).clone()
    }

    /// Blocks until released; answers what the holder recorded.
    fn wait_released(&self) -> FenceState {
        let mut g = lock(&self.released);
        loop {
            if let Some(s) = &*g {
                return s.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn release(&self, record: FenceState) {
        *lock(&self.released) = Some(record);
        self.cv.notify_all();
    }
}

/// Every use that the released `holds` stand for (their records, and the
/// holds those name, transitively), with only writes unless `with_reads`; one
/// entry per stream (its latest). A hold not released yet is waited for when
/// `block`, else the answer is `None`.
fn collect_uses(holds: Vec<Arc<Hold>>, with_reads: bool, block: bool) -> Option<Vec<Use>> {
    let mut out: Vec<Use> = Vec::new();
    let mut add = |u: &Use| match out.iter_mut().find(|x| Arc::ptr_eq(&x.stream, &u.stream)) {
        Some(x) => x.seq = x.seq.max(u.seq),
        None => out.push(u.clone()),
    };
    let mut todo = holds;
    let mut seen: Vec<*const Hold> = Vec::new();
    while let Some(h) = todo.pop() {
        if seen.contains(&Arc::as_ptr(&h)) {
            continue;
        }
        seen.push(Arc::as_ptr(&h));
        let record = if block { h.wait_released() } else { h.published()? };
        record.write.iter().for_each(&mut add);
        if with_reads {
            record.reads().for_each(&mut add);
        }
        todo.extend(record.holds);
    }
    Some(out)
}

/// The record of which stream operations still use a buffer. Every buffer owns
/// one; host access and `Drop` wait on it, and operations on other streams are
/// ordered after it. It is what keeps the crate sound when values are leaked:
/// nothing relies on a guard's `Drop` running.
#[derive(Default)]
pub struct Fence {
    state: SpinLock<FenceState>,
    /// On the fence of a part of a buffer ([`crate::DeviceSliceMut::split_at_mut`]):
    /// the buffer's own fence, where the part's uses are recorded instead
    /// (both parts share it). Only the view holding this fence can reach it,
    /// and that view borrows the buffer, fence included, for as long as it lives.
    part_of: Option<NonNull<Fence>>,
}

// SAFETY: the state is behind a lock (as `SpinLock` is Send and Sync), and
// `part_of` is only read, as a shared reference to a `Fence` (itself Sync)
// that outlives this one (see the field).
unsafe impl Send for Fence {}
// SAFETY: as above.
unsafe impl Sync for Fence {}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.target().state.lock();
        f.debug_struct("Fence")
            .field("writes", &s.write.is_some())
            .field("reads", &s.reads().count())
            .field("holds", &s.holds.len())
            .finish()
    }
}

impl Fence {
    /// The fence of a part of the buffer whose fence is `whole`: it records
    /// into `whole`. The caller keeps `whole` borrowed while the part lives.
    pub(crate) fn part_of(whole: &Fence) -> Fence {
        Fence { state: SpinLock::default(), part_of: Some(NonNull::from(whole.target())) }
    }

    /// The fence that records: this one, or the buffer's for a part.
    #[inline]
    pub(crate) fn target(&self) -> &Fence {
        match self.part_of {
            None => self,
            // SAFETY: set by `part_of` from a live fence that the view holding
            // `self` keeps borrowed for as long as it lives (see the field); it
            // is never itself a part (`part_of` resolves it first).
            Some(p) => unsafe { p.as_ref() },
        }
    }

    /// Blocks until no stream writes the buffer any more (host reads may go on).
    pub(crate) fn wait_writes(&self) -> Result<()> {
        let this = self.target();
        let w = this.state.lock().write.clone();
        if let Some(u) = w {
            u.stream.wait_for(u.seq)?;
            let mut s = this.state.lock();
            if s.write.as_ref().is_some_and(|x| Arc::ptr_eq(&x.stream, &u.stream) && x.seq <= u.seq) {
                s.write = None;
            }
        }
        this.wait_holds()
    }

    /// Blocks until no stream uses the buffer at all.
    pub(crate) fn wait_all(&self) -> Result<()> {
        let this = self.target();
        this.wait_writes()?;
        let reads = this.state.lock().take_reads();
        for (i, u) in reads.iter().enumerate() {
            if let Err(e) = u.stream.wait_for(u.seq) {
                let mut s = this.state.lock();
                for u in &reads[i..] {
                    s.note_read_slow(&u.stream, u.seq); // keeps a newer read of the stream
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Blocks until every detached writer of the buffer has released its hold
    /// and what it enqueued has finished; then forgets those holds.
    fn wait_holds(&self) -> Result<()> {
        let holds = {
            let s = self.state.lock();
            if s.holds.is_empty() {
                return Ok(());
            }
            s.holds.clone()
        };
        for u in collect_uses(holds.clone(), true, true).unwrap_or_default() {
            u.stream.wait_for(u.seq)?;
        }
        self.state.lock().holds.retain(|h| !holds.iter().any(|x| Arc::ptr_eq(x, h)));
        Ok(())
    }

    /// True when no stream uses the buffer (by what is known without asking
    /// CUDA), and no detached writer of it may still enqueue work.
    pub fn is_idle(&self) -> bool {
        let s = self.target().state.lock();
        s.write.as_ref().is_none_or(|u| u.stream.is_done(u.seq))
            && s.reads().all(|u| u.stream.is_done(u.seq))
            && (s.holds.is_empty() || s.holds_idle())
    }

    /// A use that `on` must be ordered after: on another stream, not known done.
    #[inline]
    fn pending_elsewhere(u: &Use, on: &StreamInner) -> bool {
        !std::ptr::eq(&*u.stream, on) && !u.stream.is_done(u.seq)
    }

    /// Takes a hold on `span` for a writer that will enqueue its work later,
    /// from any thread ([`crate::DetachedSliceMut`]): records the hold here and
    /// answers it with the writer's own fence, which starts with every use of
    /// the buffer so far that the writer must be ordered after.
    pub(crate) fn hold(&mut self, span: Span) -> (Fence, Arc<Hold>) {
        let hold = Arc::new(Hold::new(span.clone()));
        let start = {
            let mut s = self.target().state.lock();
            if !s.holds.is_empty() {
                s.holds.retain(|h| !FenceState::hold_idle(h)); // released and finished: nothing to keep
            }
            let start = FenceState {
                write: s.write.clone(),
                read: s.read.clone(),
                more_reads: s.more_reads.clone(),
                holds: s.holds.iter().filter(|h| overlaps(&h.span, &span)).cloned().collect(),
            };
            s.holds.push(hold.clone());
            start
        };
        let mut own = Fence::default();
        *own.state.get_mut() = start;
        (own, hold)
    }

    /// A fence for one more writer of this (exclusively owned) fence's
    /// memory, not ordered against the other writers made so: it starts with
    /// every use recorded here (so its first operation follows them), and is
    /// handed back with [`Fence::absorb`] ([`crate::Lanes`]).
    pub(crate) fn fork(&mut self) -> Fence {
        let start = self.state.get_mut().clone();
        let mut own = Fence::default();
        *own.state.get_mut() = start;
        own
    }

    /// Takes back a fence made by [`Fence::fork`]: what was recorded in it
    /// becomes a released hold on `span` here, so that everything ordered
    /// after this fence (host access, `Drop`, other streams, the owner's
    /// fence once this one is released into it) is ordered after it too. No
    /// call to CUDA, no wait.
    pub(crate) fn absorb(&mut self, mut lane: Fence, span: Span) {
        let record = std::mem::take(lane.state.get_mut());
        if record.write.is_none() && record.read.is_none() && record.holds.is_empty() {
            return; // it recorded nothing (and started from nothing)
        }
        let hold = Arc::new(Hold::new(span));
        hold.release(record);
        let s = self.state.get_mut();
        s.holds.retain(|h| !FenceState::hold_idle(h));
        s.holds.push(hold);
    }

    /// Hands this fence's record to `hold` (releasing it) and forgets it.
    pub(crate) fn release_into(&mut self, hold: &Hold) {
        hold.release(std::mem::take(self.state.get_mut()));
    }

    /// Blocks until every earlier writer that this fence must follow has
    /// released its hold (their work is then known, and ordering after it
    /// never waits on the host).
    pub(crate) fn settle(&mut self) {
        self.state.get_mut().settle(&(0..usize::MAX));
    }

    /// True when [`Fence::settle`] would return at once.
    pub(crate) fn is_settled(&self) -> bool {
        self.state.lock().unreleased(&(0..usize::MAX)).is_empty()
    }

    /// Locks the state for an operation on `span`, first waiting (unlocked)
    /// for the writers holding part of `span` to release it.
    #[inline]
    fn lock_settled(&self, span: &Span) -> SpinGuard<'_, FenceState> {
        let g = self.state.lock();
        if g.holds.is_empty() {
            return g;
        }
        self.lock_settled_slow(g, span)
    }

    #[cold]
    #[inline(never)]
    fn lock_settled_slow<'a>(&'a self, mut g: SpinGuard<'a, FenceState>, span: &Span) -> SpinGuard<'a, FenceState> {
        loop {
            let waiting = g.unreleased(span);
            if waiting.is_empty() {
                return g;
            }
            drop(g);
            waiting.iter().for_each(|h| drop(h.wait_released()));
            g = self.state.lock();
        }
    }
}

impl FenceState {
    fn reads(&self) -> impl Iterator<Item = &Use> {
        self.read.iter().chain(self.more_reads.iter())
    }

    fn take_reads(&mut self) -> Vec<Use> {
        let mut all = std::mem::take(&mut self.more_reads);
        all.extend(self.read.take());
        all
    }

    /// The holds on `span` not released yet.
    #[inline]
    fn unreleased(&self, span: &Span) -> Vec<Arc<Hold>> {
        if self.holds.is_empty() {
            return Vec::new();
        }
        self.unreleased_slow(span)
    }

    #[cold]
    #[inline(never)]
    fn unreleased_slow(&self, span: &Span) -> Vec<Arc<Hold>> {
        self.holds.iter().filter(|h| overlaps(&h.span, span) && !h.is_released()).cloned().collect()
    }

    /// Waits (no lock is held: `self` is exclusively borrowed) until the
    /// holds on `span` are released.
    #[cold]
    #[inline(never)]
    fn settle(&mut self, span: &Span) {
        for h in self.unreleased(span) {
            drop(h.wait_released());
        }
    }

    /// True when `h` was released and what it recorded has finished.
    fn hold_idle(h: &Arc<Hold>) -> bool {
        collect_uses(vec![h.clone()], true, false).is_some_and(|u| u.iter().all(|u| u.stream.is_done(u.seq)))
    }

    fn holds_idle(&self) -> bool {
        self.holds.iter().all(FenceState::hold_idle)
    }

    /// Orders `on` after the holds on `span` (their writes only, unless
    /// `with_reads`), which are released (see [`Fence::lock_settled`]).
    /// First forgets the holds released whose work has finished, so that the
    /// operations after a detached writer take this slow path only until it
    /// is known done.
    #[cold]
    #[inline(never)]
    fn order_holds(&mut self, on: &StreamInner, span: &Span, with_reads: bool) -> Result<()> {
        self.holds.retain(|h| !FenceState::hold_idle(h));
        let held: Vec<_> = self.holds.iter().filter(|h| overlaps(&h.span, span)).cloned().collect();
        for u in collect_uses(held, with_reads, true).unwrap_or_default() {
            if Fence::pending_elsewhere(&u, on) {
                on.order_after(&u.stream, u.seq)?;
            }
        }
        Ok(())
    }

    // The per-copy path: these are inline, with the rare cases out of line.

    /// Orders `on` after the last write (for an operation reading `span`).
    #[inline]
    fn order_read(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        if !self.holds.is_empty() {
            self.order_holds(on, span, false)?;
        }
        match &self.write {
            Some(u) if Fence::pending_elsewhere(u, on) => on.order_after(&u.stream, u.seq),
            _ => Ok(()),
        }
    }

    /// Orders `on` after every use (for an operation writing `span`).
    #[inline]
    fn order_write(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        match &self.write {
            Some(u) if Fence::pending_elsewhere(u, on) => self.order_write_slow(on, span),
            _ if self.read.is_some() || !self.holds.is_empty() => self.order_write_slow(on, span),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn order_write_slow(&mut self, on: &StreamInner, span: &Span) -> Result<()> {
        for u in self.write.iter().chain(self.reads()) {
            if Fence::pending_elsewhere(u, on) {
                on.order_after(&u.stream, u.seq)?;
            }
        }
        if !self.holds.is_empty() {
            self.order_holds(on, span, true)?;
        }
        Ok(())
    }

    /// Records a read by operation `seq` of `stream`.
    #[inline]
    fn note_read(&mut self, stream: &Arc<StreamInner>, seq: u64) {
        match &mut self.read {
            Some(u) if Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            _ => self.note_read_slow(stream, seq),
        }
    }

    #[cold]
    #[inline(never)]
    fn note_read_slow(&mut self, stream: &Arc<StreamInner>, seq: u64) {
        if let Some(u) = self.read.iter_mut().chain(self.more_reads.iter_mut()).find(|u| Arc::ptr_eq(&u.stream, stream))
        {
            u.seq = u.seq.max(seq); // (also puts back reads `wait_all` took)
            return;
        }
        let mut kept = self.take_reads();
        kept.retain(|u| !u.stream.is_done(u.seq));
        kept.push(Use { stream: stream.clone(), seq });
        // The newest reader goes inline: the next copy from it takes the fast path.
        self.read = kept.pop();
        self.more_reads = kept;
    }

    /// Records a write of `span` by operation `seq` of `stream` (it follows
    /// every earlier use, and the holds on `span`).
    #[inline]
    fn note_write(&mut self, stream: &Arc<StreamInner>, seq: u64, span: &Span) {
        match &mut self.write {
            Some(u) if self.read.is_none() && self.holds.is_empty() && Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            _ => self.note_write_slow(stream, seq, span),
        }
    }

    #[cold]
    #[inline(never)]
    fn note_write_slow(&mut self, stream: &Arc<StreamInner>, seq: u64, span: &Span) {
        self.read = None;
        self.more_reads.clear();
        // The holds on `span` were released and ordered before this write,
        // which stands for them from now on; others stay.
        self.holds.retain(|h| !overlaps(&h.span, span));
        match &mut self.write {
            Some(u) if Arc::ptr_eq(&u.stream, stream) => u.seq = seq,
            w => *w = Some(Use { stream: stream.clone(), seq }),
        }
    }
}

impl Stream {
    /// Enqueues one operation reading `read` (a buffer's fence and the span
    /// read, if any) and writing `write` (likewise): orders it after other
    /// streams' conflicting uses, runs `enqueue`, then records the uses.
    /// Returns the pending operation, borrowing for `'a`.
    ///
    /// This is the per-copy hot path. The written buffer is exclusively
    /// borrowed by the caller, so its fence is reached through `&mut` without
    /// locking; the read buffer's fence is locked once, across the enqueue (so
    /// its record cannot interleave with another thread's copy from the same
    /// buffer). Locks are taken in one order (read, then the streams' `cross`
    /// events), and a written fence is never locked by anyone else meanwhile,
    /// so no cycle can form. A part of a buffer ([`crate::DeviceSliceMut::split_at_mut`])
    /// records into the buffer's fence, shared with the other part: that case
    /// is [`Stream::enqueue_into_part`]. No lock is held while waiting for a
    /// detached writer to release its hold.
    #[inline]
    pub(crate) fn enqueue<'a>(
        &'a self,
        read: Option<(&Fence, Span)>,
        write: (&mut Fence, Span),
        enqueue: impl FnOnce(Queue) -> Result<()>,
    ) -> Result<Pending<'a>> {
        let on = self.inner();
        on.ensure_current()?;
        let (write, wspan) = write;
        if write.part_of.is_some() {
            return self.enqueue_into_part(read, write.target(), wspan, enqueue);
        }
        let w = write.state.get_mut();
        if !w.holds.is_empty() {
            w.settle(&wspan);
        }
        let mut r = read.map(|(f, span)| (f.target().lock_settled(&span), span));
        if let Some((r, span)) = &mut r {
            r.order_read(on, span)?;
        }
        w.order_write(on, &wspan)?;
        let seq = on.submit(enqueue)?;
        if let Some((r, _)) = &mut r {
            r.note_read(on, seq);
        }
        w.note_write(on, seq, &wspan);
        Ok(Pending::new(on, seq))
    }

    /// [`Stream::enqueue`] writing a part of a buffer whose fence, `write`, the
    /// other part shares: it is locked too. When the read fence is another
    /// one, the two are locked in address order (two threads copying between
    /// parts of two buffers in opposite directions cannot deadlock); when it is
    /// the same (a copy from one part to the other), it is locked once.
    #[cold]
    #[inline(never)]
    fn enqueue_into_part<'a>(
        &'a self,
        read: Option<(&Fence, Span)>,
        write: &Fence,
        wspan: Span,
        enqueue: impl FnOnce(Queue) -> Result<()>,
    ) -> Result<Pending<'a>> {
        let on = self.inner();
        let read = read.map(|(f, span)| (f.target(), span));
        let other = read.as_ref().map(|(f, _)| *f).filter(|f| !std::ptr::eq(*f, write));
        loop {
            let (mut w, mut r) = match other {
                None => (write.state.lock(), None),
                Some(f) if (f as *const Fence) < (write as *const Fence) => {
                    let r = f.state.lock();
                    (write.state.lock(), Some(r))
                }
                Some(f) => {
                    let w = write.state.lock();
                    let r = f.state.lock();
                    (w, Some(r))
                }
            };
            // Any hold on either span still held: wait for it unlocked, then again.
            let mut waiting = w.unreleased(&wspan);
            if let Some((_, span)) = &read {
                waiting.extend(r.as_deref().unwrap_or(&*w).unreleased(span));
            }
            if !waiting.is_empty() {
                drop(r);
                drop(w);
                waiting.iter().for_each(|h| drop(h.wait_released()));
                continue;
            }
            if let Some((_, span)) = &read {
                match r.as_deref_mut() {
                    Some(r) => r.order_read(on, span)?,
                    None => w.order_read(on, span)?,
                }
            }
            w.order_write(on, &wspan)?;
            let seq = on.submit(enqueue)?;
            if read.is_some() {
                match r.as_deref_mut() {
                    Some(r) => r.note_read(on, seq),
                    None => w.note_read(on, seq), // the same fence: the write below supersedes it
                }
            }
            w.note_write(on, seq, &wspan);
            return Ok(Pending::new(on, seq));
        }
    }
}
