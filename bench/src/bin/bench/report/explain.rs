//! "What this shows": which way of feeding the GPU was fast, by how much,
//! and why, from the rows of the run.

use crate::results::{Kind, Row, find};
use crate::summary::Summary;
use crate::util::fmt_bytes;
use std::fmt::Write as _;

/// "What this shows", for the rows that streamed the file.
pub fn explain(out: &mut String, s: &Summary) {
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
    baselines(out, s, best);
    rings(out, s, &ok);
    registered(out, s);
    auto_and_kvikio(out, s);
    cold(out, s);
}

/// Per-batch pinned memory against the fastest, and pageable copies.
fn baselines(out: &mut String, s: &Summary, best: &Row) {
    let bg = best.gbps().median;
    if let Some(r) = find(s.rows, "per-batch-pinned") {
        let alloc =
            r.notes.iter().find(|(k, _)| k.starts_with("cudaHostAlloc")).map(|(_, v)| v.as_str()).unwrap_or("?");
        let _ = writeln!(
            out,
            "  - per-batch-pinned (a fresh pinned buffer per batch, as pin_memory() per batch does) reached {:.2} GB/s, \
             {:.1}x slower than {}: allocating pinned memory costs {alloc} s per GiB here and synchronizes the device, more than the copy it serves. \
             Allocate pinned memory once and reuse it.",
            r.gbps().median,
            bg / r.gbps().median,
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
}

/// The ring with slots sized from the budget, and the cache-sized ring.
fn rings(out: &mut String, s: &Summary, ok: &[&Row]) {
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
}

/// Registered memory: the sliding windows, and the whole file at once.
fn registered(out: &mut String, s: &Summary) {
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
}

/// The library's automatic choice, and KvikIO's read of the same file.
fn auto_and_kvikio(out: &mut String, s: &Summary) {
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
}

/// A file that is not in the page cache: the disk's pace, and the cold rows.
fn cold(out: &mut String, s: &Summary) {
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
