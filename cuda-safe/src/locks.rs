//! Locking that outlives a panic.
//!
//! The crates built on this one keep only bookkeeping under their locks
//! (counters, queues, registries), each update a single step that leaves the
//! state consistent, so a panic on another thread that poisoned a lock leaves
//! nothing half-done. These functions take the lock anyway instead of
//! propagating the poison as a second panic.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, also when a panic poisoned it.
///
/// ```
/// let m = std::sync::Mutex::new(1);
/// *wirespeed_cuda::locks::lock(&m) += 1;
/// assert_eq!(*wirespeed_cuda::locks::lock(&m), 2);
/// ```
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Shares `m`, also when a panic poisoned it.
///
/// ```
/// let m = std::sync::RwLock::new(1);
/// assert_eq!(*wirespeed_cuda::locks::read(&m), 1);
/// ```
pub fn read<T: ?Sized>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `m` for writing, also when a panic poisoned it.
///
/// ```
/// let m = std::sync::RwLock::new(1);
/// *wirespeed_cuda::locks::write(&m) = 2;
/// assert_eq!(*wirespeed_cuda::locks::read(&m), 2);
/// ```
pub fn write<T: ?Sized>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}
