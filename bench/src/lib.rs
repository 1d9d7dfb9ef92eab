//! What the `bench`, `soak` and `multi` binaries share: the demo file and CPU time.

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

/// User plus system CPU seconds of this process so far.
pub fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
        tv(u.user_time()) + tv(u.system_time())
    })
}
