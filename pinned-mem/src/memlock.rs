//! `mlock`/`munlock` and `RLIMIT_MEMLOCK`.
//!
//! Policy (decided here, documented on [`PinOptions::mlock`](crate::PinOptions)):
//! before locking, this crate compares what is asked (plus what the process has
//! locked already, `VmLck`) with the soft `RLIMIT_MEMLOCK`, **unless the process
//! has `CAP_IPC_LOCK` in its effective set**, which the kernel exempts from the
//! limit (root usually has it: on such machines we do not refuse what the kernel
//! allows). When `mlock` itself fails with `ENOMEM`/`EPERM`/`EAGAIN` the error is
//! the same typed [`Error::MemlockLimit`].
//!
//! This module, `mapping.rs`, `hint.rs` and `shuffle/gather.rs` hold the crate's `unsafe` code.

use std::ops::Range;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

use wirespeed_cuda::locks;

use crate::error::{Error, Result};

/// The bit of `CAP_IPC_LOCK` in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// The soft `RLIMIT_MEMLOCK` in bytes, or `None` when unlimited (or unreadable).
///
/// ```
/// match wirespeed_pinned::memlock_limit() {
///     Some(bytes) => println!("mlock limit: {bytes} bytes"),
///     None => println!("no mlock limit"),
/// }
/// ```
pub fn memlock_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit};
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft != nix::sys::resource::RLIM_INFINITY => Some(soft),
        _ => None,
    }
}

/// How many more bytes this process may `mlock`: `None` when there is no limit
/// for it (unlimited, or the process has `CAP_IPC_LOCK`).
///
/// ```
/// if let Some(left) = wirespeed_pinned::memlock_headroom() {
///     println!("{left} bytes may still be locked");
/// }
/// ```
pub fn memlock_headroom() -> Option<u64> {
    if has_cap_ipc_lock() {
        return None;
    }
    memlock_limit().map(|l| l.saturating_sub(locked_bytes()))
}

/// A field of the calling thread's `/proc/thread-self/status` (capabilities
/// are per thread, and the kernel checks the calling thread's for `mlock`).
fn status_field(name: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    s.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|r| r.trim().to_string()))
}

/// True when `CAP_IPC_LOCK` is in the calling thread's effective capability set.
pub(crate) fn has_cap_ipc_lock() -> bool {
    status_field("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Bytes this process has locked now (`VmLck`).
pub(crate) fn locked_bytes() -> u64 {
    status_field("VmLck")
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .map_or(0, |kb| kb.saturating_mul(1024))
}

/// Refuses, with the typed error, an `mlock` of `requested` bytes that the
/// kernel would refuse for `RLIMIT_MEMLOCK`.
pub(crate) fn check(requested: u64) -> Result<()> {
    if has_cap_ipc_lock() {
        return Ok(());
    }
    if let Some(limit) = memlock_limit() {
        let locked = locked_bytes();
        if locked.saturating_add(requested) > limit {
            return Err(Error::MemlockLimit { limit, requested, locked });
        }
    }
    Ok(())
}

/// Locks `[ptr, ptr + len)` in memory, after [`check`].
///
/// # Safety
/// The range must be mapped (in a mapping that outlives the lock).
pub(crate) unsafe fn lock(ptr: NonNull<u8>, len: usize, path: &Path) -> Result<()> {
    check(len as u64)?;
    // SAFETY: the caller guarantees the range is mapped; mlock does not touch
    // the contents, it only faults the pages in and keeps them resident.
    match unsafe { nix::sys::mman::mlock(ptr.cast(), len) } {
        Ok(()) => Ok(()),
        Err(e @ (nix::errno::Errno::ENOMEM | nix::errno::Errno::EPERM | nix::errno::Errno::EAGAIN)) => {
            match memlock_limit() {
                Some(limit) => Err(Error::MemlockLimit { limit, requested: len as u64, locked: locked_bytes() }),
                None => Err(Error::io("mlock", path, e.into())),
            }
        }
        Err(e) => Err(Error::io("mlock", path, e.into())),
    }
}

/// Unlocks `[ptr, ptr + len)`.
///
/// # Safety
/// The range must be mapped and have been locked by [`lock`].
pub(crate) unsafe fn unlock(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract; munlock only changes residency.
    let _ = unsafe { nix::sys::mman::munlock(ptr.cast(), len) };
}

/// The pages of one mapping locked on behalf of ranges that share a
/// registration made without `mlock` (each asked for its own pages to be
/// locked). `mlock` does not count: one `munlock` unlocks a page whoever
/// locked it. So the table keeps every holder's range (offsets into the
/// mapping), locks only the parts no other holder covers, and unlocks a
/// holder's pages only where no other holder covers them: a page stays
/// locked while any holder of it lives.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    held: Mutex<Vec<Range<usize>>>,
}

impl LockTable {
    /// Locks bytes `r` of the mapping at `base` for one more holder, after
    /// [`check`]; nothing stays locked on error.
    ///
    /// # Safety
    /// `[base + r.start, base + r.end)` must be mapped until the same range is
    /// [`LockTable::release`]d (or for good, if it never is), and every call
    /// on this table must pass the same `base`.
    pub(crate) unsafe fn hold(&self, base: NonNull<u8>, r: Range<usize>, path: &Path) -> Result<()> {
        let mut held = locks::lock(&self.held);
        let mut done: Vec<Range<usize>> = Vec::new();
        for gap in uncovered(&held, &r) {
            // SAFETY: inside `r`, mapped (the caller's contract).
            let at = unsafe { base.add(gap.start) };
            // SAFETY: as above; locked only here, unlocked only by `release`.
            if let Err(e) = unsafe { lock(at, gap.len(), path) } {
                for d in done {
                    // SAFETY: locked just above, still mapped.
                    unsafe { unlock(base.add(d.start), d.len()) };
                }
                return Err(e);
            }
            done.push(gap);
        }
        held.push(r);
        Ok(())
    }

    /// Ends one holder of bytes `r` (as given to [`LockTable::hold`]):
    /// unlocks the parts no other holder covers.
    ///
    /// # Safety
    /// As [`LockTable::hold`], for a range held by it and not released since.
    pub(crate) unsafe fn release(&self, base: NonNull<u8>, r: Range<usize>) {
        let mut held = locks::lock(&self.held);
        let Some(i) = held.iter().position(|h| *h == r) else { return };
        held.swap_remove(i);
        for gap in uncovered(&held, &r) {
            // SAFETY: inside `r`, still mapped and locked by `hold` (the caller's contract).
            unsafe { unlock(base.add(gap.start), gap.len()) };
        }
    }
}

/// The parts of `r` that no range of `held` covers, in order.
fn uncovered(held: &[Range<usize>], r: &Range<usize>) -> Vec<Range<usize>> {
    let mut cover: Vec<&Range<usize>> = held.iter().filter(|h| h.start < r.end && r.start < h.end).collect();
    cover.sort_by_key(|h| h.start);
    let mut gaps = Vec::new();
    let mut at = r.start;
    for h in cover {
        if h.start > at {
            gaps.push(at..h.start);
        }
        at = at.max(h.end);
    }
    if at < r.end {
        gaps.push(at..r.end);
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // slices of one range, on purpose
    fn the_uncovered_parts_of_a_range() {
        assert_eq!(uncovered(&[], &(0..10)), vec![0..10]);
        assert_eq!(uncovered(&[2..4, 3..5, 8..20], &(0..10)), vec![0..2, 5..8]);
        assert_eq!(uncovered(&[0..10], &(2..8)), Vec::<Range<usize>>::new());
        assert_eq!(uncovered(&[10..12], &(0..10)), vec![0..10]);
    }

    #[test]
    fn reads_status() {
        // Whatever the machine, these must not fail to parse into something sane.
        let _ = has_cap_ipc_lock();
        assert!(locked_bytes() < 1 << 50);
        if let (Some(l), false) = (memlock_limit(), has_cap_ipc_lock()) {
            assert!(memlock_headroom().is_some_and(|h| h <= l));
        }
    }

    #[test]
    fn check_refuses_more_than_the_limit_without_the_capability() {
        match (memlock_limit(), has_cap_ipc_lock()) {
            (Some(limit), false) => {
                let e = check(limit.saturating_add(1)).unwrap_err();
                assert!(matches!(e, Error::MemlockLimit { .. }), "{e}");
            }
            _ => assert!(check(u64::MAX / 2).is_ok()),
        }
    }
}
