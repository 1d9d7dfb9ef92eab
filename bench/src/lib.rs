//! What the `bench`, `soak` and `multi` binaries share: CPU time, sizes on the
//! command line, `--emulated` and the demo file.

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

/// The emulated CUDA runtime behind `--emulated`.
pub mod emulator {
    /// Selects the emulated runtime for this process (before any CUDA call) and
    /// returns the path of its library. Where this build lacks the `emulator`
    /// feature, the error says so and shows `rebuild`, a command that has it.
    pub fn select(rebuild: &str) -> Result<String, String> {
        #[cfg(feature = "emulator")]
        {
            let _ = rebuild;
            let path = wirespeed_cuda_sys::emulator::library_path()
                .map_err(|e| format!("--emulated: the emulated runtime could not be made ready: {e}"))?;
            wirespeed_cuda_sys::emulator::install()
                .map_err(|e| format!("--emulated: cannot select the emulated runtime: {e}"))?;
            Ok(path)
        }
        #[cfg(not(feature = "emulator"))]
        Err(format!(
            "--emulated: this build does not contain the emulated runtime.\n\
             Rebuild it with the `emulator` feature, e.g.\n    {rebuild}"
        ))
    }
}

/// Writes `size` bytes of a deterministic xorshift pattern to a new file in the
/// temporary folder (`TMPDIR`), named `prefix` and a random part; the file is
/// removed when the returned handle is dropped.
pub fn pattern_file(prefix: &str, size: u64) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let temp = tempfile::Builder::new().prefix(prefix).suffix(".bin").tempfile()?;
    let mut f = std::io::BufWriter::with_capacity(8 << 20, temp.as_file());
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
    drop(f);
    temp.as_file().set_len(size)?;
    Ok(temp)
}

/// Parses a size: "4G", "512M", "1.5GiB", "64k", "4096" (K, M, G and T are
/// powers of 1024; a trailing "B" or "iB" is allowed). For clap's `value_parser`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    const KIB: u64 = 1 << 10;
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, mult) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], KIB),
        Some('m') => (&stripped[..stripped.len() - 1], KIB << 10),
        Some('g') => (&stripped[..stripped.len() - 1], KIB << 20),
        Some('t') => (&stripped[..stripped.len() - 1], KIB << 30),
        _ => (stripped, 1),
    };
    let bad = || format!("{s:?} is not a size (examples: 4G, 512M, 1.5GiB, 65536)");
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a whole number of at least 1 (repetitions, threads). For clap's `value_parser`.
pub fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number >= 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        const GIB: u64 = 1 << 30;
        assert_eq!(parse_size("4G"), Ok(4 * GIB));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 * GIB / 2));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64kB"), Ok(64 << 10));
        assert_eq!(parse_size("4 GB"), Ok(4 * GIB));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("4X").is_err());
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("3"), Ok(3));
        assert!(parse_count("0").is_err() && parse_count("-1").is_err() && parse_count("x").is_err());
    }
}
