//! Small helpers: the bench's error type, what the host has, sizes, statistics.

use std::fmt;
use std::path::Path;

/// What ended a run early. Usage and no-GPU errors exit 2, failed runs exit 1.
#[derive(Debug)]
pub enum Fatal {
    /// Bad arguments or an environment the bench cannot run in (exit 2).
    Usage(String),
    /// No usable GPU (exit 2); the message says what was looked for.
    NoGpu(String),
    /// A measurement failed (exit 1).
    Run(String),
}

impl Fatal {
    pub fn exit_code(&self) -> u8 {
        match self {
            Fatal::Usage(_) | Fatal::NoGpu(_) => 2,
            Fatal::Run(_) => 1,
        }
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fatal::Usage(m) | Fatal::NoGpu(m) | Fatal::Run(m) => f.write_str(m),
        }
    }
}

/// Any library error becomes a failed run, with its message (and hint).
impl<E: std::error::Error> From<E> for Fatal {
    fn from(e: E) -> Self {
        Fatal::Run(e.to_string())
    }
}

pub type Result<T, E = Fatal> = std::result::Result<T, E>;

/// Adds context to an error's message.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Fatal::Run(format!("{}: {e}", what())))
    }
}

/// Logical cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The host the bench runs on, in words: the CPU model (from
/// /proc/cpuinfo), the cores this process may use, the last-level cache
/// (from /sys) and the memory. Machines lent by the hour differ from start to
/// start; this is what a log needs to compare them.
pub fn host() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "CPU model unknown".into());
    let mut parts = vec![model, format!("{} cores", cores())];
    if let Some((level, size)) = last_level_cache() {
        parts.push(format!("L{level} cache {size}"));
    }
    if let Some(total) = mem_field("MemTotal:") {
        parts.push(format!("{} memory", fmt_bytes(total)));
    }
    format!("host: {}", parts.join(", "))
}

/// The highest cache level of CPU 0 and its size as /sys writes it ("105M"
/// becomes "105 MiB").
fn last_level_cache() -> Option<(u32, String)> {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, String)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).ok().map(|s| s.trim().to_string());
        let (Some(level), Some(size)) = (read("level").and_then(|l| l.parse::<u32>().ok()), read("size")) else {
            continue;
        };
        if best.as_ref().is_none_or(|(l, _)| level > *l) {
            let size = match size.strip_suffix('K') {
                Some(k) => k.parse::<u64>().map_or(size.clone(), |k| fmt_bytes(k * KIB)),
                None => size.strip_suffix('M').map_or(size.clone(), |m| format!("{m} MiB")),
            };
            best = Some((level, size));
        }
    }
    best
}

fn mem_field(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    mem_field("MemAvailable:")
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path`.
pub fn disk_available(path: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

/// True when `path` lives on tmpfs (RAM): nothing there is ever read from a disk.
pub fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// "4.00 GiB", "256 MiB", "12 KiB", "100 B".
pub fn fmt_bytes(n: u64) -> String {
    let (unit, div) = match n {
        n if n >= GIB => ("GiB", GIB),
        n if n >= MIB => ("MiB", MIB),
        n if n >= KIB => ("KiB", KIB),
        _ => return format!("{n} B"),
    };
    if n.is_multiple_of(div) { format!("{} {unit}", n / div) } else { format!("{:.2} {unit}", n as f64 / div as f64) }
}

/// Median, minimum and maximum of some values.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub fn stats(values: &[f64]) -> Stats {
    if values.is_empty() {
        return Stats { median: f64::NAN, min: f64::NAN, max: f64::NAN };
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Stats { median, min: v[0], max: v[n - 1] }
}

/// Splits `0..len` into pieces of at most `piece` bytes.
pub fn pieces(len: u64, piece: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    let piece = piece.max(1);
    (0..len.div_ceil(piece)).map(move |i| i * piece..((i + 1) * piece).min(len))
}

/// `value` rounded down to a multiple of `to` (at least `to`).
pub fn round_down(value: u64, to: u64) -> u64 {
    (value / to * to).max(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median() {
        let s = stats(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(stats(&[1.0, 2.0, 3.0, 4.0]).median, 2.5);
    }

    #[test]
    fn bytes() {
        assert_eq!(fmt_bytes(4 * GIB), "4 GiB");
        assert_eq!(fmt_bytes(3 * GIB / 2), "1.50 GiB");
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(pieces(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
    }
}
