//! What a run of the bench measures, in order: the line rate always, then
//! the file's rows, the PyTorch rows and the safe-layer overhead, as the
//! options select them.

use crate::args::Options;

/// One run of the file, in the order they happen (the cold ones last: they
/// empty the page cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRun {
    Pageable,
    PerBatchPinned,
    /// One of the library's strategies.
    Library(Lib),
    Overlap,
    /// KvikIO's script, run once for its hot and/or its cold row.
    Kvikio {
        hot: bool,
        cold: bool,
    },
    DiskDirect,
}

/// A row of the library streaming the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// The pinned ring with this many filler threads (`ring-T`).
    Ring(usize),
    RingCache,
    Windows,
    Hybrid,
    WholeFile,
    Auto,
    NewMap,
    OneShot,
    /// `--strategy` number `i` (from 0): the row `custom-{i + 1}`.
    Custom(usize),
    BudgetReuse,
    ColdAuto,
    ColdDirect,
}

impl Lib {
    /// The row's name, as `--only` knows it.
    pub fn name(self) -> String {
        let name = match self {
            Lib::Ring(t) => return format!("ring-{t}"),
            Lib::Custom(i) => return format!("custom-{}", i + 1),
            Lib::RingCache => "ring-cache",
            Lib::Windows => "windows",
            Lib::Hybrid => "hybrid",
            Lib::WholeFile => "whole-file",
            Lib::Auto => "auto",
            Lib::NewMap => "new-map",
            Lib::OneShot => "one-shot",
            Lib::BudgetReuse => "budget-reuse",
            Lib::ColdAuto => "cold-auto",
            Lib::ColdDirect => "cold-direct",
        };
        name.to_string()
    }
}

impl FileRun {
    /// The names of its rows, as `--only` knows them.
    pub fn names(self) -> Vec<String> {
        let name = match self {
            FileRun::Pageable => "pageable",
            FileRun::PerBatchPinned => "per-batch-pinned",
            FileRun::Library(lib) => return vec![lib.name()],
            FileRun::Overlap => "overlap",
            FileRun::Kvikio { hot, cold } => {
                let both = [("kvikio-hot", hot), ("kvikio-cold", cold)];
                return both.into_iter().filter(|(_, on)| *on).map(|(n, _)| n.to_string()).collect();
            }
            FileRun::DiskDirect => "disk-direct",
        };
        vec![name.to_string()]
    }
}

/// Ring filler-thread counts: 1, 4, 8 and the maximum, up to the maximum.
pub fn ring_threads(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 4, 8].into_iter().filter(|&t| t < max).collect();
    v.push(max);
    v
}

/// A place in the order of the file's runs: one that `--only` can name, or
/// the `--strategy` rows (the warm ones after the library's warm runs, the
/// cold ones after the cold runs).
enum Step {
    Run(FileRun),
    Customs { cold: bool },
}

/// Every place in the order, with up to `threads` ring filler threads.
fn every(threads: usize) -> Vec<Step> {
    let lib = |l: Lib| Step::Run(FileRun::Library(l));
    let mut v = vec![Step::Run(FileRun::Pageable), Step::Run(FileRun::PerBatchPinned)];
    v.extend(ring_threads(threads).into_iter().map(|t| lib(Lib::Ring(t))));
    let warm = [Lib::RingCache, Lib::Windows, Lib::Hybrid, Lib::WholeFile, Lib::Auto, Lib::NewMap, Lib::OneShot];
    v.extend(warm.map(lib));
    v.push(Step::Customs { cold: false });
    v.extend([lib(Lib::BudgetReuse), Step::Run(FileRun::Overlap)]);
    v.push(Step::Run(FileRun::Kvikio { hot: true, cold: true }));
    v.extend([Step::Run(FileRun::DiskDirect), lib(Lib::ColdAuto), lib(Lib::ColdDirect)]);
    v.push(Step::Customs { cold: true });
    v
}

/// What this run measures beside the line rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The file's runs, in order (none: the file is not streamed).
    pub file: Vec<FileRun>,
    /// PyTorch's row-by-row copy (`--pytorch-rows`).
    pub pytorch_rows: bool,
    /// The safe-layer overhead microbenchmark.
    pub overhead: bool,
}

impl Plan {
    /// The plan `opts` ask for, with up to `threads` ring filler threads.
    pub fn new(opts: &Options, threads: usize) -> Plan {
        let mut file = Vec::new();
        if opts.streams() {
            for step in every(threads) {
                match step {
                    Step::Customs { cold } => {
                        let mine = opts.custom.iter().enumerate().filter(|(_, c)| c.cold == cold);
                        file.extend(mine.map(|(i, _)| FileRun::Library(Lib::Custom(i))));
                    }
                    Step::Run(FileRun::Kvikio { .. }) => {
                        let (hot, cold) = (opts.selected("kvikio-hot"), opts.selected("kvikio-cold"));
                        if hot || cold {
                            file.push(FileRun::Kvikio { hot, cold });
                        }
                    }
                    Step::Run(run) if run.names().iter().all(|n| opts.selected(n)) => file.push(run),
                    Step::Run(_) => {}
                }
            }
        }
        let overhead = opts.overhead || (!opts.pytorch_rows && opts.only.is_none());
        Plan { file, pytorch_rows: opts.pytorch_rows, overhead }
    }
}
