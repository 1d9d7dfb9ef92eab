//! `bench`: "why is pinned memory slower?" answered by one command. It
//! measures the line rate, then streams a file to the GPU with every way of
//! feeding it (pageable copies, per-batch pinned allocation, the pinned ring,
//! registered windows, whole-file registration, the hybrid, cold reads, the
//! library's automatic choice) and prints GB/s, the fraction of the line rate,
//! CPU seconds per GB, peak pinned bytes and whether the data arrived intact,
//! with the bench's targets as PASS/MISS lines.
//!
//! ```text
//! cargo run --release -p wirespeed-bench                         # demo file, every strategy
//! cargo run --release -p wirespeed-bench -- my.memmap            # your file
//! cargo run --release -p wirespeed-bench -- --pytorch-rows       # every strategy, and PyTorch's row-by-row copy
//! cargo run -p wirespeed-bench --features emulator -- --emulated --quick   # no GPU needed
//! bench --size 4G --budget 512M --pytorch-rows --out results/   # every target, KvikIO where importable
//! bench --size 40G --budget 4G --only auto --out results-40g/              # the page-cached target at scale
//! bench --only overlap                                                      # streaming overlapped with the caller's work
//! ```
//!
//! `--pytorch-rows`, `--strategy` and `--overhead` add to the default run;
//! `--only` and `--no-cold` narrow it, and the bench says what they leave out
//! before it starts. See `bench --help` for every option.

mod args;
mod checksum;
mod data;
mod gpu;
mod plan;
mod progress;
mod rawcuda;
mod report;
mod results;
mod runs;
mod script;
mod session;
mod summary;
mod targets;
mod util;

use args::Options;
use clap::Parser;
use plan::Plan;
use progress::Progress;
use results::{Kind, Row};
use runs::file::Streamed;
use runs::overlap::Overlap;
use session::Bench;
use std::io::Write;
use std::process::ExitCode;
use summary::{FileInfo, Summary};
use util::{Context, Fatal, MIB, Result, fmt_bytes, round_down};

fn main() -> ExitCode {
    // Bad arguments exit 2 (clap's usage errors), --help and --version 0.
    let opts = Options::parse();
    match run(opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}{e}", if matches!(e, Fatal::NoGpu(_)) { "" } else { "bench: " });
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(opts: Options) -> Result<ExitCode> {
    if let Some(dir) = &opts.out {
        std::fs::create_dir_all(dir).map_err(|e| Fatal::Usage(format!("--out {}: {e}", dir.display())))?;
    }
    data::preflight(&opts)?; // a bad FILE fails before any measurement
    let progress = Progress::new();
    let gpu = gpu::select(&opts)?;
    if gpu.emulated {
        progress.note(&format!("*** {} ***", summary::EMULATED));
    }
    progress.note(&gpu.describe());
    progress.note(&gpu.host);
    let plan = Plan::new(&opts, opts.threads());
    for line in plan.statement(&opts) {
        progress.note(&line);
    }
    let mut b = Bench::new(&opts, gpu, progress.clone())?;

    let line = runs::line_rate::line_rate(&mut b)?;
    let (streamed, file) = stream_file(&mut b, &plan)?;
    let pytorch_rows = if plan.pytorch_rows { runs::rows::run(&mut b)? } else { Vec::new() };
    let torch = plan.pytorch_rows.then(|| runs::rows::torch(&b, runs::rows::row_count(opts.quick)));
    let overhead = if plan.overhead { Some(runs::overhead::run(&mut b)?) } else { None };

    let Streamed { rows, overlap, kvikio, .. } = streamed;
    let summary = Summary {
        gpu: &b.gpu,
        opts: &opts,
        threads: b.threads,
        reps: b.reps,
        target_reps: b.target_reps,
        line_rate: b.line_rate,
        line: &line,
        file: Some(file),
        rows: &rows,
        pytorch_rows: &pytorch_rows,
        overhead: overhead.as_ref(),
        overlap: overlap.as_ref(),
        torch: torch.as_ref(),
        kvikio: kvikio.as_ref(),
    };
    write(&summary, &progress)?;
    // Another tool's failure (KvikIO's) is shown, not counted.
    let all = std::iter::once(&line).chain(&rows).chain(&pytorch_rows).filter(|r| r.kind != Kind::External);
    Ok(exit_status(all, overlap.as_ref()))
}

/// Writes the demo file (or opens FILE) and runs the plan's runs of it; the
/// demo file is removed when this returns.
fn stream_file(b: &mut Bench, plan: &Plan) -> Result<(Streamed, FileInfo)> {
    let data = data::prepare(&b.opts, b.threads, &b.progress)?;
    let budget = b.opts.budget.unwrap_or_else(|| round_down(data.len / 8, MIB));
    b.progress.note(&format!(
        "pin budget {} (the file, {}, is {:.1}x the budget)",
        fmt_bytes(budget),
        fmt_bytes(data.len),
        data.len as f64 / budget as f64
    ));
    let streamed = runs::file::stream_all(b, &data, budget, &plan.file)?;
    let file = FileInfo {
        path: data.path.display().to_string(),
        bytes: data.len,
        demo: data.demo,
        checksum: data.checksum,
        budget,
        destination: streamed.destination.clone(),
        notes: data.notes.clone(),
        mem: data.mem,
    };
    Ok((streamed, file))
}

/// The report on stdout (with `--json`, the JSON there and the report on
/// stderr), and with `--out` the files in its folder.
fn write(summary: &Summary, progress: &Progress) -> Result<()> {
    // A closed stdout or stderr (`bench | head`) is not an error worth a panic.
    let text = report::text::text(summary);
    if summary.opts.json {
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
        let _ = std::io::stdout().lock().write_all(report::json::json(summary).as_bytes());
    } else {
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
    }
    let Some(dir) = &summary.opts.out else { return Ok(()) };
    let log = format!("{}{text}", progress.log());
    for (name, body) in [
        ("results.json", report::json::json(summary)),
        ("results.csv", report::csv::csv(summary)?),
        ("chart.svg", report::svg::svg(summary)),
        ("log.txt", log),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, body).context(|| format!("writing {}", p.display()))?;
    }
    eprintln!("wrote results.json, results.csv, chart.svg and log.txt to {}", dir.display());
    Ok(())
}

/// 0 when every run finished and its data arrived intact, else 1 (and
/// which did not, on stderr).
fn exit_status<'a>(rows: impl Iterator<Item = &'a Row>, overlap: Option<&Overlap>) -> ExitCode {
    let mut failed: Vec<&str> =
        rows.filter(|r| r.error.is_some() || r.intact.as_bool() == Some(false)).map(|r| r.name.as_str()).collect();
    if overlap.is_some_and(|o| o.error.is_some() || o.intact.as_bool() == Some(false)) {
        failed.push("overlap");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("bench: {} run(s) failed or delivered damaged data: {}", failed.len(), failed.join(", "));
        ExitCode::from(1)
    }
}
