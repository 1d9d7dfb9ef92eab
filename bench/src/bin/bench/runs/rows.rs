//! `--pytorch-rows`: PyTorch's row-by-row copy, `a = torch.rand(1024, 655360)`
//! (1024 rows of 2.5 MiB of float32) sent to the GPU one row at a time, the
//! ways PyTorch code does it (pageable `i.cuda()`, a fresh pinned buffer per
//! row with `i.pin_memory()`) and ours (pinned memory allocated or registered
//! once; several threads filling one shared `PinnedRing`, with a reserve
//! thread: [`ring`]); and PyTorch's own run of the same, through
//! `bench/torch_rows.py`, where torch is importable. The memory anchors of
//! the start (how fast one thread copies the rows into a slot, and all the
//! filler threads read them) are measured on the rows themselves.

mod ring;

use crate::checksum;
use crate::data::MemRates;
use crate::data::fill_pattern;
use crate::rawcuda;
use crate::results::{Intact, Kind, Row, Sample};
use crate::session::Bench;
use crate::util::{Fatal, Result};
use std::ops::Range;
use std::time::{Duration, Instant};
use wirespeed_bench::cpu;
use wirespeed_cuda::{DeviceBuffer, HostRegistration, PinnedBuffer, RegisterFlags};
use wirespeed_pinned::{PinBudget, PinnedRing};

pub const ROWS: usize = 1024;
pub const COLS: usize = 655_360;
pub const ROW_BYTES: usize = COLS * 4;

/// The PyTorch code each variant stands for, or "(ours) ...".
pub fn torch_code(name: &str) -> &'static str {
    match name {
        "rows-cuda" => "i.cuda()",
        "rows-cuda-nb" => "i.cuda(non_blocking=True)",
        "rows-pin-nb" => "i.pin_memory().cuda(non_blocking=True), no cache",
        "rows-pin" => "i.pin_memory().cuda(), no cache",
        "rows-ring" => "(ours) 4-slot pinned ring, allocated once",
        "rows-ring-mt" => "(ours) N threads into one PinnedRing, 4 slots each, + a reserve",
        "rows-registered" => "(ours) whole tensor registered once",
        _ => "",
    }
}

fn fill_rows(host: &mut [u8], threads: usize) {
    let per = host.len().div_ceil(threads.max(1)).div_ceil(8) * 8;
    std::thread::scope(|s| {
        for (i, part) in host.chunks_mut(per.max(8)).enumerate() {
            s.spawn(move || fill_pattern(part, 0x70_2C4, (i * per) as u64));
        }
    });
}

/// Rows used: 1024, or 128 with --quick.
pub fn row_count(quick: bool) -> usize {
    if quick { 128 } else { ROWS }
}

/// PyTorch's variants, then ours; every variant's median of `b.reps` runs.
pub fn run(b: &mut Bench) -> Result<Vec<Row>> {
    let rows = row_count(b.opts.quick);
    let total = rows * ROW_BYTES;
    b.progress.note(&format!(
        "row-by-row experiment: {rows} rows x {COLS} float32 ({:.2} GB) in host memory, copied row by row",
        total as f64 / 1e9
    ));
    let mut host = vec![0u8; total].into_boxed_slice();
    fill_rows(&mut host, b.threads);
    let t0 = Instant::now();
    let expected = checksum::of_host(&host, b.threads);
    let read_all = total as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    let anchors = MemRates { read_all, copy_one: copy_rate(&host) };
    b.progress.note(&format!(
        "memory anchors of this start, on the rows: {} threads read them at {:.1} GB/s; one thread copies them into \
         a slot of a row (as a ring thread fills its slots) at {:.1} GB/s ({:.3} CPU s/GB)",
        b.threads,
        anchors.read_all / 1e9,
        anchors.copy_one / 1e9,
        1e9 / anchors.copy_one.max(1.0)
    ));
    let dst = DeviceBuffer::<u8>::new(&b.gpu.device, total)?;
    let mut x = Experiment { rows, expected, dst, out: Vec::new() };
    pytorch_ways(b, &mut x, &host);
    let ours = ours_pinned(b, &mut x, &host)?;
    ours_registered(b, &mut x, host)?;
    if let Some(row) = x.out.iter_mut().find(|r| r.name == "rows-ring-mt") {
        note_ring_mt(row, b, &ours, anchors);
    }
    Ok(x.out)
}

/// Bytes per second one thread copies the rows (their first GiB) into a
/// buffer of a row, as a ring thread fills its slot.
fn copy_rate(host: &[u8]) -> f64 {
    let part = &host[..host.len().min(1 << 30)];
    let mut slot = vec![0u8; ROW_BYTES];
    slot.copy_from_slice(&part[..ROW_BYTES.min(part.len())]); // the slot's pages, untimed
    let t0 = Instant::now();
    for row in part.chunks(ROW_BYTES) {
        slot[..row.len()].copy_from_slice(row);
        std::hint::black_box(&mut slot);
    }
    part.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9)
}

/// What rows-ring-mt's notes say: its threads, the ring's allocation, the
/// cores it kept busy, how often the reserve joined, how long the ring
/// threads waited for free slots, and the start's memory anchors (read back
/// by the target's reason: [`ANCHOR_COPY_ONE`], [`ANCHOR_READ_ALL`]).
fn note_ring_mt(row: &mut Row, b: &Bench, ours: &OursPinned, anchors: MemRates) {
    row.note("threads", b.opts.row_threads.to_string());
    row.note("ring allocation ms (once, not in wall)", format!("{:.1}", ours.ring_alloc_ms));
    row.note("cores busy (CPU s / wall s)", format!("{:.1}", row.cores_busy()));
    let joined = ours.passes.iter().filter(|p| p.reserve_joined).count();
    row.note(RESERVE_JOINED, format!("{joined} of {} rep(s)", ours.passes.len()));
    let mut waits: Vec<f64> = ours.passes.iter().map(|p| p.slot_wait_share).collect();
    waits.sort_by(f64::total_cmp);
    if let Some(w) = waits.get(waits.len() / 2) {
        row.note(SLOT_WAIT, format!("{w:.3}"));
    }
    row.note(ANCHOR_COPY_ONE, format!("{:.2}", anchors.copy_one / 1e9));
    row.note(ANCHOR_READ_ALL, format!("{:.2}", anchors.read_all / 1e9));
    row.note(ANCHOR_THREADS, b.threads.to_string());
}

/// rows-ring-mt's notes: in how many repetitions the reserve thread joined.
pub const RESERVE_JOINED: &str = "reserve thread joined";
/// The share of the ring threads' time spent waiting for free slots (median rep).
pub const SLOT_WAIT: &str = "ring threads waiting for free slots (share of their time)";
/// GB/s one thread copies the rows into a slot (this start's anchor).
pub const ANCHOR_COPY_ONE: &str = "anchor: one thread copies the rows into a slot, GB/s";
/// GB/s all the filler threads read the rows (this start's anchor), and how many they are.
pub const ANCHOR_READ_ALL: &str = "anchor: all filler threads read the rows, GB/s";
pub const ANCHOR_THREADS: &str = "anchor: filler threads";

/// The rows' bytes in host memory at `i`.
fn row_range(i: usize) -> Range<usize> {
    i * ROW_BYTES..(i + 1) * ROW_BYTES
}

/// The experiment under way: the rows, their checksum, where they go on the
/// device, and the variants' rows so far.
struct Experiment {
    rows: usize,
    expected: u64,
    dst: DeviceBuffer<u8>,
    out: Vec<Row>,
}

/// A variant's body: moves every row once into the device buffer.
type Body<'a> = dyn FnMut(&mut Bench, &mut DeviceBuffer<u8>) -> Result<()> + 'a;

impl Experiment {
    /// Bytes of all the rows.
    fn total(&self) -> usize {
        self.rows * ROW_BYTES
    }

    /// One variant, `name` (what it does in `what`, pinning `peak` bytes):
    /// `body` runs `b.reps` times; a failure is the row's.
    fn measure(&mut self, b: &mut Bench, name: &str, what: &str, peak: u64, body: &mut Body) {
        let mut row = Row::new(name, Kind::Rows, what, self.total() as u64);
        row.strategy = torch_code(name).to_string();
        row.peak_pinned = peak;
        if let Err(e) = self.repeat(b, &mut row, body) {
            row.error = Some(e.to_string());
        }
        b.progress.note(&format!(
            "  {name:<16} {:>8.1} ms wall {:>8.1} ms CPU {:>7.2} GB/s  intact: {}{}",
            row.seconds() * 1e3,
            row.cpu_seconds() * 1e3,
            row.gbps().median,
            row.intact.short(),
            row.error.as_deref().map(|e| format!("  FAILED: {e}")).unwrap_or_default()
        ));
        self.out.push(row);
    }

    /// `body`'s repetitions, each from a cleared device buffer, then the
    /// check of what arrived.
    fn repeat(&mut self, b: &mut Bench, row: &mut Row, body: &mut Body) -> Result<()> {
        let dev = b.gpu.device;
        let name = row.name.clone();
        for rep in 0..b.reps {
            b.stream.memset(&mut self.dst, 0)?.wait()?;
            dev.synchronize()?;
            b.progress.begin(&name, rep + 1, b.reps);
            let (c0, t0) = (cpu::process_seconds(), Instant::now());
            body(b, &mut self.dst)?;
            dev.synchronize()?;
            let s = Sample { seconds: t0.elapsed().as_secs_f64(), cpu_seconds: cpu::process_seconds() - c0 };
            row.samples.push(s);
            b.progress.rep_done(
                &format!(
                    "{name} rep {}/{}: {:.1} ms wall, {:.1} ms CPU",
                    rep + 1,
                    b.reps,
                    s.seconds * 1e3,
                    s.cpu_seconds * 1e3
                ),
                b.reps,
            );
        }
        row.intact = Intact::compare(self.expected, b.readback.checksum(&self.dst, 0..self.total())?);
        Ok(())
    }
}

/// The ways PyTorch code copies rows: pageable (`i.cuda()`, with and
/// without `non_blocking`) and a fresh pinned buffer per row (`i.pin_memory()`).
fn pytorch_ways(b: &mut Bench, x: &mut Experiment, host: &[u8]) {
    let (rows, rb) = (x.rows, ROW_BYTES as u64);
    x.measure(b, "rows-cuda", "pageable cudaMemcpy per row", 0, &mut |_, dst| {
        rawcuda::copy_pageable(dst, (0..rows).map(|i| (i * ROW_BYTES, &host[row_range(i)])), |_| {})
    });
    x.measure(b, "rows-cuda-nb", "pageable cudaMemcpyAsync per row", 0, &mut |b, dst| {
        rawcuda::copy_pageable_async(&b.stream, dst, (0..rows).map(|i| (i * ROW_BYTES, &host[row_range(i)])))
    });
    let what = "per row: cudaHostAlloc + memcpy + async copy; freed after the next row is queued";
    x.measure(b, "rows-pin-nb", what, 2 * rb, &mut |b, dst| {
        let mut prev: Option<PinnedBuffer<u8>> = None;
        for i in 0..rows {
            let mut p = PinnedBuffer::<u8>::new(ROW_BYTES)?;
            p.as_mut_slice()?.copy_from_slice(&host[row_range(i)]);
            b.stream.copy_to_device(&p, &mut dst.slice_mut(row_range(i))?)?.detach();
            prev = Some(p); // frees the previous row's buffer once its copy is done
        }
        drop(prev);
        Ok(b.stream.synchronize()?)
    });
    x.measure(b, "rows-pin", "per row: cudaHostAlloc + memcpy + copy, wait, cudaFreeHost", rb, &mut |b, dst| {
        for i in 0..rows {
            let mut p = PinnedBuffer::<u8>::new(ROW_BYTES)?;
            p.as_mut_slice()?.copy_from_slice(&host[row_range(i)]);
            b.stream.copy_to_device(&p, &mut dst.slice_mut(row_range(i))?)?.wait()?;
        }
        Ok(())
    });
}

/// What rows-ring-mt did beside its samples: the milliseconds its ring took
/// to allocate, and each repetition's [`ring::Pass`].
struct OursPinned {
    ring_alloc_ms: f64,
    passes: Vec<ring::Pass>,
}

/// Ours, pinned memory allocated once: a 4-slot ring on one thread, then
/// several threads each taking the next row into a free slot of one shared
/// `PinnedRing` and sending it to the row's place, a reserve thread joining
/// them when they are the bound.
fn ours_pinned(b: &mut Bench, x: &mut Experiment, host: &[u8]) -> Result<OursPinned> {
    let rows = x.rows;
    let mut slots = Vec::new();
    for _ in 0..4 {
        slots.push(PinnedBuffer::<u8>::new(ROW_BYTES)?);
    }
    let what = "4 pinned row slots allocated once, memcpy + async copy";
    x.measure(b, "rows-ring", what, 4 * ROW_BYTES as u64, &mut |b, dst| {
        for i in 0..rows {
            let slot = &mut slots[i % 4];
            slot.as_mut_slice()?.copy_from_slice(&host[row_range(i)]); // waits for the slot's last copy
            b.stream.copy_to_device(slot, &mut dst.slice_mut(row_range(i))?)?.detach();
        }
        Ok(b.stream.synchronize()?)
    });
    drop(slots);

    let n = b.opts.row_threads;
    let t = Instant::now();
    let ring = PinnedRing::new(4 * n, ROW_BYTES, &PinBudget::unlimited())?;
    let alloc_ms = t.elapsed().as_secs_f64() * 1e3;
    let what = format!(
        "{n} threads each take the next row, memcpy it into a free slot of one pinned ring ({} slots of a row, \
         4 per thread, allocated once) and copy it to its place on one stream; the ring's events decide reuse; a \
         reserve thread joins them once they wait for free slots less than {:.0} % of their time",
        4 * n,
        ring::ROOM * 100.0
    );
    let mut passes = Vec::new();
    x.measure(b, "rows-ring-mt", &what, (4 * n * ROW_BYTES) as u64, &mut |b, dst| {
        passes.push(ring::ring_rows(&ring, &b.stream, host, dst, rows, n)?);
        Ok(())
    });
    Ok(OursPinned { ring_alloc_ms: alloc_ms, passes })
}

/// Ours: the whole tensor registered once (it owns the memory meanwhile),
/// then an asynchronous copy per row.
fn ours_registered(b: &mut Bench, x: &mut Experiment, host: Box<[u8]>) -> Result<()> {
    let rows = x.rows;
    let t = Instant::now();
    let reg = match HostRegistration::try_new(host, RegisterFlags::default()) {
        Ok(reg) => reg,
        Err((e, _host)) => {
            let mut row = Row::new("rows-registered", Kind::Rows, "whole tensor registered once", x.total() as u64);
            row.strategy = torch_code("rows-registered").into();
            row.error = Some(format!("cudaHostRegister of the whole tensor: {e}"));
            x.out.push(row);
            return Ok(());
        }
    };
    let reg_s = t.elapsed().as_secs_f64();
    let what = "whole tensor registered once (cudaHostRegister), async copy per row";
    x.measure(b, "rows-registered", what, x.total() as u64, &mut |b, dst| {
        for i in 0..rows {
            b.stream.copy_to_device(&reg.slice(row_range(i))?, &mut dst.slice_mut(row_range(i))?)?.detach();
        }
        Ok(b.stream.synchronize()?)
    });
    let t = Instant::now();
    let host = reg.into_inner().map_err(|e| Fatal::Run(format!("cudaHostUnregister: {e}")))?;
    let unreg_s = t.elapsed().as_secs_f64();
    drop(host);
    if let Some(row) = x.out.last_mut() {
        row.note("register ms (once, not in wall)", format!("{:.1}", reg_s * 1e3));
        row.note("unregister ms", format!("{:.1}", unreg_s * 1e3));
    }
    Ok(())
}

/// PyTorch's own run of the same experiment (`bench/torch_rows.py`): what it
/// printed (its table) or why it did not run, and the JSON it wrote.
pub type Torch = crate::script::Output;

/// The script, built into the binary so that the bench runs it from any folder.
const SCRIPT: &str = include_str!("../../../../torch_rows.py");

/// Runs torch_rows.py with the same rows and repetitions, so that one run
/// prints both tables. It skips itself (exit 0) where torch or a GPU is missing.
pub fn torch(b: &Bench, rows: usize) -> Torch {
    if b.gpu.emulated {
        return Torch::not_run("skipped: this is an emulated run".into());
    }
    let (rows_s, reps_s) = (rows.to_string(), b.reps.to_string());
    b.progress
        .note(&format!("running PyTorch's own version: python3 bench/torch_rows.py --rows {rows_s} --reps {reps_s}"));
    // Generous: the script's own runs take seconds; this only stops a hung one.
    let limit = Duration::from_secs(300 + 2 * rows as u64 * b.reps as u64 / 10);
    crate::script::run("torch_rows.py", SCRIPT, &["--rows".into(), rows_s, "--reps".into(), reps_s], &[], limit)
}

/// PyTorch's per-row `i.pin_memory().cuda(non_blocking=True)`, as its script
/// measured it: (wall seconds, CPU seconds), medians.
pub fn torch_pin_nb(t: &Torch) -> Option<(f64, f64)> {
    let r = t.json.as_ref()?.get("results")?.as_array()?.iter().find(|r| r["name"] == "torch-pin-nb")?;
    Some((r["wall_ms"].as_f64()? / 1e3, r["cpu_ms"].as_f64()? / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// The built-in script runs from its temporary folder: it skips itself
    /// (exit 0) without torch or a GPU, or runs one row where both are there.
    #[test]
    fn script_runs_or_skips() {
        let (dir, script) = crate::script::write("torch_rows.py", SCRIPT).unwrap();
        assert_eq!(std::fs::read_to_string(&script).unwrap(), SCRIPT);
        let out = Command::new("python3")
            .arg(&script)
            .args(["--rows", "1", "--reps", "1", "--json"])
            .arg(dir.path().join("results.json"))
            .stdin(Stdio::null())
            .output();
        let Ok(out) = out else { return }; // no python3 here
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
    }
}
