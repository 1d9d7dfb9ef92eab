//! Hints to the CPU that change no result: [`prefetch`].

/// Asks the CPU to bring the cache line holding `bytes[at]` into its caches
/// (and to walk the page tables for it now), so that a read of it a little
/// later does not stall: for loops that read scattered records, a few records
/// ahead. Does nothing when `at` is past the end, or off x86_64.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = bytes.get(at) {
        let p: *const i8 = std::ptr::from_ref(b).cast();
        // SAFETY: a prefetch reads nothing the program can see and cannot
        // fault (it is dropped where a read would fault); SSE, which the
        // instruction needs, is part of every x86_64 CPU; `p` points into a
        // live slice anyway.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, at);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefetch_changes_nothing_and_ignores_what_is_out_of_range() {
        let v = vec![7u8; 100];
        super::prefetch(&v, 0);
        super::prefetch(&v, 99);
        super::prefetch(&v, 100);
        super::prefetch(&v, usize::MAX);
        assert!(v.iter().all(|&b| b == 7));
    }
}
