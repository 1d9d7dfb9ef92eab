//! `soak`: streams a file to the GPU again and again with each strategy and
//! checks that the data keeps arriving intact and that memory stays flat.
//!
//! ```text
//! cargo run --release -p wirespeed-bench --bin soak -- --gb 100            # 100 GB per strategy
//! cargo run -p wirespeed-bench --features emulator --bin soak -- --emulated --gb 2 --size 64M
//! ```
//!
//! Every pass, three random 16 MiB pieces of the device copy are read back and
//! compared with the file; the last pass of each strategy compares all of it.
//! After each strategy it prints bytes moved, mismatches, peak pinned bytes,
//! time, CPU seconds per GB, and the process's resident and locked memory at the start, the end
//! and the peak (flat memory: the end is where the start was).

use clap::Parser;
use wirespeed_bench::{cpu, parse_size, pattern_file};
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, Strategy, StreamConfig, Streamer};

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const PIECE: usize = 16 << 20;

/// `(VmRSS, VmLck)` of this process in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmLck:"))
}

/// Streams a file to the GPU again and again with each strategy and checks that
/// the data keeps arriving intact and that memory stays flat.
#[derive(Debug, Parser)]
#[command(name = "soak", version)]
struct Args {
    /// GB (10^9 bytes) to stream per strategy
    #[arg(long, value_name = "GB", default_value_t = 100.0, value_parser = parse_gb)]
    gb: f64,

    /// Size of the file streamed (at least 64M; K/M/G/T are powers of 1024)
    #[arg(long, value_name = "BYTES", default_value = "4G", value_parser = parse_file_size)]
    size: u64,

    /// Pin budget (default: the file size / 8)
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    budget: Option<u64>,

    /// Use the emulated CUDA runtime (needs a build with `--features emulator`)
    #[arg(long)]
    emulated: bool,
}

fn parse_gb(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(gb) if gb.is_finite() && gb > 0.0 => Ok(gb),
        _ => Err(format!("{v:?} is not a number of GB above 0")),
    }
}

fn parse_file_size(v: &str) -> Result<u64, String> {
    match parse_size(v)? {
        s if s < 64 * MIB => Err("at least 64M".into()),
        s => Ok(s),
    }
}

/// Compares `len` bytes at `off` of the device copy with the file, through a pinned bounce buffer.
fn check_piece(
    stream: &Stream,
    dst: &DeviceBuffer<u8>,
    bounce: &mut PinnedBuffer<u8>,
    file: &[u8],
    off: usize,
    len: usize,
) -> Result<bool, String> {
    let src = dst.slice(off..off + len).map_err(|e| e.to_string())?;
    let mut into = bounce.slice_mut(0..len).map_err(|e| e.to_string())?;
    stream.copy_to_host(&src, &mut into).map_err(|e| e.to_string())?.wait().map_err(|e| e.to_string())?;
    Ok(bounce.as_slice().map_err(|e| e.to_string())?[..len] == file[off..off + len])
}

fn run(a: Args) -> Result<bool, String> {
    if a.emulated {
        wirespeed_bench::emulator::select(
            "cargo run --release -p wirespeed-bench --features emulator --bin soak -- --emulated --gb 2 --size 64M",
        )?;
    }
    let dev = Device::get(0).map_err(|e| format!("no GPU: {e}"))?;
    let temp = pattern_file("wirespeed-soak-", a.size)
        .map_err(|e| format!("writing the file in {}: {e}", std::env::temp_dir().display()))?;
    let res = soak_file(&a, dev, temp.path());
    drop(temp); // removes the file
    res
}

/// The strategies soaked, each with its name and pin budget, within
/// `budget` for a file of `len` bytes with up to `threads` ring threads.
fn plans(budget: u64, len: u64, threads: usize) -> Vec<(&'static str, Strategy, u64)> {
    let slot = |share: u64| (share / (2 * threads as u64)).clamp(MIB, 16 * MIB) as usize;
    vec![
        ("auto", Strategy::Auto, budget),
        ("windows", Strategy::Windows { window: (budget / 4) as usize, in_flight: 4 }, budget),
        ("hybrid", Strategy::Hybrid { window: (budget / 8) as usize, slot: slot(budget / 4), threads }, budget),
        ("ring", Strategy::Ring { slots: 2 * threads, slot: slot(budget), threads }, budget),
        ("whole-file (reused)", Strategy::WholeFile, len + (4 * MIB)),
    ]
}

/// Where the file goes, and what the checks read it back through.
struct Target {
    dst: DeviceBuffer<u8>,
    stream: Stream,
    bounce: PinnedBuffer<u8>,
}

/// Every strategy on the file at `path`, a line each; whether all the data
/// arrived intact.
fn soak_file(a: &Args, dev: Device, path: &Path) -> Result<bool, String> {
    let label = if a.emulated { " [EMULATED: not GPU measurements]" } else { "" };
    // SAFETY: the soak file is this process's own, written by the caller,
    // and nothing changes it until it is removed after the runs.
    let file = unsafe { MappedFile::open(path) }.map_err(|e| e.to_string())?;
    let len = file.len();
    let budget_bytes = a.budget.unwrap_or(len / 8);
    let mut on = Target {
        dst: DeviceBuffer::<u8>::new(&dev, len as usize).map_err(|e| e.to_string())?,
        stream: Stream::new(&dev).map_err(|e| e.to_string())?,
        bounce: PinnedBuffer::<u8>::new(PIECE).map_err(|e| e.to_string())?,
    };
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    println!(
        "soak{label}: {} file, {:.1} GB per strategy, pin budget {} MiB (whole-file: the file)",
        wirespeed_pinned::Bytes(len),
        a.gb,
        budget_bytes / MIB
    );
    println!(
        "strategy             passes      GB moved  mismatches  peak pinned    seconds   GB/s  CPU s/GB  RSS start->end (peak) MiB  VmLck start->end MiB"
    );
    let mut all_ok = true;
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    for (name, strategy, budget) in plans(budget_bytes, len, threads) {
        let streamer = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(budget)))
            .map_err(|e| format!("{name}: {e}"))?;
        let passes = ((a.gb * 1e9) / len as f64).ceil().max(1.0) as u64;
        all_ok &= soak(name, &streamer, &file, &mut on, passes, &mut rng)?;
    }
    println!("(timing and CPU include the sampled read-back checks; GB/s here is not the bench's rate)");
    Ok(all_ok)
}

/// Where the pieces of pass `p` of `passes` checked start: three at random,
/// or, in the last pass, every piece of the file's `len` bytes.
fn pieces(p: u64, passes: u64, len: u64, rng: &mut u64) -> Vec<usize> {
    if p + 1 == passes {
        return (0..len as usize).step_by(PIECE).collect();
    }
    (0..3)
        .map(|_| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % (len - PIECE as u64)) as usize
        })
        .collect()
}

/// `passes` passes of `streamer` over the file, each checked in pieces;
/// prints the strategy's line and answers whether every piece matched.
fn soak(
    name: &str,
    streamer: &Streamer,
    file: &Arc<MappedFile>,
    on: &mut Target,
    passes: u64,
    rng: &mut u64,
) -> Result<bool, String> {
    let (len, bytes) = (file.len(), file.as_bytes());
    let (rss0, lck0) = memory();
    let mut rss_peak = rss0;
    let (mut mismatches, mut moved, mut peak) = (0u64, 0u64, 0u64);
    let (c0, t0) = (cpu::process_seconds(), Instant::now());
    for p in 0..passes {
        let r = streamer.to_device(file, 0..len, &mut on.dst).map_err(|e| format!("{name} pass {p}: {e}"))?;
        moved += r.bytes;
        peak = peak.max(r.peak_pinned);
        for off in pieces(p, passes, len, rng) {
            let n = PIECE.min(len as usize - off);
            if !check_piece(&on.stream, &on.dst, &mut on.bounce, bytes, off, n)? {
                mismatches += 1;
            }
        }
        rss_peak = rss_peak.max(memory().0);
    }
    let (secs, cpu_s) = (t0.elapsed().as_secs_f64(), cpu::process_seconds() - c0);
    let (rss1, lck1) = memory();
    println!(
        "{name:<20} {passes:>6} {:>13.1} {mismatches:>11} {:>8} MiB {secs:>10.1} {:>6.1}  {:>8.3}  {:>6}->{:<6} ({:>6})       {:>5}->{:<5}",
        moved as f64 / 1e9,
        peak / MIB,
        moved as f64 / 1e9 / secs,
        cpu_s / (moved as f64 / 1e9),
        rss0 / MIB,
        rss1 / MIB,
        rss_peak / MIB,
        lck0 / MIB,
        lck1 / MIB
    );
    Ok(mismatches == 0)
}

fn main() -> ExitCode {
    // Bad arguments exit 2 (clap's usage errors), --help and --version 0.
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("soak: MISMATCHES: data arrived damaged");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}
