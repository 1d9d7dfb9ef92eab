//! What every run shares (the device, its stream, the options, the progress
//! lines, the readback) and how a run is timed, settled and announced.

use crate::args::Options;
use crate::checksum::Readback;
use crate::gpu::Gpu;
use crate::progress::Progress;
use crate::results::{Kind, Row, Sample};
use crate::util::{Fatal, MIB, Result};
use std::sync::Arc;
use std::time::Instant;
use wirespeed_bench::cpu;
use wirespeed_cuda::Stream;

/// What every run shares.
pub struct Bench {
    pub opts: Options,
    pub gpu: Gpu,
    pub stream: Stream,
    pub progress: Arc<Progress>,
    /// Most filler threads (--threads, default the cores).
    pub threads: usize,
    pub reps: usize,
    /// Repetitions of the target rows (auto, ring-cache).
    pub target_reps: usize,
    pub readback: Readback,
    /// GB/s of the line-rate run of this process.
    pub line_rate: f64,
}

impl Bench {
    /// What the runs of `opts` on `gpu` share: the stream they copy on, the
    /// readback of what arrived, their threads and repetitions.
    pub fn new(opts: &Options, gpu: Gpu, progress: Arc<Progress>) -> Result<Bench> {
        let threads = opts.threads();
        let stream = Stream::new(&gpu.device)?;
        let readback_bytes = if opts.quick { 64 * MIB } else { 256 * MIB } as usize;
        let readback = Readback::new(&stream, readback_bytes, threads)?;
        Ok(Bench {
            opts: opts.clone(),
            gpu,
            stream,
            progress,
            threads,
            reps: opts.reps(),
            target_reps: opts.target_reps(),
            readback,
            line_rate: 0.0,
        })
    }

    /// A repetition's progress line: its GB/s, fraction of the line rate
    /// and CPU seconds per GB, then `extra`.
    pub fn label(&self, row: &Row, s: &Sample, reps: usize, extra: &str) -> String {
        let gbps = row.bytes as f64 / s.seconds.max(1e-12) / 1e9;
        let frac =
            if self.line_rate > 0.0 { format!(", {:.2} of line rate", gbps / self.line_rate) } else { String::new() };
        format!(
            "{} rep {}/{}: {gbps:.2} GB/s{frac}, {:.3} CPU s/GB{extra}{}",
            row.name,
            row.samples.len(),
            reps,
            s.cpu_seconds / (row.bytes as f64 / 1e9),
            if self.gpu.emulated { " [emulated]" } else { "" }
        )
    }

    pub fn sample_done(&self, row: &mut Row, s: Sample, reps: usize) {
        self.sample_done_with(row, s, reps, "");
    }

    /// As `sample_done`, with `extra` after the repetition's numbers.
    pub fn sample_done_with(&self, row: &mut Row, s: Sample, reps: usize, extra: &str) {
        row.samples.push(s);
        self.progress.rep_done(&self.label(row, &s, reps, extra), reps);
    }

    pub fn finished(&self, row: &Row) {
        let msg = if let Some(e) = &row.error {
            format!("  {:<18} FAILED: {e}", row.name)
        } else if let Some(s) = &row.skipped {
            format!("  {:<18} skipped: {s}", row.name)
        } else {
            let g = row.gbps();
            let frac = if self.line_rate > 0.0 && row.kind != Kind::Disk {
                let f = row.fractions(self.line_rate);
                if row.samples.len() > 1 {
                    format!(" = {:.2} x line rate ({:.2}-{:.2})", f.median, f.min, f.max)
                } else {
                    format!(" = {:.2} x line rate", f.median)
                }
            } else {
                String::new()
            };
            format!(
                "  {:<18} {:8.2} GB/s{frac}, {:.3} CPU s/GB, intact: {}{}",
                row.name,
                g.median,
                row.cpu_per_gb(),
                row.intact.short(),
                if self.gpu.emulated { "  [emulated]" } else { "" }
            )
        };
        self.progress.note(&msg);
    }
}

/// Times `f` (wall and process CPU).
pub fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Sample)> {
    let (c0, t0) = (cpu::process_seconds(), Instant::now());
    let v = f()?;
    Ok((v, Sample { seconds: t0.elapsed().as_secs_f64(), cpu_seconds: cpu::process_seconds() - c0 }))
}

/// Turns a failure into the row's error, unless the CUDA context is gone.
pub fn settle(mut row: Row, r: Result<()>) -> Result<Row> {
    if let Err(e) = r {
        let msg = e.to_string();
        if msg.contains("sticky") || msg.contains("context is lost") {
            return Err(Fatal::Run(format!("{}: {msg} (the CUDA context is lost: stopping)", row.name)));
        }
        row.error = Some(msg);
    }
    Ok(row)
}
