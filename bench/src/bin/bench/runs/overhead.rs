//! The safe layer's cost: CPU time per 64 KiB asynchronous host-to-device copy
//! through cuda-safe (`Stream::copy_to_device` + `detach`) against a raw
//! `cudaMemcpyAsync` through cuda-sys, in the same run, interleaved. A third
//! variant, raw `cudaSetDevice` + `cudaMemcpyAsync`, shows what making the
//! device current on every call would cost (cuda-safe caches it per thread).
//!
//! The time per copy can drift between rounds, for both sides alike, so the
//! figure reported is paired: the median over rounds of safe / raw within the
//! same round. The ratio of the two sides' overall medians is shown too; it
//! can land the two medians in different modes. The thread stays on one CPU
//! while it measures.

use crate::rawcuda;
use crate::session::Bench;
use crate::util::{Result, Stats, stats};
use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;
use std::time::Instant;
use wirespeed_bench::cpu;
use wirespeed_cuda::{DeviceBuffer, PinnedBuffer, Stream};

pub const COPY_BYTES: usize = 64 << 10;
/// Copies per batch: few enough that the stream's queue never fills (a full
/// queue makes the enqueue wait for the GPU, which is not overhead).
pub const BATCH: usize = 500;

pub struct Overhead {
    pub rounds: usize,
    pub batch: usize,
    /// Microseconds of CPU per copy, per round.
    pub safe_cpu_us: Stats,
    pub raw_cpu_us: Stats,
    /// Raw, with `cudaSetDevice` before each copy.
    pub raw_set_cpu_us: Stats,
    pub safe_wall_us: Stats,
    pub raw_wall_us: Stats,
    /// Per-round overhead in percent (safe over raw CPU time, same round).
    pub round_pct: Stats,
    /// The overhead, in percent: the median of the per-round figures.
    pub pct: f64,
    /// The ratio of the overall medians, in percent (not paired).
    pub medians_pct: f64,
    /// The CPU the measuring thread was kept on, if it could be.
    pub cpu: Option<usize>,
}

/// Keeps the calling thread on the CPU it runs on until dropped, then gives
/// back its former affinity. Does nothing where affinity cannot be set.
struct OnOneCpu {
    former: Option<CpuSet>,
    cpu: Option<usize>,
}

impl OnOneCpu {
    fn here() -> OnOneCpu {
        let me = Pid::from_raw(0);
        let (Ok(former), Ok(cpu)) = (sched_getaffinity(me), sched_getcpu()) else {
            return OnOneCpu { former: None, cpu: None };
        };
        let mut one = CpuSet::new();
        if one.set(cpu).is_err() || sched_setaffinity(me, &one).is_err() {
            return OnOneCpu { former: None, cpu: None };
        }
        OnOneCpu { former: Some(former), cpu: Some(cpu) }
    }
}

impl Drop for OnOneCpu {
    fn drop(&mut self) {
        if let Some(f) = &self.former {
            let _ = sched_setaffinity(Pid::from_raw(0), f);
        }
    }
}

impl Overhead {
    /// The bench's target: at most this many percent more CPU time than raw.
    pub const TARGET_PCT: f64 = 3.0;
    pub fn copies(&self) -> usize {
        self.rounds * self.batch
    }
}

fn safe_batch(stream: &Stream, src: &PinnedBuffer<u8>, dst: &mut DeviceBuffer<u8>, count: usize) -> Result<(f64, f64)> {
    stream.device().synchronize()?;
    let (c0, t0) = (cpu::thread_seconds(), Instant::now());
    for _ in 0..count {
        stream.copy_to_device(src, dst)?.detach();
    }
    let r = (cpu::thread_seconds() - c0, t0.elapsed().as_secs_f64());
    stream.synchronize()?;
    Ok(r)
}

pub fn run(b: &mut Bench) -> Result<Overhead> {
    let dev = b.gpu.device;
    let rounds = if b.opts.quick { 8 } else { 600 };
    let pinned = OnOneCpu::here();
    let mut src = PinnedBuffer::<u8>::new(COPY_BYTES)?;
    crate::data::fill_pattern(src.as_mut_slice()?, 3, 0);
    let mut dsts = [DeviceBuffer::<u8>::new(&dev, COPY_BYTES)?, DeviceBuffer::<u8>::new(&dev, COPY_BYTES)?];
    let streams = [Stream::new(&dev)?, Stream::new(&dev)?];
    // Warm-up: first calls load code and fill caches.
    for (stream, dst) in streams.iter().zip(dsts.iter_mut()) {
        safe_batch(stream, &src, dst, BATCH)?;
        rawcuda::raw_copies(stream, &src, dst, BATCH, false)?;
        rawcuda::raw_copies(stream, &src, dst, BATCH, true)?;
    }
    let per = |x: f64| x * 1e6 / BATCH as f64;
    let (mut sc, mut rc, mut rsc, mut sw, mut rw, mut pct) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for r in 0..rounds {
        b.progress.begin("overhead (cuda-safe vs raw cuda-sys)", r + 1, rounds);
        // Each side takes each stream and destination half the time (a
        // stream's own driver state must not count for or against a side),
        // and each goes first half the time: all four cases equally often.
        let (safe_i, raw_i) = if (r / 2) % 2 == 0 { (0, 1) } else { (1, 0) };
        let [d0, d1] = &mut dsts;
        let (dst_safe, dst_raw) = if safe_i == 0 { (d0, d1) } else { (d1, d0) };
        let (safe_stream, raw_stream) = (&streams[safe_i], &streams[raw_i]);
        let (s, raw) = if r % 2 == 0 {
            let s = safe_batch(safe_stream, &src, dst_safe, BATCH)?;
            (s, rawcuda::raw_copies(raw_stream, &src, dst_raw, BATCH, false)?)
        } else {
            let raw = rawcuda::raw_copies(raw_stream, &src, dst_raw, BATCH, false)?;
            (safe_batch(safe_stream, &src, dst_safe, BATCH)?, raw)
        };
        let raw_set = rawcuda::raw_copies(raw_stream, &src, dst_raw, BATCH, true)?;
        sc.push(per(s.0));
        rc.push(per(raw.0));
        rsc.push(per(raw_set.0));
        sw.push(per(s.1));
        rw.push(per(raw.1));
        pct.push((s.0 / raw.0.max(1e-12) - 1.0) * 100.0);
        b.progress.update((r + 1) as u64, rounds as u64);
    }
    let (safe_cpu_us, raw_cpu_us) = (stats(&sc), stats(&rc));
    let o = Overhead {
        rounds,
        batch: BATCH,
        safe_cpu_us,
        raw_cpu_us,
        raw_set_cpu_us: stats(&rsc),
        safe_wall_us: stats(&sw),
        raw_wall_us: stats(&rw),
        round_pct: stats(&pct),
        pct: stats(&pct).median,
        medians_pct: (safe_cpu_us.median / raw_cpu_us.median.max(1e-12) - 1.0) * 100.0,
        cpu: pinned.cpu,
    };
    drop(pinned);
    b.progress.note(&format!(
        "  overhead           cuda-safe {:.3} us vs raw {:.3} us CPU per 64 KiB copy: {:+.1} % (paired, per round){}",
        o.safe_cpu_us.median,
        o.raw_cpu_us.median,
        o.pct,
        if b.gpu.emulated { "  [emulated]" } else { "" }
    ));
    Ok(o)
}
