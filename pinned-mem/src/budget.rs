//! The pinned-bytes budget: every pinned range, window, ring slot and bounce
//! buffer of this crate draws from one, so a program can never pin more than it
//! was allowed to. Running out is a clear [`Error::BudgetExceeded`], never a
//! crash of the machine.

use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};

/// A limit on pinned (page-locked) bytes, shared by clones (an `Arc` inside).
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
#[derive(Clone)]
pub struct PinBudget {
    inner: Arc<Inner>,
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
}

use wirespeed_cuda::locks::lock;

impl std::fmt::Debug for PinBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = lock(&self.inner.state);
        f.debug_struct("PinBudget")
            .field("limit", &self.inner.limit)
            .field("used", &s.used)
            .field("peak", &s.peak)
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
        PinBudget { inner: Arc::new(Inner { limit: limit_bytes, state: Mutex::new(State::default()) }) }
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
    /// Use it to account for pinned memory made outside this crate.
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
        Ok(Reservation { budget: self.clone(), bytes })
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
