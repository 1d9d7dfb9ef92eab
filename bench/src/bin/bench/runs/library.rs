//! One of the library's strategies streaming the file (or part of it), with
//! the streamer made once or for every repetition, the file mapped once or
//! anew, the page cache kept or dropped.

use crate::args::SpanMode;
use crate::data::Data;
use crate::progress::Callback;
use crate::results::{Intact, Kind, Row};
use crate::runs::dest::Dest;
use crate::session::{Bench, settle, timed};
use crate::util::{Fatal, MIB, Result};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
use wirespeed_pinned::{Breakdown, MappedFile, PinBudget, Report, Strategy, StreamConfig, Streamer};

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
    /// The range as transfers of this many bytes, started as the mode says
    /// (see `Custom::spans`).
    pub spans: Option<(u64, SpanMode)>,
    /// `StreamConfig::reserve_threads`, when not the default.
    pub reserve: Option<usize>,
    /// `StreamConfig::read_ahead`, when not the default.
    pub ahead: Option<std::time::Duration>,
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
    spans: Option<(u64, SpanMode)>,
) -> Result<Report> {
    if let Some((span, mode)) = spans {
        return transfer_spans(streamer, file, range, target, span, mode);
    }
    Ok(if target.scratch {
        streamer.to_scratch(file, range.clone(), &mut target.buf)?
    } else {
        streamer.to_device(file, range.clone(), &mut target.buf)?
    })
}

/// The range as transfers of `span` bytes into consecutive parts of the
/// destination (`Streamer::start`), started as `mode` says. Answers the first transfer's report with the registrations
/// of all, the highest peak, `chained` when every later transfer was, and the
/// breakdown of all their passes.
fn transfer_spans(
    streamer: &Streamer,
    file: &Arc<MappedFile>,
    range: &Range<u64>,
    target: &mut Dest,
    span: u64,
    mode: SpanMode,
) -> Result<Report> {
    let len = range.end - range.start;
    if target.scratch || len > target.buf.len() as u64 {
        return Err(Fatal::Run("spans need a destination as large as the range (not a scratch buffer)".into()));
    }
    let dev = target.buf.device();
    let base = target.buf.as_raw_ptr();
    let totals = streamer.totals();
    let consumer = match mode {
        SpanMode::Then => Some(Stream::new(&dev)?),
        _ => None,
    };
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
        match (started, &consumer) {
            (Ok(t), Some(c)) => {
                if let Err(e) = t.then_on(c) {
                    failed = Some(e.into());
                }
                pending.push(t);
            }
            (Ok(t), None) if mode == SpanMode::Queued => pending.push(t),
            (Ok(t), None) => reports.push(t.wait()),
            (Err(e), _) => failed = Some(e),
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
    // The breakdown of every pass the transfers ran in (chained transfers'
    // own breakdowns overlap), once the last one has ended: a pass reading
    // ahead for a next transfer ends at a blocking call (here an empty one).
    let mut none = target.buf.slice_mut(0..0)?;
    streamer.to_device(file, 0..0, &mut none)?;
    first.breakdown = streamer.totals().since(&totals);
    Ok(first)
}

/// Runs `spec` on `data` into `dest`; its row.
pub fn library(b: &mut Bench, data: &Data, dest: &mut Dest, spec: LibRun) -> Result<Row> {
    let run = Run { spec: &spec, data, dev: b.gpu.device, callback: b.progress.callback() };
    let mut row = Row::new(&spec.name, Kind::Stream, &spec.what, run.len());
    let r = run.measure(b, dest, &mut row);
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

/// A library row being measured: what it runs, on which file, and how its
/// streamers are made.
struct Run<'a> {
    spec: &'a LibRun,
    data: &'a Data,
    dev: Device,
    callback: Callback,
}

impl Run<'_> {
    /// Bytes per repetition.
    fn len(&self) -> u64 {
        self.spec.range.end - self.spec.range.start
    }

    /// A streamer for the row; `verify` for the extra pass that checks each
    /// part as it lands.
    fn streamer(&self, verify: bool) -> Result<Streamer> {
        let spec = self.spec;
        // Verifying needs a bounce buffer on top of what the strategy pins.
        let budget =
            if verify { PinBudget::new(spec.budget.limit().saturating_add(16 * MIB)) } else { spec.budget.clone() };
        let mut config = StreamConfig::new(spec.strategy, budget);
        config.verify = verify;
        // Transfers are chained into one pass only without a callback
        // (its counts are one transfer's).
        config.progress = if spec.spans.is_some() { None } else { Some(self.callback.clone()) };
        config.copy_streams = spec.copy_streams;
        if let Some(n) = spec.reserve {
            config.reserve_threads = n;
        }
        if let Some(d) = spec.ahead {
            config.read_ahead = d;
        }
        Ok(Streamer::new(&[self.dev], config)?)
    }

    fn transfer(&self, st: &Streamer, file: &Arc<MappedFile>, target: &mut Dest) -> Result<Report> {
        transfer(st, file, &self.spec.range, target, self.spec.spans)
    }

    /// The untimed first pass, every repetition, and the check of the data.
    fn measure(&self, b: &mut Bench, dest: &mut Dest, row: &mut Row) -> Result<()> {
        let kept = if self.spec.fresh { None } else { Some(self.streamer(false)?) };
        // A range shorter than the destination gets its own buffer of its size.
        let len = self.len();
        let mut own;
        let target: &mut Dest = if len < dest.buf.len() as u64 && !dest.scratch {
            own = Dest { buf: DeviceBuffer::new(&self.dev, len as usize)?, scratch: false };
            &mut own
        } else {
            dest
        };
        if let Some(st) = &kept
            && self.spec.warm_up
        {
            self.warm_up(b, st, target, row)?;
        }
        let mut tally = Tally::default();
        let reps = self.spec.reps.max(1);
        for rep in 0..reps {
            target.clear(&b.stream)?;
            if self.spec.cold {
                self.drop_cache(rep, row)?;
            }
            self.spec.budget.reset_peak();
            b.progress.begin(&row.name, rep + 1, reps);
            let ((report, edges), s) = timed(|| self.pass(kept.as_ref(), target))?;
            tally.edges.push(edges);
            let extra = tally.add(self.spec, row, &report, s.seconds, rep + 1 == reps);
            b.sample_done_with(row, s, reps, &extra);
        }
        tally.finish(self.spec, row, reps);
        self.check(b, kept, target, row)
    }

    /// The pass a program would make first, untimed: the streamer allocates
    /// its ring or registers what it keeps.
    fn warm_up(&self, b: &Bench, st: &Streamer, target: &mut Dest, row: &mut Row) -> Result<()> {
        b.progress.begin(&format!("{} (untimed first pass)", row.name), 1, 1);
        let (rep, s) = timed(|| self.transfer(st, &self.data.file, target))?;
        row.note("untimed first pass GB/s", format!("{:.2}", self.len() as f64 / s.seconds / 1e9));
        if rep.registrations > 0 {
            row.note("its registrations", rep.registrations.to_string());
        }
        Ok(())
    }

    /// Drops the file's page cache before repetition `rep`; the first time,
    /// notes what stayed resident.
    fn drop_cache(&self, rep: usize, row: &mut Row) -> Result<()> {
        self.data.file.drop_page_cache()?;
        if rep == 0 {
            let resident = self.data.file.resident_bytes(self.spec.range.clone())?;
            row.note(
                "resident after dropping the cache",
                format!("{:.1} %", resident as f64 * 100.0 / self.len() as f64),
            );
        }
        Ok(())
    }

    /// One timed pass, with the streamer made and the file mapped for it
    /// where the row asks (`fresh`, `new_map`), and dropped after it. Answers
    /// the report and the seconds of making and dropping the streamer,
    /// mapping and unmapping the file (zero where the row does not).
    fn pass(&self, kept: Option<&Streamer>, target: &mut Dest) -> Result<(Report, [f64; 4])> {
        let t = Instant::now();
        let fresh = if kept.is_none() { Some(self.streamer(false)?) } else { None };
        let made = t.elapsed().as_secs_f64();
        let st = fresh.as_ref().or(kept).ok_or_else(|| Fatal::Run("no streamer".into()))?;
        let t = Instant::now();
        // SAFETY: the bench's file is not written while the bench runs.
        let mapped = if self.spec.new_map { Some(unsafe { MappedFile::open(&self.data.path) }?) } else { None };
        let opened = t.elapsed().as_secs_f64();
        let r = self.transfer(st, mapped.as_ref().unwrap_or(&self.data.file), target)?;
        self.dev.synchronize()?;
        let t = Instant::now();
        drop(fresh); // a fresh streamer's teardown (unregistering) belongs to its pass
        let dropped = t.elapsed().as_secs_f64();
        let t = Instant::now();
        drop(mapped); // and so does unmapping a file mapped for the pass
        Ok((r, [made, dropped, opened, t.elapsed().as_secs_f64()]))
    }

    /// Whether the data arrived intact: the destination's checksum against
    /// the file's, or, where parts overwrote each other in a scratch buffer,
    /// one more pass in which the library checks each part as it lands.
    fn check(&self, b: &mut Bench, kept: Option<Streamer>, target: &mut Dest, row: &mut Row) -> Result<()> {
        let len = self.len();
        if target.scratch && len > target.buf.len() as u64 {
            // Parts that share scratch bytes may land in any order (threads,
            // windows from the front and the ring from the back): no final
            // image can be predicted, so the library checks each part as it
            // lands, in one more pass, untimed.
            drop(kept);
            b.progress.begin(&format!("{} (untimed verifying pass)", row.name), 1, 1);
            row.intact = match self.streamer(true).and_then(|st| self.transfer(&st, &self.data.file, target)) {
                Ok(Report { verified: Some(ok), .. }) => Intact::Verified(ok),
                Ok(_) => Intact::Unchecked("the library did not verify".into()),
                Err(e) => Intact::Unchecked(format!("the verifying pass failed: {e}")),
            };
        } else {
            let from = self.spec.range.start as usize;
            let whole = (self.spec.range == (0..self.data.len)).then_some(self.data.checksum);
            row.intact = target.verify(b, &self.data.bytes()[from..from + len as usize], whole)?;
        }
        Ok(())
    }
}

/// What the repetitions leave beside their samples.
#[derive(Default)]
struct Tally {
    registrations: u64,
    /// Each repetition's wall seconds and where its agents' time went.
    breakdowns: Vec<(f64, Breakdown)>,
    /// Each repetition's seconds of making and dropping a fresh streamer,
    /// mapping and unmapping the file.
    edges: Vec<[f64; 4]>,
}

impl Tally {
    /// Takes one repetition's report into `row`; answers what its progress
    /// line adds to the figures.
    fn add(&mut self, spec: &LibRun, row: &mut Row, report: &Report, seconds: f64, last: bool) -> String {
        row.peak_pinned = row.peak_pinned.max(report.peak_pinned).max(spec.budget.peak());
        self.registrations += report.registrations;
        if spec.spans.is_some() && last {
            let chained = if report.chained { "yes" } else { "no" };
            row.note("every later transfer ran in the first one's pass", chained.to_string());
        }
        row.strategy = report.strategy.to_string();
        row.resolved = Some(report.strategy);
        // Where the agents' time went (for spans, that of every pass their
        // transfers ran in: `transfer_spans`).
        let extra = format!("; {}", report.breakdown);
        self.breakdowns.push((seconds, report.breakdown));
        extra
    }

    /// The registrations per repetition, the medians of the setup and
    /// teardown times the row asked for, and the median repetition's breakdown.
    fn finish(mut self, spec: &LibRun, row: &mut Row, reps: usize) {
        row.registrations = Some(self.registrations / reps as u64);
        let median_ms = |i: usize| {
            let mut v: Vec<f64> = self.edges.iter().map(|e| e[i] * 1e3).collect();
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
            self.breakdowns.sort_by(|a, b| a.0.total_cmp(&b.0));
            if let Some(&(seconds, median)) = self.breakdowns.get(self.breakdowns.len() / 2) {
                row.note("where its agents' time went (the median repetition)", median.to_string());
                row.breakdown = Some((seconds, median));
            }
        }
    }
}
