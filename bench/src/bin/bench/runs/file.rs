//! Every run of the file, in the plan's order (the cold runs last: they
//! empty the page cache), and what each of the library's rows runs.

use crate::args::{Custom, SpanMode};
use crate::data::Data;
use crate::plan::{FileRun, Lib};
use crate::results::{Kind, Row};
use crate::runs::baselines::{pageable, per_batch_pinned};
use crate::runs::dest::Dest;
use crate::runs::disk::disk_direct;
use crate::runs::library::{LibRun, library};
use crate::runs::shapes::{RING_CACHE_BUDGET, direct_for, hybrid_for, ring_for, windows_for};
use crate::runs::{kvikio, overlap};
use crate::session::Bench;
use crate::util::{KIB, MIB, Result, fmt_bytes};
use std::time::Instant;
use wirespeed_cuda::PinnedBuffer;
use wirespeed_pinned::{CopyStreams, PinBudget, Strategy};

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

/// Each of `runs` on the file, in order, within `budget`. On tmpfs the cold
/// runs give rows that say why they were skipped (the cold `--strategy` rows
/// none).
pub fn stream_all(b: &mut Bench, data: &Data, budget: u64, runs: &[FileRun]) -> Result<Streamed> {
    let mut dest = Dest::new(&b.gpu, data.len)?;
    b.progress.note(&format!("destination: {}", dest.describe()));
    let specs = Specs {
        len: data.len,
        budget,
        threads: b.threads,
        reps: b.reps,
        target_reps: b.target_reps,
        ring_cache: b.opts.ring_cache,
        customs: b.opts.custom.clone(),
    };
    let mut out = Streamed { rows: Vec::new(), destination: dest.describe(), kvikio: None, overlap: None };
    let on_disk = |name: &str, kind: Kind| {
        Row::skipped(name, kind, "cold read", "the file is on tmpfs (RAM): nothing is read from a disk")
    };
    for &run in runs {
        let row = match run {
            FileRun::Pageable => pageable(b, data, &mut dest)?,
            FileRun::PerBatchPinned => per_batch_pinned(b, data, &mut dest)?,
            FileRun::Overlap => {
                // On the page-cached file, before the cold runs empty the cache.
                out.overlap = Some(overlap::run(b, data, budget)?);
                continue;
            }
            FileRun::Kvikio { hot, cold } => {
                // Its own GPU memory beside ours: the destination stays allocated.
                if hot || (cold && !data.tmpfs) {
                    let (rows, script) = kvikio::run(b, data, hot, cold && !data.tmpfs);
                    out.rows.extend(rows);
                    out.kvikio = script;
                }
                if !(cold && data.tmpfs) {
                    continue;
                }
                on_disk("kvikio-cold", Kind::Stream)
            }
            FileRun::DiskDirect if data.tmpfs => on_disk("disk-direct", Kind::Disk),
            FileRun::DiskDirect => disk_direct(b, data)?,
            FileRun::Library(l @ (Lib::ColdAuto | Lib::ColdDirect)) if data.tmpfs => on_disk(&l.name(), Kind::Stream),
            FileRun::Library(Lib::Custom(i)) if data.tmpfs && specs.customs[i].cold => continue,
            FileRun::Library(lib) => library_row(b, data, &mut dest, &specs, lib)?,
        };
        out.rows.push(row);
    }
    Ok(out)
}

/// A library row; the one-shot row also says what a streamer's setup costs alone.
fn library_row(b: &mut Bench, data: &Data, dest: &mut Dest, specs: &Specs, lib: Lib) -> Result<Row> {
    let mut row = library(b, data, dest, specs.spec(lib))?;
    if lib == Lib::OneShot && row.ok() {
        row.note("what a streamer's setup costs here, alone", setup_anchors(&b.gpu.device));
    }
    Ok(row)
}

/// What the library's rows run: the file's length, the pin budget, the
/// most ring threads, the repetitions, and the shapes the options give.
struct Specs {
    len: u64,
    budget: u64,
    threads: usize,
    reps: usize,
    target_reps: usize,
    /// `--ring-cache`: threads, slot bytes, slots per thread.
    ring_cache: (usize, usize, usize),
    customs: Vec<Custom>,
}

impl Specs {
    /// A row of the whole file, warmed up first unless `cold`.
    fn lib(&self, name: &str, what: String, strategy: Strategy, budget: PinBudget, cold: bool) -> LibRun {
        LibRun {
            name: name.to_string(),
            what,
            strategy,
            budget,
            cold,
            range: 0..self.len,
            warm_up: !cold,
            fresh: false,
            reps: self.reps,
            copy_streams: CopyStreams::default(),
            spans: None,
            reserve: None,
            ahead: None,
            new_map: false,
        }
    }

    /// What library row `lib` runs.
    fn spec(&self, lib: Lib) -> LibRun {
        let (budget, threads) = (self.budget, self.threads);
        let lim = || PinBudget::new(budget);
        let name = lib.name();
        match lib {
            Lib::Ring(t) => {
                let what = format!(
                    "pinned slots allocated once (sized from the budget), filled by {t} thread(s) by memcpy from the mapping, copied as filled"
                );
                self.lib(&name, what, ring_for(t, budget), lim(), false)
            }
            Lib::RingCache => self.ring_cache(),
            Lib::Windows => {
                let what = "windows of the mapping registered in place, copied, unregistered; no memcpy".to_string();
                self.lib(&name, what, windows_for(budget), lim(), false)
            }
            Lib::Hybrid => {
                let what =
                    format!("registered windows from the front, pinned ring with {threads} threads from the back");
                self.lib(&name, what, hybrid_for(threads, budget), lim(), false)
            }
            Lib::WholeFile => {
                let what = "one pass: register the whole file, copy, unregister (pins all of it: ignores the budget)";
                let spec = self.lib(&name, what.to_string(), Strategy::WholeFile, PinBudget::unlimited(), false);
                LibRun { fresh: true, warm_up: false, ..spec }
            }
            Lib::Auto | Lib::NewMap | Lib::OneShot => self.auto(lib),
            Lib::Custom(i) => self.custom(i),
            Lib::BudgetReuse => self.budget_reuse(),
            Lib::ColdAuto => {
                let what = "page cache dropped (POSIX_FADV_DONTNEED) before each run, then auto".to_string();
                self.lib(&name, what, Strategy::Auto, lim(), true)
            }
            Lib::ColdDirect => {
                let what = "page cache dropped, O_DIRECT reads straight into pinned slots".to_string();
                self.lib(&name, what, direct_for(threads, budget), lim(), true)
            }
        }
    }

    /// The cache-sized ring, within a budget of its own.
    fn ring_cache(&self) -> LibRun {
        let what =
            "the ring alone, cache-sized: slots of 4 MiB that stay in the CPU cache between the memcpy and the DMA, \
                    4 per thread, within a 128 MiB budget of its own"
                .to_string();
        let (threads, slot, per) = self.ring_cache;
        let strategy = Strategy::Ring { slots: threads * per, slot, threads };
        // What the ring pins, its slots' slack included, if more than the target's 128 MiB.
        let need = strategy.pinned_bytes(self.len).unwrap_or(RING_CACHE_BUDGET);
        let budget = PinBudget::new(need.max(RING_CACHE_BUDGET));
        LibRun { reps: self.target_reps, ..self.lib("ring-cache", what, strategy, budget, false) }
    }

    /// The library's automatic choice: as a program runs it (`auto`), with
    /// the file mapped anew for each repetition (`new-map`), or with a new
    /// streamer too (`one-shot`).
    fn auto(&self, lib: Lib) -> LibRun {
        let (len, budget) = (fmt_bytes(self.len), fmt_bytes(self.budget));
        let lim = PinBudget::new(self.budget);
        match lib {
            Lib::Auto => {
                let what = format!("the library's choice for a {len} file within a {budget} pin budget");
                LibRun { reps: self.target_reps, ..self.lib("auto", what, Strategy::Auto, lim, false) }
            }
            Lib::NewMap => {
                let what = format!(
                    "auto with the streamer kept, the file mapped anew for each repetition (page cache warm, page tables \
                     empty): a program that opens, streams once and closes each of its files, within a {budget} pin budget"
                );
                LibRun { new_map: true, ..self.lib("new-map", what, Strategy::Auto, lim, false) }
            }
            _ => {
                let what = format!(
                    "auto with a new streamer and a new mapping for each repetition, both made and dropped in the timed \
                     region: a program that loads one file once, within a {budget} pin budget"
                );
                let spec = self.lib("one-shot", what, Strategy::Auto, lim, false);
                LibRun { new_map: true, fresh: true, warm_up: false, ..spec }
            }
        }
    }

    /// `--strategy` number `i`.
    fn custom(&self, i: usize) -> LibRun {
        let custom = &self.customs[i];
        let streams = match custom.copy_streams {
            CopyStreams::One => "",
            CopyStreams::RingApart => ", the ring's copies on a stream of their own",
            _ => ", a stream per ring thread",
        };
        let cold = if custom.cold { ", page cache dropped before each run" } else { "" };
        let reserve = match custom.reserve {
            Some(n) => format!(", {n} ring thread(s) in reserve"),
            None => String::new(),
        };
        let spans = match custom.spans {
            Some((n, SpanMode::Queued)) => format!(", as transfers of {} started at once (one pass)", fmt_bytes(n)),
            Some((n, SpanMode::Wait)) => format!(", as transfers of {} started one after the other", fmt_bytes(n)),
            Some((n, SpanMode::Then)) => format!(
                ", as transfers of {} each ordered before a stream before the next starts (a loop of Python read_into)",
                fmt_bytes(n)
            ),
            None => String::new(),
        };
        let ahead = match custom.ahead {
            Some(d) => format!(", reading ahead up to {:.1} ms", d.as_secs_f64() * 1e3),
            None => String::new(),
        };
        let what = format!(
            "a strategy given with --strategy, within the {} pin budget{streams}{reserve}{spans}{ahead}{cold}",
            fmt_bytes(self.budget)
        );
        let spec =
            self.lib(&format!("custom-{}", i + 1), what, custom.strategy, PinBudget::new(self.budget), custom.cold);
        LibRun {
            reps: self.target_reps,
            copy_streams: custom.copy_streams,
            spans: custom.spans,
            reserve: custom.reserve,
            ahead: custom.ahead,
            ..spec
        }
    }

    /// The data within the pin budget, registered once by auto and copied again.
    fn budget_reuse(&self) -> LibRun {
        // A registration rounds out to pages and may need one more: stay two pages under the budget.
        let n = (self.budget.saturating_sub(8 * KIB).min(self.len) / (4 * KIB) * (4 * KIB)).max(self.len.min(4 * KIB));
        let what = format!("the first {} (within the budget): registered once by auto, copied again", fmt_bytes(n));
        LibRun { range: 0..n, ..self.lib("budget-reuse", what, Strategy::Auto, PinBudget::new(self.budget), false) }
    }
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
