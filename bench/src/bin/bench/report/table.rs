//! The table of rows (GB/s, fraction of the line rate, CPU, peak pinned,
//! intact) and the legend that says what each row does.

use crate::report::figures::{num, range, spread};
use crate::results::{Intact, Kind, Row};
use crate::util::fmt_bytes;
use std::fmt::Write as _;

/// The table of `rows`, each set against `line_rate`.
pub fn table_rows(out: &mut String, rows: &[&Row], line_rate: f64) {
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

/// What each of `rows` does, its strategy, its notes, and how its data was checked.
pub fn legend(out: &mut String, rows: &[&Row]) {
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
