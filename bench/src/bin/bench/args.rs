//! Command-line options.

use crate::util::GIB;
use clap::Parser;
use std::path::PathBuf;
use wirespeed_bench::{parse_count, parse_size};

const ABOUT: &str = "Which way of feeding the GPU from host memory is fast, by how much, and why.";

const LONG_ABOUT: &str = "\
Which way of feeding the GPU from host memory is fast, by how much, and why.

With no FILE it writes a demo file (4 GiB, less when disk or RAM are short) in the temporary \
folder, streams it to GPU 0 with every strategy, and removes it. With FILE (any size, e.g. your \
own np.memmap) it streams that file instead; it is mapped, so it must not be written or \
truncated while the bench runs. The line rate and the safe-layer overhead are measured too.

--pytorch-rows, --strategy and --overhead add to that run; --only and --no-cold narrow it, and \
--quick makes it small: the bench then says what it runs and what it leaves out before it starts.";

const AFTER_HELP: &str = "The strategies (--only), the environment and the exit status: see --help.";

const AFTER_LONG_HELP: &str = "\
STRATEGIES (--only):
    pageable          cudaMemcpy straight from the file mapping, 64 MiB chunks
    per-batch-pinned  cudaHostAlloc + memcpy + copy + cudaFreeHost per 64 MiB chunk
    ring-T            pinned ring, allocated once, T filler threads (T = 1, 4, 8, --threads),
                      slots sized from the budget (2 per thread, up to 64 MiB)
    ring-cache        the cache-sized ring: 32 slots of 4 MiB, 8 threads (128 MiB pinned)
    windows           sliding windows of the mapping, registered in place, 3 in flight
    hybrid            registered windows and the pinned ring together
    whole-file        the whole file registered once (ignores the pin budget)
    auto              the library's automatic choice within the pin budget
    budget-reuse      data within the pin budget: registered once, copied again
    overlap           batches of the file streamed into an arena the caller owns while the caller's
                      own stream copies each landed batch (device to device, k times, k calibrated
                      to take as long as the streaming): wall of both against each alone
    kvikio-hot        KvikIO (compatibility mode) reads the page-cached file into a torch CUDA
                      tensor: the best of a small sweep (bench/kvikio_read.py; needs kvikio, torch)
    kvikio-cold       the same with the page cache dropped before each read
    disk-direct       parallel O_DIRECT reads of the file, no GPU: what the disk gives (the best
                      of 1, 4, 8 and 16 threads)
    cold-auto         page cache dropped (POSIX_FADV_DONTNEED) before each run, then auto
    cold-direct       page cache dropped, O_DIRECT reads into pinned slots
    (the line rate, a resident pinned buffer copied with cudaMemcpyAsync, is always measured)

REPETITIONS:
    Every run is repeated --reps times (default 3) and its median shown with the min-max; the
    target rows, auto and ring-cache, at least 5 times (unless --quick).

ENVIRONMENT:
    CUDA_SYS_RUNTIME  path of the libcudart.so to load (else libcudart.so.13, .so.12, .so)
    TMPDIR            where the demo file goes

EXIT STATUS:
    0 every run finished and every copy arrived intact; 1 a run failed or data arrived
    damaged (KvikIO's own rows do not count); 2 bad arguments or no usable GPU.
    The targets' PASS/MISS lines do not change it.";

/// Repetitions the targets ask of their rows (a median of at least 5).
pub const TARGET_REPS: usize = 5;

/// Every strategy name, in the order the runs happen.
pub const STRATEGY_FAMILIES: &[&str] = &[
    "pageable",
    "per-batch-pinned",
    "ring",
    "ring-cache",
    "windows",
    "hybrid",
    "whole-file",
    "auto",
    "new-map",
    "one-shot",
    "budget-reuse",
    "overlap",
    "kvikio-hot",
    "kvikio-cold",
    "disk-direct",
    "cold-auto",
    "cold-direct",
];

/// The strategies `--only` selected (lower case, checked against [`STRATEGY_FAMILIES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Only(pub Vec<String>);

fn parse_only(v: &str) -> Result<Only, String> {
    let list: Vec<String> = v.split(',').map(|x| x.trim().to_ascii_lowercase()).filter(|x| !x.is_empty()).collect();
    if list.is_empty() {
        return Err("needs at least one strategy name".into());
    }
    for n in &list {
        let ok = STRATEGY_FAMILIES.iter().any(|f| f == n || f.starts_with(&format!("{n}-")))
            || n.strip_prefix("ring-").is_some_and(|t| t.parse::<usize>().is_ok_and(|t| t >= 1))
            || n == "cold";
        if !ok {
            return Err(format!(
                "unknown strategy {n:?}; known: {}, ring-T (T threads), cold",
                STRATEGY_FAMILIES.join(", ")
            ));
        }
    }
    Ok(Only(list))
}

fn parse_demo_size(v: &str) -> Result<u64, String> {
    match parse_size(v)? {
        0 => Err("must be more than 0".into()),
        s if s > 64 * 1024 * GIB => Err("more than 64 TiB is surely a typo".into()),
        s => Ok(s),
    }
}

/// `THREADS,SLOT,PER_THREAD` for the ring-cache row, e.g. `8,4M,4`.
fn parse_ring_cache(v: &str) -> Result<(usize, usize, usize), String> {
    let parts: Vec<&str> = v.split(',').collect();
    let [t, s, k] = parts[..] else { return Err("give THREADS,SLOT,SLOTS_PER_THREAD, e.g. 8,4M,4".into()) };
    let threads: usize = t.trim().parse().map_err(|e| format!("threads: {e}"))?;
    let slot = parse_size(s)?;
    let per: usize = k.trim().parse().map_err(|e| format!("slots per thread: {e}"))?;
    if !(1..=1024).contains(&threads) || !(1..=64).contains(&per) || !(4096..=(1 << 30)).contains(&slot) {
        return Err("threads 1-1024, slot 4 KiB-1 GiB, slots per thread 1-64".into());
    }
    Ok((threads, slot as usize, per))
}

/// A row given with `--strategy`: the strategy, and the streams its copies go
/// on (`StreamConfig::copy_streams`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Custom {
    pub strategy: wirespeed_pinned::Strategy,
    pub copy_streams: wirespeed_pinned::CopyStreams,
    /// Run with the page cache dropped before each repetition, after the cold rows.
    pub cold: bool,
    /// Stream the file as transfers of this many bytes (`Streamer::start`),
    /// started as the [`SpanMode`] says.
    pub spans: Option<(u64, SpanMode)>,
    /// `StreamConfig::reserve_threads` (auto only; else the default).
    pub reserve: Option<usize>,
    /// `StreamConfig::read_ahead` (else the default, none).
    pub ahead: Option<std::time::Duration>,
}

/// How the transfers of `/spans=SIZE` start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanMode {
    /// All at once: the streamer runs them as one pass.
    Queued,
    /// Each waited for before the next starts.
    Wait,
    /// Each ordered before a stream of the caller's (`Transfer::then_on`,
    /// which returns once its last copy is enqueued) before the next starts:
    /// as a loop of Python `read_into` calls runs them.
    Then,
}

/// A strategy spelled out: `hybrid:WINDOW,SLOT,THREADS`, `ring:SLOTS,SLOT,THREADS`,
/// `windows:WINDOW,IN_FLIGHT`, `direct:SLOTS,SLOT,THREADS` (sizes with K/M/G) or
/// `auto`, each optionally followed by `/streams=one|ring|thread` (see `CopyStreams`), then
/// `/spans=SIZE`, `/spans=SIZE,wait` or `/spans=SIZE,then` (transfers of SIZE bytes, queued
/// at once or one at a time: see [`SpanMode`]) and then `/cold` (the page cache dropped before
/// each repetition); `auto` may also end in `/reserve=N` (`StreamConfig::reserve_threads`).
/// Any may end in `/ahead=MSms` (`StreamConfig::read_ahead`, in milliseconds).
fn parse_strategy(v: &str) -> Result<Custom, String> {
    use wirespeed_pinned::{CopyStreams, Strategy};
    let (v, ahead) = match v.rsplit_once("/ahead=") {
        Some((rest, ms)) => {
            let n = ms.strip_suffix("ms").ok_or_else(|| format!("ahead={ms}: give milliseconds, as 5ms"))?;
            let n = n.parse::<f64>().map_err(|e| format!("ahead={ms}: {e}"))?;
            let d = std::time::Duration::try_from_secs_f64(n / 1e3).map_err(|e| format!("ahead={ms}: {e}"))?;
            (rest, Some(d))
        }
        None => (v, None),
    };
    let (v, reserve) = match v.rsplit_once("/reserve=") {
        Some((rest, n)) => (rest, Some(n.parse::<usize>().map_err(|e| format!("reserve={n}: {e}"))?)),
        None => (v, None),
    };
    let (v, cold) = match v.strip_suffix("/cold") {
        Some(rest) => (rest, true),
        None => (v, false),
    };
    let (v, spans) = match v.split_once("/spans=") {
        Some((rest, spec)) => {
            let (size, mode) = match (spec.strip_suffix(",wait"), spec.strip_suffix(",then")) {
                (Some(size), _) => (size, SpanMode::Wait),
                (_, Some(size)) => (size, SpanMode::Then),
                _ => (spec, SpanMode::Queued),
            };
            match parse_size(size)? {
                0 => return Err(format!("{spec}: a span must hold at least one byte")),
                n => (rest, Some((n, mode))),
            }
        }
        None => (v, None),
    };
    let (spec, copy_streams) = match v.split_once("/streams=") {
        Some((spec, "one")) => (spec, CopyStreams::One),
        Some((spec, "ring")) => (spec, CopyStreams::RingApart),
        Some((spec, "thread")) => (spec, CopyStreams::PerThread),
        Some((_, other)) => return Err(format!("{v}: streams={other}: give one, ring or thread")),
        None => (v, CopyStreams::default()),
    };
    if spec == "auto" {
        return Ok(Custom { strategy: Strategy::Auto, copy_streams, cold, spans, reserve, ahead });
    }
    if reserve.is_some() {
        return Err(format!("{v}: /reserve= is for auto (a strategy given explicitly runs exactly its threads)"));
    }
    let (kind, args) = spec.split_once(':').ok_or("give KIND:ARGS, e.g. hybrid:112M,4M,4")?;
    let a: Vec<&str> = args.split(',').map(str::trim).collect();
    let size = |s: &str| parse_size(s).map(|x| x as usize);
    let count = |s: &str| s.parse::<usize>().map_err(|e| format!("{s}: {e}"));
    let s = match (kind, &a[..]) {
        ("hybrid", [w, s, t]) => Strategy::Hybrid { window: size(w)?, slot: size(s)?, threads: count(t)? },
        ("ring", [n, s, t]) => Strategy::Ring { slots: count(n)?, slot: size(s)?, threads: count(t)? },
        ("direct", [n, s, t]) => Strategy::Direct { slots: count(n)?, slot: size(s)?, threads: count(t)? },
        ("windows", [w, k]) => Strategy::Windows { window: size(w)?, in_flight: count(k)? },
        _ => {
            return Err(format!(
                "{v}: not one of hybrid:W,SLOT,T ring:N,SLOT,T direct:N,SLOT,T windows:W,K auto (each may end in /streams=one|ring|thread, then /spans=SIZE[,wait|,then], then /cold)"
            ));
        }
    };
    Ok(Custom { strategy: s, copy_streams, cold, spans, reserve: None, ahead })
}

fn parse_budget(v: &str) -> Result<u64, String> {
    match parse_size(v)? {
        s if s < 4096 => Err("must be at least 4 KiB".into()),
        s => Ok(s),
    }
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    after_long_help = AFTER_LONG_HELP
)]
pub struct Options {
    /// The file to stream (default: a demo file, written and removed)
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,

    /// Demo file size: 4G, 512M, 1.5GiB, 65536 (K/M/G/T are powers of 1024)
    #[arg(long, value_name = "BYTES", value_parser = parse_demo_size, conflicts_with = "file")]
    pub size: Option<u64>,

    /// Pin budget (default: file size / 8, so that the default run measures the target for a
    /// file 8x the budget)
    #[arg(long, value_name = "BYTES", value_parser = parse_budget)]
    pub budget: Option<u64>,

    /// Repetitions per strategy; the median is reported, min-max shown (default 3, 1 with --quick;
    /// the target rows, auto and ring-cache, at least 5 unless --quick)
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub reps: Option<usize>,

    /// The ring-cache row's shape: THREADS,SLOT,SLOTS_PER_THREAD (default 8,4M,4: 128 MiB pinned)
    #[arg(long, value_name = "T,SLOT,K", value_parser = parse_ring_cache, default_value = "8,4M,4")]
    pub ring_cache: (usize, usize, usize),

    /// Extra rows, each a strategy spelled out (hybrid:WINDOW,SLOT,THREADS, ring:SLOTS,SLOT,THREADS,
    /// windows:WINDOW,IN_FLIGHT, direct:SLOTS,SLOT,THREADS), run within the pin budget as
    /// `custom-1`, `custom-2`, ... after the others: for trying what `auto` could pick. `auto` and
    /// a `/streams=one|ring|thread` suffix (the streams the copies go on: the streamer's, a second
    /// one for the ring threads, one per ring thread), then `/spans=SIZE` (the file as transfers of
    /// SIZE bytes, all started at once: the streamer runs them as one pass), `/spans=SIZE,wait`
    /// (each waited for before the next starts) or `/spans=SIZE,then` (each ordered before a
    /// stream, waiting until its last copy is enqueued, before the next starts: as a loop of
    /// Python `read_into` calls) and then `/cold` (the page cache dropped before
    /// each repetition; such rows run after the cold rows) are accepted too; `auto` may end in
    /// `/reserve=N` (ring threads auto's hybrid keeps in reserve; default 1, 0 for none), and any
    /// in `/ahead=MSms` (how long a ring pass reads ahead for the next transfer)
    #[arg(long = "strategy", value_name = "KIND:ARGS", value_parser = parse_strategy)]
    pub custom: Vec<Custom>,

    /// Most filler threads for the pinned ring (default: the number of cores; at most 1024)
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub threads: Option<usize>,

    /// Run only these strategies of the file (named in --help; a family name such as `ring` or
    /// `cold` selects all its members); the safe-layer overhead is then left out unless --overhead
    /// is given. The bench says what this leaves out before it starts
    #[arg(long, value_name = "A,B,...", value_parser = parse_only)]
    pub only: Option<Only>,

    /// Add PyTorch's row-by-row copy to the run: 1024 rows of 2.5 MiB to the GPU one at a time, a
    /// fresh pinned buffer per row vs pageable vs pinned once; with PyTorch's own rows where torch
    /// is importable
    #[arg(long)]
    pub pytorch_rows: bool,

    /// Threads that copy rows into the shared pinned ring in --pytorch-rows (the rows-ring-mt row)
    #[arg(long, value_name = "N", value_parser = parse_count, default_value_t = 8)]
    pub row_threads: usize,

    /// The safe-layer overhead microbenchmark (cuda-safe vs raw cuda-sys, CPU time per 64 KiB
    /// async copy): in the run even when --only narrows it (the default run has it anyway)
    #[arg(long)]
    pub overhead: bool,

    /// Use the emulated CUDA runtime (needs a build with `--features emulator`)
    #[arg(long)]
    pub emulated: bool,

    /// Write results.json, results.csv, chart.svg and log.txt (the progress lines and the report) into DIR
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Print the results as JSON on stdout (the tables then go to stderr)
    #[arg(long)]
    pub json: bool,

    /// Small sizes and 1 repetition (CI, the emulator)
    #[arg(long)]
    pub quick: bool,

    /// Skip the cold-read runs (kvikio-cold too) and the O_DIRECT disk measurement (the bench says
    /// so before it starts)
    #[arg(long)]
    pub no_cold: bool,
}

impl Options {
    /// Repetitions: --reps, else 1 with --quick, else 3.
    pub fn reps(&self) -> usize {
        self.reps.unwrap_or(if self.quick { 1 } else { 3 })
    }

    /// Repetitions of the target rows (auto, ring-cache): at least 5 unless --quick.
    pub fn target_reps(&self) -> usize {
        if self.quick { self.reps() } else { self.reps().max(TARGET_REPS) }
    }

    /// Filler threads: --threads (at most 1024), else the cores.
    pub fn threads(&self) -> usize {
        self.threads.map_or_else(crate::util::cores, |t| t.min(1024))
    }

    /// Whether strategy `name` (e.g. "ring-4") was selected.
    pub fn selected(&self, name: &str) -> bool {
        self.left_out_by(name).is_none()
    }

    /// The option that leaves strategy `name` out of the run (`--no-cold`
    /// or `--only`), if one does.
    pub fn left_out_by(&self, name: &str) -> Option<&'static str> {
        if self.no_cold && (name.starts_with("cold") || name == "disk-direct" || name == "kvikio-cold") {
            return Some("--no-cold");
        }
        match &self.only {
            Some(Only(list))
                if !list
                    .iter()
                    .any(|o| o == name || name.strip_prefix(o.as_str()).is_some_and(|rest| rest.starts_with('-'))) =>
            {
                Some("--only")
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn auto_takes_a_reserve_suffix_and_explicit_strategies_refuse_it() {
        let c = super::parse_strategy("auto/streams=ring/reserve=0").unwrap();
        assert_eq!((c.strategy, c.reserve), (wirespeed_pinned::Strategy::Auto, Some(0)));
        assert_eq!(c.copy_streams, wirespeed_pinned::CopyStreams::RingApart);
        assert_eq!(super::parse_strategy("auto/cold/reserve=2").unwrap().reserve, Some(2));
        assert_eq!(super::parse_strategy("auto").unwrap().reserve, None);
        let c = super::parse_strategy("auto/spans=64M,then/ahead=5ms").unwrap();
        assert_eq!(
            (c.spans, c.ahead),
            (Some((64 << 20, super::SpanMode::Then)), Some(std::time::Duration::from_millis(5)))
        );
        assert_eq!(
            super::parse_strategy("ring:8,4M,2/ahead=0.5ms").unwrap().ahead,
            Some(std::time::Duration::from_micros(500))
        );
        assert!(super::parse_strategy("auto/ahead=5").is_err());
        assert!(super::parse_strategy("hybrid:64M,4M,4/reserve=1").unwrap_err().contains("for auto"));
        assert!(super::parse_strategy("auto/reserve=x").is_err());
    }

    use super::*;
    use clap::CommandFactory;

    fn p(a: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("bench").chain(a.iter().copied()))
    }

    #[test]
    fn command() {
        Options::command().debug_assert();
    }

    #[test]
    fn options() {
        let o = p(&["--size", "1G", "--reps=5", "--only", "ring,auto"]).unwrap();
        assert_eq!(o.size, Some(GIB));
        assert_eq!(o.reps(), 5);
        assert!(o.selected("ring-4") && o.selected("auto") && !o.selected("windows"));
        assert!(o.selected("ring-cache") && !o.selected("kvikio-hot"));
        let o = p(&["--only", "ring-cache,kvikio", "--reps", "2"]).unwrap();
        assert!(o.selected("ring-cache") && !o.selected("ring-4") && o.selected("kvikio-cold"));
        assert_eq!((o.reps(), o.target_reps()), (2, 5));
        assert_eq!(p(&["--quick"]).unwrap().target_reps(), 1);
        assert_eq!(p(&["--reps", "7"]).unwrap().target_reps(), 7);
        assert_eq!(p(&[]).unwrap().row_threads, 8);
        assert!(p(&["--row-threads", "0"]).is_err());
        assert!(p(&["--size", "1G", "data.bin"]).is_err());
        let o = p(&["f.bin", "--only=Cold,"]).unwrap();
        assert!(o.selected("cold-auto") && o.selected("cold-direct") && !o.selected("auto"));
        assert!(p(&["--only", "nope"]).is_err());
        assert!(p(&["--only", ","]).is_err());
        assert!(p(&["--reps", "0"]).is_err());
        assert!(p(&["--size", "0"]).is_err());
        assert!(p(&["--size", "65T"]).is_err());
        assert!(p(&["--budget", "4000"]).is_err());
        assert!(p(&["--size"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
        assert!(p(&["a", "b"]).is_err());
        assert!(p(&["--json=1"]).is_err());
        assert_eq!(p(&["-h"]).unwrap_err().kind(), clap::error::ErrorKind::DisplayHelp);
        assert_eq!(p(&["--threads", "5000"]).unwrap().threads(), 1024);
        let o = p(&["--quick", "--no-cold"]).unwrap();
        assert_eq!(o.reps(), 1);
        assert!(!o.selected("cold-direct") && !o.selected("disk-direct") && o.selected("pageable"));
        assert!(!o.selected("kvikio-cold") && o.selected("kvikio-hot"));
        let o = p(&["--only", "auto", "--no-cold"]).unwrap();
        assert_eq!(
            (o.left_out_by("cold-auto"), o.left_out_by("pageable"), o.left_out_by("auto")),
            (Some("--no-cold"), Some("--only"), None)
        );
    }
}
