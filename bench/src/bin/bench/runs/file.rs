//! Every run of the file, in order (the cold runs last: they empty the page
//! cache).

use crate::args::Custom;
use crate::data::Data;
use crate::results::{Kind, Row};
use crate::runs::baselines::{pageable, per_batch_pinned};
use crate::runs::dest::Dest;
use crate::runs::disk::disk_direct;
use crate::runs::library::{LibRun, library};
use crate::runs::shapes::{RING_CACHE_BUDGET, direct_for, hybrid_for, ring_for, ring_threads, windows_for};
use crate::runs::{kvikio, overlap};
use crate::session::Bench;
use crate::util::{KIB, MIB, Result, fmt_bytes};
use std::time::Instant;
use wirespeed_cuda::PinnedBuffer;
use wirespeed_pinned::{PinBudget, Strategy};

/// What the file-streaming runs produced.
pub struct Streamed {
    pub rows: Vec<Row>,
    /// Where the file went on the device, in words.
    pub destination: String,
    /// What KvikIO's script printed and wrote, where it ran.
    pub kvikio: Option<crate::script::Output>,
    /// The overlap run, where it ran.
    pub overlap: Option<overlap::Overlap>,
}

/// Every file-streaming run, in order (cold runs last: they empty the page
/// cache).
pub fn stream_all(b: &mut Bench, data: &Data, budget: u64) -> Result<Streamed> {
    let mut rows = Vec::new();
    let mut dest = Dest::new(&b.gpu, data.len)?;
    b.progress.note(&format!("destination: {}", dest.describe()));
    let opts = b.opts.clone();
    let sel = |n: &str| opts.selected(n);
    let threads = b.threads;
    let (reps, target_reps) = (b.reps, b.target_reps);
    let lim = || PinBudget::new(budget);
    let full = 0..data.len;
    let lib = |name: &str, what: String, strategy: Strategy, budget: PinBudget, cold: bool| LibRun {
        name: name.to_string(),
        what,
        strategy,
        budget,
        cold,
        range: full.clone(),
        warm_up: !cold,
        fresh: false,
        reps,
        copy_streams: wirespeed_pinned::CopyStreams::default(),
        spans: None,
        reserve: None,
        new_map: false,
    };

    if sel("pageable") {
        rows.push(pageable(b, data, &mut dest)?);
    }
    if sel("per-batch-pinned") {
        rows.push(per_batch_pinned(b, data, &mut dest)?);
    }
    for t in ring_threads(threads) {
        let name = format!("ring-{t}");
        if sel(&name) {
            let s = ring_for(t, budget);
            let what = format!(
                "pinned slots allocated once (sized from the budget), filled by {t} thread(s) by memcpy from the mapping, copied as filled"
            );
            rows.push(library(b, data, &mut dest, lib(&name, what, s, lim(), false))?);
        }
    }
    if sel("ring-cache") {
        let what =
            "the ring alone, cache-sized: slots of 4 MiB that stay in the CPU cache between the memcpy and the DMA, \
                    4 per thread, within a 128 MiB budget of its own"
                .to_string();
        let (threads, slot, per) = b.opts.ring_cache;
        let strategy = Strategy::Ring { slots: threads * per, slot, threads };
        // What the ring pins, its slots' slack included, if more than the target's 128 MiB.
        let need = strategy.pinned_bytes(data.len).unwrap_or(RING_CACHE_BUDGET);
        let budget = PinBudget::new(need.max(RING_CACHE_BUDGET));
        let mut spec = lib("ring-cache", what, strategy, budget, false);
        spec.reps = target_reps;
        rows.push(library(b, data, &mut dest, spec)?);
    }
    if sel("windows") {
        let what = "windows of the mapping registered in place, copied, unregistered; no memcpy".to_string();
        rows.push(library(b, data, &mut dest, lib("windows", what, windows_for(budget), lim(), false))?);
    }
    if sel("hybrid") {
        let what = format!("registered windows from the front, pinned ring with {threads} threads from the back");
        rows.push(library(b, data, &mut dest, lib("hybrid", what, hybrid_for(threads, budget), lim(), false))?);
    }
    if sel("whole-file") {
        let what =
            "one pass: register the whole file, copy, unregister (pins all of it: ignores the budget)".to_string();
        let mut spec = lib("whole-file", what, Strategy::WholeFile, PinBudget::unlimited(), false);
        spec.fresh = true;
        spec.warm_up = false;
        rows.push(library(b, data, &mut dest, spec)?);
    }
    if sel("auto") {
        let what = format!(
            "the library's choice for a {} file within a {} pin budget",
            fmt_bytes(data.len),
            fmt_bytes(budget)
        );
        let mut spec = lib("auto", what, Strategy::Auto, lim(), false);
        spec.reps = target_reps;
        rows.push(library(b, data, &mut dest, spec)?);
    }
    if sel("new-map") {
        let what = format!(
            "auto with the streamer kept, the file mapped anew for each repetition (page cache warm, page tables \
             empty): a program that opens, streams once and closes each of its files, within a {} pin budget",
            fmt_bytes(budget)
        );
        let mut spec = lib("new-map", what, Strategy::Auto, lim(), false);
        spec.new_map = true;
        rows.push(library(b, data, &mut dest, spec)?);
    }
    if sel("one-shot") {
        let what = format!(
            "auto with a new streamer and a new mapping for each repetition, both made and dropped in the timed \
             region: a program that loads one file once, within a {} pin budget",
            fmt_bytes(budget)
        );
        let mut spec = lib("one-shot", what, Strategy::Auto, lim(), false);
        spec.new_map = true;
        spec.fresh = true;
        spec.warm_up = false;
        let mut row = library(b, data, &mut dest, spec)?;
        if row.ok() {
            row.note("what a streamer's setup costs here, alone", setup_anchors(&b.gpu.device));
        }
        rows.push(row);
    }
    let customs: Vec<(usize, Custom)> = b.opts.custom.iter().copied().enumerate().collect();
    let custom_spec = |i: usize, custom: &Custom| {
        let streams = match custom.copy_streams {
            wirespeed_pinned::CopyStreams::One => "",
            wirespeed_pinned::CopyStreams::RingApart => ", the ring's copies on a stream of their own",
            _ => ", a stream per ring thread",
        };
        let cold = if custom.cold { ", page cache dropped before each run" } else { "" };
        let reserve = match custom.reserve {
            Some(n) => format!(", {n} ring thread(s) in reserve"),
            None => String::new(),
        };
        let spans = match custom.spans {
            Some((n, true)) => format!(", as transfers of {} started at once (one pass)", fmt_bytes(n)),
            Some((n, false)) => format!(", as transfers of {} started one after the other", fmt_bytes(n)),
            None => String::new(),
        };
        let what = format!(
            "a strategy given with --strategy, within the {} pin budget{streams}{reserve}{spans}{cold}",
            fmt_bytes(budget)
        );
        let mut spec = lib(&format!("custom-{}", i + 1), what, custom.strategy, lim(), custom.cold);
        spec.reps = target_reps;
        spec.copy_streams = custom.copy_streams;
        spec.spans = custom.spans;
        spec.reserve = custom.reserve;
        spec
    };
    for (i, custom) in customs.iter().filter(|(_, c)| !c.cold) {
        rows.push(library(b, data, &mut dest, custom_spec(*i, custom))?);
    }
    if sel("budget-reuse") {
        // A registration rounds out to pages and may need one more: stay two pages under the budget.
        let n = (budget.saturating_sub(8 * KIB).min(data.len) / (4 * KIB) * (4 * KIB)).max(data.len.min(4 * KIB));
        let what = format!("the first {} (within the budget): registered once by auto, copied again", fmt_bytes(n));
        let mut spec = lib("budget-reuse", what, Strategy::Auto, lim(), false);
        spec.range = 0..n;
        rows.push(library(b, data, &mut dest, spec)?);
    }
    // On the page-cached file, before the cold runs empty the cache.
    let overlap = if sel("overlap") { Some(overlap::run(b, data, budget)?) } else { None };
    let (hot, cold) = (sel("kvikio-hot"), sel("kvikio-cold") && !data.tmpfs);
    let mut kvikio = None;
    if hot || cold {
        // Its own GPU memory beside ours: the destination stays allocated.
        let (kv_rows, out) = kvikio::run(b, data, hot, cold);
        rows.extend(kv_rows);
        kvikio = out;
    }
    let cold = ["kvikio-cold", "disk-direct", "cold-auto", "cold-direct"];
    if data.tmpfs {
        for n in cold.into_iter().filter(|n| sel(n)) {
            let kind = if n == "disk-direct" { Kind::Disk } else { Kind::Stream };
            rows.push(Row::skipped(n, kind, "cold read", "the file is on tmpfs (RAM): nothing is read from a disk"));
        }
        return Ok(Streamed { rows, destination: dest.describe(), kvikio, overlap });
    }
    if sel("disk-direct") {
        rows.push(disk_direct(b, data)?);
    }
    if sel("cold-auto") {
        let what = "page cache dropped (POSIX_FADV_DONTNEED) before each run, then auto".to_string();
        rows.push(library(b, data, &mut dest, lib("cold-auto", what, Strategy::Auto, lim(), true))?);
    }
    if sel("cold-direct") {
        let what = "page cache dropped, O_DIRECT reads straight into pinned slots".to_string();
        rows.push(library(b, data, &mut dest, lib("cold-direct", what, direct_for(threads, budget), lim(), true))?);
    }
    for (i, custom) in customs.iter().filter(|(_, c)| c.cold) {
        rows.push(library(b, data, &mut dest, custom_spec(*i, custom))?);
    }
    Ok(Streamed { rows, destination: dest.describe(), kvikio, overlap })
}

/// What a new streamer's first pass sets up, each made and dropped alone
/// three times (medians): a context to register windows in, and a 64 MiB
/// pinned buffer (the ring `auto` plans within a 512 MiB budget).
fn setup_anchors(dev: &wirespeed_cuda::Device) -> String {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN) * 1e3
    };
    let (mut ctx_make, mut ctx_drop, mut buf_make, mut buf_drop) = (vec![], vec![], vec![], vec![]);
    for _ in 0..3 {
        let t = Instant::now();
        let ctx = wirespeed_cuda::RegistrationContext::new(dev);
        ctx_make.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let ok = ctx.is_ok();
        drop(ctx);
        if ok {
            ctx_drop.push(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let buf = PinnedBuffer::<u8>::new(64 * MIB as usize);
        buf_make.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        drop(buf);
        buf_drop.push(t.elapsed().as_secs_f64());
    }
    format!(
        "a registration context made in {:.1} ms, dropped in {:.1} ms; 64 MiB of pinned memory allocated in {:.1} ms, \
         freed in {:.1} ms",
        median(ctx_make),
        median(ctx_drop),
        median(buf_make),
        median(buf_drop)
    )
}
