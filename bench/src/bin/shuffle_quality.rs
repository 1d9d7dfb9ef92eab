//! `shuffle_quality`: how well the pool's quasi-random order mixes a
//! class-sorted file, against a full shuffle.
//!
//! ```text
//! cargo run --release -p wirespeed-bench --features emulator --bin shuffle_quality -- --emulated
//! cargo run --release -p wirespeed-bench --bin shuffle_quality -- --size 8G --blocks 256M,16M
//! ```
//!
//! Record `i` of `n` has label `floor(i * C / n)` (a file sorted by class,
//! `C` classes). For one epoch of each order it counts the distinct labels of
//! every batch: the pool's order ([`Way::Pool`] with `--pool` bytes of device
//! memory in blocks of each size of `--blocks`), and a full shuffle (the order
//! of [`Way::Resident`], [`Way::Registered`] and [`Way::Ring`], which share one
//! permutation; taken from a ring loader, which loads nothing up front). Both
//! come from [`Loader::batch_records`], which computes the order on the host
//! without reading the file, so the file is a sparse one of `--size` bytes
//! (removed afterwards) and nothing is transferred. The pool's halves are
//! allocated (on the emulated runtime, as untouched host mappings). Beside
//! them: the expected distinct labels of a batch drawn uniformly without
//! replacement.

use clap::Parser;
use std::process::ExitCode;
use wirespeed_bench::{parse_count, parse_size};
use wirespeed_cuda::Device;
use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, PinBudget, Records, Way};

/// Distinct labels per batch of the pool's order against a full shuffle, for a class-sorted file.
#[derive(Debug, Parser)]
#[command(name = "shuffle_quality", version)]
struct Args {
    /// Size of the (sparse) file
    #[arg(long, value_name = "BYTES", default_value = "32G", value_parser = parse_size)]
    size: u64,
    /// Bytes of a record
    #[arg(long, default_value_t = 2883)]
    record: u64,
    /// Records of a batch
    #[arg(long, default_value_t = 4096)]
    batch: u64,
    /// Classes of the file (record i has label floor(i * classes / records))
    #[arg(long, default_value = "1000", value_parser = parse_count)]
    classes: usize,
    /// Device memory of the pool (its two halves)
    #[arg(long, value_name = "BYTES", default_value = "8G", value_parser = parse_size)]
    pool: u64,
    /// Sizes of a pool block, comma-separated
    #[arg(long, value_name = "BYTES", default_value = "256M,64M,16M", value_delimiter = ',', value_parser = parse_size)]
    blocks: Vec<u64>,
    /// The epoch whose order is counted
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Seed of the orders
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Use the emulated CUDA runtime (needs a build with `--features emulator`)
    #[arg(long)]
    emulated: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if a.emulated {
        let rebuild = "cargo run -p wirespeed-bench --features emulator --bin shuffle_quality -- --emulated";
        if let Err(e) = wirespeed_bench::emulator::select(rebuild) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    let dev = match Device::get(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("shuffle_quality: no CUDA device ({e}); run it with --emulated (it transfers nothing)");
            return ExitCode::from(2);
        }
    };
    match run(&a, dev) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shuffle_quality: {e}");
            ExitCode::from(1)
        }
    }
}

/// Distinct labels per batch over an epoch: mean, min, max.
#[derive(Debug, Clone, Copy)]
struct Counts {
    mean: f64,
    min: usize,
    max: usize,
}

fn run(a: &Args, dev: Device) -> Result<(), String> {
    let file = tempfile::Builder::new()
        .prefix("wirespeed-shuffle-quality-")
        .suffix(".bin")
        .tempfile()
        .map_err(|e| format!("a temporary file: {e}"))?;
    file.as_file().set_len(a.size).map_err(|e| format!("sizing the sparse file: {e}"))?;
    // SAFETY: the file is this run's own; nothing writes it while it is mapped.
    let mapped = unsafe { MappedFile::open(file.path()) }.map_err(|e| format!("mapping the file: {e}"))?;
    let records = Records::ignoring_tail(&mapped, 0, a.record).map_err(|e| format!("records: {e}"))?;
    let n = records.count();
    if n < a.batch || (a.classes as u64) > n {
        return Err(format!("{n} records: fewer than a batch of {} or than {} classes", a.batch, a.classes));
    }
    let label = |r: u64| ((r as u128 * a.classes as u128) / n as u128) as usize;
    let emu = if a.emulated { " [emulated runtime: the orders are the library's, nothing is timed]" } else { "" };
    println!(
        "shuffle_quality{emu}: {n} records of {} bytes ({:.2} GiB, a sparse file), {} classes sorted, batches of {}, \
         epoch {}, seed {}",
        a.record,
        (n * a.record) as f64 / (1u64 << 30) as f64,
        a.classes,
        a.batch,
        a.epoch,
        a.seed
    );

    let uniform = expected_uniform(n, a.classes as u64, a.batch);
    let config = |way: Way| LoaderConfig::new(a.batch).seed(a.seed).way(way);
    eprintln!("full shuffle ...");
    let full = {
        let c = config(Way::Ring).pin_budget(PinBudget::new(64 << 20)).device_budget(1);
        let mut l = Loader::new(&dev, std::slice::from_ref(&records), c).map_err(|e| format!("full: {e}"))?;
        count(&mut l, a.epoch, a.classes, label)?
    };
    let mut rows = Vec::new();
    for &block in &a.blocks {
        eprintln!("pool of {} MiB blocks ...", block >> 20);
        let c = config(Way::Pool).pin_budget(PinBudget::new(1 << 30)).device_budget(a.pool).block_bytes(block);
        let mut l = Loader::new(&dev, std::slice::from_ref(&records), c)
            .map_err(|e| format!("pool of {} MiB blocks: {e}", block >> 20))?;
        let block_records = (block / a.record).clamp(1, n);
        let slot = block_records * a.record;
        // Loader's pool_shape: two halves of whole slots, each half followed by 16 bytes.
        let per_half = a.pool.saturating_sub(32) / (2 * slot);
        let counts = count(&mut l, a.epoch, a.classes, label)?;
        rows.push((block, block_records, per_half, counts));
    }

    println!(
        "\n| order | block | records/block | blocks/half | classes/block | distinct labels/batch: mean | min | max | \
         of uniform |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (block, block_records, per_half, c) in &rows {
        println!(
            "| pool | {} MiB | {block_records} | {per_half} | {:.1} | {:.1} | {} | {} | {:.3} |",
            block >> 20,
            *block_records as f64 * a.classes as f64 / n as f64,
            c.mean,
            c.min,
            c.max,
            c.mean / uniform
        );
    }
    println!(
        "| full shuffle | - | - | - | - | {:.1} | {} | {} | {:.3} |",
        full.mean,
        full.min,
        full.max,
        full.mean / uniform
    );
    println!("| uniform draw (expected) | - | - | - | - | {uniform:.1} | - | - | 1.000 |");
    Ok(())
}

/// Distinct labels of every batch of `epoch` in `loader`'s order.
fn count(loader: &mut Loader, epoch: u64, classes: usize, label: impl Fn(u64) -> usize) -> Result<Counts, String> {
    loader.set_epoch(epoch).map_err(|e| format!("set_epoch: {e}"))?;
    let mut seen = vec![u64::MAX; classes];
    let (mut total, mut min, mut max) = (0usize, usize::MAX, 0usize);
    let batches = loader.len();
    for b in 0..batches {
        let mut distinct = 0;
        for r in loader.batch_records(b) {
            let l = label(r);
            if seen[l] != b {
                seen[l] = b;
                distinct += 1;
            }
        }
        total += distinct;
        min = min.min(distinct);
        max = max.max(distinct);
    }
    Ok(Counts { mean: total as f64 / batches.max(1) as f64, min, max })
}

/// The expected distinct labels of `batch` records drawn uniformly without
/// replacement from `n` records whose labels are `floor(i * classes / n)`:
/// the sum over classes of 1 - C(n - m, batch) / C(n, batch), m the class's size.
fn expected_uniform(n: u64, classes: u64, batch: u64) -> f64 {
    let size = |c: u64| (((c + 1) * n).div_ceil(classes)) - ((c * n).div_ceil(classes));
    let mut sizes: Vec<u64> = (0..classes).map(size).collect();
    sizes.sort_unstable();
    let mut e = 0.0;
    let mut i = 0;
    while i < sizes.len() {
        let m = sizes[i];
        let same = sizes[i..].iter().take_while(|&&s| s == m).count();
        // ln P(a class of m records is absent) = sum over draws j of ln((n - m - j) / (n - j)).
        let ln_absent: f64 = (0..batch)
            .map(|j| if n < m + j + 1 { f64::NEG_INFINITY } else { ((n - m - j) as f64 / (n - j) as f64).ln() })
            .sum();
        e += same as f64 * (1.0 - ln_absent.exp());
        i += same;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_uniform_matches_small_cases() {
        // One class: always 1. A batch of everything: every class.
        assert!((expected_uniform(100, 1, 10) - 1.0).abs() < 1e-12);
        assert!((expected_uniform(100, 10, 100) - 10.0).abs() < 1e-9);
        // Two classes of 2, batches of 2 of 4 records: P(both of one class) = 2/6.
        assert!((expected_uniform(4, 2, 2) - (2.0 - 2.0 / 6.0)).abs() < 1e-12);
        // The class sizes the label rule gives add up to n.
        let n: u64 = 1003;
        let sizes: u64 = (0..7u64).map(|c| ((c + 1) * n).div_ceil(7) - (c * n).div_ceil(7)).sum();
        assert_eq!(sizes, n);
    }
}
