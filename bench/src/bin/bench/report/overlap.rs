//! The overlap section: streaming into the caller's arena while the
//! caller's stream works on each landed batch, against each alone.

use crate::report::figures::{num, range};
use crate::runs::overlap::{self, Overlap};
use crate::util::{Stats, fmt_bytes};
use std::fmt::Write as _;

/// The overlap run: its shape, calibration, walls and ratio.
pub fn section(out: &mut String, o: &Overlap, emulated: bool) {
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
