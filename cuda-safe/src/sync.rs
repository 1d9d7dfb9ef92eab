//! A small spin lock for the fences' state.
//!
//! A fence is locked on every asynchronous copy that reads its buffer, for a
//! few dozen instructions (and, rarely, across two quick CUDA calls that order
//! one stream after another). `std::sync::Mutex` costs two atomic
//! read-modify-writes per lock (the unlock swaps, to find waiters); this lock
//! costs one, the unlock being a plain release store. Contention is rare (two
//! threads copying from the same buffer at once), so a waiter spins briefly,
//! then yields its time slice, then sleeps in short steps. A guard that is leaked leaves the lock held:
//! later lockers then wait forever, which is a hang, never unsoundness.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Mutual exclusion around a `T`, with one atomic operation per lock.
#[derive(Default)]
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time, so
// sharing the lock shares only the ability to take turns; `T: Send` is what
// moving the value's use between threads needs (as for `Mutex`).
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: owning the lock owns the value.
unsafe impl<T: Send> Send for SpinLock<T> {}
// No code that can unwind runs while the lock is held (its users only do
// bookkeeping and non-panicking CUDA calls under it), so a value seen after a
// panic elsewhere is consistent; as for `Mutex`, which marks itself so too.
impl<T> RefUnwindSafe for SpinLock<T> {}
impl<T> UnwindSafe for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        SpinGuard { lock: self, _value: PhantomData }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        // The holder may be enqueueing onto a stream whose host function runs
        // on this thread: let that stream go on before waiting.
        crate::hostfn::release();
        let mut waits = 0u32;
        loop {
            // Wait reading (no write traffic on the line) until it looks free:
            // spin, then yield, then sleep (the holder may be in a CUDA call
            // that waits for room in a full stream queue, for milliseconds).
            while self.locked.load(Ordering::Relaxed) {
                waits = waits.saturating_add(1);
                if waits < 200 {
                    std::hint::spin_loop();
                } else if waits < 300 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// The value, through exclusive access to the lock: no locking needed.
    #[inline]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Access to the locked value; dropping it releases the lock.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Sharing the guard shares `&T`: it is `Sync` only for `T: Sync`.
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so no
        // other reference to the value is live.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;
    use std::sync::Arc;

    #[test]
    fn counts_under_contention() {
        let l = Arc::new(SpinLock::<u64>::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(*l.lock(), 80_000);
    }

    #[test]
    fn leaked_guard_keeps_it_locked() {
        let l = SpinLock::new_for_test(5u8);
        std::mem::forget(l.lock());
        assert!(l.locked.load(std::sync::atomic::Ordering::Relaxed));
    }

    impl<T> SpinLock<T> {
        fn new_for_test(v: T) -> Self {
            SpinLock { locked: Default::default(), value: std::cell::UnsafeCell::new(v) }
        }
    }
}
