//! The overlap run (`--only overlap`): a runtime that owns its device memory
//! and its stream streams a file's batches into its own arena and works on
//! each batch on its stream as soon as it has landed. Does the streaming hide
//! behind the work (or the work behind the streaming)?
//!
//! The caller owns an arena (one [`DeviceBuffer`], [`SLOTS`] batch slots used
//! in turn) and a [`Stream`]. For batch `i` it starts the transfer into slot
//! `i % SLOTS` with [`Streamer::start_with`] and
//! [`StartOptions::after`]`(caller)` (so the copies wait, on the device, for
//! the work that last read the slot), keeping [`SLOTS`]` - 1` transfers
//! queued ahead; for the oldest batch it calls [`Transfer::then_on`]`(caller)`
//! and enqueues the dependent work on its stream: `k` device-to-device copies
//! of the batch into a buffer of its own. Nothing waits on the host between
//! batches but `then_on` (until the streamer has enqueued that batch's last
//! copy); the walls end once every transfer has been waited for and the
//! caller's stream synchronized.
//!
//! The slots are handed to the streamer, and read by the work, through
//! [`DeviceSliceMut::from_raw_parts`], as a runtime hands over memory it
//! allocated itself: a view borrowed from the arena would make the work's
//! enqueue wait on the host for the whole transfer (the arena's fence holds
//! a started transfer's destination until it ends), which is what this run
//! means to show is not needed.
//!
//! Three walls of the same batches, in every repetition: the transfers alone
//! (the same calls, no work), the work alone (no streaming), both. `k` is
//! calibrated first so that the work alone takes about as long as the
//! streaming alone: then running them one after the other would take twice
//! as long as either, and overlapping them perfectly as long as the longer.
//! The target: both within [`TARGET_RATIO`] of the longer one alone.

use crate::checksum;
use crate::data::Data;
use crate::results::Intact;
use crate::session::Bench;
use crate::util::{Fatal, KIB, MIB, Result, Stats, fmt_bytes, stats};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, Report, StartOptions, Strategy, StreamConfig, Streamer, Transfer};

/// The target: the overlapped wall at most this many times the longer of the two alone.
pub const TARGET_RATIO: f64 = 1.10;
/// Batch slots of the arena: a transfer writes a slot while the work reads
/// the others, and up to `SLOTS - 1` transfers wait in the streamer's queue.
pub const SLOTS: usize = 4;
/// The most batches streamed per pass.
pub const MAX_BATCHES: usize = 64;
/// The work's copies per batch, at most.
pub const MAX_K: usize = 4096;
/// The first guess of `k`.
const FIRST_K: usize = 4;
/// Calibration stops once the work alone is within this fraction of the streaming alone.
const CALIBRATED: f64 = 0.10;
/// Passes of the work alone that calibration may take.
const CALIBRATION_PASSES: usize = 5;

/// What the overlap run measured.
pub struct Overlap {
    /// Bytes per batch.
    pub batch: u64,
    pub batches: usize,
    pub slots: usize,
    /// Device-to-device copies of each batch: the caller's work.
    pub k: usize,
    /// Each calibration pass: `k` and the work-alone seconds it took.
    pub calibration: Vec<(usize, f64)>,
    /// The streaming-alone seconds calibration aimed at.
    pub calibration_target: f64,
    /// The strategy the streamer ran (its Display), and its registrations
    /// per pass of the overlapped runs (median).
    pub strategy: String,
    pub registrations: Option<u64>,
    /// Where those registrations were made ([`WindowContext`]): a second
    /// CUDA context, or the primary one (where unregistering waits for
    /// every copy on the device).
    ///
    /// [`WindowContext`]: wirespeed_pinned::WindowContext
    pub windows: Option<wirespeed_pinned::WindowContext>,
    /// Wall seconds of each repetition.
    pub stream_s: Vec<f64>,
    pub compute_s: Vec<f64>,
    pub both_s: Vec<f64>,
    pub intact: Intact,
    /// The run failed with this message (the bench then exits 1).
    pub error: Option<String>,
    /// Why it did not run (not a failure).
    pub skipped: Option<String>,
}

impl Overlap {
    fn new(batch: u64, batches: usize) -> Overlap {
        Overlap {
            batch,
            batches,
            slots: SLOTS.min(batches),
            k: 0,
            calibration: Vec::new(),
            calibration_target: f64::NAN,
            strategy: String::new(),
            registrations: None,
            windows: None,
            stream_s: Vec::new(),
            compute_s: Vec::new(),
            both_s: Vec::new(),
            intact: Intact::Unchecked("not checked".into()),
            error: None,
            skipped: None,
        }
    }

    /// Bytes streamed per pass.
    pub fn bytes(&self) -> u64 {
        self.batch * self.batches as u64
    }

    pub fn ok(&self) -> bool {
        self.error.is_none() && self.skipped.is_none() && !self.both_s.is_empty()
    }

    pub fn stream(&self) -> Stats {
        stats(&self.stream_s)
    }

    pub fn compute(&self) -> Stats {
        stats(&self.compute_s)
    }

    pub fn both(&self) -> Stats {
        stats(&self.both_s)
    }

    /// Both over the longer alone, of the medians.
    pub fn ratio(&self) -> f64 {
        ratio(self.both().median, self.stream().median, self.compute().median)
    }

    /// The same ratio within each repetition: median, min, max.
    pub fn ratios(&self) -> Stats {
        let v: Vec<f64> = (self.both_s.iter().zip(&self.stream_s).zip(&self.compute_s))
            .map(|((b, s), c)| ratio(*b, *s, *c))
            .collect();
        stats(&v)
    }

    /// The work alone over the streaming alone (medians): 1 when calibration hit.
    pub fn balance(&self) -> f64 {
        self.compute().median / self.stream().median
    }

    /// Whether the run meets the target (None: it did not run).
    pub fn pass(&self) -> Option<bool> {
        self.ok().then(|| verdict(self.ratio()) && self.intact.as_bool() != Some(false))
    }
}

/// `both` over the longer of the two alone.
pub fn ratio(both: f64, stream: f64, compute: f64) -> f64 {
    both / stream.max(compute)
}

/// True when `ratio` meets the target.
pub fn verdict(ratio: f64) -> bool {
    ratio <= TARGET_RATIO
}

/// The next `k`: the work is `k` copies per batch, so its time scales with
/// `k`; aim `k` at `stream` seconds given that `k` took `compute` seconds
/// (1 to [`MAX_K`]).
pub fn next_k(k: usize, stream: f64, compute: f64) -> usize {
    if !(stream > 0.0 && compute > 0.0 && stream.is_finite() && compute.is_finite()) {
        return (k.saturating_mul(2)).clamp(1, MAX_K); // nothing measurable yet: grow
    }
    let want = (k as f64 * stream / compute).round();
    if want >= MAX_K as f64 { MAX_K } else { (want as usize).max(1) }
}

/// True when the work alone is close enough to the streaming alone.
pub fn calibrated(stream: f64, compute: f64) -> bool {
    (compute / stream - 1.0).abs() <= CALIBRATED
}

/// Bytes per batch and batches for a file of `len` bytes: batches of 64 MiB
/// (16 MiB with `--quick`), smaller when the file holds fewer than [`SLOTS`]
/// of them, and at most [`MAX_BATCHES`]. None for a file under 16 KiB.
pub fn shape(len: u64, quick: bool) -> Option<(u64, usize)> {
    let page = 4 * KIB;
    let mut batch = if quick { 16 * MIB } else { 64 * MIB };
    if len / batch < SLOTS as u64 {
        batch = len / SLOTS as u64 / page * page;
    }
    if batch < page {
        return None;
    }
    let batches = (len / batch).min(MAX_BATCHES as u64) as usize;
    Some((batch, batches))
}

/// The caller's side: its device, stream and arena.
struct Caller {
    dev: Device,
    stream: Stream,
    /// None once leaked: a wait for what uses it failed.
    arena: Option<DeviceBuffer<u8>>,
    batch: usize,
    batches: usize,
    slots: usize,
}

impl Caller {
    /// File bytes of batch `i`.
    fn range(&self, i: usize) -> Range<u64> {
        let b = self.batch as u64;
        i as u64 * b..(i as u64 + 1) * b
    }

    /// Slot `s` of the arena, as memory the caller hands over.
    ///
    /// # Safety
    /// The contract of [`DeviceSliceMut::from_raw_parts`] for the slot: until
    /// what is given the view is observed complete, only work ordered after
    /// it through a stream (`then_on`, `StartOptions::after`) touches the
    /// slot. [`pass`] keeps it: each view is used by one transfer (waited for
    /// before `pass` returns) or by work on the caller's stream (synchronized
    /// before `pass` returns), each ordered after the slot's previous user;
    /// and the arena is leaked, not freed, when those waits fail.
    unsafe fn slot(&self, s: usize) -> Result<DeviceSliceMut<'_, u8>> {
        let arena = self.arena.as_ref().ok_or_else(|| Fatal::Run("the arena was leaked".into()))?;
        if s >= self.slots {
            return Err(Fatal::Run(format!("slot {s} of {}", self.slots)));
        }
        let ptr = arena.as_raw_ptr().wrapping_add(s * self.batch);
        // SAFETY: `ptr .. ptr + batch` lies inside the arena (s < slots), device
        // memory of `dev` that lives as long as the borrow of `self`; the
        // exclusive use is this function's own contract, passed on.
        Ok(unsafe { DeviceSliceMut::from_raw_parts(ptr, self.batch, self.dev) }?)
    }
}

/// One pass: the batches streamed (`stream`), `k` copies of each into `out`
/// by the caller (`k > 0`), or both overlapped. Answers the wall seconds and
/// the transfers' reports.
fn pass(
    streamer: &Streamer,
    file: &Arc<MappedFile>,
    c: &mut Caller,
    out: &mut DeviceBuffer<u8>,
    stream: bool,
    k: usize,
) -> Result<(f64, Vec<Report>)> {
    let t0 = Instant::now();
    let mut transfers = Vec::with_capacity(c.batches);
    let enqueued = enqueue(streamer, file, c, out, stream, k, &mut transfers);
    // However that ended, nothing may use the arena once this returns: every
    // transfer waited for, the streamer's and the caller's streams synchronized.
    let mut reports = Vec::with_capacity(transfers.len());
    let mut failed = None;
    for t in transfers {
        match t.wait() {
            Ok(r) => reports.push(r),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    let synced = streamer.streams().iter().chain([&c.stream]).try_for_each(Stream::synchronize);
    let seconds = t0.elapsed().as_secs_f64();
    if let Err(e) = synced {
        std::mem::forget(c.arena.take());
        return Err(Fatal::Run(format!(
            "a stream could not be synchronized ({e}): the arena is leaked rather than freed under a copy"
        )));
    }
    enqueued?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok((seconds, reports))
}

/// The pipeline of one pass (see the module docs); `transfers` gets every
/// transfer started, so that [`pass`] waits for them however this ends.
fn enqueue<'s>(
    streamer: &'s Streamer,
    file: &Arc<MappedFile>,
    c: &'s Caller,
    out: &mut DeviceBuffer<u8>,
    stream: bool,
    k: usize,
    transfers: &mut Vec<Transfer<'s>>,
) -> Result<()> {
    let ahead = c.slots - 1;
    for i in 0..c.batches + ahead {
        if stream && i < c.batches {
            // SAFETY: the transfer is the slot's only user until `then_on`
            // below orders the caller's stream after it; `after` orders it
            // after the slot's previous user (batch i - slots, whose work went
            // to the caller's stream before this call), and `pass` waits for
            // it before the arena can go.
            let dst = unsafe { c.slot(i % c.slots) }?;
            let options = StartOptions::new().after(&c.stream);
            transfers.push(streamer.start_with(file, c.range(i), dst, options)?);
        }
        let Some(j) = i.checked_sub(ahead) else { continue };
        if stream {
            transfers[j].then_on(&c.stream)?;
        }
        if k > 0 {
            // SAFETY: read only by work on the caller's stream, enqueued after
            // `then_on` ordered that stream after the batch's transfer (with
            // no streaming, after earlier work of the same stream only); the
            // next transfer into the slot waits for it (`after`), and `pass`
            // synchronizes the stream before the arena can go.
            let src = unsafe { c.slot(j % c.slots) }?;
            for _ in 0..k {
                c.stream.copy_device_to_device(&src, out)?.detach();
            }
        }
    }
    Ok(())
}

/// The overlap run on the page-cached file, within the pin budget.
pub fn run(b: &mut Bench, data: &Data, budget: u64) -> Result<Overlap> {
    let Some((batch, batches)) = shape(data.len, b.opts.quick) else {
        let mut o = Overlap::new(0, 0);
        o.skipped = Some(format!("the file ({}) is too small for batches", fmt_bytes(data.len)));
        return Ok(o);
    };
    let mut o = Overlap::new(batch, batches);
    let r = measure(b, data, budget, &mut o);
    if let Err(e) = r {
        let msg = e.to_string();
        if msg.contains("sticky") || msg.contains("context is lost") || msg.contains("is leaked") {
            return Err(Fatal::Run(format!("overlap: {msg} (stopping)")));
        }
        o.error = Some(msg);
    }
    note(b, &o);
    Ok(o)
}

/// One pass as [`pass`] makes it: the batches streamed or not, `k` copies
/// of each by the caller; its wall seconds and the transfers' reports.
type PassFn<'a> = dyn FnMut(bool, usize) -> Result<(f64, Vec<Report>)> + 'a;

fn label(what: &str) -> String {
    format!("overlap: {what}")
}

fn measure(b: &mut Bench, data: &Data, budget: u64, o: &mut Overlap) -> Result<()> {
    let dev = b.gpu.device;
    let batch = usize::try_from(o.batch).map_err(|_| Fatal::Run("batch size beyond usize".into()))?;
    // Declared before the caller's side: dropped after it, once nothing uses the arena.
    let mut out = DeviceBuffer::<u8>::new(&dev, batch)?;
    let mut c = Caller {
        dev,
        stream: Stream::new(&dev)?,
        arena: Some(DeviceBuffer::new(&dev, batch * o.slots)?),
        batch,
        batches: o.batches,
        slots: o.slots,
    };
    let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(budget)))?;
    let file = &data.file;
    let mut run_pass = |stream: bool, k: usize| pass(&streamer, file, &mut c, &mut out, stream, k);

    // Untimed: the streamer registers or allocates what it keeps, its worker
    // thread starts, the caller's copies load their code.
    b.progress.begin(&label("untimed first pass"), 1, 1);
    run_pass(true, FIRST_K)?;
    calibrate(b, &mut run_pass, o)?;
    repeat(b, &mut run_pass, o)?;
    drop(streamer);
    o.intact = check(b, data, &c, &out)?;
    Ok(())
}

/// k: copies per batch such that the work alone takes as long as the
/// streaming alone (the last k measured, or the one it pointed at when the
/// passes ran out).
fn calibrate(b: &Bench, run_pass: &mut PassFn, o: &mut Overlap) -> Result<()> {
    b.progress.begin(&label("calibrating k"), 1, 1);
    let (target, _) = run_pass(true, 0)?;
    o.calibration_target = target;
    let mut k = FIRST_K;
    for _ in 0..CALIBRATION_PASSES {
        let (t, _) = run_pass(false, k)?;
        o.calibration.push((k, t));
        let next = next_k(k, target, t);
        if calibrated(target, t) || next == k {
            break;
        }
        k = next;
    }
    o.k = k;
    Ok(())
}

/// The timed repetitions: in each, the streaming alone, the work alone, both.
fn repeat(b: &Bench, run_pass: &mut PassFn, o: &mut Overlap) -> Result<()> {
    let reps = b.target_reps;
    let mut regs = Vec::new();
    for rep in 0..reps {
        b.progress.begin(&label("stream alone, compute alone, both"), rep + 1, reps);
        let (s, _) = run_pass(true, 0)?;
        let (w, _) = run_pass(false, o.k)?;
        let (both, reports) = run_pass(true, o.k)?;
        o.stream_s.push(s);
        o.compute_s.push(w);
        o.both_s.push(both);
        regs.push(reports.iter().map(|r| r.registrations).sum::<u64>() as f64);
        if let Some(r) = reports.last() {
            o.strategy = r.strategy.to_string();
            o.windows = Some(r.windows.clone());
        }
        b.progress.rep_done(
            &format!(
                "overlap rep {}/{reps}: stream {:.1} ms, compute {:.1} ms, both {:.1} ms: {:.3} of the longer{}",
                rep + 1,
                s * 1e3,
                w * 1e3,
                both * 1e3,
                ratio(both, s, w),
                if b.gpu.emulated { " [emulated]" } else { "" }
            ),
            reps,
        );
    }
    o.registrations = Some(stats(&regs).median as u64);
    Ok(())
}

/// Whether the data arrived intact. The last pass streamed every batch: the
/// slots hold the last ones, and `out` the last batch's copy.
fn check(b: &mut Bench, data: &Data, c: &Caller, out: &DeviceBuffer<u8>) -> Result<Intact> {
    let (batch, batches, slots) = (c.batch, c.batches, c.slots);
    let bytes = data.bytes();
    let at = |i: usize| {
        let r = c.range(i);
        &bytes[r.start as usize..r.end as usize]
    };
    let arena = c.arena.as_ref().ok_or_else(|| Fatal::Run("the arena was leaked".into()))?;
    let mut bad = None;
    for i in batches.saturating_sub(slots)..batches {
        let s = (i % slots) * batch;
        let (expected, got) = (checksum::of_host(at(i), b.threads), b.readback.checksum(arena, s..s + batch)?);
        if got != expected {
            bad.get_or_insert((expected, got));
        }
    }
    let last = checksum::of_host(at(batches - 1), b.threads);
    let got = b.readback.checksum(out, 0..batch)?;
    if got != last {
        bad.get_or_insert((last, got));
    }
    Ok(match bad {
        None => Intact::Yes(last),
        Some((expected, got)) => Intact::No { expected, got },
    })
}

/// The progress line once the run has ended.
fn note(b: &Bench, o: &Overlap) {
    let msg = if let Some(e) = &o.error {
        format!("  {:<18} FAILED: {e}", "overlap")
    } else if let Some(s) = &o.skipped {
        format!("  {:<18} skipped: {s}", "overlap")
    } else {
        format!(
            "  {:<18} both {:.1} ms vs stream alone {:.1} ms, compute alone {:.1} ms (k = {}): {:.3} of the longer \
             (target <= {TARGET_RATIO:.2}), intact: {}{}",
            "overlap",
            o.both().median * 1e3,
            o.stream().median * 1e3,
            o.compute().median * 1e3,
            o.k,
            o.ratio(),
            o.intact.short(),
            if b.gpu.emulated { "  [emulated]" } else { "" }
        )
    };
    b.progress.note(&msg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_scales_with_the_time_it_must_fill() {
        // 4 copies took 10 ms, the streaming 100 ms: 40 copies.
        assert_eq!(next_k(4, 0.100, 0.010), 40);
        // Too many: scale down, never below 1.
        assert_eq!(next_k(40, 0.100, 0.125), 32);
        assert_eq!(next_k(3, 0.001, 1.0), 1);
        // Never past the cap, and growing when nothing was measurable.
        assert_eq!(next_k(4, 10.0, 1e-6), MAX_K);
        assert_eq!(next_k(4, 0.1, 0.0), 8);
        assert_eq!(next_k(MAX_K, 0.1, f64::NAN), MAX_K);
        // Already there: the same k.
        assert_eq!(next_k(37, 0.100, 0.100), 37);
    }

    #[test]
    fn calibration_and_verdict() {
        assert!(calibrated(0.100, 0.109) && calibrated(0.100, 0.091));
        assert!(!calibrated(0.100, 0.115) && !calibrated(0.100, 0.085));
        // Serial would be 2x the longer; perfect overlap 1x.
        assert_eq!(ratio(0.2, 0.1, 0.1), 2.0);
        assert!((ratio(0.105, 0.1, 0.09) - 1.05).abs() < 1e-12);
        assert!(verdict(1.10) && verdict(1.0) && !verdict(1.11));
    }

    #[test]
    fn shapes() {
        assert_eq!(shape(4 << 30, false), Some((64 * MIB, 64)));
        assert_eq!(shape(40 << 30, false), Some((64 * MIB, MAX_BATCHES)));
        assert_eq!(shape(256 * MIB, true), Some((16 * MIB, 16)));
        // Fewer than SLOTS batches of the usual size: smaller batches, whole pages.
        assert_eq!(shape(100 * MIB, false), Some((25 * MIB, 4)));
        assert_eq!(shape(10_000_000, false), Some((2_498_560, 4)));
        assert_eq!(shape(16 * KIB, false), Some((4 * KIB, 4)));
        assert_eq!(shape(16 * KIB - 1, false), None);
    }

    #[test]
    fn medians_and_ratios() {
        let mut o = Overlap::new(MIB, 8);
        assert!(!o.ok() && o.pass().is_none());
        o.stream_s = vec![0.10, 0.12, 0.11];
        o.compute_s = vec![0.10, 0.10, 0.13];
        o.both_s = vec![0.11, 0.125, 0.14];
        o.intact = Intact::Yes(1);
        assert!((o.ratio() - 0.125 / 0.11).abs() < 1e-12);
        let r = o.ratios();
        assert!((r.min - 0.125 / 0.12).abs() < 1e-12 && (r.max - 1.1).abs() < 1e-12);
        assert_eq!(o.pass(), Some(false)); // 1.136 > 1.10
        o.both_s = vec![0.11, 0.115, 0.14];
        assert_eq!(o.pass(), Some(true));
        o.intact = Intact::No { expected: 1, got: 2 };
        assert_eq!(o.pass(), Some(false));
        assert_eq!(o.bytes(), 8 * MIB);
    }
}
