//! The pinned-bytes budget: every pinned range, window, ring slot and bounce
//! buffer of this crate draws from one, so a program can never pin more than it
//! was allowed to. Running out is a clear [`Error::BudgetExceeded`], never a
//! crash of the machine.
//!
//! A budget also holds what streamers leave *parked* with it: a
//! [`Streamer`](crate::Streamer) dropped while the program still holds its
//! budget leaves its ring (still drawn from the budget) and its registration
//! context here, and the next streamer on the budget takes them up instead of
//! making them again. What is parked gives way to any reservation that needs
//! its room, and goes with the program's last handle of the budget, or with
//! [`PinBudget::release_parked`].

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};

/// A limit on pinned (page-locked) bytes, shared by clones (an `Arc` inside).
///
/// Streamers dropped while the program holds the budget (a handle besides
/// their own) park their ring and registration context with it, for the next
/// streamer on the budget: their bytes stay in [`PinBudget::used`]
/// ([`PinBudget::parked_bytes`] says how many) until a streamer takes them
/// up, a reservation needs their room (they are freed then, oldest first),
/// [`PinBudget::release_parked`] or [`Streamer::release_pins`](crate::Streamer::release_pins)
/// gives them back, or the program's last handle of the budget is dropped
/// (a handle forgotten with `mem::forget` keeps them, as it keeps the budget).
///
/// ```
/// use wirespeed_pinned::PinBudget;
/// let budget = PinBudget::new(8 << 20);
/// let a = budget.reserve(6 << 20)?;
/// assert_eq!(budget.used(), 6 << 20);
/// assert!(budget.reserve(4 << 20).is_err()); // only 2 MiB left
/// drop(a);
/// assert_eq!(budget.used(), 0);
/// assert_eq!(budget.peak(), 6 << 20);
/// # Ok::<(), wirespeed_pinned::Error>(())
/// ```
pub struct PinBudget {
    inner: Arc<Inner>,
    /// A handle of the program's (made by `new` or a clone), counted in
    /// `State::handles`, rather than the one a [`Reservation`] holds: what is
    /// parked lives while one of these does.
    held: bool,
}

struct Inner {
    limit: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    used: u64,
    peak: u64,
    watches: Vec<Weak<Mutex<u64>>>,
    /// The program's handles ([`PinBudget::held`]).
    handles: usize,
    /// What streamers parked, oldest first.
    parked: Vec<Parked>,
}

/// Something a streamer parked, and the bytes it holds drawn from the budget.
struct Parked {
    item: Box<dyn Any + Send>,
    bytes: u64,
}

impl Clone for PinBudget {
    /// Another handle of the same budget (the program's: what is parked lives
    /// while one exists).
    fn clone(&self) -> Self {
        lock(&self.inner.state).handles += 1;
        PinBudget { inner: Arc::clone(&self.inner), held: true }
    }
}

impl Drop for PinBudget {
    /// The program's last handle gives back what is parked: nobody could
    /// take it up any more.
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let gone = {
            let mut s = lock(&self.inner.state);
            s.handles = s.handles.saturating_sub(1);
            if s.handles == 0 { std::mem::take(&mut s.parked) } else { Vec::new() }
        };
        drop(gone); // outside the lock: their reservations give bytes back
    }
}

use wirespeed_cuda::locks::lock;

impl std::fmt::Debug for PinBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = lock(&self.inner.state);
        f.debug_struct("PinBudget")
            .field("limit", &self.inner.limit)
            .field("used", &s.used)
            .field("peak", &s.peak)
            .field("parked", &s.parked.iter().map(|p| p.bytes).sum::<u64>())
            .finish()
    }
}

impl PinBudget {
    /// A budget of `limit_bytes` pinned bytes.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(1 << 30);
    /// assert_eq!(b.limit(), 1 << 30);
    /// ```
    pub fn new(limit_bytes: u64) -> PinBudget {
        let state = State { handles: 1, ..State::default() };
        PinBudget { inner: Arc::new(Inner { limit: limit_bytes, state: Mutex::new(state) }), held: true }
    }

    /// A budget without a limit (it still counts `used` and `peak`).
    ///
    /// ```
    /// assert_eq!(wirespeed_pinned::PinBudget::unlimited().limit(), u64::MAX);
    /// ```
    pub fn unlimited() -> PinBudget {
        PinBudget::new(u64::MAX)
    }

    /// The limit in bytes (`u64::MAX` when unlimited).
    ///
    /// ```
    /// assert_eq!(wirespeed_pinned::PinBudget::new(5).limit(), 5);
    /// ```
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes pinned now through this budget.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(100);
    /// let _r = b.reserve(40)?;
    /// assert_eq!(b.used(), 40);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn used(&self) -> u64 {
        lock(&self.inner.state).used
    }

    /// Bytes that can still be pinned.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(100);
    /// let _r = b.reserve(40)?;
    /// assert_eq!(b.available(), 60);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn available(&self) -> u64 {
        self.inner.limit.saturating_sub(self.used())
    }

    /// The most bytes pinned at once since creation or [`PinBudget::reset_peak`].
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(100);
    /// drop(b.reserve(70)?);
    /// assert_eq!((b.used(), b.peak()), (0, 70));
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn peak(&self) -> u64 {
        lock(&self.inner.state).peak
    }

    /// Restarts the peak from what is pinned now.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(100);
    /// drop(b.reserve(70)?);
    /// b.reset_peak();
    /// assert_eq!(b.peak(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn reset_peak(&self) {
        let mut s = lock(&self.inner.state);
        s.peak = s.used;
    }

    /// Draws `bytes` from the budget until the returned [`Reservation`] is dropped.
    /// Use it to account for pinned memory made outside this crate. Where
    /// the budget falls short, what streamers parked with it is freed first,
    /// oldest first, as far as that makes room.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(100);
    /// let r = b.reserve(100)?;
    /// assert!(matches!(b.reserve(1), Err(wirespeed_pinned::Error::BudgetExceeded { requested: 1, available: 0, limit: 100 })));
    /// drop(r);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] with what was asked, what is left and the limit.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation> {
        match self.try_reserve(bytes) {
            Err(Error::BudgetExceeded { .. }) if self.reclaim(bytes) => self.try_reserve(bytes),
            r => r,
        }
    }

    /// [`PinBudget::reserve`] without freeing what is parked.
    fn try_reserve(&self, bytes: u64) -> Result<Reservation> {
        let mut s = lock(&self.inner.state);
        let available = self.inner.limit.saturating_sub(s.used);
        if bytes > available {
            return Err(Error::BudgetExceeded { requested: bytes, available, limit: self.inner.limit });
        }
        s.used += bytes;
        let used = s.used;
        s.peak = s.peak.max(used);
        s.watches.retain(|w| match w.upgrade() {
            Some(p) => {
                let mut p = lock(&p);
                *p = (*p).max(used);
                true
            }
            None => false,
        });
        Ok(Reservation { budget: PinBudget { inner: Arc::clone(&self.inner), held: false }, bytes })
    }

    /// Bytes held by what streamers parked with the budget (counted in
    /// [`PinBudget::used`]).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy, Streamer};
    /// let budget = PinBudget::new(512 << 20);
    /// let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, budget.clone()))?;
    /// s.prepare(4 << 30)?; // makes its ring
    /// drop(s); // the program still holds the budget: the ring is parked with it
    /// assert!(budget.parked_bytes() > 0);
    /// assert_eq!(budget.used(), budget.parked_bytes());
    /// # Ok(()) }
    /// ```
    pub fn parked_bytes(&self) -> u64 {
        lock(&self.inner.state).parked.iter().map(|p| p.bytes).sum()
    }

    /// Gives back everything streamers parked with the budget: their rings
    /// are freed (their bytes return to the budget) and their registration
    /// contexts let go of.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy, Streamer};
    /// let budget = PinBudget::new(512 << 20);
    /// let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, budget.clone()))?;
    /// s.prepare(4 << 30)?;
    /// drop(s);
    /// budget.release_parked();
    /// assert_eq!(budget.used(), 0);
    /// # Ok(()) }
    /// ```
    pub fn release_parked(&self) {
        let gone = std::mem::take(&mut lock(&self.inner.state).parked);
        drop(gone); // outside the lock
    }

    /// Parks `item`, which holds `bytes` drawn from this budget, for a later
    /// streamer on it; dropped at once where the program holds no handle of
    /// the budget any more.
    pub(crate) fn park(&self, item: Box<dyn Any + Send>, bytes: u64) {
        let mut s = lock(&self.inner.state);
        if s.handles == 0 {
            drop(s);
            drop(item);
            return;
        }
        s.parked.push(Parked { item, bytes });
    }

    /// Takes back the newest parked `T` that `fits`.
    pub(crate) fn take_parked<T: Any>(&self, fits: impl Fn(&T) -> bool) -> Option<T> {
        let mut s = lock(&self.inner.state);
        let i = s.parked.iter().rposition(|p| p.item.downcast_ref::<T>().is_some_and(&fits))?;
        s.parked.remove(i).item.downcast::<T>().ok().map(|b| *b)
    }

    /// Frees parked items that hold bytes, oldest first, until `bytes` are
    /// available (or none is left); true when it freed something.
    pub(crate) fn reclaim(&self, bytes: u64) -> bool {
        let gone: Vec<Parked> = {
            let mut s = lock(&self.inner.state);
            let short = bytes.saturating_sub(self.inner.limit.saturating_sub(s.used));
            let mut freed = 0u64;
            let mut gone = Vec::new();
            let mut i = 0;
            while freed < short && i < s.parked.len() {
                if s.parked[i].bytes == 0 {
                    i += 1;
                    continue;
                }
                let p = s.parked.remove(i);
                freed = freed.saturating_add(p.bytes);
                gone.push(p);
            }
            gone
        };
        let any = !gone.is_empty();
        drop(gone); // outside the lock: their reservations give bytes back
        any
    }

    /// True when both handles share one budget.
    ///
    /// ```
    /// let a = wirespeed_pinned::PinBudget::new(1);
    /// assert!(a.same(&a.clone()));
    /// assert!(!a.same(&wirespeed_pinned::PinBudget::new(1)));
    /// ```
    pub fn same(&self, other: &PinBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Starts a private high-water mark (for one transfer's report) at the
    /// bytes pinned now.
    pub(crate) fn watch(&self) -> PeakWatch {
        let mut s = lock(&self.inner.state);
        let w = Arc::new(Mutex::new(s.used));
        // Passes that reserve nothing (a kept registration) never prune in
        // `reserve`: prune the finished watches here too, or they pile up.
        s.watches.retain(|w| w.strong_count() > 0);
        s.watches.push(Arc::downgrade(&w));
        PeakWatch(w)
    }

    fn release(&self, bytes: u64) {
        let mut s = lock(&self.inner.state);
        s.used = s.used.saturating_sub(bytes);
    }
}

/// Bytes drawn from a [`PinBudget`], given back when dropped. Forgetting it
/// only leaks budget (never memory safety).
///
/// ```
/// let b = wirespeed_pinned::PinBudget::new(10);
/// let r = b.reserve(4)?;
/// assert_eq!(r.bytes(), 4);
/// # Ok::<(), wirespeed_pinned::Error>(())
/// ```
#[must_use = "the bytes go back to the budget when the reservation is dropped"]
pub struct Reservation {
    budget: PinBudget,
    bytes: u64,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").field("bytes", &self.bytes).finish()
    }
}

impl Reservation {
    /// The bytes held.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(10);
    /// assert_eq!(b.reserve(4)?.bytes(), 4);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The budget they were drawn from.
    ///
    /// ```
    /// let b = wirespeed_pinned::PinBudget::new(10);
    /// assert!(b.reserve(4)?.budget().same(&b));
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn budget(&self) -> &PinBudget {
        &self.budget
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// A high-water mark of a budget's `used`, private to its holder.
pub(crate) struct PeakWatch(Arc<Mutex<u64>>);

impl PeakWatch {
    pub(crate) fn peak(&self) -> u64 {
        *lock(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_peak() {
        let b = PinBudget::new(10);
        let w = b.watch();
        let r1 = b.reserve(4).unwrap();
        let r2 = b.clone().reserve(6).unwrap();
        assert_eq!(b.available(), 0);
        match b.reserve(1) {
            Err(Error::BudgetExceeded { requested, available, limit }) => {
                assert_eq!((requested, available, limit), (1, 0, 10))
            }
            other => panic!("{other:?}"),
        }
        drop(r1);
        assert_eq!(b.used(), 6);
        drop(r2);
        assert_eq!((b.used(), b.peak(), w.peak()), (0, 10, 10));
        b.reset_peak();
        assert_eq!(b.peak(), 0);
        let w2 = b.watch();
        drop(b.reserve(3).unwrap());
        assert_eq!((w.peak(), w2.peak()), (10, 3));
    }

    #[test]
    fn unlimited_never_refuses() {
        let b = PinBudget::unlimited();
        let _a = b.reserve(u64::MAX / 2).unwrap();
        let _c = b.reserve(u64::MAX / 2).unwrap();
        assert!(b.reserve(u64::MAX).is_err());
    }

    #[test]
    fn concurrent_reservations_never_exceed() {
        let b = PinBudget::new(1000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let b = b.clone();
                s.spawn(move || {
                    for _ in 0..1000 {
                        if let Ok(r) = b.reserve(300) {
                            assert!(b.used() <= 1000);
                            drop(r);
                        }
                    }
                });
            }
        });
        assert_eq!(b.used(), 0);
        assert!(b.peak() <= 900);
    }
}
