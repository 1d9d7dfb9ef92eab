//! What the `bench`, `soak` and `multi` binaries share: CPU time and the demo file.

/// CPU time, as the binaries measure it.
pub mod cpu {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeVal;

    fn seconds(t: TimeVal) -> f64 {
        t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6
    }

    /// User + system CPU seconds of the whole process so far (every thread,
    /// the library's filler threads and the CUDA driver's own included).
    pub fn process_seconds() -> f64 {
        getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| seconds(u.user_time()) + seconds(u.system_time()))
    }

    /// CPU seconds of the calling thread, to the nanosecond (`getrusage` may
    /// count in scheduler ticks, too coarse for a batch of microsecond calls).
    pub fn thread_seconds() -> f64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is
        // always supported on Linux and clock_gettime writes nothing else.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        if rc == 0 {
            t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
        } else {
            getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |u| seconds(u.user_time()) + seconds(u.system_time()))
        }
    }
}

/// Writes `size` bytes of a deterministic xorshift pattern to a new file at `path`.
pub fn pattern_file(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..size.div_ceil(1 << 20) {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block)?;
    }
    f.flush()?;
    f.get_ref().set_len(size)
}
