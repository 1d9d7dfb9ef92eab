//! The human-readable report: the header, the file's rows with what each
//! does and what they show, then each other run's section and the targets.

use crate::report::explain::explain;
use crate::report::table::{legend, table_rows};
use crate::report::{overlap, rows};
use crate::results::Row;
use crate::runs::overhead::Overhead;
use crate::summary::{EMULATED, FileInfo, Summary};
use crate::targets;
use crate::util::fmt_bytes;
use std::fmt::Write as _;

/// The human-readable report.
pub fn text(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    header(&mut out, s);
    if let Some(f) = &s.file {
        file(&mut out, s, f);
    }
    if !s.pytorch_rows.is_empty() {
        rows::section(&mut out, s);
    }
    if let Some(o) = s.overhead {
        overhead(&mut out, o, s.gpu.emulated);
    }
    if let Some(o) = s.overlap {
        overlap::section(&mut out, o, s.gpu.emulated);
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

/// The device, the host, how the figures were taken, and the line rate.
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

/// The file streamed, its rows, what each does and what they show.
fn file(out: &mut String, s: &Summary, f: &FileInfo) {
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
    table_rows(out, &rows, s.line_rate);
    let _ = writeln!(
        out,
        "(x line = fraction of the line rate measured in this run; kvikio-* are KvikIO's reads of the same file)"
    );
    let _ = writeln!(out, "\nWhat each row does:");
    legend(out, &rows);
    explain(out, s);
}

/// The safe-layer overhead: cuda-safe against raw cuda-sys, per copy.
fn overhead(out: &mut String, o: &Overhead, emulated: bool) {
    let _ = writeln!(
        out,
        "\nSafe-layer overhead{}: {} async 64 KiB H2D copies each way, {} interleaved rounds of {}{}; per copy, median (min-max):",
        if emulated { " [EMULATED]" } else { "" },
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

/// Each target: PASS, MISS or not measured, what was measured, and why.
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
