//! The PyTorch rows section: PyTorch's row-by-row copy, its ways and ours,
//! and PyTorch's own run of the same where it ran.

use crate::report::figures::num;
use crate::report::table::legend;
use crate::results::{Row, find};
use crate::runs::rows;
use crate::summary::Summary;
use std::fmt::Write as _;

/// The rows' table, what each does, and how they compare.
pub fn section(out: &mut String, s: &Summary) {
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
    torch(out, s);
}

/// PyTorch's own run, where it ran, and our threaded ring against its per-row pinning.
fn torch(out: &mut String, s: &Summary) {
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
            "rows-ring-mt: {} threads filling one PinnedRing (and a reserve thread, which joined in {}) reached \
             {:.2} GB/s = {:.2} of the line rate at {:.3} CPU s/GB ({:.1} ms CPU)",
            r.note_value("threads").unwrap_or("?"),
            r.note_value(rows::RESERVE_JOINED).unwrap_or("? rep(s)"),
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
