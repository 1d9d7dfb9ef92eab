//! Small helpers: byte formatting, page arithmetic, CPU time.

use std::fmt;

/// Formats a byte count the short way: `256 MiB`, `1 GiB`, `1.5 MiB`, `4000 B`.
///
/// ```
/// use wirespeed_pinned::Bytes;
/// assert_eq!(Bytes(256 << 20).to_string(), "256 MiB");
/// assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
/// assert_eq!(Bytes(1000).to_string(), "1000 B");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut unit = 0;
        let mut v = self.0;
        while unit + 1 < UNITS.len() && v >= 1024 && v.is_multiple_of(1024) {
            v /= 1024;
            unit += 1;
        }
        if unit + 1 < UNITS.len() && v >= 1024 {
            // Not a whole number of the next unit: one decimal of the largest unit.
            let mut x = self.0 as f64;
            let mut u = 0;
            while u + 1 < UNITS.len() && x >= 1024.0 {
                x /= 1024.0;
                u += 1;
            }
            let s = format!("{x:.1}");
            let s = s.trim_end_matches(".0");
            return write!(f, "{s} {}", UNITS[u]);
        }
        write!(f, "{v} {}", UNITS[unit])
    }
}

/// The most filler or reader threads a strategy may ask for, and ring
/// threads a streamer may keep in reserve.
pub(crate) const MAX_THREADS: usize = 1024;
/// The most windows in flight or ring slots a strategy or a ring may ask for
/// (state is kept per window and per slot, sized before anything is pinned).
pub(crate) const MAX_COUNT: usize = 1 << 16;
/// The largest window or slot (1 TiB): beyond it sizes overflow page rounding
/// and offsets long before any budget could grant them.
pub(crate) const MAX_SIZE: usize = 1 << 40;

/// The system page size (4096 when it cannot be read).
pub(crate) fn page_size() -> u64 {
    use std::sync::OnceLock;
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| u64::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Rounds `x` down to a multiple of `align` (a power of two).
pub(crate) fn align_down(x: u64, align: u64) -> u64 {
    x & !(align - 1)
}

/// Rounds `x` up to a multiple of `align` (a power of two), saturating.
pub(crate) fn align_up(x: u64, align: u64) -> u64 {
    x.saturating_add(align - 1) & !(align - 1)
}

/// User + system CPU seconds of the whole process so far (all threads).
pub(crate) fn process_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// The number of CPUs this process may use (1 when unknown).
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format() {
        assert_eq!(Bytes(0).to_string(), "0 B");
        assert_eq!(Bytes(4096).to_string(), "4 KiB");
        assert_eq!(Bytes(64 << 20).to_string(), "64 MiB");
        assert_eq!(Bytes(1 << 30).to_string(), "1 GiB");
        assert_eq!(Bytes((1 << 20) + (1 << 19)).to_string(), "1.5 MiB");
        assert_eq!(Bytes(12345).to_string(), "12.1 KiB");
    }

    #[test]
    fn alignment() {
        assert_eq!(align_down(4097, 4096), 4096);
        assert_eq!(align_up(4097, 4096), 8192);
        assert_eq!(align_up(8192, 4096), 8192);
        assert_eq!(align_up(u64::MAX, 4096), !4095);
        assert!(page_size().is_power_of_two());
    }

    #[test]
    fn cpu_time_moves() {
        let a = process_cpu_seconds();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_seconds() >= a);
    }
}
