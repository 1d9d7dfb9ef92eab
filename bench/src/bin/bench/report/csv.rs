//! results.csv: one line per run (the line rate, the file's rows, the
//! PyTorch rows), one for the overhead microbenchmark and one for the
//! overlap run.

use crate::report::figures::finite;
use crate::results::{Kind, Row};
use crate::runs::overhead::Overhead;
use crate::runs::overlap::{self, Overlap};
use crate::summary::Summary;
use crate::util::{Fatal, Result, fmt_bytes, stats};
use serde::Serialize;

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

impl<'a> CsvRow<'a> {
    /// A line with its names and every figure empty.
    fn blank(kind: &'a str, name: &'a str, description: &'a str, emulated: bool) -> Self {
        CsvRow {
            kind,
            name,
            description,
            strategy: "",
            bytes: None,
            reps: 0,
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
            emulated,
        }
    }

    /// A run's line (no fraction of the line rate for the disk alone).
    fn run(r: &'a Row, line_rate: f64, emulated: bool) -> Self {
        let (g, f, c) = (r.gbps(), r.fractions(line_rate), r.cpu_stats());
        let gpu = r.kind != Kind::Disk;
        CsvRow {
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
            ..CsvRow::blank(r.kind.name(), &r.name, &r.what, emulated)
        }
    }
}

/// The overhead microbenchmark, in words: its figures have no column.
fn overhead_description(o: &Overhead) -> String {
    format!(
        "CPU us per 64 KiB async copy: cuda-safe {:.4}, raw {:.4}, overhead {:+.2} %",
        o.safe_cpu_us.median, o.raw_cpu_us.median, o.pct
    )
}

/// The overlap run, in words, for its line's description.
fn overlap_description(o: &Overlap) -> String {
    format!(
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
    )
}

/// The results as CSV: one line per run, and one for the overhead microbenchmark.
pub fn csv(sm: &Summary) -> Result<String> {
    let emulated = sm.gpu.emulated;
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in std::iter::once(sm.line).chain(sm.rows).chain(sm.pytorch_rows) {
        w.serialize(CsvRow::run(r, sm.line_rate, emulated))?;
    }
    if let Some(o) = sm.overhead {
        let what = overhead_description(o);
        w.serialize(CsvRow { reps: o.rounds, ..CsvRow::blank("overhead", "safe-vs-raw", &what, emulated) })?;
    }
    if let Some(o) = sm.overlap {
        let what = overlap_description(o);
        let g = stats(&o.both_s.iter().map(|t| o.bytes() as f64 / t / 1e9).collect::<Vec<_>>());
        w.serialize(CsvRow {
            strategy: &o.strategy,
            bytes: Some(o.bytes()),
            reps: o.both_s.len(),
            gbps_median: finite(g.median),
            gbps_min: finite(g.min),
            gbps_max: finite(g.max),
            fraction_of_line_rate: finite(g.median / sm.line_rate),
            fraction_of_line_rate_min: finite(g.min / sm.line_rate),
            fraction_of_line_rate_max: finite(g.max / sm.line_rate),
            intact: o.intact.as_bool(),
            error: o.error.clone().or_else(|| o.skipped.as_ref().map(|s| format!("skipped: {s}"))),
            ..CsvRow::blank("overlap", "overlap", &what, emulated)
        })?;
    }
    let bytes = w.into_inner().map_err(|e| Fatal::Run(format!("writing results.csv: {e}")))?;
    String::from_utf8(bytes).map_err(|e| Fatal::Run(format!("results.csv: {e}")))
}
