//! `shuffle`: shuffled batches of fixed-size records (2,883-byte records of
//! shape (3, 31, 31) by default) from a page-cached file to the GPU, every
//! way of the library's `Loader` beside PyTorch's `DataLoader`.
//!
//! ```text
//! cargo run --release -p wirespeed-bench --bin shuffle                   # 32 GiB file, 4 GiB pin budget, 8 GiB pool
//! cargo run --release -p wirespeed-bench --bin shuffle -- --size 8G --ways pool,resident
//! cargo run -p wirespeed-bench --features emulator --bin shuffle -- --emulated --quick
//! cargo run --release -p wirespeed-bench --bin shuffle -- --size 8G --ways resident,pool --no-torch --busy 50
//! ```
//!
//! Each row runs whole epochs (the first one apart where it loads), checks
//! that every record of an epoch arrived once, and compares sampled batches
//! with the file. Rates are set against the line rate measured in the same
//! run; CPU is the whole process's. Where `torch` is importable, PyTorch's
//! `DataLoader` reads the same file in the same run (`bench/torch_shuffle.py`),
//! and where `wirespeed` is too, its `Loader` from Python
//! (`bench/python_loader.py`; with `--busy MS`, beside MS of calibrated GPU
//! work per batch). Both scripts are built into the binary, written to a
//! temporary folder and run from there, so the binary runs them from any
//! folder; on `--emulated` they only check their imports and say they skip.

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use wirespeed_bench::{cpu, parse_count, parse_size, pattern_file};
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, PinBudget, Records, Way};

type Res<T> = Result<T, String>;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Shuffled batches of records to the GPU, every way, beside PyTorch.
#[derive(Debug, Parser)]
#[command(name = "shuffle", version)]
struct Args {
    /// The file of records (default: a pattern file of --size in TMPDIR, removed afterwards)
    file: Option<PathBuf>,
    /// Size of the generated file
    #[arg(long, value_name = "BYTES", default_value = "32G", value_parser = parse_size)]
    size: u64,
    /// Bytes of a record
    #[arg(long, default_value_t = 2883)]
    record: u64,
    /// Records of a batch
    #[arg(long, default_value_t = 4096)]
    batch: u64,
    /// Pin budget of the pool, resident and ring rows (the registered row gets the file's size)
    #[arg(long, value_name = "BYTES", default_value = "4G", value_parser = parse_size)]
    budget: u64,
    /// Device memory of the pool
    #[arg(long, value_name = "BYTES", default_value = "8G", value_parser = parse_size)]
    pool: u64,
    /// Bytes of a pool block
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = parse_size)]
    block: u64,
    /// Epochs timed per row
    #[arg(long, default_value = "5", value_parser = parse_count)]
    reps: usize,
    /// Which ways, comma-separated: pool, registered, resident, ring (`ring:N`: with N threads)
    #[arg(long, default_value = "pool,registered,resident,ring", value_delimiter = ',')]
    ways: Vec<String>,
    /// Skip PyTorch's DataLoader rows
    #[arg(long)]
    no_torch: bool,
    /// Skip the Python package's rows (wirespeed.Loader from Python, where it is importable)
    #[arg(long)]
    no_python: bool,
    /// Also wirespeed.Loader from Python with MS of calibrated GPU work per batch queued
    /// on torch's stream, for each way of --ways: next()'s host time, and the wall time
    /// against the loader alone and the work alone (bench/python_loader.py --busy)
    #[arg(long, value_name = "MS")]
    busy: Option<f64>,
    /// Batches of each phase of the --busy rows (default: an epoch)
    #[arg(long, value_name = "N")]
    busy_batches: Option<u64>,
    /// Passed to wirespeed.Loader from Python as prefetch=N (batches gathered ahead); not passed if not given
    #[arg(long, value_name = "N")]
    prefetch: Option<u64>,
    /// Seconds each DataLoader row runs
    #[arg(long, default_value_t = 15.0)]
    torch_seconds: f64,
    /// The pool row once more with the file's pages dropped from the page cache before each epoch
    #[arg(long)]
    cold: bool,
    /// Small sizes, two epochs: a quick check of the pipeline
    #[arg(long)]
    quick: bool,
    /// Use the emulated CUDA runtime (needs a build with `--features emulator`)
    #[arg(long)]
    emulated: bool,
    /// Also write the results as JSON to this file
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// What one row measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    name: String,
    way: String,
    /// Median of the timed epochs.
    gbps: f64,
    x_line: f64,
    mrec_per_s: f64,
    cpu_s_per_gb: f64,
    peak_pinned: u64,
    /// The first epoch (loading included), when it differs.
    first_gbps: Option<f64>,
    min_gbps: f64,
    max_gbps: f64,
    /// Mean distinct blocks per batch and mean gap between consecutive records / records (pool).
    blocks_per_batch: Option<f64>,
    gap: f64,
    checked: String,
}

fn main() -> ExitCode {
    let mut a = Args::parse();
    if a.quick {
        a.size = a.size.min(64 << 20);
        a.budget = a.budget.min(8 << 20);
        a.pool = a.pool.min(16 << 20);
        a.block = a.block.min(1 << 20);
        a.batch = a.batch.min(256);
        a.reps = a.reps.min(2);
        a.torch_seconds = a.torch_seconds.min(3.0);
        a.busy_batches = Some(a.busy_batches.unwrap_or(40).min(40));
    }
    if a.emulated {
        let rebuild = "cargo run -p wirespeed-bench --features emulator --bin shuffle -- --emulated --quick";
        if let Err(e) = wirespeed_bench::emulator::select(rebuild) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    let dev = match Device::get(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("shuffle: no CUDA device ({e}); run it on a machine with an NVIDIA GPU, or with --emulated");
            return ExitCode::from(2);
        }
    };
    match run(&a, dev) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("shuffle: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(a: &Args, dev: Device) -> Res<bool> {
    let generated;
    let path = match &a.file {
        Some(p) => p.clone(),
        None => {
            let size = a.size / a.record * a.record;
            eprintln!("writing a {:.1} GiB file of {}-byte records ...", size as f64 / (1u64 << 30) as f64, a.record);
            generated = pattern_file("wirespeed-shuffle-", size).map_err(err("writing the file"))?;
            generated.path().to_path_buf()
        }
    };
    // SAFETY: the file is this run's own (or the caller's, unchanged while it runs).
    let file = unsafe { MappedFile::open(&path) }.map_err(err("mapping the file"))?;
    let records = Records::ignoring_tail(&file, 0, a.record).map_err(err("records"))?;
    warm(&file);
    let line = line_rate(&dev).map_err(err("line rate"))?;
    let label = if a.emulated { " [EMULATED: not GPU measurements]" } else { "" };
    println!(
        "shuffle{label}: {} records of {} bytes ({:.2} GiB), batches of {}; line rate {line:.2} GB/s",
        records.count(),
        a.record,
        (records.count() * a.record) as f64 / (1u64 << 30) as f64,
        a.batch
    );
    let mut rows = Vec::new();
    let mut ok = true;
    for w in &a.ways {
        let (w, threads) = match w.split_once(':') {
            Some((w, t)) => (w, Some(t.parse::<usize>().map_err(|_| format!("--ways: {t:?} is not a thread count"))?)),
            None => (w.as_str(), None),
        };
        let (name, way, pin, dev_budget) = match w {
            "pool" => ("shuffle-pool", Way::Pool, a.budget, a.pool),
            "registered" => ("shuffle-full-registered", Way::Registered, records.count() * a.record + (64 << 20), 0),
            "resident" => ("shuffle-full-resident", Way::Resident, a.budget, records.count() * a.record + (1 << 20)),
            "ring" => ("shuffle-full-ring", Way::Ring, a.budget, 0),
            other => return Err(format!("--ways: unknown way {other:?} (pool, registered, resident, ring)")),
        };
        let name = match threads {
            Some(t) => format!("{name}-{t}-threads"),
            None => name.to_string(),
        };
        let spec = Spec { name: name.clone(), way, pin, dev_budget, cold: false, threads };
        match measure(a, &dev, &records, line, spec) {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("{name}: {e}");
                ok = false;
            }
        }
        if w == "pool" && a.cold {
            let spec = Spec { name: "shuffle-pool-cold".into(), way, pin, dev_budget, cold: true, threads };
            match measure(a, &dev, &records, line, spec) {
                Ok(row) => rows.push(row),
                Err(e) => eprintln!("shuffle-pool-cold: {e}"),
            }
        }
    }
    let (mut torch, mut busy) = (Vec::new(), Vec::new());
    if !(a.no_torch && a.no_python) {
        match Scripts::write() {
            Err(e) => {
                eprintln!("the Python rows are skipped: could not write their scripts to a temporary folder ({e})")
            }
            Ok(scripts) => {
                if !a.no_torch {
                    torch = torch_rows(a, &scripts, &path, line);
                }
                if !a.no_python {
                    for r in &rows {
                        torch.extend(python_row(a, &scripts, &path, line, r));
                    }
                    if let Some(ms) = a.busy {
                        busy = busy_rows(a, &scripts, &path, line, ms);
                    }
                }
            }
        }
    }
    print_table(&rows, &torch, line);
    print_busy(&busy);
    if let Some(j) = &a.json {
        let v = serde_json::json!({ "line_rate_gbps": line, "rows": rows, "torch": torch, "busy": busy });
        std::fs::write(j, serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(err("writing --json"))?;
    }
    Ok(ok && rows.iter().all(|r| r.checked.starts_with("ok")))
}

/// Reads the whole file once with 16 threads, so that it is in the page cache.
fn warm(file: &std::sync::Arc<MappedFile>) {
    let bytes = file.as_bytes();
    let chunk = bytes.len().div_ceil(16).max(1);
    std::thread::scope(|s| {
        for part in bytes.chunks(chunk) {
            s.spawn(move || part.iter().step_by(4096).fold(0u8, |a, &b| a ^ b));
        }
    });
}

/// GB/s of 256 MiB copied from pinned memory, best of five.
fn line_rate(dev: &Device) -> wirespeed_cuda::Result<f64> {
    let n = 256 << 20;
    let src = PinnedBuffer::<u8>::new(n)?;
    let mut dst = DeviceBuffer::<u8>::new(dev, n)?;
    let s = Stream::new(dev)?;
    let mut best = 0f64;
    for _ in 0..6 {
        let t = Instant::now();
        s.copy_to_device(&src, &mut dst)?.wait()?;
        best = best.max(n as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(best)
}

struct Spec {
    name: String,
    way: Way,
    pin: u64,
    dev_budget: u64,
    cold: bool,
    /// Threads of the ring way (the loader's default if none).
    threads: Option<usize>,
}

/// One epoch: every batch gathered into two alternating buffers; returns
/// (seconds, CPU seconds, the epoch's records in order).
fn epoch(loader: &mut Loader, bufs: &mut [DeviceBuffer<u8>; 2], e: u64, keep: bool) -> Res<(f64, f64, Vec<u64>)> {
    loader.set_epoch(e).map_err(err("set_epoch"))?;
    let mut seen = Vec::new();
    if keep {
        for b in 0..loader.len() {
            seen.extend(loader.batch_records(b));
        }
        loader.set_epoch(e).map_err(err("set_epoch"))?;
    }
    let (t, c) = (Instant::now(), cpu::process_seconds());
    let mut i = 0;
    loop {
        let dst = bufs[i % 2].slice_mut(..).map_err(err("batch buffer"))?;
        if loader.next_into(&mut [dst]).map_err(err("next batch"))?.is_none() {
            break;
        }
        i += 1;
    }
    loader.stream().synchronize().map_err(err("synchronize"))?;
    Ok((t.elapsed().as_secs_f64(), cpu::process_seconds() - c, seen))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Drops the file's pages from the page cache (for a cold epoch).
fn drop_cache(file: &MappedFile) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the advice only drops clean cached pages.
    unsafe { libc::posix_fadvise(file.file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn measure(a: &Args, dev: &Device, records: &Records, line: f64, spec: Spec) -> Res<Row> {
    let n = records.count();
    let config = LoaderConfig::new(a.batch)
        .seed(7)
        .way(spec.way)
        .pin_budget(PinBudget::new(spec.pin))
        .device_budget(spec.dev_budget.max(1))
        .block_bytes(a.block);
    let config = match spec.threads {
        Some(t) => config.ring_threads(t),
        None => config,
    };
    let budget = config.pin_budget.clone();
    eprintln!("{}: ...", spec.name);
    let (t0, c0) = (Instant::now(), cpu::process_seconds());
    let mut loader = Loader::new(dev, std::slice::from_ref(records), config).map_err(err("Loader::new"))?;
    let setup = (t0.elapsed().as_secs_f64(), cpu::process_seconds() - c0);
    let len = (a.batch * a.record) as usize;
    let mut bufs = [
        DeviceBuffer::<u8>::new(dev, len).map_err(err("buffer"))?,
        DeviceBuffer::new(dev, len).map_err(err("buffer"))?,
    ];
    let bytes = (n * a.record) as f64;
    let (s, _, seen) = epoch(&mut loader, &mut bufs, 0, true)?;
    let first_gbps = bytes / (s + setup.0) / 1e9;
    let mut rates = Vec::new();
    let mut cpus = Vec::new();
    let totals0 = loader.streamer().totals();
    for e in 1..=a.reps as u64 {
        if spec.cold {
            drop_cache(records.file());
        }
        let (s, c, _) = epoch(&mut loader, &mut bufs, e, false)?;
        rates.push(bytes / s / 1e9);
        cpus.push(c / (bytes / 1e9));
    }
    if let Some((r, chained, transfers)) = loader.pool_report() {
        eprintln!("{}: a whole block's transfer from the middle of an epoch: {r}; {}", spec.name, r.breakdown);
        let t = loader.streamer().totals().since(&totals0);
        eprintln!("{}: every pass of the timed epochs, added up: {t}", spec.name);
        let waited = loader.pool_waited_seconds().unwrap_or(0.0);
        let total = setup.0 + s + rates.iter().map(|g| bytes / g / 1e9).sum::<f64>();
        eprintln!(
            "{}: {chained} of {transfers} transfers ran chained; batches waited {waited:.3} s for blocks to land, \
             of {total:.3} s in all",
            spec.name
        );
    }
    let checked = check(&mut loader, &mut bufs, records, &seen)?;
    let blocks = (spec.way == Way::Pool).then(|| blocks_per_batch(&seen, a.batch, (a.block / a.record).max(1)));
    let gbps = median(&mut rates.clone());
    Ok(Row {
        name: spec.name.clone(),
        way: format!("{:?}", loader.way()),
        gbps,
        x_line: gbps / line,
        mrec_per_s: gbps * 1e9 / a.record as f64 / 1e6,
        cpu_s_per_gb: median(&mut cpus),
        peak_pinned: budget.peak(),
        first_gbps: Some(first_gbps),
        min_gbps: rates.iter().copied().fold(f64::INFINITY, f64::min),
        max_gbps: rates.iter().copied().fold(0.0, f64::max),
        blocks_per_batch: blocks,
        gap: mean_gap(&seen, n),
        checked,
    })
}

/// Every record of the epoch once, and two batches' bytes equal to the file's records.
fn check(loader: &mut Loader, bufs: &mut [DeviceBuffer<u8>; 2], records: &Records, seen: &[u64]) -> Res<String> {
    let n = records.count() as usize;
    let mut count = vec![0u8; n];
    for &r in seen {
        count[r as usize] = count[r as usize].saturating_add(1);
    }
    if let Some(bad) = count.iter().position(|&c| c != 1) {
        return Ok(format!("FAILED: record {bad} arrived {} times in an epoch", count[bad]));
    }
    let file = records.file().as_bytes();
    let rec = records.record_bytes() as usize;
    let last = loader.len() - 1;
    for b in [0, last] {
        loader.load_state(wirespeed_pinned::LoaderState { epoch: 0, batch: b }).map_err(err("load_state"))?;
        let want = loader.batch_records(b);
        let dst = bufs[0].slice_mut(..).map_err(err("buffer"))?;
        loader.next_into(&mut [dst]).map_err(err("next batch"))?;
        let got = bufs[0].to_vec().map_err(err("read back"))?;
        for (k, &r) in want.iter().enumerate() {
            let at = records.range(r).start as usize;
            if got[k * rec..(k + 1) * rec] != file[at..at + rec] {
                return Ok(format!("FAILED: batch {b}, record {k} (file record {r}) differs from the file"));
            }
        }
    }
    Ok(format!("ok: {n} records once each; batches 0 and {last} equal the file"))
}

fn blocks_per_batch(seen: &[u64], batch: u64, block_records: u64) -> f64 {
    let mut total = 0usize;
    let chunks = seen.chunks(batch as usize);
    let count = chunks.len();
    for c in chunks {
        let mut blocks: Vec<u64> = c.iter().map(|r| r / block_records).collect();
        blocks.sort_unstable();
        blocks.dedup();
        total += blocks.len();
    }
    total as f64 / count.max(1) as f64
}

/// Mean distance between consecutive records, over the record count (1/3 for a uniform shuffle).
fn mean_gap(seen: &[u64], n: u64) -> f64 {
    let sum: f64 = seen.windows(2).map(|w| w[0].abs_diff(w[1]) as f64).sum();
    sum / seen.len().saturating_sub(1).max(1) as f64 / n as f64
}

/// The Python scripts, built into the binary so that it runs them from any folder.
const PYTHON_LOADER: &str = include_str!("../../python_loader.py");
const TORCH_SHUFFLE: &str = include_str!("../../torch_shuffle.py");

/// The scripts written into a new temporary folder, removed when this is dropped.
struct Scripts {
    dir: tempfile::TempDir,
}

impl Scripts {
    fn write() -> std::io::Result<Scripts> {
        let dir = tempfile::Builder::new().prefix("wirespeed-shuffle-scripts-").tempdir()?;
        std::fs::write(dir.path().join("python_loader.py"), PYTHON_LOADER)?;
        std::fs::write(dir.path().join("torch_shuffle.py"), TORCH_SHUFFLE)?;
        Ok(Scripts { dir })
    }

    /// `python3 SCRIPT` (or `$PYTHON`), the script in its temporary folder, its
    /// stderr ours; in our working folder, where a relative path to the file holds.
    fn command(&self, name: &str, a: &Args) -> std::process::Command {
        let mut cmd = std::process::Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
        cmd.arg(self.dir.path().join(name));
        cmd.stdin(std::process::Stdio::null()).stderr(std::process::Stdio::inherit());
        if a.emulated {
            cmd.arg("--emulated");
        }
        cmd
    }
}

/// The arguments of bench/python_loader.py common to its rows.
fn loader_args(cmd: &mut std::process::Command, a: &Args, path: &Path, line: f64) {
    cmd.arg(path).args(["--record", &a.record.to_string(), "--batch", &a.batch.to_string()]);
    cmd.args(["--block", &a.block.to_string(), "--line", &line.to_string()]);
    if let Some(p) = a.prefetch {
        cmd.args(["--prefetch", &p.to_string()]);
    }
}

/// `wirespeed.Loader` from Python on the same file and way as `row` (bench/python_loader.py).
fn python_row(a: &Args, scripts: &Scripts, path: &Path, line: f64, row: &Row) -> Option<serde_json::Value> {
    let (way, budget, dev) = match row.name.as_str() {
        "shuffle-pool" => ("pool", a.budget, a.pool),
        "shuffle-full-resident" => ("resident", a.budget, 0),
        _ => return None,
    };
    eprintln!("wirespeed.Loader from Python ({way}) ...");
    let mut cmd = scripts.command("python_loader.py", a);
    loader_args(&mut cmd, a, path, line);
    cmd.args(["--way", way, "--budget", &budget.to_string(), "--reps", &a.reps.to_string()]);
    if dev > 0 {
        cmd.args(["--device-budget", &dev.to_string()]);
    }
    json_lines(cmd.output(), "Python rows").into_iter().next().map(|mut v| {
        v["of_rust"] = serde_json::json!(v["gbps"].as_f64().unwrap_or(0.0) / row.gbps);
        v
    })
}

/// `wirespeed.Loader` from Python with `ms` of calibrated work per batch
/// queued on torch's stream, for each way of --ways (bench/python_loader.py --busy).
fn busy_rows(a: &Args, scripts: &Scripts, path: &Path, line: f64, ms: f64) -> Vec<serde_json::Value> {
    let mut ways: Vec<&str> = Vec::new();
    for w in &a.ways {
        let w = w.split_once(':').map_or(w.as_str(), |(w, _)| w);
        if !ways.contains(&w) {
            ways.push(w);
        }
    }
    eprintln!("wirespeed.Loader from Python with {ms} ms of work per batch ({}) ...", ways.join(", "));
    let mut cmd = scripts.command("python_loader.py", a);
    loader_args(&mut cmd, a, path, line);
    cmd.args(["--way", &ways.join(","), "--budget", &a.budget.to_string()]);
    cmd.args(["--device-budget", &a.pool.to_string(), "--busy", &ms.to_string()]);
    if let Some(n) = a.busy_batches {
        cmd.args(["--busy-batches", &n.to_string()]);
    }
    json_lines(cmd.output(), "Python busy rows")
}

/// The JSON lines a script printed; its other lines (a skip, a failure) are
/// shown as they are.
fn json_lines(out: std::io::Result<std::process::Output>, what: &str) -> Vec<serde_json::Value> {
    match out {
        Ok(o) => {
            // The rows that finished, even when a later one failed.
            let mut rows = Vec::new();
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                match serde_json::from_str::<serde_json::Value>(l) {
                    Ok(v) if v.is_object() => rows.push(v),
                    _ if l.trim().is_empty() => {}
                    _ => eprintln!("{what}: {l}"),
                }
            }
            if !o.status.success() {
                eprintln!("{what}: a row failed ({}; its errors above)", o.status);
            }
            rows
        }
        Err(e) => {
            eprintln!("{what} skipped: could not run Python ({e})");
            Vec::new()
        }
    }
}

/// PyTorch's DataLoader on the same file (bench/torch_shuffle.py), if torch is importable.
fn torch_rows(a: &Args, scripts: &Scripts, path: &Path, line: f64) -> Vec<serde_json::Value> {
    eprintln!("PyTorch DataLoader rows ({} s each) ...", a.torch_seconds);
    let mut cmd = scripts.command("torch_shuffle.py", a);
    cmd.arg(path).args(["--record", &a.record.to_string(), "--batch", &a.batch.to_string()]);
    cmd.args(["--seconds", &a.torch_seconds.to_string(), "--line", &line.to_string()]);
    json_lines(cmd.output(), "PyTorch rows")
}

fn print_busy(busy: &[serde_json::Value]) {
    if busy.is_empty() {
        return;
    }
    println!(
        "\n| row | work ms/batch | next() ms median | p99 (goal 0.5) | max (goal 2) | queued ms (goal 200+) | wall s \
         | loader alone s | work alone s | wall / max (goal 1.05) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or("?").to_string();
    for b in busy {
        println!(
            "| {} | {:.1} | {:.3} | {:.3} {} | {:.3} {} | {:.0} {} | {:.2} | {:.2} | {:.2} | {:.3} {} |",
            s(b, "name"),
            f(b, "busy_ms"),
            f(b, "next_ms_median"),
            f(b, "next_ms_p99"),
            s(b, "next_p99_goal"),
            f(b, "next_ms_max"),
            s(b, "next_max_goal"),
            f(b, "queued_ms"),
            s(b, "queued_200ms"),
            f(b, "wall_s"),
            f(b, "loader_alone_s"),
            f(b, "work_alone_s"),
            f(b, "ratio"),
            s(b, "ratio_goal"),
        );
    }
}

fn print_table(rows: &[Row], torch: &[serde_json::Value], line: f64) {
    println!(
        "\n| row | way | GB/s (min-max) | x line | M records/s | CPU s/GB | peak pinned | first epoch GB/s | blocks/batch | gap | check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} ({:.2}-{:.2}) | {:.2} | {:.2} | {:.3} | {} MiB | {} | {} | {:.3} | {} |",
            r.name,
            r.way,
            r.gbps,
            r.min_gbps,
            r.max_gbps,
            r.x_line,
            r.mrec_per_s,
            r.cpu_s_per_gb,
            r.peak_pinned >> 20,
            r.first_gbps.map_or("-".into(), |g| format!("{g:.2}")),
            r.blocks_per_batch.map_or("-".into(), |b| format!("{b:.1}")),
            r.gap,
            r.checked
        );
    }
    for t in torch {
        let g = t["gbps"].as_f64().unwrap_or(0.0);
        println!(
            "| {} | Python | {g:.2} | {:.3} | {:.3} | {:.3} | - | - | - | - | {} |",
            t["name"].as_str().unwrap_or("?"),
            g / line,
            t["mrec_per_s"].as_f64().unwrap_or(0.0),
            t["cpu_s_per_gb"].as_f64().unwrap_or(0.0),
            match t["of_rust"].as_f64() {
                Some(r) => format!("{r:.2} of the Rust row's rate"),
                None => format!("{} batches", t["batches"].as_u64().unwrap_or(0)),
            }
        );
    }
    let dataloader = torch.iter().filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("dataloader")));
    let best_torch = dataloader.filter_map(|t| t["mrec_per_s"].as_f64()).fold(0.0, f64::max);
    if best_torch > 0.0 {
        for r in rows {
            println!("{}: {:.1}x the best DataLoader row's records/s", r.name, r.mrec_per_s / best_torch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in scripts are written whole, and run from there:
    /// each says why it skips (here: no torch, or an emulated run) and exits 0.
    #[test]
    fn scripts_run_from_a_temporary_folder_or_skip() {
        let scripts = Scripts::write().unwrap();
        for (name, source) in [("python_loader.py", PYTHON_LOADER), ("torch_shuffle.py", TORCH_SHUFFLE)] {
            assert_eq!(std::fs::read_to_string(scripts.dir.path().join(name)).unwrap(), source);
        }
        if std::process::Command::new("python3").arg("-c").arg("pass").status().is_err() {
            return; // no python3 here
        }
        let a = Args::parse_from(["shuffle", "--emulated"]);
        for name in ["python_loader.py", "torch_shuffle.py"] {
            let out = scripts.command(name, &a).arg("no-such-file").output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{name}: {text}");
            assert!(text.starts_with(&format!("{name}: skipped: ")), "{name}: {text}");
        }
    }
}
