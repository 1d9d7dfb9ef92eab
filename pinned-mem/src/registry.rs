//! The live registrations of one mapping, and the leases that share them.
//!
//! CUDA refuses a page registered twice, so each [`MappedFile`](crate::MappedFile)
//! keeps a registry of its live registrations:
//!
//! * a range inside a live registration **shares** it (no new registration,
//!   no new budget), provided the registration is at least as portable as
//!   the range asks (a range asking for `mlock` inside one made without it
//!   shares it too, and locks its own pages: see `PinnedRange`);
//! * a range that overlaps a live registration without being inside it, or
//!   overlaps pages whose unregistering failed, is refused with
//!   [`Error::Overlap`];
//! * a range that overlaps a registration being undone right now waits until
//!   it is gone, then looks again.
//!
//! The registry does not know what a registration is (`R`, a
//! `HostRegistration` of file pages in this crate). Each one is handed out as
//! [`Lease`]s: while any lease lives, the registry keeps the registration in
//! its entry to hand out more. The last lease to go takes it out of the entry
//! (which then reads as dying) and drops it, undoing the registration; the
//! registration's liveness token drops after it and removes the entry, so no
//! one registers those pages again before CUDA has forgotten them. Where the
//! registration could not be undone (its memory was leaked rather than freed
//! under a copy), the token marks the entry leaked instead, and later ranges
//! of those pages are refused clearly.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use wirespeed_cuda::locks::lock;

use crate::error::{Error, Result};

/// What a registration was made with, and what a range sharing one asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Terms {
    /// Registered for every device (`cudaHostRegisterPortable`).
    pub(crate) portable: bool,
    /// The pages are also `mlock`-ed.
    pub(crate) mlock: bool,
}

impl Terms {
    /// Why a registration made with `self` cannot serve a range asking for
    /// `want`, or `None` when it can. `mlock` never refuses: a range that asks
    /// for it locks its own pages of a registration made without it (a
    /// registration of other devices' pages cannot be made portable later).
    fn refuses(self, want: Terms) -> Option<&'static str> {
        (want.portable && !self.portable)
            .then_some("it is registered without the Portable flag, which this range asks for")
    }
}

/// The live registrations of one mapping. Made with [`Registry::new`] and
/// kept in an `Arc`, which every lease and token holds.
pub(crate) struct Registry<R> {
    state: Mutex<State<R>>,
    /// Signalled when an entry is removed (or marked leaked).
    removed: Condvar,
}

struct State<R> {
    entries: Vec<Entry<R>>,
    next_id: u64,
}

struct Entry<R> {
    id: u64,
    pages: Range<u64>,
    terms: Terms,
    status: Status<R>,
}

enum Status<R> {
    /// Held by `sharers` leases; the entry keeps one more `Arc` to hand out.
    Live { shared: Arc<Shared<R>>, sharers: usize },
    /// The last lease is gone and the registration is being undone now.
    Dying,
    /// Undoing the registration failed: its pages stay registered for good.
    Leaked,
}

/// A registration and its liveness token. Fields drop in order: the
/// registration is undone before the token removes the entry.
struct Shared<R> {
    value: R,
    pages: Range<u64>,
    terms: Terms,
    token: Token<R>,
}

/// Removes its entry when dropped, once the registration is gone, and wakes
/// those waiting for it. When the registration's memory was leaked instead
/// (its `gone` flag never set), it marks the entry leaked.
struct Token<R> {
    registry: Arc<Registry<R>>,
    id: u64,
    /// Set when the registered memory is released (its registration undone).
    gone: Arc<AtomicBool>,
}

/// One share of a live registration: [`Lease::value`] is the registration,
/// valid as long as the lease. Dropping the last lease of a registration
/// undoes it.
pub(crate) struct Lease<R> {
    /// Declared first, so dropped first: the last lease has taken the entry's
    /// `Arc` out of the registry by the time its own `shared` drops.
    share: Share<R>,
    shared: Arc<Shared<R>>,
}

/// Counts one lease in its entry.
struct Share<R> {
    registry: Arc<Registry<R>>,
    id: u64,
}

/// What [`Registry::claim`] found for a range.
pub(crate) enum Claim<'a, R> {
    /// A live registration holds the range: a new lease of it.
    Shared(Lease<R>),
    /// Nothing registered overlaps the range: register it, and
    /// [`Vacancy::insert`] the registration.
    Vacant(Vacancy<'a, R>),
}

/// Pages nothing registered overlaps. It holds the registry locked, so that
/// nobody else registers pages of the mapping before this registration is
/// inserted (or the vacancy dropped).
pub(crate) struct Vacancy<'a, R> {
    registry: &'a Arc<Registry<R>>,
    state: MutexGuard<'a, State<R>>,
    pages: Range<u64>,
}

/// The outcome of one look at the entries.
enum Lookup<R> {
    /// A new lease of the live registration that holds the range.
    Share(Lease<R>),
    /// A registration of overlapping pages is being undone.
    Wait,
    /// Nothing overlaps.
    Free,
}

impl<R> Registry<R> {
    /// An empty registry.
    pub(crate) fn new() -> Arc<Registry<R>> {
        Arc::new(Registry { state: Mutex::new(State { entries: Vec::new(), next_id: 0 }), removed: Condvar::new() })
    }

    /// Shares the live registration that holds `pages` on `want`'s terms, or
    /// hands out the registry locked for a new one when nothing registered
    /// overlaps them. Waits while a registration of overlapping pages is being
    /// undone.
    ///
    /// # Errors
    /// [`Error::Overlap`] (naming `requested`, the bytes asked for) when a live
    /// registration overlaps `pages` without holding them, holds them without
    /// the Portable flag `want` asks for, or when overlapping pages stay
    /// registered after a failed unregistration. A lease of a registration
    /// made without the `mlock` that `want` asks for is handed out: its
    /// [`Lease::terms`] say so, and the caller locks the pages itself.
    pub(crate) fn claim<'a>(
        self: &'a Arc<Self>,
        requested: &Range<u64>,
        pages: Range<u64>,
        want: Terms,
    ) -> Result<Claim<'a, R>> {
        let mut st = lock(&self.state);
        loop {
            match st.look_up(self, requested, &pages, want)? {
                Lookup::Share(lease) => return Ok(Claim::Shared(lease)),
                Lookup::Wait => st = self.removed.wait(st).unwrap_or_else(PoisonError::into_inner),
                Lookup::Free => return Ok(Claim::Vacant(Vacancy { registry: self, state: st, pages })),
            }
        }
    }

    /// The pages of the live registration (one still held by a lease) that
    /// overlaps `pages` and starts first, if any: the streamer cuts its
    /// windows at such a registration's edges and shares it for the pages
    /// inside, instead of failing with [`Error::Overlap`].
    pub(crate) fn first_live_overlap(&self, pages: &Range<u64>) -> Option<Range<u64>> {
        let st = lock(&self.state);
        st.entries
            .iter()
            .filter(|e| overlaps(&e.pages, pages) && matches!(e.status, Status::Live { .. }))
            .map(|e| e.pages.clone())
            .min_by_key(|p| p.start)
    }
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

impl<R> State<R> {
    /// Looks for what overlaps `pages`, and joins the live registration that
    /// holds them, if one does (see [`Registry::claim`]).
    fn look_up(
        &mut self,
        registry: &Arc<Registry<R>>,
        requested: &Range<u64>,
        pages: &Range<u64>,
        want: Terms,
    ) -> Result<Lookup<R>> {
        let mut dying = false;
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| overlaps(&e.pages, pages)) {
            let refuse = |reason| Error::Overlap { requested: requested.clone(), existing: e.pages.clone(), reason };
            match e.status {
                Status::Leaked => {
                    return Err(refuse(
                        "unregistering those pages failed earlier (a CUDA error), so they stay registered",
                    ));
                }
                Status::Dying => dying = true,
                Status::Live { .. } => {
                    if !(e.pages.start <= pages.start && pages.end <= e.pages.end) {
                        return Err(refuse("the range is not inside that registration"));
                    }
                    // Copies run in the primary context, which sees a
                    // registration made there or a portable one made in any
                    // context: a live one is shared whatever context the new
                    // range asks for (its owner unregisters it in its own).
                    if let Some(reason) = e.terms.refuses(want) {
                        return Err(refuse(reason));
                    }
                    found = Some(i);
                }
            }
        }
        if let Some(entry) = found.and_then(|i| self.entries.get_mut(i))
            && let Status::Live { shared, sharers } = &mut entry.status
        {
            *sharers += 1;
            let share = Share { registry: Arc::clone(registry), id: entry.id };
            return Ok(Lookup::Share(Lease { share, shared: Arc::clone(shared) }));
        }
        Ok(if dying { Lookup::Wait } else { Lookup::Free })
    }
}

impl<R> Vacancy<'_, R> {
    /// Records `value`, the registration of the vacant pages made on `terms`,
    /// and returns its first lease. `gone` is set when the registered memory
    /// is released; if it is still unset once the registration is dropped,
    /// the pages count as registered for good.
    pub(crate) fn insert(mut self, value: R, terms: Terms, gone: Arc<AtomicBool>) -> Lease<R> {
        let id = self.state.next_id;
        self.state.next_id += 1;
        let token = Token { registry: Arc::clone(self.registry), id, gone };
        let shared = Arc::new(Shared { value, pages: self.pages.clone(), terms, token });
        let status = Status::Live { shared: Arc::clone(&shared), sharers: 1 };
        self.state.entries.push(Entry { id, pages: self.pages, terms, status });
        Lease { share: Share { registry: Arc::clone(self.registry), id }, shared }
    }
}

impl<R> Lease<R> {
    /// The registration.
    pub(crate) fn value(&self) -> &R {
        &self.shared.value
    }

    /// The registered pages.
    pub(crate) fn pages(&self) -> &Range<u64> {
        &self.shared.pages
    }

    /// What the registration was made with.
    pub(crate) fn terms(&self) -> Terms {
        self.shared.terms
    }

    /// How many leases share the registration (1 when alone).
    pub(crate) fn sharers(&self) -> usize {
        let st = lock(&self.share.registry.state);
        match st.entries.iter().find(|e| e.id == self.share.id).map(|e| &e.status) {
            Some(Status::Live { sharers, .. }) => *sharers,
            _ => 1,
        }
    }

    /// Ends this lease. When it was the last, `finish` gets the registration
    /// to undo (the entry goes once `finish` returned) and its answer is
    /// returned; otherwise the others keep it and the answer is `None`.
    pub(crate) fn end_with<T>(self, finish: impl FnOnce(R) -> T) -> Option<T> {
        let Lease { share, shared } = self;
        drop(share);
        let Shared { value, token, .. } = Arc::try_unwrap(shared).ok()?;
        let answer = finish(value);
        drop(token);
        Some(answer)
    }
}

impl<R> Drop for Share<R> {
    fn drop(&mut self) {
        let taken = {
            let mut st = lock(&self.registry.state);
            st.entries.iter_mut().find(|e| e.id == self.id).and_then(Entry::leave)
        };
        // Never the last `Arc` (the lease still holds its own): dropped
        // outside the lock all the same.
        drop(taken);
    }
}

impl<R> Entry<R> {
    /// Counts one lease out; when it was the last, the entry reads as dying
    /// and hands back its `Arc` of the registration.
    fn leave(&mut self) -> Option<Arc<Shared<R>>> {
        let Status::Live { sharers, .. } = &mut self.status else { return None };
        *sharers = sharers.saturating_sub(1);
        if *sharers > 0 {
            return None;
        }
        match std::mem::replace(&mut self.status, Status::Dying) {
            Status::Live { shared, .. } => Some(shared),
            _ => None,
        }
    }
}

impl<R> Drop for Token<R> {
    fn drop(&mut self) {
        let mut st = lock(&self.registry.state);
        if self.gone.load(Ordering::Acquire) {
            st.entries.retain(|e| e.id != self.id);
        } else if let Some(e) = st.entries.iter_mut().find(|e| e.id == self.id) {
            e.status = Status::Leaked;
        }
        drop(st);
        self.registry.removed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in registration: sets its `gone` flag when dropped, unless leaked.
    struct Fake {
        gone: Arc<AtomicBool>,
        leak: bool,
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            if !self.leak {
                self.gone.store(true, Ordering::Release);
            }
        }
    }

    const PLAIN: Terms = Terms { portable: false, mlock: false };

    fn register(reg: &Arc<Registry<Fake>>, pages: Range<u64>, terms: Terms, leak: bool) -> Lease<Fake> {
        match reg.claim(&pages, pages.clone(), terms).unwrap() {
            Claim::Vacant(v) => {
                let gone = Arc::new(AtomicBool::new(false));
                v.insert(Fake { gone: Arc::clone(&gone), leak }, terms, gone)
            }
            Claim::Shared(_) => panic!("{pages:?} should be vacant"),
        }
    }

    fn reason(r: Result<Claim<'_, Fake>>) -> &'static str {
        match r {
            Err(Error::Overlap { reason, .. }) => reason,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("not refused"),
        }
    }

    #[test]
    fn ranges_inside_share_and_the_last_lease_removes_the_entry() {
        let reg = Registry::new();
        let outer = register(&reg, 0..8192, PLAIN, false);
        let Ok(Claim::Shared(inner)) = reg.claim(&(10..20), 0..4096, PLAIN) else { panic!("not shared") };
        assert_eq!((outer.sharers(), inner.sharers(), inner.pages().clone()), (2, 2, 0..8192));
        assert_eq!(reg.first_live_overlap(&(4096..12288)), Some(0..8192));
        drop(outer);
        assert_eq!(inner.sharers(), 1);
        assert_eq!(inner.end_with(|f| f.leak), Some(false));
        assert_eq!(reg.first_live_overlap(&(0..8192)), None);
        assert!(matches!(reg.claim(&(0..1), 0..4096, PLAIN), Ok(Claim::Vacant(_))));
    }

    #[test]
    fn partial_overlaps_and_registrations_short_of_portable_are_refused() {
        let reg = Registry::new();
        let lease = register(&reg, 4096..8192, PLAIN, false);
        assert_eq!(reason(reg.claim(&(0..5000), 0..8192, PLAIN)), "the range is not inside that registration");
        let portable = Terms { portable: true, mlock: false };
        assert!(reason(reg.claim(&(4096..5000), 4096..8192, portable)).contains("Portable"));
        // Without mlock, shared all the same: the lease says so.
        let locked = Terms { portable: false, mlock: true };
        let Ok(Claim::Shared(l)) = reg.claim(&(4096..5000), 4096..8192, locked) else { panic!("not shared") };
        assert!(!l.terms().mlock);
        drop(l);
        // A portable, locked registration serves a range asking for less.
        drop(lease);
        let strong = Terms { portable: true, mlock: true };
        let _lease = register(&reg, 4096..8192, strong, false);
        assert!(matches!(reg.claim(&(4096..5000), 4096..8192, PLAIN), Ok(Claim::Shared(_))));
    }

    #[test]
    fn a_leaked_registration_is_refused_for_good() {
        let reg = Registry::new();
        drop(register(&reg, 0..4096, PLAIN, true));
        assert_eq!(reg.first_live_overlap(&(0..4096)), None);
        assert!(reason(reg.claim(&(0..10), 0..4096, PLAIN)).contains("stay registered"));
        // Pages beside it are free.
        assert!(matches!(reg.claim(&(4096..4097), 4096..8192, PLAIN), Ok(Claim::Vacant(_))));
    }

    #[test]
    fn a_claim_waits_for_a_dying_registration() {
        let reg = Registry::new();
        let lease = register(&reg, 0..4096, PLAIN, false);
        let gone = Arc::clone(&lease.value().gone);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            // The last lease ends on another thread, and undoing takes a while.
            s.spawn(move || {
                lease.end_with(|f| {
                    tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    drop(f);
                })
            });
            rx.recv().unwrap();
            // The entry is dying: the claim waits until it is gone.
            assert!(matches!(reg.claim(&(0..10), 0..4096, PLAIN), Ok(Claim::Vacant(_))));
            assert!(gone.load(Ordering::Acquire));
        });
    }
}
