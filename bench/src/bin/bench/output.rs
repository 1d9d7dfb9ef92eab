//! The results for people (tables, the targets, what it means) and for machines
//! (JSON, CSV, an SVG chart).

use crate::results::{Intact, Kind, Row, Sample};
use crate::runs::overlap::{self, Overlap};
use crate::runs::rows;
use crate::script;
use crate::summary::{EMULATED, Summary};
use crate::targets::{self, Target};
use crate::util::{Fatal, Result, Stats, fmt_bytes, stats};
use serde::Serialize;
use std::fmt::Write as _;

fn find<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.name == name && r.ok())
}

// ---------------------------------------------------------------- text

fn num(v: f64, prec: usize) -> String {
    if v.is_finite() { format!("{v:.prec$}") } else { "-".into() }
}

fn spread(g: Stats) -> String {
    if g.min.is_finite() { format!("{:.2}-{:.2}", g.min, g.max) } else { "-".into() }
}

fn range(s: Stats, prec: usize) -> String {
    if s.min.is_finite() { format!("{:.prec$}-{:.prec$}", s.min, s.max) } else { "-".into() }
}

fn table_rows(out: &mut String, rows: &[&Row], line_rate: f64) {
    let _ = writeln!(
        out,
        "{:<18} {:>4} {:>8} {:>13} {:>6} {:>11} {:>8} {:>13} {:>11} {:>6}",
        "strategy",
        "reps",
        "GB/s",
        "GB/s min-max",
        "x line",
        "x min-max",
        "CPU s/GB",
        "CPU min-max",
        "peak pinned",
        "intact"
    );
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(out, "{:<18} FAILED: {e}", r.name);
            continue;
        }
        if let Some(s) = &r.skipped {
            let _ = writeln!(out, "{:<18} skipped: {s}", r.name);
            continue;
        }
        let g = r.gbps();
        let (frac, frac_range) = if r.kind == Kind::Disk {
            ("-".to_string(), "-".to_string())
        } else {
            let f = r.fractions(line_rate);
            (num(f.median, 2), range(f, 2))
        };
        let peak = if r.kind == Kind::External { "-".to_string() } else { fmt_bytes(r.peak_pinned) };
        let _ = writeln!(
            out,
            "{:<18} {:>4} {:>8} {:>13} {:>6} {:>11} {:>8} {:>13} {:>11} {:>6}",
            r.name,
            r.samples.len(),
            num(g.median, 2),
            spread(g),
            frac,
            frac_range,
            num(r.cpu_per_gb(), 3),
            range(r.cpu_stats(), 3),
            peak,
            r.intact.short()
        );
    }
}

fn legend(out: &mut String, rows: &[&Row]) {
    for r in rows {
        let mut line = format!("  {:<18} {}", r.name, r.what);
        if !r.strategy.is_empty() {
            let _ = write!(line, " [{}]", r.strategy);
        }
        for (k, v) in &r.notes {
            let _ = write!(line, "; {k}: {v}");
        }
        match r.intact {
            Intact::No { expected, got } => {
                let _ = write!(line, "; DATA DAMAGED: checksum {got:#018x}, expected {expected:#018x}");
            }
            Intact::Verified(ok) => {
                let _ = write!(
                    line,
                    "; checked by an extra verifying pass: {}",
                    if ok { "intact" } else { "DATA DAMAGED" }
                );
            }
            Intact::Spot { ok, blocks } => {
                let _ = write!(
                    line,
                    "; spot-checked ({blocks} blocks): {}",
                    if ok { "equal to the file" } else { "DIFFERENT FROM THE FILE" }
                );
            }
            _ => {}
        }
        let _ = writeln!(out, "{line}");
    }
}

/// "What this shows": which way is fast, by how much, and why.
fn explain(out: &mut String, s: &Summary) {
    // Whole passes over the file only (budget-reuse moves a smaller range).
    let ok: Vec<&Row> =
        s.rows.iter().filter(|r| r.ok() && r.kind == Kind::Stream && r.name != "budget-reuse").collect();
    let Some(best) = ok.iter().max_by(|a, b| a.gbps().median.total_cmp(&b.gbps().median)) else { return };
    let bg = best.gbps().median;
    let _ = writeln!(out, "\nWhat this shows:");
    let _ = writeln!(
        out,
        "  - fastest: {} at {:.2} GB/s = {:.2} of the line rate ({}).",
        best.name,
        bg,
        bg / s.line_rate,
        best.what
    );
    let times = |r: &Row| bg / r.gbps().median;
    if let Some(r) = find(s.rows, "per-batch-pinned") {
        let alloc =
            r.notes.iter().find(|(k, _)| k.starts_with("cudaHostAlloc")).map(|(_, v)| v.as_str()).unwrap_or("?");
        let _ = writeln!(
            out,
            "  - per-batch-pinned (a fresh pinned buffer per batch, as pin_memory() per batch does) reached {:.2} GB/s, \
             {:.1}x slower than {}: allocating pinned memory costs {alloc} s per GiB here and synchronizes the device, more than the copy it serves. \
             Allocate pinned memory once and reuse it.",
            r.gbps().median,
            times(r),
            best.name
        );
    }
    if let Some(r) = find(s.rows, "pageable") {
        let _ = writeln!(
            out,
            "  - pageable reached {:.2} GB/s ({:.2} of the line rate): the driver copies pageable memory through its own \
             small pinned staging buffer, one CPU memcpy at a time, so the copy engine waits on the CPU.",
            r.gbps().median,
            r.fraction(s.line_rate)
        );
    }
    let rings: Vec<&&Row> = ok.iter().filter(|r| r.name.starts_with("ring-") && r.name != "ring-cache").collect();
    if let (Some(first), Some(last)) = (rings.first(), rings.last())
        && rings.len() > 1
    {
        let _ = writeln!(
            out,
            "  - the pinned ring with slots sized from the budget: {:.2} GB/s with {}, {:.2} GB/s with {} at {:.3} CPU \
             s/GB: the CPU copies every byte into a slot first (memcpy from the mapping), so it is bounded by host \
             memory bandwidth and costs cores.",
            first.gbps().median,
            first.name,
            last.gbps().median,
            last.name,
            last.cpu_per_gb()
        );
    }
    if let Some(r) = find(s.rows, "ring-cache") {
        let big = find(s.rows, "ring-8")
            .map(|b| {
                format!(
                    " (ring-8, its slots {} each: {:.2} GB/s at {:.3} CPU s/GB)",
                    b.strategy,
                    b.gbps().median,
                    b.cpu_per_gb()
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  - the cache-sized ring (ring-cache, {}) reached {:.2} GB/s = {:.2} of the line rate at {:.3} CPU s/GB{big}: \
             a 4 MiB slot written by the CPU is still in its last-level cache when the DMA reads it.",
            r.strategy,
            r.gbps().median,
            r.fraction(s.line_rate),
            r.cpu_per_gb()
        );
    }
    if let Some(r) = find(s.rows, "windows") {
        let _ = writeln!(
            out,
            "  - windows reached {:.2} GB/s at {:.3} CPU s/GB: no memcpy (the page cache is registered in place), \
             but the driver registers and unregisters pages one call at a time (serialized).",
            r.gbps().median,
            r.cpu_per_gb()
        );
    }
    if let Some(r) = find(s.rows, "whole-file") {
        let again = find(s.rows, "budget-reuse")
            .map(|a| {
                format!(
                    ", and copying again from a kept registration runs at {:.2} GB/s (budget-reuse)",
                    a.gbps().median
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  - whole-file reached {:.2} GB/s for one pass, registering and unregistering {} included{again}; but it \
             pins the whole file at once, which a machine may refuse for a large file (the memlock limit, RAM).",
            r.gbps().median,
            fmt_bytes(r.bytes)
        );
    }
    if let Some(r) = find(s.rows, "auto") {
        let _ = writeln!(
            out,
            "  - auto chose {} and reached {:.2} GB/s = {:.2} of the line rate within the pin budget.",
            r.strategy,
            r.gbps().median,
            r.fraction(s.line_rate)
        );
    }
    if let Some(k) = find(s.rows, "kvikio-hot") {
        let ours = find(s.rows, "auto")
            .map(|a| format!(" (auto: {:.2} GB/s at {:.3} CPU s/GB)", a.gbps().median, a.cpu_per_gb()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  - KvikIO (compatibility mode) read the page-cached file into a torch tensor at {:.2} GB/s = {:.2} of the \
             line rate, {:.3} CPU s/GB, at its best setting ({}){ours}: it preads every byte into small pinned bounce \
             buffers and copies those, a CPU copy of every byte.",
            k.gbps().median,
            k.fraction(s.line_rate),
            k.cpu_per_gb(),
            k.strategy
        );
    }
    if let Some(d) = find(s.rows, "disk-direct") {
        let cold: Vec<String> = ["kvikio-cold", "cold-auto", "cold-direct"]
            .iter()
            .filter_map(|n| find(s.rows, n))
            .map(|r| format!("{} {:.2} GB/s", r.name, r.gbps().median))
            .collect();
        let _ = writeln!(
            out,
            "  - a file that is not in the page cache comes at the disk's pace: O_DIRECT reads give {:.2} GB/s here \
             (threads: {}){}{}.",
            d.gbps().median,
            d.note_value("threads").unwrap_or("?"),
            if cold.is_empty() { "" } else { "; " },
            cold.join(", ")
        );
    }
}

fn header(out: &mut String, s: &Summary) {
    if s.gpu.emulated {
        let _ = writeln!(out, "*** {EMULATED} ***");
    }
    let _ = writeln!(out, "{}", s.gpu.describe());
    let _ = writeln!(out, "{}", s.gpu.host);
    let _ = writeln!(
        out,
        "{} timed repetition(s) per run, {} for the target rows (auto, ring-cache); the library's runs on a page-cached \
         file after an untimed first pass.\nThe median is shown, with min-max; x line = GB/s over the line rate of this \
         run; GB = 10^9 bytes; wall-clock times;\nCPU = all threads of the process (user + system); up to {} filler threads",
        s.reps, s.target_reps, s.threads
    );
    let _ = writeln!(
        out,
        "line rate: {:.2} GB/s ({}){}",
        s.line_rate,
        s.line.what,
        if s.gpu.emulated { " [emulated]" } else { "" }
    );
}

/// The human-readable report.
pub fn text(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    header(&mut out, s);
    if let Some(f) = &s.file {
        let _ = writeln!(
            out,
            "\nStreaming {} ({}, {}; checksum {:#018x}) to {}",
            f.path,
            fmt_bytes(f.bytes),
            if f.demo { "demo file, page-cached" } else { "your file" },
            f.checksum,
            f.destination
        );
        let _ = writeln!(
            out,
            "pin budget {} (the file is {:.1}x the budget)",
            fmt_bytes(f.budget),
            f.bytes as f64 / f.budget as f64
        );
        for n in &f.notes {
            let _ = writeln!(out, "note: {n}");
        }
        if s.gpu.emulated {
            let _ = writeln!(out, "*** {EMULATED} ***");
        }
        let mut rows: Vec<&Row> = vec![s.line];
        rows.extend(s.rows.iter());
        table_rows(&mut out, &rows, s.line_rate);
        let _ = writeln!(
            out,
            "(x line = fraction of the line rate measured in this run; kvikio-* are KvikIO's reads of the same file)"
        );
        let _ = writeln!(out, "\nWhat each row does:");
        legend(&mut out, &rows);
        explain(&mut out, s);
    }
    if !s.pytorch_rows.is_empty() {
        rows_text(&mut out, s);
    }
    if let Some(o) = s.overhead {
        let _ = writeln!(
            out,
            "\nSafe-layer overhead{}: {} async 64 KiB H2D copies each way, {} interleaved rounds of {}{}; per copy, median (min-max):",
            if s.gpu.emulated { " [EMULATED]" } else { "" },
            o.copies(),
            o.rounds,
            o.batch,
            o.cpu.map(|c| format!(", thread kept on CPU {c}")).unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "  cuda-safe Stream::copy_to_device + detach  {:>7.3} us CPU ({:.3}-{:.3}), {:.3} us wall",
            o.safe_cpu_us.median, o.safe_cpu_us.min, o.safe_cpu_us.max, o.safe_wall_us.median
        );
        let _ = writeln!(
            out,
            "  raw cudaMemcpyAsync through cuda-sys       {:>7.3} us CPU ({:.3}-{:.3}), {:.3} us wall",
            o.raw_cpu_us.median, o.raw_cpu_us.min, o.raw_cpu_us.max, o.raw_wall_us.median
        );
        let _ = writeln!(
            out,
            "  raw cudaSetDevice + cudaMemcpyAsync        {:>7.3} us CPU ({:.3}-{:.3})  (what making the device current costs)",
            o.raw_set_cpu_us.median, o.raw_set_cpu_us.min, o.raw_set_cpu_us.max
        );
        let _ = writeln!(
            out,
            "  overhead {:+.1} % CPU per copy (median of the rounds' safe / raw; rounds {:+.1} .. {:+.1} %; ratio of the overall medians {:+.1} %)",
            o.pct, o.round_pct.min, o.round_pct.max, o.medians_pct
        );
    }
    if let Some(o) = s.overlap {
        overlap_text(&mut out, o, s.gpu.emulated);
    }
    if let Some(k) = s.kvikio {
        let _ = writeln!(out, "\nKvikIO's own run on the same file (bench/kvikio_read.py):");
        for l in k.text.lines() {
            let _ = writeln!(out, "  {l}");
        }
    }
    targets_text(&mut out, s);
    if s.gpu.emulated {
        let _ = writeln!(out, "*** {EMULATED} ***");
    }
    out
}

fn overlap_text(out: &mut String, o: &Overlap, emulated: bool) {
    let _ = writeln!(
        out,
        "\nOverlap with the caller's work{}: {} batches of {} ({}) streamed with start_with(.., after(caller)) into \
         {} slots of an arena the caller owns (up to {} transfers queued ahead); per batch, then_on(caller), then \
         the caller's work on its own stream: k device-to-device copies of the batch",
        if emulated { " [EMULATED]" } else { "" },
        o.batches,
        fmt_bytes(o.batch),
        fmt_bytes(o.bytes()),
        o.slots,
        o.slots.saturating_sub(1)
    );
    if let Some(e) = &o.error {
        let _ = writeln!(out, "  FAILED: {e}");
        return;
    }
    if let Some(why) = &o.skipped {
        let _ = writeln!(out, "  skipped: {why}");
        return;
    }
    let tries: Vec<String> = o.calibration.iter().map(|(k, t)| format!("k={k}: {:.1} ms", t * 1e3)).collect();
    let _ = writeln!(
        out,
        "  k = {}, calibrated against the streaming alone ({:.1} ms): {}",
        o.k,
        o.calibration_target * 1e3,
        tries.join(", ")
    );
    let _ = writeln!(out, "  median of {} repetition(s) (min-max):", o.both_s.len());
    let gb = o.bytes() as f64 / 1e9;
    for (name, st) in [("stream alone", o.stream()), ("compute alone", o.compute()), ("both", o.both())] {
        let _ = writeln!(
            out,
            "  {name:<14} {:>9} ms ({}){}",
            num(st.median * 1e3, 1),
            range(Stats { median: st.median * 1e3, min: st.min * 1e3, max: st.max * 1e3 }, 1),
            if name == "compute alone" { String::new() } else { format!(", {:.2} GB/s streamed", gb / st.median) }
        );
    }
    let r = o.ratios();
    let _ = writeln!(
        out,
        "  both / max(alone) = {:.3} (per repetition {}): target <= {:.2}; compute alone / stream alone = {:.2}; \
         the streamer ran {} ({} registrations per pass); intact: {}",
        o.ratio(),
        range(r, 3),
        overlap::TARGET_RATIO,
        o.balance(),
        if o.strategy.is_empty() { "?" } else { &o.strategy },
        o.registrations.map_or("?".into(), |r| r.to_string()),
        o.intact.short()
    );
}

fn targets_text(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "\nTargets{} (PASS / MISS; ---- = not measured, or only partly, in this run):",
        if s.gpu.emulated { " — EMULATED: these are not GPU measurements" } else { "" }
    );
    for g in targets::all(s) {
        let tag = match g.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "----",
        };
        let _ = writeln!(out, "  {tag}  {}: {}", g.name, g.target);
        let _ = writeln!(out, "        measured: {}", g.measured);
        if let Some(why) = &g.reason {
            let _ = writeln!(out, "        why: {why}");
        }
    }
}

fn rows_text(out: &mut String, s: &Summary) {
    let rows = s.pytorch_rows.first().map_or(0, |r| r.bytes as usize / rows::ROW_BYTES);
    let _ = writeln!(
        out,
        "\nPyTorch's row-by-row copy{}: a = torch.rand({rows}, {}) ({:.2} GB of float32), `for i in a: ...` row by row",
        if s.gpu.emulated { " [EMULATED]" } else { "" },
        rows::COLS,
        s.pytorch_rows.first().map_or(0.0, |r| r.bytes as f64 / 1e9)
    );
    let _ = writeln!(
        out,
        "{:<16} {:<50} {:>9} {:>9} {:>7} {:>7} {:>7}",
        "variant", "code", "wall ms", "CPU ms", "GB/s", "x line", "intact"
    );
    for r in s.pytorch_rows {
        if let Some(e) = &r.error {
            let _ = writeln!(out, "{:<16} {:<50} FAILED: {e}", r.name, r.strategy);
            continue;
        }
        let g = r.gbps();
        let _ = writeln!(
            out,
            "{:<16} {:<50} {:>9} {:>9} {:>7} {:>7} {:>7}",
            r.name,
            r.strategy,
            num(r.seconds() * 1e3, 1),
            num(r.cpu_seconds() * 1e3, 1),
            num(g.median, 2),
            num(g.median / s.line_rate, 2),
            r.intact.short()
        );
    }
    let refs: Vec<&Row> = s.pytorch_rows.iter().collect();
    legend(out, &refs);
    if let (Some(pin), Some(reg)) = (find(s.pytorch_rows, "rows-pin-nb"), find(s.pytorch_rows, "rows-registered")) {
        let _ = writeln!(
            out,
            "Pinning a new buffer for every row (rows-pin-nb) is {:.1}x slower than pinning the tensor once \
             (rows-registered): the pinning, not the copy, is what is slow.",
            reg.gbps().median / pin.gbps().median
        );
    }
    let _ = writeln!(
        out,
        "rows-pin*: a fresh cudaHostAlloc per row (cuda-safe's PinnedBuffer::new also zero-fills it); PyTorch's\n\
         pin_memory() may cache pinned blocks and copy with several threads instead: see its own table."
    );
    match s.torch {
        Some(t) => {
            let _ = writeln!(out, "\nPyTorch's own run of the same (bench/torch_rows.py):");
            for l in t.text.lines() {
                let _ = writeln!(out, "  {l}");
            }
        }
        None => {
            let _ =
                writeln!(out, "PyTorch's own run of the same: python3 bench/torch_rows.py (needs torch and a GPU).");
        }
    }
    if let Some(r) = find(s.pytorch_rows, "rows-ring-mt") {
        let mut line = format!(
            "rows-ring-mt: {} threads filling one PinnedRing reached {:.2} GB/s = {:.2} of the line rate at {:.3} CPU s/GB \
             ({:.1} ms CPU)",
            r.note_value("threads").unwrap_or("?"),
            r.gbps().median,
            r.fraction(s.line_rate),
            r.cpu_per_gb(),
            r.cpu_seconds() * 1e3
        );
        if let Some((wall, cpu)) = s.torch.and_then(rows::torch_pin_nb) {
            let _ = write!(
                line,
                "; PyTorch's per-row pin_memory().cuda(non_blocking=True): {:.2} GB/s, {:.1} ms CPU: ours takes {:.2} of its CPU time",
                r.bytes as f64 / wall / 1e9,
                cpu * 1e3,
                r.cpu_seconds() / cpu
            );
        }
        let _ = writeln!(out, "{line}.");
    }
}

// ---------------------------------------------------------------- JSON

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
        device: DeviceJson {
            ordinal: gpu.device.ordinal(),
            name: &gpu.name,
            runtime_version: gpu.runtime_version.max(0),
            driver_version: gpu.driver_version.max(0),
            runtime_path: &gpu.runtime_path,
            memory_free_bytes: gpu.free,
            memory_total_bytes: gpu.total,
            host: &gpu.host,
        },
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
        file: sm.file.as_ref().map(|fi| FileJson {
            path: &fi.path,
            bytes: fi.bytes,
            demo: fi.demo,
            checksum: format!("{:#018x}", fi.checksum),
            pin_budget_bytes: fi.budget,
            destination: &fi.destination,
            notes: &fi.notes,
            memory_read_gbps: fi.mem.map(|m| m.read_all / 1e9),
            memory_copy_one_thread_gbps: fi.mem.map(|m| m.copy_one / 1e9),
        }),
        results: sm.rows.iter().map(|r| RowJson::new(r, sm.line_rate)).collect(),
        pytorch_rows: sm.pytorch_rows.iter().map(|r| RowJson::new(r, sm.line_rate)).collect(),
        overhead: sm.overhead.map(|o| OverheadJson {
            copy_bytes: crate::runs::overhead::COPY_BYTES,
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
        }),
        overlap: sm.overlap.map(OverlapJson::new),
        torch_rows: sm.torch.map(TorchJson::new),
        kvikio: sm.kvikio.map(TorchJson::new),
        targets: targets::all(sm)
            .into_iter()
            .map(|g: Target| TargetJson {
                name: g.name,
                target: g.target,
                pass: g.pass,
                measured: g.measured,
                reason: g.reason,
            })
            .collect(),
    };
    // Serializing plain structs of strings and numbers cannot fail.
    let mut out = serde_json::to_string_pretty(&doc).unwrap_or_default();
    out.push('\n');
    out
}

// ---------------------------------------------------------------- CSV

/// One line of results.csv; empty cells for what was not measured.
#[derive(Serialize)]
struct CsvRow<'a> {
    kind: &'a str,
    name: &'a str,
    description: &'a str,
    strategy: &'a str,
    bytes: Option<u64>,
    reps: usize,
    gbps_median: Option<f64>,
    gbps_min: Option<f64>,
    gbps_max: Option<f64>,
    fraction_of_line_rate: Option<f64>,
    fraction_of_line_rate_min: Option<f64>,
    fraction_of_line_rate_max: Option<f64>,
    cpu_s_per_gb: Option<f64>,
    cpu_s_per_gb_min: Option<f64>,
    cpu_s_per_gb_max: Option<f64>,
    peak_pinned_bytes: Option<u64>,
    intact: Option<bool>,
    error: Option<String>,
    emulated: bool,
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The results as CSV: one line per run, and one for the overhead microbenchmark.
pub fn csv(sm: &Summary) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in std::iter::once(sm.line).chain(sm.rows).chain(sm.pytorch_rows) {
        let (g, f, c) = (r.gbps(), r.fractions(sm.line_rate), r.cpu_stats());
        let gpu = r.kind != Kind::Disk;
        w.serialize(CsvRow {
            kind: r.kind.name(),
            name: &r.name,
            description: &r.what,
            strategy: &r.strategy,
            bytes: Some(r.bytes),
            reps: r.samples.len(),
            gbps_median: finite(g.median),
            gbps_min: finite(g.min),
            gbps_max: finite(g.max),
            fraction_of_line_rate: if gpu { finite(f.median) } else { None },
            fraction_of_line_rate_min: if gpu { finite(f.min) } else { None },
            fraction_of_line_rate_max: if gpu { finite(f.max) } else { None },
            cpu_s_per_gb: finite(c.median),
            cpu_s_per_gb_min: finite(c.min),
            cpu_s_per_gb_max: finite(c.max),
            peak_pinned_bytes: Some(r.peak_pinned),
            intact: r.intact.as_bool(),
            error: r.error.clone().or_else(|| r.skipped.as_ref().map(|s| format!("skipped: {s}"))),
            emulated: sm.gpu.emulated,
        })?;
    }
    if let Some(o) = sm.overhead {
        let what = format!(
            "CPU us per 64 KiB async copy: cuda-safe {:.4}, raw {:.4}, overhead {:+.2} %",
            o.safe_cpu_us.median, o.raw_cpu_us.median, o.pct
        );
        w.serialize(CsvRow {
            kind: "overhead",
            name: "safe-vs-raw",
            description: &what,
            strategy: "",
            bytes: None,
            reps: o.rounds,
            gbps_median: None,
            gbps_min: None,
            gbps_max: None,
            fraction_of_line_rate: None,
            fraction_of_line_rate_min: None,
            fraction_of_line_rate_max: None,
            cpu_s_per_gb: None,
            cpu_s_per_gb_min: None,
            cpu_s_per_gb_max: None,
            peak_pinned_bytes: None,
            intact: None,
            error: None,
            emulated: sm.gpu.emulated,
        })?;
    }
    if let Some(o) = sm.overlap {
        let what = format!(
            "{} batches of {} streamed into the caller's arena while its stream copies each batch {} times: \
             both / max(stream alone, compute alone) = {:.3} (target <= {:.2}); stream alone {:.4} s, compute \
             alone {:.4} s, both {:.4} s",
            o.batches,
            fmt_bytes(o.batch),
            o.k,
            o.ratio(),
            overlap::TARGET_RATIO,
            o.stream().median,
            o.compute().median,
            o.both().median
        );
        let g = stats(&o.both_s.iter().map(|t| o.bytes() as f64 / t / 1e9).collect::<Vec<_>>());
        w.serialize(CsvRow {
            kind: "overlap",
            name: "overlap",
            description: &what,
            strategy: &o.strategy,
            bytes: Some(o.bytes()),
            reps: o.both_s.len(),
            gbps_median: finite(g.median),
            gbps_min: finite(g.min),
            gbps_max: finite(g.max),
            fraction_of_line_rate: finite(g.median / sm.line_rate),
            fraction_of_line_rate_min: finite(g.min / sm.line_rate),
            fraction_of_line_rate_max: finite(g.max / sm.line_rate),
            cpu_s_per_gb: None,
            cpu_s_per_gb_min: None,
            cpu_s_per_gb_max: None,
            peak_pinned_bytes: None,
            intact: o.intact.as_bool(),
            error: o.error.clone().or_else(|| o.skipped.as_ref().map(|s| format!("skipped: {s}"))),
            emulated: sm.gpu.emulated,
        })?;
    }
    let bytes = w.into_inner().map_err(|e| Fatal::Run(format!("writing results.csv: {e}")))?;
    String::from_utf8(bytes).map_err(|e| Fatal::Run(format!("results.csv: {e}")))
}

// ---------------------------------------------------------------- SVG

fn xml(v: &str) -> String {
    v.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A horizontal bar chart of GB/s per run, whiskers at min-max, a line at the line rate.
pub fn svg(sm: &Summary) -> String {
    let bars: Vec<&Row> = std::iter::once(sm.line).chain(sm.rows).chain(sm.pytorch_rows).filter(|r| r.ok()).collect();
    let (left, width, bar_h, gap, top) = (190.0, 640.0, 20.0, 8.0, 80.0);
    let max = bars.iter().map(|r| r.gbps().max).fold(sm.line_rate, f64::max).max(1e-9) * 1.12;
    let x = |v: f64| left + v / max * width;
    let height = top + bars.len() as f64 * (bar_h + gap) + 60.0;
    let total_w = left + width + 130.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{height}" viewBox="0 0 {total_w} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!(
        "Host-to-device GB/s per strategy — {}{}",
        sm.gpu.name,
        if sm.gpu.emulated { " — EMULATED: not GPU measurements" } else { "" }
    );
    let _ = writeln!(o, r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#, xml(&title));
    let sub = format!(
        "median of {} run(s) ({} for auto and ring-cache), whiskers min-max; dashed line: the line rate, {:.2} GB/s, \
         measured in the same run",
        sm.reps, sm.target_reps, sm.line_rate
    );
    let _ = writeln!(o, r##"<text x="10" y="42" fill="#444">{}</text>"##, xml(&sub));
    let mut lx = 10.0;
    for (color, what) in [
        ("#2b6cb0", "line rate"),
        ("#38a169", "file to GPU"),
        ("#a0aec0", "disk alone (O_DIRECT)"),
        ("#dd6b20", "PyTorch's row-by-row copy"),
        ("#805ad5", "KvikIO, same file"),
        ("#e53e3e", "data damaged"),
    ] {
        let _ = writeln!(
            o,
            r##"<rect x="{lx}" y="50" width="10" height="10" fill="{color}"/><text x="{}" y="59" fill="#444">{what}</text>"##,
            lx + 14.0
        );
        lx += 28.0 + what.len() as f64 * 6.5;
    }
    for (i, r) in bars.iter().enumerate() {
        let y = top + i as f64 * (bar_h + gap);
        let g = r.gbps();
        let color = match r.kind {
            Kind::LineRate => "#2b6cb0",
            Kind::Disk => "#a0aec0",
            Kind::Rows => "#dd6b20",
            Kind::External => "#805ad5",
            Kind::Stream if r.intact.as_bool() == Some(false) => "#e53e3e",
            Kind::Stream => "#38a169",
        };
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + bar_h * 0.72,
            xml(&r.name)
        );
        let _ = writeln!(
            o,
            r#"<rect x="{left}" y="{y}" width="{:.1}" height="{bar_h}" fill="{color}"><title>{}</title></rect>"#,
            (x(g.median) - left).max(0.5),
            xml(&format!("{}: {:.2} GB/s ({})", r.name, g.median, r.what))
        );
        let ym = y + bar_h / 2.0;
        let _ = writeln!(
            o,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{ym}" y2="{ym}" stroke="#222"/><line x1="{:.1}" x2="{:.1}" y1="{}" y2="{}" stroke="#222"/><line x1="{:.1}" x2="{:.1}" y1="{}" y2="{}" stroke="#222"/>"##,
            x(g.min),
            x(g.max),
            x(g.min),
            x(g.min),
            ym - 5.0,
            ym + 5.0,
            x(g.max),
            x(g.max),
            ym - 5.0,
            ym + 5.0
        );
        let label = if r.kind == Kind::Disk {
            format!("{:.2}", g.median)
        } else {
            format!("{:.2} ({:.2}x)", g.median, g.median / sm.line_rate)
        };
        let _ = writeln!(o, r#"<text x="{:.1}" y="{}">{}</text>"#, x(g.max) + 6.0, y + bar_h * 0.72, xml(&label));
    }
    let lx = x(sm.line_rate);
    let bottom = top + bars.len() as f64 * (bar_h + gap);
    let _ = writeln!(
        o,
        r##"<line x1="{lx:.1}" x2="{lx:.1}" y1="{}" y2="{bottom}" stroke="#2b6cb0" stroke-dasharray="5,4"/>"##,
        top - 8.0
    );
    let _ = writeln!(o, r##"<line x1="{left}" x2="{}" y1="{bottom}" y2="{bottom}" stroke="#888"/>"##, left + width);
    let step = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0].into_iter().find(|s| max / s <= 8.0).unwrap_or(200.0);
    let mut t = 0.0;
    while t <= max {
        let _ =
            writeln!(o, r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#444">{t}</text>"##, x(t), bottom + 16.0);
        t += step;
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#444">GB/s (10^9 bytes per second)</text>"##,
        left + width / 2.0,
        bottom + 36.0
    );
    o.push_str("</svg>\n");
    o
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
