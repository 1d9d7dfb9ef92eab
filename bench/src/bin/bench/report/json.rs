//! results.json (and `--json`): every run with its samples and notes, the
//! device, the configuration, the other runs' figures and the targets.

use crate::gpu::Gpu;
use crate::report::figures::finite;
use crate::results::{Intact, Kind, Row, Sample};
use crate::runs::overhead::{self, Overhead};
use crate::runs::overlap::{self, Overlap};
use crate::script;
use crate::summary::{EMULATED, FileInfo, Summary};
use crate::targets::{self, Target};
use crate::util::Stats;
use serde::Serialize;

/// One run, as results.json has it.
#[derive(Serialize)]
struct RowJson<'a> {
    name: &'a str,
    kind: &'static str,
    description: &'a str,
    strategy: &'a str,
    bytes: u64,
    reps: usize,
    gbps_median: f64,
    gbps_min: f64,
    gbps_max: f64,
    /// None for the disk alone (no GPU).
    fraction_of_line_rate: Option<f64>,
    fraction_of_line_rate_min: Option<f64>,
    fraction_of_line_rate_max: Option<f64>,
    cpu_s_per_gb: f64,
    cpu_s_per_gb_min: f64,
    cpu_s_per_gb_max: f64,
    /// CPU seconds over wall seconds (median of the repetitions).
    cores_busy: f64,
    seconds_median: f64,
    cpu_seconds_median: f64,
    peak_pinned_bytes: u64,
    registrations: Option<u64>,
    intact: Option<bool>,
    checksum: String,
    error: Option<&'a str>,
    skipped: Option<&'a str>,
    samples: &'a [Sample],
    notes: &'a [(String, String)],
}

impl<'a> RowJson<'a> {
    fn new(r: &'a Row, line_rate: f64) -> Self {
        let (g, f, c) = (r.gbps(), r.fractions(line_rate), r.cpu_stats());
        let gpu = r.kind != Kind::Disk;
        RowJson {
            name: &r.name,
            kind: r.kind.name(),
            description: &r.what,
            strategy: &r.strategy,
            bytes: r.bytes,
            reps: r.samples.len(),
            gbps_median: g.median,
            gbps_min: g.min,
            gbps_max: g.max,
            fraction_of_line_rate: gpu.then_some(f.median),
            fraction_of_line_rate_min: gpu.then_some(f.min),
            fraction_of_line_rate_max: gpu.then_some(f.max),
            cpu_s_per_gb: c.median,
            cpu_s_per_gb_min: c.min,
            cpu_s_per_gb_max: c.max,
            cores_busy: r.cores_busy(),
            seconds_median: r.seconds(),
            cpu_seconds_median: r.cpu_seconds(),
            peak_pinned_bytes: r.peak_pinned,
            registrations: r.registrations,
            intact: r.intact.as_bool(),
            checksum: match &r.intact {
                Intact::Yes(c) | Intact::No { got: c, .. } => format!("{c:#018x}"),
                Intact::Verified(_) => "read back and compared by the library after each copy (scratch buffer)".into(),
                Intact::Spot { blocks, .. } => format!("spot check: {blocks} blocks of 4 KiB compared with the file"),
                Intact::Unchecked(why) => format!("not checked: {why}"),
            },
            error: r.error.as_deref(),
            skipped: r.skipped.as_deref(),
            samples: &r.samples,
            notes: &r.notes,
        }
    }
}

#[derive(Serialize)]
struct DeviceJson<'a> {
    ordinal: usize,
    name: &'a str,
    runtime_version: i32,
    driver_version: i32,
    runtime_path: &'a str,
    memory_free_bytes: u64,
    memory_total_bytes: u64,
    /// The host's CPU model, cores, last-level cache and memory, in words.
    host: &'a str,
}

impl<'a> DeviceJson<'a> {
    fn new(gpu: &'a Gpu) -> Self {
        DeviceJson {
            ordinal: gpu.device.ordinal(),
            name: &gpu.name,
            runtime_version: gpu.runtime_version.max(0),
            driver_version: gpu.driver_version.max(0),
            runtime_path: &gpu.runtime_path,
            memory_free_bytes: gpu.free,
            memory_total_bytes: gpu.total,
            host: &gpu.host,
        }
    }
}

#[derive(Serialize)]
struct ConfigJson {
    reps: usize,
    target_reps: usize,
    row_threads: usize,
    threads: usize,
    quick: bool,
    cores: usize,
}

#[derive(Serialize)]
struct FileJson<'a> {
    path: &'a str,
    bytes: u64,
    demo: bool,
    checksum: String,
    pin_budget_bytes: u64,
    destination: &'a str,
    notes: &'a [String],
    /// GB/s, every filler thread reading the page-cached file (null: not measured).
    memory_read_gbps: Option<f64>,
    /// GB/s, one thread copying it into 4 MiB buffers (null: not measured).
    memory_copy_one_thread_gbps: Option<f64>,
}

impl<'a> FileJson<'a> {
    fn new(fi: &'a FileInfo) -> Self {
        FileJson {
            path: &fi.path,
            bytes: fi.bytes,
            demo: fi.demo,
            checksum: format!("{:#018x}", fi.checksum),
            pin_budget_bytes: fi.budget,
            destination: &fi.destination,
            notes: &fi.notes,
            memory_read_gbps: fi.mem.map(|m| m.read_all / 1e9),
            memory_copy_one_thread_gbps: fi.mem.map(|m| m.copy_one / 1e9),
        }
    }
}

#[derive(Serialize)]
struct OverheadJson {
    copy_bytes: usize,
    copies_each: usize,
    rounds: usize,
    safe_cpu_us_per_copy: Stats,
    raw_cpu_us_per_copy: Stats,
    raw_set_device_cpu_us_per_copy: Stats,
    safe_wall_us_per_copy: Stats,
    raw_wall_us_per_copy: Stats,
    round_overhead_pct: Stats,
    overhead_pct: f64,
    medians_overhead_pct: f64,
    cpu: Option<usize>,
}

impl OverheadJson {
    fn new(o: &Overhead) -> Self {
        OverheadJson {
            copy_bytes: overhead::COPY_BYTES,
            copies_each: o.copies(),
            rounds: o.rounds,
            safe_cpu_us_per_copy: o.safe_cpu_us,
            raw_cpu_us_per_copy: o.raw_cpu_us,
            raw_set_device_cpu_us_per_copy: o.raw_set_cpu_us,
            safe_wall_us_per_copy: o.safe_wall_us,
            raw_wall_us_per_copy: o.raw_wall_us,
            round_overhead_pct: o.round_pct,
            overhead_pct: o.pct,
            medians_overhead_pct: o.medians_pct,
            cpu: o.cpu,
        }
    }
}

/// The overlap run, as results.json has it (seconds; `ratio` is both over
/// the longer of the two alone, of the medians).
#[derive(Serialize)]
struct OverlapJson<'a> {
    batch_bytes: u64,
    batches: usize,
    slots: usize,
    /// Device-to-device copies of each batch by the caller.
    k: usize,
    calibration_target_seconds: Option<f64>,
    calibration: Vec<CalibrationJson>,
    strategy: &'a str,
    registrations_per_pass: Option<u64>,
    stream_alone_seconds: Stats,
    compute_alone_seconds: Stats,
    both_seconds: Stats,
    stream_alone_samples: &'a [f64],
    compute_alone_samples: &'a [f64],
    both_samples: &'a [f64],
    ratio: Option<f64>,
    ratio_per_rep: Stats,
    target_ratio: f64,
    pass: Option<bool>,
    intact: Option<bool>,
    error: Option<&'a str>,
    skipped: Option<&'a str>,
}

#[derive(Serialize)]
struct CalibrationJson {
    k: usize,
    compute_alone_seconds: f64,
}

impl<'a> OverlapJson<'a> {
    fn new(o: &'a Overlap) -> Self {
        OverlapJson {
            batch_bytes: o.batch,
            batches: o.batches,
            slots: o.slots,
            k: o.k,
            calibration_target_seconds: finite(o.calibration_target),
            calibration: o.calibration.iter().map(|&(k, t)| CalibrationJson { k, compute_alone_seconds: t }).collect(),
            strategy: &o.strategy,
            registrations_per_pass: o.registrations,
            stream_alone_seconds: o.stream(),
            compute_alone_seconds: o.compute(),
            both_seconds: o.both(),
            stream_alone_samples: &o.stream_s,
            compute_alone_samples: &o.compute_s,
            both_samples: &o.both_s,
            ratio: finite(o.ratio()),
            ratio_per_rep: o.ratios(),
            target_ratio: overlap::TARGET_RATIO,
            pass: o.pass(),
            intact: o.intact.as_bool(),
            error: o.error.as_deref(),
            skipped: o.skipped.as_deref(),
        }
    }
}

#[derive(Serialize)]
/// A script's run (torch_rows.py, kvikio_read.py).
struct TorchJson<'a> {
    /// What the script printed, or why it did not run.
    output: &'a str,
    /// Its exit code (None: it did not run, was stopped, or died of a signal).
    exit_code: Option<i32>,
    /// The JSON the script wrote, as it wrote it.
    results: Option<&'a serde_json::Value>,
}

impl<'a> TorchJson<'a> {
    fn new(t: &'a script::Output) -> Self {
        TorchJson { output: &t.text, exit_code: t.status.and_then(|s| s.code()), results: t.json.as_ref() }
    }
}

#[derive(Serialize)]
struct TargetJson {
    name: &'static str,
    target: String,
    pass: Option<bool>,
    measured: String,
    reason: Option<String>,
}

impl TargetJson {
    fn new(g: Target) -> Self {
        TargetJson { name: g.name, target: g.target, pass: g.pass, measured: g.measured, reason: g.reason }
    }
}

/// The whole of results.json (and of `--json`).
#[derive(Serialize)]
struct Doc<'a> {
    tool: &'static str,
    version: &'static str,
    emulated: bool,
    label: Option<&'static str>,
    device: DeviceJson<'a>,
    config: ConfigJson,
    line_rate_gbps: f64,
    line_rate: RowJson<'a>,
    file: Option<FileJson<'a>>,
    results: Vec<RowJson<'a>>,
    pytorch_rows: Vec<RowJson<'a>>,
    overhead: Option<OverheadJson>,
    overlap: Option<OverlapJson<'a>>,
    torch_rows: Option<TorchJson<'a>>,
    kvikio: Option<TorchJson<'a>>,
    targets: Vec<TargetJson>,
}

/// The results as JSON (numbers that are not finite are null).
pub fn json(sm: &Summary) -> String {
    let gpu = sm.gpu;
    let doc = Doc {
        tool: "wirespeed-bench",
        version: env!("CARGO_PKG_VERSION"),
        emulated: gpu.emulated,
        label: gpu.emulated.then_some(EMULATED),
        device: DeviceJson::new(gpu),
        config: ConfigJson {
            reps: sm.reps,
            target_reps: sm.target_reps,
            row_threads: sm.opts.row_threads,
            threads: sm.threads,
            quick: sm.opts.quick,
            cores: crate::util::cores(),
        },
        line_rate_gbps: sm.line_rate,
        line_rate: RowJson::new(sm.line, sm.line_rate),
        file: sm.file.as_ref().map(FileJson::new),
        results: sm.rows.iter().map(|r| RowJson::new(r, sm.line_rate)).collect(),
        pytorch_rows: sm.pytorch_rows.iter().map(|r| RowJson::new(r, sm.line_rate)).collect(),
        overhead: sm.overhead.map(OverheadJson::new),
        overlap: sm.overlap.map(OverlapJson::new),
        torch_rows: sm.torch.map(TorchJson::new),
        kvikio: sm.kvikio.map(TorchJson::new),
        targets: targets::all(sm).into_iter().map(TargetJson::new).collect(),
    };
    // Serializing plain structs of strings and numbers cannot fail.
    let mut out = serde_json::to_string_pretty(&doc).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_json_has_null_for_what_was_not_measured() {
        let row = Row::skipped("disk-direct", Kind::Disk, "O_DIRECT reads", "the file is on tmpfs");
        let v = serde_json::to_value(RowJson::new(&row, 10.0)).unwrap();
        assert_eq!(v["name"], "disk-direct");
        assert_eq!(v["kind"], "disk");
        assert!(v["gbps_median"].is_null() && v["fraction_of_line_rate"].is_null() && v["intact"].is_null());
        assert_eq!(v["skipped"], "the file is on tmpfs");
        assert_eq!(v["samples"], serde_json::json!([]));
    }
}
