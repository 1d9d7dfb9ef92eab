//! How the report writes a figure: a dash, or null, for one that is not finite.

use crate::util::Stats;

/// `v` with `prec` decimals, or "-".
pub fn num(v: f64, prec: usize) -> String {
    if v.is_finite() { format!("{v:.prec$}") } else { "-".into() }
}

/// "min-max" of GB/s, or "-".
pub fn spread(g: Stats) -> String {
    if g.min.is_finite() { format!("{:.2}-{:.2}", g.min, g.max) } else { "-".into() }
}

/// "min-max" with `prec` decimals, or "-".
pub fn range(s: Stats, prec: usize) -> String {
    if s.min.is_finite() { format!("{:.prec$}-{:.prec$}", s.min, s.max) } else { "-".into() }
}

/// `v`, or None (null in JSON, an empty cell in CSV) where it is not finite.
pub fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}
