//! An experiment, CPU only: threads gathering random fixed-size records of a
//! page-cached file into buffers of their own (as the shuffle's ring threads
//! fill their slots), with and without prefetching the records a few ahead.
//!
//! ```text
//! cargo run --release -p wirespeed-bench --example cpu_gather -- FILE [RECORD_BYTES]
//! ```
//!
//! Prints GB/s for 1, 8 and 16 threads at prefetch distances 0 (none), 4, 8
//! and 16, and 0 again (the first look at each count may differ).

use std::time::Instant;

use wirespeed_pinned::MappedFile;

/// Hints the CPU to fetch the line holding `bytes[at]`.
fn prefetch(bytes: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = bytes.get(at) {
        // SAFETY: a prefetch reads nothing the program sees and cannot fault;
        // SSE is part of every x86_64 CPU; `b` is a live reference.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(std::ptr::from_ref(b).cast()) };
    }
}

/// Gathers `n` random records into a 4 MiB buffer, over and over; bytes moved.
fn gather(bytes: &[u8], rec: usize, n: usize, seed: u64, ahead: usize) -> usize {
    let count = bytes.len() / rec;
    let mut x = seed | 1;
    let offsets: Vec<usize> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as usize % count) * rec
        })
        .collect();
    let per = ((4 << 20) / rec).max(1);
    let mut buf = vec![0u8; per * rec];
    for (k, &at) in offsets.iter().enumerate() {
        if let Some(&p) = offsets.get(k + ahead).filter(|_| ahead > 0) {
            prefetch(bytes, p);
            let last = p + rec - 1;
            if last / 4096 != p / 4096 {
                prefetch(bytes, last / 4096 * 4096);
            }
        }
        let o = (k % per) * rec;
        buf[o..o + rec].copy_from_slice(&bytes[at..at + rec]);
    }
    std::hint::black_box(&buf);
    n * rec
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: cpu_gather FILE [RECORD_BYTES]")?;
    let rec: usize = args.next().map_or(Ok(2883), |s| s.parse())?;
    // SAFETY: the caller's file, not changed while this runs.
    let file = unsafe { MappedFile::open(std::path::Path::new(&path)) }?;
    let bytes = file.as_bytes();
    // Every page mapped first: a fresh mapping's first touch of each page faults.
    let warm: u64 = bytes.iter().step_by(4096).map(|&b| u64::from(b)).sum();
    std::hint::black_box(warm);
    println!("{path}: {:.2} GiB, records of {rec} bytes", bytes.len() as f64 / (1u64 << 30) as f64);
    for threads in [1usize, 8, 16] {
        for ahead in [0usize, 4, 8, 16, 0] {
            let n = 300_000;
            let t = Instant::now();
            let moved: usize = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|i| s.spawn(move || gather(bytes, rec, n, 0x9e37 + i as u64 * 7919, ahead)))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
            });
            let secs = t.elapsed().as_secs_f64();
            println!("{threads:2} threads, prefetch {ahead} ahead: {:6.2} GB/s", moved as f64 / secs / 1e9);
        }
    }
    Ok(())
}
