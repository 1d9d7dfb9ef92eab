//! The measured runs: the line rate, the baselines written here with
//! cuda-safe, the library's strategies, the disk and the cold runs.

use crate::args::Custom;
use crate::checksum;
use crate::data::{self, Data};
use crate::gpu::Gpu;
use crate::rawcuda;
use crate::results::{Intact, Kind, Row, Sample};
use crate::session::{Bench, settle, timed};
use crate::util::{Fatal, GIB, KIB, MIB, Result, fmt_bytes, pieces, round_down};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use wirespeed_cuda::{DeviceBuffer, DeviceSliceMut, Event, EventOptions, PinnedBuffer, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, Report, Strategy, StreamConfig, Streamer};

/// The chunk size of the baselines.
pub const CHUNK: u64 = 64 * MIB;

// ---------------------------------------------------------------- line rate

/// A resident pinned buffer copied to the device again and again with
/// cudaMemcpyAsync, timed with events: the fastest any host-to-device copy goes.
pub fn line_rate(b: &mut Bench) -> Result<Row> {
    let n = if b.opts.quick { 64 * MIB } else { 256 * MIB } as usize;
    let per_rep = if b.opts.quick { GIB } else { 4 * GIB };
    let k = (per_rep / n as u64).max(1) as usize;
    let mut row = Row::new(
        "line-rate",
        Kind::LineRate,
        &format!("resident {} pinned buffer, cudaMemcpyAsync x{k}", fmt_bytes(n as u64)),
        (n * k) as u64,
    );
    row.strategy = "cudaHostAlloc once + cudaMemcpyAsync".into();
    row.peak_pinned = n as u64;
    let reps = b.reps.max(3);
    let r = (|| -> Result<()> {
        let dev = b.gpu.device;
        let mut host = PinnedBuffer::<u8>::new(n)?;
        data::fill_pattern(host.as_mut_slice()?, 0x11, 0);
        let expected = checksum::of_host(host.as_slice()?, b.threads);
        let mut on_dev = DeviceBuffer::<u8>::new(&dev, n)?;
        let timing = EventOptions { timing: true, blocking_sync: true }; // waiting sleeps, as the library's does
        let (start, end) = (Event::new(&dev, timing)?, Event::new(&dev, timing)?);
        b.stream.copy_to_device(&host, &mut on_dev)?.wait()?; // warm-up
        let mut engine = Vec::new();
        for rep in 0..reps {
            b.progress.begin("line-rate", rep + 1, reps);
            // Wall clock, as every other run here is timed; the events give the
            // copy engine's own time besides.
            let (ms, s) = timed(|| {
                b.stream.record(&start)?;
                for _ in 0..k {
                    b.stream.copy_to_device(&host, &mut on_dev)?.detach();
                }
                b.stream.record(&end)?;
                end.synchronize()?;
                Ok(end.elapsed_ms(&start)?)
            })?;
            engine.push(row.bytes as f64 / (f64::from(ms) / 1e3) / 1e9);
            row.samples.push(s);
            b.line_rate = row.gbps().median;
            b.progress.rep_done(&b.label(&row, &s, reps, ""), reps);
        }
        row.note("copy engine alone (event-timed) GB/s", format!("{:.2}", crate::util::stats(&engine).median));
        row.intact = Intact::compare(expected, b.readback.checksum(&on_dev, 0..n)?);
        Ok(())
    })();
    let row = settle(row, r)?;
    if !row.ok() {
        return Err(Fatal::Run(format!(
            "the line-rate run failed, so nothing can be compared with it: {}",
            row.error.as_deref().unwrap_or("?")
        )));
    }
    b.line_rate = row.gbps().median;
    b.finished(&row);
    Ok(row)
}

// ---------------------------------------------------------------- destination

/// Where the file goes on the device: a buffer of the file's size when it fits
/// in free device memory, else a scratch buffer that the data wraps around in.
pub struct Dest {
    pub buf: DeviceBuffer<u8>,
    pub scratch: bool,
}

impl Dest {
    pub fn new(gpu: &Gpu, len: u64) -> Result<Dest> {
        let (free, _) = gpu.device.mem_info()?;
        let free = free as u64;
        let margin = 512 * MIB + free / 20;
        if len + margin <= free {
            return Ok(Dest { buf: DeviceBuffer::new(&gpu.device, len as usize)?, scratch: false });
        }
        let s = round_down((free / 2).min(4 * GIB), CHUNK);
        if s + margin / 2 > free {
            return Err(Fatal::Run(format!(
                "the GPU has only {} free: not enough for a scratch buffer",
                fmt_bytes(free)
            )));
        }
        Ok(Dest { buf: DeviceBuffer::new(&gpu.device, s as usize)?, scratch: true })
    }

    pub fn describe(&self) -> String {
        if self.scratch {
            format!(
                "a {} scratch buffer on the GPU (the file does not fit: it wraps around)",
                fmt_bytes(self.buf.len() as u64)
            )
        } else {
            format!("a {} device buffer (the whole file)", fmt_bytes(self.buf.len() as u64))
        }
    }

    /// Device offset of file offset `off` (relative to the range start).
    fn at(&self, off: u64) -> usize {
        if self.scratch { (off % self.buf.len() as u64) as usize } else { off as usize }
    }

    fn clear(&mut self, stream: &Stream) -> Result<()> {
        stream.memset(&mut self.buf, 0)?.wait()?;
        Ok(())
    }

    /// Compares what is on the device with what `data` (streamed from its start) should have left there.
    fn verify(&self, b: &mut Bench, data: &[u8], whole_sum: Option<u64>) -> Result<Intact> {
        let n = data.len();
        let s = self.buf.len();
        let (expected, dev_range) = if !self.scratch || n <= s {
            let e = match whole_sum {
                Some(sum) if n == data.len() => sum,
                _ => checksum::of_host(data, b.threads),
            };
            (e, 0..n)
        } else {
            // The last pass left data[n-r..n] at the start, data[n-s..n-r] after it.
            let r = n % s;
            (checksum::of_parts(&[&data[n - r..], &data[n - s..n - r]]), 0..s)
        };
        let got = b.readback.checksum(&self.buf, dev_range)?;
        Ok(Intact::compare(expected, got))
    }
}

// ---------------------------------------------------------------- baselines

/// Pageable copies straight from the file mapping, cudaMemcpy per 64 MiB chunk.
pub fn pageable(b: &mut Bench, data: &Data, dest: &mut Dest) -> Result<Row> {
    let mut row = Row::new("pageable", Kind::Stream, "cudaMemcpy straight from the mapping, 64 MiB chunks", data.len);
    row.strategy = "pageable cudaMemcpy (driver staging)".into();
    let r = (|| -> Result<()> {
        let bytes = data.bytes();
        for rep in 0..b.reps {
            dest.clear(&b.stream)?;
            b.progress.begin(&row.name, rep + 1, b.reps);
            let mut done = 0u64;
            let ((), s) = timed(|| {
                let copies: Vec<(usize, &[u8])> = pieces(data.len, CHUNK)
                    .map(|r| (dest.at(r.start), &bytes[r.start as usize..r.end as usize]))
                    .collect();
                rawcuda::copy_pageable(&mut dest.buf, copies, |n| {
                    done += n as u64;
                    b.progress.update(done, data.len);
                })
            })?;
            b.sample_done(&mut row, s, b.reps);
        }
        row.intact = dest.verify(b, bytes, Some(data.checksum))?;
        Ok(())
    })();
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

/// The anti-pattern of `pin_memory()` per batch: pinned memory allocated per
/// batch (cudaHostAlloc), filled, copied, freed.
pub fn per_batch_pinned(b: &mut Bench, data: &Data, dest: &mut Dest) -> Result<Row> {
    let mut row = Row::new(
        "per-batch-pinned",
        Kind::Stream,
        "fresh pinned buffer per 64 MiB chunk: cudaHostAlloc + memcpy + async copy + cudaFreeHost (pin_memory() per batch)",
        data.len,
    );
    row.strategy = "PinnedBuffer::new per chunk".into();
    row.peak_pinned = CHUNK.min(data.len);
    let mut alloc_seconds = Vec::new();
    let r = (|| -> Result<()> {
        let bytes = data.bytes();
        for rep in 0..b.reps {
            dest.clear(&b.stream)?;
            b.progress.begin(&row.name, rep + 1, b.reps);
            let mut alloc = 0.0;
            let ((), s) = timed(|| {
                for r in pieces(data.len, CHUNK) {
                    let src = &bytes[r.start as usize..r.end as usize];
                    let t = Instant::now();
                    let mut p = PinnedBuffer::<u8>::new(src.len())?;
                    alloc += t.elapsed().as_secs_f64();
                    p.as_mut_slice()?.copy_from_slice(src);
                    let at = dest.at(r.start);
                    b.stream.copy_to_device(&p, &mut dest.buf.slice_mut(at..at + src.len())?)?.wait()?;
                    drop(p); // cudaFreeHost
                    b.progress.update(r.end, data.len);
                }
                Ok(())
            })?;
            alloc_seconds.push(alloc);
            b.sample_done(&mut row, s, b.reps);
        }
        row.intact = dest.verify(b, bytes, Some(data.checksum))?;
        Ok(())
    })();
    if !alloc_seconds.is_empty() {
        let med = crate::util::stats(&alloc_seconds).median;
        row.note("cudaHostAlloc (+ zero fill) s/GiB", format!("{:.3}", med / (data.len as f64 / GIB as f64)));
    }
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

// ---------------------------------------------------------------- the library

/// One of the library's strategies.
pub struct LibRun {
    pub name: String,
    pub what: String,
    pub strategy: Strategy,
    pub budget: PinBudget,
    /// Drop the file's page cache before each repetition.
    pub cold: bool,
    /// Byte range of the file streamed.
    pub range: Range<u64>,
    /// Run once, untimed, before the repetitions: the streamer allocates its
    /// ring or registers what it keeps then, as a program's first pass would.
    pub warm_up: bool,
    /// A new streamer for every repetition, made and dropped inside the timed
    /// region: one complete pass with every setup cost (registering and
    /// unregistering the whole file). Otherwise one streamer, made untimed,
    /// serves every repetition, as a program would use it.
    pub fresh: bool,
    /// Timed repetitions.
    pub reps: usize,
    /// `StreamConfig::copy_streams`.
    pub copy_streams: wirespeed_pinned::CopyStreams,
    /// The range as transfers of this many bytes, queued at once or one at a
    /// time (see `Custom::spans`).
    pub spans: Option<(u64, bool)>,
    /// `StreamConfig::reserve_threads`, when not the default.
    pub reserve: Option<usize>,
    /// Map the file anew for every repetition, inside the timed region (the
    /// page cache stays warm; the mapping's page tables start empty): what a
    /// program gets for a file it opens, streams once and closes.
    pub new_map: bool,
}

fn transfer(
    streamer: &Streamer,
    file: &Arc<MappedFile>,
    range: &Range<u64>,
    target: &mut Dest,
    spans: Option<(u64, bool)>,
) -> Result<Report> {
    if let Some((span, queued)) = spans {
        return transfer_spans(streamer, file, range, target, span, queued);
    }
    Ok(if target.scratch {
        streamer.to_scratch(file, range.clone(), &mut target.buf)?
    } else {
        streamer.to_device(file, range.clone(), &mut target.buf)?
    })
}

/// The range as transfers of `span` bytes into consecutive parts of the
/// destination (`Streamer::start`): all started at once (`queued`: the
/// streamer takes each into the running pass) or each waited for before the
/// next starts. Answers the first transfer's report with the registrations
/// of all, the highest peak, and `chained` when every later transfer was.
fn transfer_spans(
    streamer: &Streamer,
    file: &Arc<MappedFile>,
    range: &Range<u64>,
    target: &mut Dest,
    span: u64,
    queued: bool,
) -> Result<Report> {
    let len = range.end - range.start;
    if target.scratch || len > target.buf.len() as u64 {
        return Err(Fatal::Run("spans need a destination as large as the range (not a scratch buffer)".into()));
    }
    let dev = target.buf.device();
    let base = target.buf.as_raw_ptr();
    let mut reports = Vec::new();
    let mut pending = Vec::new();
    let mut failed = None;
    let mut off = 0;
    while off < len && failed.is_none() {
        let n = span.min(len - off);
        // SAFETY: `base + off .. + n` lies inside the destination buffer
        // (len <= its length), device memory of `dev` that outlives this
        // function (borrowed by `target`); the parts are disjoint, each used
        // by one transfer only, and every transfer started is waited for
        // (below, on errors too) before this function returns and the
        // buffer is read or freed.
        let dst = unsafe { DeviceSliceMut::<u8>::from_raw_parts(base.wrapping_add(off as usize), n as usize, dev) };
        let started = dst
            .map_err(Fatal::from)
            .and_then(|dst| Ok(streamer.start(file, range.start + off..range.start + off + n, dst)?));
        match started {
            Ok(t) if queued => pending.push(t),
            Ok(t) => reports.push(t.wait()),
            Err(e) => failed = Some(e),
        }
        off += n;
    }
    reports.extend(pending.into_iter().map(|t| t.wait()));
    if let Some(e) = failed {
        return Err(e);
    }
    let reports = reports.into_iter().collect::<std::result::Result<Vec<Report>, _>>()?;
    let mut first = reports.first().cloned().ok_or_else(|| Fatal::Run("an empty range".into()))?;
    first.registrations = reports.iter().map(|r| r.registrations).sum();
    first.peak_pinned = reports.iter().map(|r| r.peak_pinned).max().unwrap_or(0);
    first.chained = reports.len() > 1 && reports[1..].iter().all(|r| r.chained);
    Ok(first)
}

pub fn library(b: &mut Bench, data: &Data, dest: &mut Dest, spec: LibRun) -> Result<Row> {
    let len = spec.range.end - spec.range.start;
    let mut row = Row::new(&spec.name, Kind::Stream, &spec.what, len);
    let r = (|| -> Result<()> {
        let dev = b.gpu.device;
        let callback = b.progress.callback();
        let make = |verify: bool| -> Result<Streamer> {
            // Verifying needs a bounce buffer on top of what the strategy pins.
            let budget =
                if verify { PinBudget::new(spec.budget.limit().saturating_add(16 * MIB)) } else { spec.budget.clone() };
            let mut config = StreamConfig::new(spec.strategy, budget);
            config.verify = verify;
            // Transfers are chained into one pass only without a callback
            // (its counts are one transfer's).
            config.progress = if spec.spans.is_some() { None } else { Some(callback.clone()) };
            config.copy_streams = spec.copy_streams;
            if let Some(n) = spec.reserve {
                config.reserve_threads = n;
            }
            Ok(Streamer::new(&[dev], config)?)
        };
        let kept = if spec.fresh { None } else { Some(make(false)?) };
        // A range shorter than the destination gets its own buffer of its size.
        let mut own;
        let target: &mut Dest = if len < dest.buf.len() as u64 && !dest.scratch {
            own = Dest { buf: DeviceBuffer::new(&dev, len as usize)?, scratch: false };
            &mut own
        } else {
            dest
        };
        if let Some(st) = &kept
            && spec.warm_up
        {
            b.progress.begin(&format!("{} (untimed first pass)", row.name), 1, 1);
            let (rep, s) = timed(|| transfer(st, &data.file, &spec.range, target, spec.spans))?;
            row.note("untimed first pass GB/s", format!("{:.2}", len as f64 / s.seconds / 1e9));
            if rep.registrations > 0 {
                row.note("its registrations", rep.registrations.to_string());
            }
        }
        let mut regs = 0;
        let mut breakdowns = Vec::new();
        // Per repetition: making and dropping a fresh streamer, mapping and
        // unmapping the file (zero where the row does not).
        let mut edges: Vec<[f64; 4]> = Vec::new();
        let reps = spec.reps.max(1);
        for rep in 0..reps {
            target.clear(&b.stream)?;
            if spec.cold {
                data.file.drop_page_cache()?;
                if rep == 0 {
                    let resident = data.file.resident_bytes(spec.range.clone())?;
                    row.note(
                        "resident after dropping the cache",
                        format!("{:.1} %", resident as f64 * 100.0 / len as f64),
                    );
                }
            }
            spec.budget.reset_peak();
            b.progress.begin(&row.name, rep + 1, reps);
            let (report, s) = timed(|| {
                let t = Instant::now();
                let fresh = if kept.is_none() { Some(make(false)?) } else { None };
                let made = t.elapsed().as_secs_f64();
                let st = fresh.as_ref().or(kept.as_ref()).ok_or_else(|| Fatal::Run("no streamer".into()))?;
                let t = Instant::now();
                // SAFETY: the bench's file is not written while the bench runs.
                let mapped = if spec.new_map { Some(unsafe { MappedFile::open(&data.path) }?) } else { None };
                let opened = t.elapsed().as_secs_f64();
                let r = transfer(st, mapped.as_ref().unwrap_or(&data.file), &spec.range, target, spec.spans)?;
                dev.synchronize()?;
                let t = Instant::now();
                drop(fresh); // a fresh streamer's teardown (unregistering) belongs to its pass
                let dropped = t.elapsed().as_secs_f64();
                let t = Instant::now();
                drop(mapped); // and so does unmapping a file mapped for the pass
                edges.push([made, dropped, opened, t.elapsed().as_secs_f64()]);
                Ok(r)
            })?;
            row.peak_pinned = row.peak_pinned.max(report.peak_pinned).max(spec.budget.peak());
            regs += report.registrations;
            if spec.spans.is_some() && rep + 1 == reps {
                let chained = if report.chained { "yes" } else { "no" };
                row.note("every later transfer ran in the first one's pass", chained.to_string());
            }
            row.strategy = report.strategy.to_string();
            row.resolved = Some(report.strategy);
            // Where the agents' time went (one transfer's: not for spans,
            // whose transfers overlap).
            let extra = if spec.spans.is_none() { format!("; {}", report.breakdown) } else { String::new() };
            breakdowns.push((s.seconds, report.breakdown));
            b.sample_done_with(&mut row, s, reps, &extra);
        }
        row.registrations = Some(regs / reps as u64);
        let median_ms = |i: usize| {
            let mut v: Vec<f64> = edges.iter().map(|e| e[i] * 1e3).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        if spec.fresh {
            let what = format!("{:.1} ms, dropped in {:.1} ms (medians)", median_ms(0), median_ms(1));
            row.note("the streamer made in", what);
        }
        if spec.new_map {
            let what = format!("{:.2} ms, unmapped in {:.2} ms (medians)", median_ms(2), median_ms(3));
            row.note("the file mapped in", what);
        }
        if spec.spans.is_none() {
            breakdowns.sort_by(|a, b| a.0.total_cmp(&b.0));
            if let Some(&(seconds, median)) = breakdowns.get(breakdowns.len() / 2) {
                row.note("where its agents' time went (the median repetition)", median.to_string());
                row.breakdown = Some((seconds, median));
            }
        }
        if target.scratch && len > target.buf.len() as u64 {
            // Parts that share scratch bytes may land in any order (threads,
            // windows from the front and the ring from the back): no final
            // image can be predicted, so the library checks each part as it
            // lands, in one more pass, untimed.
            drop(kept);
            b.progress.begin(&format!("{} (untimed verifying pass)", row.name), 1, 1);
            row.intact = match make(true).and_then(|st| transfer(&st, &data.file, &spec.range, target, spec.spans)) {
                Ok(Report { verified: Some(ok), .. }) => Intact::Verified(ok),
                Ok(_) => Intact::Unchecked("the library did not verify".into()),
                Err(e) => Intact::Unchecked(format!("the verifying pass failed: {e}")),
            };
        } else {
            let from = spec.range.start as usize;
            let whole = (spec.range == (0..data.len)).then_some(data.checksum);
            row.intact = target.verify(b, &data.bytes()[from..from + len as usize], whole)?;
        }
        Ok(())
    })();
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

// ---------------------------------------------------------------- disk

/// Reader-thread counts the disk is measured with.
pub const DISK_THREADS: [usize; 4] = [1, 4, 8, 16];

/// The disk alone: parallel O_DIRECT reads of the file, 16 MiB each, into
/// aligned buffers, no GPU. One pass with each of [`DISK_THREADS`], then more
/// passes with the fastest count until it has `b.reps`; the row is that count's.
pub fn disk_direct(b: &mut Bench, data: &Data) -> Result<Row> {
    let what = "parallel O_DIRECT reads, 16 MiB each, no GPU: what the disk gives (best of 1, 4, 8, 16 threads)";
    if data.tmpfs {
        return Ok(Row::skipped("disk-direct", Kind::Disk, what, "the file is on tmpfs (RAM): no disk to measure"));
    }
    let mut row = Row::new("disk-direct", Kind::Disk, what, data.len);
    row.intact = Intact::Unchecked("disk only, nothing sent to the GPU".into());
    let r = (|| -> Result<()> {
        let mut by_threads: Vec<(usize, Vec<Sample>)> = Vec::new();
        let pass = |b: &Bench, t: usize, rep: usize, reps: usize| -> Result<std::result::Result<Sample, String>> {
            b.progress.begin(&format!("disk-direct, {t} thread(s)"), rep, reps);
            let (res, s) = timed(|| data::read_direct(&data.path, data.len, t, &b.progress))?;
            Ok(res.map(|secs| Sample { seconds: secs, cpu_seconds: s.cpu_seconds }))
        };
        for t in DISK_THREADS {
            match pass(b, t, 1, 1)? {
                Ok(s) => {
                    b.progress.note(&format!(
                        "  disk-direct, {t:>2} thread(s): {:.2} GB/s",
                        data.len as f64 / s.seconds.max(1e-12) / 1e9
                    ));
                    by_threads.push((t, vec![s]));
                }
                Err(why) => {
                    row.skipped = Some(why);
                    return Ok(());
                }
            }
        }
        let rate = |s: &Sample| data.len as f64 / s.seconds.max(1e-12) / 1e9;
        let best = by_threads
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, c)| rate(&a.1[0]).total_cmp(&rate(&c.1[0])))
            .map_or(0, |(i, _)| i);
        let t = by_threads[best].0;
        while by_threads[best].1.len() < b.reps {
            let rep = by_threads[best].1.len() + 1;
            match pass(b, t, rep, b.reps)? {
                Ok(s) => by_threads[best].1.push(s),
                Err(why) => {
                    row.skipped = Some(why);
                    return Ok(());
                }
            }
        }
        let rates: Vec<String> = by_threads.iter().map(|(t, s)| format!("{t}: {:.2}", rate(&s[0]))).collect();
        row.note("GB/s by reader threads (first pass)", rates.join(", "));
        row.strategy = format!("pread(O_DIRECT), {t} thread(s), 16 MiB");
        row.note("threads", t.to_string());
        row.samples = by_threads.swap_remove(best).1;
        Ok(())
    })();
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

// ---------------------------------------------------------------- the plan

/// What a ring slot may pin beyond its size: the library counts up to a page
/// of alignment slack per slot (`Strategy::pinned_bytes`), asked of it here.
fn slot_slack() -> u64 {
    let g = 64 * KIB;
    Strategy::Ring { slots: 1, slot: g as usize, threads: 1 }.pinned_bytes(g).map_or(0, |b| b.saturating_sub(g))
}

/// Bytes per slot for `slots` slots within `budget`, each with its slack:
/// 64 KiB multiples, at most `cap`.
fn slot_within(budget: u64, slots: usize, cap: u64) -> usize {
    let g = 64 * KIB;
    (((budget / slots as u64).saturating_sub(slot_slack()) / g * g).min(cap)).max(g) as usize
}

/// The pinned ring for `threads` filler threads within `budget`: two slots per
/// thread (at least four), at most 64 MiB each.
pub fn ring_for(threads: usize, budget: u64) -> Strategy {
    let slots = (2 * threads).max(4);
    Strategy::Ring { slots, slot: slot_within(budget, slots, 64 * MIB), threads }
}

/// Sliding windows within `budget`: 3 in flight, each a third of it (at most 1 GiB).
pub fn windows_for(budget: u64) -> Strategy {
    let g = if budget / 3 >= 2 * MIB { 2 * MIB } else { 4 * KIB };
    Strategy::Windows { window: (budget / 3 / g * g).clamp(g, GIB) as usize, in_flight: 3 }
}

/// The hybrid with all `threads` ring threads within `budget`: a quarter of it
/// to the ring (4 slots per thread, as the library plans them, at most 16 MiB
/// each), the rest to the 4 windows the library keeps registered at once.
pub fn hybrid_for(threads: usize, budget: u64) -> Strategy {
    let slots = 4 * threads;
    let slot = slot_within(budget / 4, slots, 16 * MIB);
    let rest = budget.saturating_sub((slot as u64 + slot_slack()) * slots as u64) / 4;
    let window = (rest / (64 * KIB) * (64 * KIB)).clamp(64 * KIB, GIB) as usize;
    Strategy::Hybrid { window, slot, threads }
}

/// O_DIRECT reads within `budget`: up to 4 reader threads, 2 slots each, at most 16 MiB.
pub fn direct_for(threads: usize, budget: u64) -> Strategy {
    let t = threads.clamp(1, 4);
    let slots = 2 * t;
    Strategy::Direct { slots, slot: slot_within(budget, slots, 16 * MIB), threads: t }
}

/// The cache-sized ring's own pin budget (its shape is `--ring-cache`,
/// default 8 threads with 4 slots of 4 MiB each): what the target allows it.
pub const RING_CACHE_BUDGET: u64 = 128 * MIB;

/// Ring filler-thread counts: 1, 4, 8 and the maximum, up to the maximum.
pub fn ring_threads(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 4, 8].into_iter().filter(|&t| t < max).collect();
    v.push(max);
    v
}

/// What the file-streaming runs produced.
pub struct Streamed {
    pub rows: Vec<Row>,
    /// Where the file went on the device, in words.
    pub destination: String,
    /// What KvikIO's script printed and wrote, where it ran.
    pub kvikio: Option<crate::script::Output>,
    /// The overlap run, where it ran.
    pub overlap: Option<crate::overlap::Overlap>,
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
    let overlap = if sel("overlap") { Some(crate::overlap::run(b, data, budget)?) } else { None };
    let (hot, cold) = (sel("kvikio-hot"), sel("kvikio-cold") && !data.tmpfs);
    let mut kvikio = None;
    if hot || cold {
        // Its own GPU memory beside ours: the destination stays allocated.
        let (kv_rows, out) = crate::kvikio::run(b, data, hot, cold);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_strategies_fit_their_budget_slack_included() {
        for budget in [32 * MIB, 64 * MIB, 512 * MIB, 4 * GIB] {
            for threads in [1, 2, 4, 8, 16, 64] {
                for s in [ring_for(threads, budget), hybrid_for(threads, budget), direct_for(threads, budget)] {
                    let need = s.pinned_bytes(64 * GIB).unwrap();
                    assert!(need <= budget, "{s} needs {need} of a {budget}-byte budget");
                }
            }
            assert!(windows_for(budget).pinned_bytes(64 * GIB).unwrap() <= budget);
        }
    }
}
