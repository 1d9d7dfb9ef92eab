//! `multi`: one page-cached file streamed to every visible GPU at once.
//!
//! ```text
//! cargo run --release -p wirespeed-bench --bin multi                       # 4 GiB file, budget file/8
//! cargo run -p wirespeed-bench --features emulator --bin multi -- --emulated --size 64M   # CUDA_EMU_DEVICES=2
//! ```
//!
//! It measures each GPU's line rate alone and all of them at once (resident
//! pinned buffers), then streams the file: the whole file to every GPU at once
//! from shared registered windows (portable), from the ring, with the hybrid
//! and with auto; and the file split between the GPUs (one streamer per GPU,
//! each its share, concurrently). Aggregate GB/s is set against the sum of the
//! per-GPU line rates measured in the same run; the last pass of every run is
//! copied back and compared.

use clap::Parser;
use std::cell::RefCell;
use std::ops::Range;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use wirespeed_bench::cpu;
use wirespeed_bench::{parse_count, parse_size, pattern_file};
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, PinnedFlags, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, Strategy, StreamConfig, Streamer};

const MIB: u64 = 1 << 20;

type Res<T> = Result<T, String>;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// GB/s of `reps` copies of a resident portable pinned buffer to each of `devs`, all at once.
fn line_rate(devs: &[Device], bytes: usize, reps: usize) -> Res<f64> {
    let src = PinnedBuffer::<u8>::with_flags(bytes, PinnedFlags::new().portable(true)).map_err(err("pinned buffer"))?;
    let mut dsts: Vec<DeviceBuffer<u8>> =
        devs.iter().map(|d| DeviceBuffer::new(d, bytes)).collect::<Result<_, _>>().map_err(err("device buffer"))?;
    let streams: Vec<Stream> = devs.iter().map(Stream::new).collect::<Result<_, _>>().map_err(err("stream"))?;
    let t = Instant::now();
    for _ in 0..reps {
        for (s, d) in streams.iter().zip(dsts.iter_mut()) {
            s.copy_to_device(&src, d).map_err(err("copy"))?.detach();
        }
    }
    for s in &streams {
        s.synchronize().map_err(err("synchronize"))?;
    }
    Ok((bytes * reps * devs.len()) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// One page-cached file streamed to every visible GPU at once.
#[derive(Debug, Parser)]
#[command(name = "multi", version)]
struct Args {
    /// Size of the file streamed (K/M/G/T are powers of 1024)
    #[arg(long, value_name = "BYTES", default_value = "4G", value_parser = parse_size)]
    size: u64,

    /// Timed passes per run, after one untimed
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_count)]
    reps: usize,

    /// Use the emulated CUDA runtime (needs a build with `--features emulator`)
    #[arg(long)]
    emulated: bool,
}

struct Row {
    name: String,
    strategy: String,
    gbps: f64,
    cpu_per_gb: f64,
    intact: bool,
}

fn run() -> Res<()> {
    let Args { size, reps, emulated } = Args::parse();
    if emulated {
        wirespeed_bench::emulator::select(
            "cargo run --release -p wirespeed-bench --features emulator --bin multi -- --emulated --size 64M",
        )?;
    }
    let devs = Device::all().map_err(err("no GPU"))?;
    let names: Vec<String> = devs.iter().map(|d| d.name().unwrap_or_default()).collect();
    println!("{} device(s): {}{}", devs.len(), names.join(", "), if emulated { "  [EMULATED]" } else { "" });
    let sum = line_rates(&devs, emulated)?;
    let temp = pattern_file("wirespeed-multi-", size).map_err(err("demo file"))?;
    let result = stream_file(&devs, temp.path(), reps);
    drop(temp); // removes the demo file
    let rows = result?;
    println!(
        "{} file, pin budget {} MiB, {reps} timed passes after one untimed; GB/s = bytes landed on all GPUs / time",
        wirespeed_pinned::Bytes(size),
        size / 8 / MIB
    );
    println!("{:<32} {:>8} {:>10} {:>9} {:>7}  strategy", "run", "GB/s", "x sum LR", "CPU s/GB", "intact");
    for r in &rows {
        println!(
            "{:<32} {:>8.2} {:>10.2} {:>9.3} {:>7}  {}",
            r.name,
            r.gbps,
            r.gbps / sum,
            r.cpu_per_gb,
            if r.intact { "yes" } else { "NO" },
            r.strategy
        );
    }
    if rows.iter().any(|r| !r.intact) {
        return Err("data arrived damaged".into());
    }
    Ok(())
}

/// Each GPU's line rate alone and all of them at once, printed; answers the
/// sum of the per-GPU rates.
fn line_rates(devs: &[Device], emulated: bool) -> Res<f64> {
    let probe = 256 * MIB as usize;
    let probe = if emulated { probe / 16 } else { probe };
    let mut per_gpu = Vec::new();
    for d in devs {
        per_gpu.push(line_rate(std::slice::from_ref(d), probe, 8)?);
    }
    let sum: f64 = per_gpu.iter().sum();
    let together = line_rate(devs, probe, 8)?;
    println!(
        "line rate per GPU alone: {} GB/s (sum {sum:.2}); all GPUs at once from one portable pinned buffer: {together:.2} GB/s = {:.2} of the sum",
        per_gpu.iter().map(|g| format!("{g:.2}")).collect::<Vec<_>>().join(" / "),
        together / sum
    );
    Ok(sum)
}

/// The file at `path`, mapped, and what reads device memory back to compare
/// it with the file (one pinned buffer, allocated once: pinning is slow).
struct Check<'a> {
    devs: &'a [Device],
    file: Arc<MappedFile>,
    back: RefCell<PinnedBuffer<u8>>,
}

impl Check<'_> {
    /// Reads `buf` (on device `i`) back and compares it with file bytes `r`.
    fn same(&self, i: usize, buf: &DeviceBuffer<u8>, r: Range<u64>) -> Res<bool> {
        let mut back = self.back.borrow_mut();
        let s = Stream::new(&self.devs[i]).map_err(err("stream"))?;
        let mut view = back.slice_mut(0..buf.len()).map_err(err("readback"))?;
        s.copy_to_host(buf, &mut view).map_err(err("readback"))?.wait().map_err(err("readback"))?;
        Ok(back.as_slice().map_err(err("readback"))?[..buf.len()]
            == self.file.as_bytes()[r.start as usize..r.end as usize])
    }
}

/// The broadcast runs, then the split; the rows of both.
fn stream_file(devs: &[Device], path: &Path, reps: usize) -> Res<Vec<Row>> {
    // SAFETY: the demo file is this process's own, written by the caller,
    // and nothing changes it until it is removed after the runs.
    let file = unsafe { MappedFile::open(path) }.map_err(err("map"))?;
    let len = file.len();
    let mut dsts: Vec<DeviceBuffer<u8>> = devs
        .iter()
        .map(|d| DeviceBuffer::new(d, len as usize))
        .collect::<Result<_, _>>()
        .map_err(err("device buffers"))?;
    let back = RefCell::new(PinnedBuffer::<u8>::new(len as usize).map_err(err("readback"))?);
    let check = Check { devs, file, back };
    let mut rows = broadcast(&check, &mut dsts, reps)?;
    rows.push(split(&check, dsts, reps)?);
    Ok(rows)
}

/// The whole file to every GPU at once, with each strategy, into `dsts`.
fn broadcast(check: &Check, dsts: &mut [DeviceBuffer<u8>], reps: usize) -> Res<Vec<Row>> {
    let (devs, file) = (check.devs, &check.file);
    let len = file.len();
    let budget = len / 8;
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let kib64 = 64 << 10;
    let slot = (budget / (2 * threads as u64)).clamp(kib64, 16 * MIB) as usize;
    // The hybrid: a quarter of the budget to 4 ring threads (2 slots each), the
    // rest to the 4 windows the library keeps registered at once.
    let h_slot = (budget / 4 / 8 / kib64 * kib64).clamp(kib64, 16 * MIB);
    let h_window = ((budget - 8 * h_slot) / 4 / kib64 * kib64).max(kib64);
    let plans: Vec<(&str, Strategy, u64)> = vec![
        ("broadcast windows", Strategy::Windows { window: (budget / 4) as usize, in_flight: 4 }, budget),
        ("broadcast ring", Strategy::Ring { slots: 2 * threads, slot, threads }, budget),
        ("broadcast hybrid", Strategy::Hybrid { window: h_window as usize, slot: h_slot as usize, threads: 4 }, budget),
        ("broadcast auto", Strategy::Auto, budget),
        ("broadcast whole-file (reused)", Strategy::WholeFile, len + 4 * MIB),
    ];
    let mut rows = Vec::new();
    for (name, strategy, b) in plans {
        let st = Streamer::new(devs, StreamConfig::new(strategy, PinBudget::new(b))).map_err(err(name))?;
        st.to_devices(file, 0..len, dsts).map_err(err(name))?; // untimed first pass
        let (c0, t0) = (cpu::process_seconds(), Instant::now());
        let mut used = String::new();
        for _ in 0..reps {
            used = st.to_devices(file, 0..len, dsts).map_err(err(name))?.strategy.to_string();
        }
        let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu::process_seconds() - c0);
        let moved = (len * devs.len() as u64 * reps as u64) as f64 / 1e9;
        let mut intact = true;
        for (i, d) in dsts.iter().enumerate() {
            intact &= check.same(i, d, 0..len)?;
        }
        rows.push(Row { name: name.into(), strategy: used, gbps: moved / secs, cpu_per_gb: cpu / moved, intact });
    }
    Ok(rows)
}

/// The file split: device i gets share i, one streamer per device,
/// concurrently. `dsts` are freed once the shares are allocated.
fn split(check: &Check, dsts: Vec<DeviceBuffer<u8>>, reps: usize) -> Res<Row> {
    let (devs, file) = (check.devs, &check.file);
    let len = file.len();
    let n = devs.len() as u64;
    let share = len.div_ceil(n).div_ceil(4096) * 4096;
    let parts: Vec<(usize, Range<u64>)> =
        (0..n).map(|i| (i as usize, (i * share).min(len)..((i + 1) * share).min(len))).collect();
    let streamers: Vec<Streamer> = devs
        .iter()
        .map(|d| Streamer::new(&[*d], StreamConfig::new(Strategy::Auto, PinBudget::new(len / 8 / n))))
        .collect::<Result<_, _>>()
        .map_err(err("split"))?;
    let mut shares: Vec<DeviceBuffer<u8>> = parts
        .iter()
        .map(|(i, r)| DeviceBuffer::new(&devs[*i], (r.end - r.start) as usize))
        .collect::<Result<_, _>>()
        .map_err(err("split buffers"))?;
    drop(dsts); // room on the devices for the shares
    let pass = |shares: &mut [DeviceBuffer<u8>]| -> Res<String> {
        std::thread::scope(|s| {
            let hs: Vec<_> = streamers
                .iter()
                .zip(shares.iter_mut())
                .zip(parts.iter())
                .map(|((st, d), (_, r))| {
                    s.spawn(move || {
                        st.to_device(file, r.clone(), d).map(|rep| rep.strategy.to_string()).map_err(err("split"))
                    })
                })
                .collect();
            let mut used = String::new();
            for h in hs {
                used = h.join().map_err(|_| "split: a thread panicked".to_string())??;
            }
            Ok(used)
        })
    };
    pass(&mut shares)?; // untimed first pass
    let (c0, t0) = (cpu::process_seconds(), Instant::now());
    let mut used = String::new();
    for _ in 0..reps {
        used = pass(&mut shares)?;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu::process_seconds() - c0);
    let moved = (len * reps as u64) as f64 / 1e9;
    let mut intact = true;
    for ((i, r), d) in parts.iter().zip(&shares) {
        intact &= check.same(*i, d, r.clone())?;
    }
    let strategy = format!("{used} per GPU");
    Ok(Row { name: "split (each GPU its share)".into(), strategy, gbps: moved / secs, cpu_per_gb: cpu / moved, intact })
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("multi: {e}");
            ExitCode::FAILURE
        }
    }
}
