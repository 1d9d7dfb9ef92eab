//! What a run of the bench measures, in order: the line rate always, then
//! the file's rows, the PyTorch rows and the safe-layer overhead, as the
//! options select them; and what the options leave out of the default run,
//! said before the run starts.

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
///
/// The default run streams the file with every strategy and measures the
/// safe-layer overhead. `--pytorch-rows`, `--strategy` and `--overhead` add
/// to it; `--only` and `--no-cold` narrow it, and [`Plan::statement`] says
/// what they leave out.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The file's runs, in order.
    pub file: Vec<FileRun>,
    /// PyTorch's row-by-row copy (`--pytorch-rows`).
    pub pytorch_rows: bool,
    /// The safe-layer overhead microbenchmark.
    pub overhead: bool,
    /// What the options leave out of the default run: each row's name, and
    /// the option that leaves it out.
    pub left_out: Vec<(String, &'static str)>,
}

impl Plan {
    /// The plan `opts` ask for, with up to `threads` ring filler threads.
    pub fn new(opts: &Options, threads: usize) -> Plan {
        let mut file = Vec::new();
        let mut left_out = Vec::new();
        for step in every(threads) {
            match step {
                Step::Customs { cold } => {
                    let mine = opts.custom.iter().enumerate().filter(|(_, c)| c.cold == cold);
                    file.extend(mine.map(|(i, _)| FileRun::Library(Lib::Custom(i))));
                }
                Step::Run(run) => {
                    let names = run.names();
                    left_out.extend(names.iter().filter_map(|n| Some((n.clone(), opts.left_out_by(n)?))));
                    let kept = |n: &str| opts.selected(n);
                    match run {
                        FileRun::Kvikio { .. } => {
                            let (hot, cold) = (kept("kvikio-hot"), kept("kvikio-cold"));
                            if hot || cold {
                                file.push(FileRun::Kvikio { hot, cold });
                            }
                        }
                        run if names.iter().all(|n| kept(n)) => file.push(run),
                        _ => {}
                    }
                }
            }
        }
        let overhead = opts.overhead || opts.only.is_none();
        if !overhead {
            left_out.push((OVERHEAD.to_string(), "--only"));
        }
        Plan { file, pytorch_rows: opts.pytorch_rows, overhead, left_out }
    }

    /// What this run measures and what it leaves out, a line each, where
    /// an option narrows the default run (`--only`, `--no-cold`) or makes it
    /// small (`--quick`); nothing for a run that only adds to it.
    pub fn statement(&self, opts: &Options) -> Vec<String> {
        if self.left_out.is_empty() && !opts.quick {
            return Vec::new();
        }
        let mut runs = vec!["the line rate".to_string()];
        let names: Vec<String> = self.file.iter().flat_map(|r| r.names()).collect();
        runs.push(if names.is_empty() {
            "no run of the file".into()
        } else {
            format!("the file with {}", names.join(", "))
        });
        if self.pytorch_rows {
            runs.push("PyTorch's row-by-row copy".into());
        }
        if self.overhead {
            runs.push(OVERHEAD.into());
        }
        let mut lines = vec![format!("this run: {}", runs.join("; "))];
        for (option, what) in [("--only", opts.only.as_ref().map(|o| o.0.join(","))), ("--no-cold", None)] {
            let out: Vec<&str> =
                self.left_out.iter().filter(|(_, by)| *by == option).map(|(n, _)| n.as_str()).collect();
            if !out.is_empty() {
                let hint = if out.contains(&OVERHEAD) { " (add --overhead to keep it)" } else { "" };
                let option = what.map_or(option.to_string(), |w| format!("{option} {w}"));
                lines.push(format!("left out by {option}: {}{hint}", out.join(", ")));
            }
        }
        if opts.quick {
            lines.push(format!(
                "--quick: {} repetition(s) per run, for the target rows too, and smaller sizes (demo file, buffers, \
                 batches, rows, overhead rounds): a quick check, not a measurement for the targets",
                opts.reps()
            ));
        }
        lines
    }
}

/// The safe-layer overhead microbenchmark, in the plan's words.
const OVERHEAD: &str = "the safe-layer overhead";

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn plan(args: &[&str]) -> (Plan, Options) {
        let opts = Options::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap();
        (Plan::new(&opts, 8), opts)
    }

    fn names(p: &Plan) -> Vec<String> {
        p.file.iter().flat_map(|r| r.names()).collect()
    }

    const DEFAULT: &str = "pageable per-batch-pinned ring-1 ring-4 ring-8 ring-cache windows hybrid whole-file auto \
                           new-map one-shot budget-reuse overlap kvikio-hot kvikio-cold disk-direct cold-auto cold-direct";

    #[test]
    fn the_default_run_streams_every_strategy_and_measures_the_overhead() {
        let (p, opts) = plan(&[]);
        assert_eq!(names(&p).join(" "), DEFAULT);
        assert!(p.overhead && !p.pytorch_rows && p.left_out.is_empty());
        assert!(p.statement(&opts).is_empty());
    }

    #[test]
    fn extra_options_add_to_the_default_run() {
        let (p, opts) = plan(&["--pytorch-rows"]);
        assert_eq!(names(&p).join(" "), DEFAULT);
        assert!(p.pytorch_rows && p.overhead && p.statement(&opts).is_empty());
        let (p, _) = plan(&["--overhead", "--pytorch-rows", "--size", "1G"]);
        assert_eq!(names(&p).join(" "), DEFAULT);
        assert!(p.pytorch_rows && p.overhead);
        let (p, _) = plan(&["--strategy", "auto", "--strategy", "auto/cold"]);
        let all = names(&p).join(" ");
        assert!(all.starts_with(&DEFAULT[..DEFAULT.find(" budget-reuse").unwrap()]), "{all}");
        assert!(all.contains("one-shot custom-1 budget-reuse") && all.ends_with("cold-direct custom-2"), "{all}");
    }

    #[test]
    fn narrowing_options_say_what_they_leave_out() {
        let (p, opts) = plan(&["--only", "auto,kvikio", "--no-cold"]);
        assert_eq!(names(&p).join(" "), "auto kvikio-hot");
        assert_eq!(p.file[1], FileRun::Kvikio { hot: true, cold: false });
        assert!(!p.overhead);
        let s = p.statement(&opts);
        assert_eq!(s[0], "this run: the line rate; the file with auto, kvikio-hot");
        assert!(s[1].starts_with("left out by --only auto,kvikio: pageable, per-batch-pinned, ring-1,"), "{}", s[1]);
        assert!(s[1].ends_with("overlap, the safe-layer overhead (add --overhead to keep it)"), "{}", s[1]);
        assert_eq!(s[2], "left out by --no-cold: kvikio-cold, disk-direct, cold-auto, cold-direct");
        assert_eq!(s.len(), 3);
        let (p, opts) = plan(&["--only", "auto", "--overhead", "--pytorch-rows"]);
        assert!(p.overhead && p.pytorch_rows);
        let s = p.statement(&opts);
        assert_eq!(
            s[0],
            "this run: the line rate; the file with auto; PyTorch's row-by-row copy; the safe-layer overhead"
        );
        assert!(!s[1].contains("overhead"), "{}", s[1]);
    }

    #[test]
    fn quick_says_it_is_small() {
        let (p, opts) = plan(&["--quick"]);
        assert_eq!(names(&p).join(" "), DEFAULT);
        let s = p.statement(&opts);
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[1].starts_with("--quick: 1 repetition(s) per run"), "{}", s[1]);
    }
}
