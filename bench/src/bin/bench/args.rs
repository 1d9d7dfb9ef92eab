//! Command-line options (hand-rolled: no argument-parsing crate).

use crate::util::{GIB, parse_size};
use std::ffi::OsString;
use std::path::PathBuf;

pub const USAGE: &str = "\
bench: which way of feeding the GPU from host memory is fast, by how much, and why.

USAGE:
    bench [OPTIONS] [FILE]

With no FILE it writes a demo file (4 GiB, less when disk or RAM are short) in
the temporary folder, streams it to GPU 0 with every strategy, and removes it.
With FILE (any size, e.g. your own np.memmap) it streams that file instead; it
is mapped, so it must not be written or truncated while the bench runs.

OPTIONS:
    --size BYTES     demo file size: 4G, 512M, 1.5GiB, 65536 (K/M/G/T are powers of 1024)
    --budget BYTES   pin budget (default: file size / 8, so the default run measures
                     the goal for a file 8x the budget)
    --reps N         repetitions per strategy; the median is reported, min-max shown (default 3)
    --threads N      most filler threads for the pinned ring (default: the number of cores)
    --only A,B,...   run only these strategies (names below; a family name such as
                     `ring` or `cold` selects all its members)
    --seed           the seed's experiment: 1024 rows of 655360 float32, row by row,
                     the seed's four PyTorch variants and ours
    --overhead       the safe-layer overhead microbenchmark (cuda-safe vs raw cuda-sys,
                     CPU time per 64 KiB async copy); runs in the default run too
    --emulated       use the emulated CUDA runtime (needs a build with `--features emulator`)
    --out DIR        write results.json, results.csv and chart.svg into DIR
    --json           print the results as JSON on stdout (the tables then go to stderr)
    --quick          small sizes and 1 repetition (CI, the emulator)
    --no-cold        skip the cold-read runs and the O_DIRECT disk measurement
    -h, --help       this text

STRATEGIES (--only):
    pageable          cudaMemcpy straight from the file mapping, 64 MiB chunks
    per-batch-pinned  cudaHostAlloc + memcpy + copy + cudaFreeHost per 64 MiB chunk (the seed's way)
    ring-T            pinned ring, allocated once, T filler threads (T = 1, 4, 8, --threads)
    windows           sliding windows of the mapping, registered in place, 3 in flight
    hybrid            registered windows and the pinned ring together
    whole-file        the whole file registered once (ignores the pin budget)
    auto              the library's automatic choice within the pin budget
    budget-reuse      data within the pin budget: registered once, copied again
    disk-direct       O_DIRECT reads of the file, no GPU: what the disk gives (`dd iflag=direct`)
    cold-auto         page cache dropped (POSIX_FADV_DONTNEED) before each run, then auto
    cold-direct       page cache dropped, O_DIRECT reads into pinned slots
    (the line rate, a resident pinned buffer copied with cudaMemcpyAsync, is always measured)

ENVIRONMENT:
    CUDA_SYS_RUNTIME  path of the libcudart.so to load (else libcudart.so.13, .so.12, .so)
    TMPDIR            where the demo file goes

EXIT STATUS:
    0 every run finished and every copy arrived intact; 1 a run failed or data arrived
    damaged; 2 bad arguments or no usable GPU.
";

/// Every strategy name, in the order the runs happen.
pub const STRATEGY_FAMILIES: &[&str] = &[
    "pageable",
    "per-batch-pinned",
    "ring",
    "windows",
    "hybrid",
    "whole-file",
    "auto",
    "budget-reuse",
    "disk-direct",
    "cold-auto",
    "cold-direct",
];

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub file: Option<PathBuf>,
    pub size: Option<u64>,
    pub budget: Option<u64>,
    pub reps: Option<usize>,
    pub threads: Option<usize>,
    pub only: Option<Vec<String>>,
    pub seed: bool,
    pub overhead: bool,
    pub emulated: bool,
    pub out: Option<PathBuf>,
    pub json: bool,
    pub quick: bool,
    pub no_cold: bool,
}

pub enum Parsed {
    Run(Box<Options>),
    Help,
}

impl Options {
    /// Repetitions: --reps, else 1 with --quick, else 3.
    pub fn reps(&self) -> usize {
        self.reps.unwrap_or(if self.quick { 1 } else { 3 })
    }

    /// Whether the file-streaming runs happen (not when only --seed/--overhead were asked).
    pub fn streams(&self) -> bool {
        !(self.seed || self.overhead) || self.file.is_some() || self.size.is_some() || self.only.is_some()
    }

    /// Whether strategy `name` (e.g. "ring-4") was selected.
    pub fn selected(&self, name: &str) -> bool {
        if self.no_cold && (name.starts_with("cold") || name == "disk-direct") {
            return false;
        }
        match &self.only {
            None => true,
            Some(list) => list
                .iter()
                .any(|o| o == name || name.strip_prefix(o.as_str()).is_some_and(|rest| rest.starts_with('-'))),
        }
    }
}

fn value(name: &str, inline: Option<String>, it: &mut impl Iterator<Item = OsString>) -> Result<String, String> {
    if let Some(v) = inline {
        return Ok(v);
    }
    match it.next() {
        Some(v) => v.into_string().map_err(|v| format!("{name}: {v:?} is not valid UTF-8")),
        None => Err(format!("{name} needs a value")),
    }
}

fn count(name: &str, v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{name}: {v:?} is not a whole number >= 1")),
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut o = Options::default();
    let mut it = args.into_iter();
    let mut no_more_options = false;
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy().into_owned();
        if no_more_options || !s.starts_with('-') || s == "-" {
            if o.file.is_some() {
                return Err(format!("only one FILE may be given (got {:?} too)", arg));
            }
            o.file = Some(PathBuf::from(arg));
            continue;
        }
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (s.clone(), None),
        };
        let flag = |inline: &Option<String>| match inline {
            Some(_) => Err(format!("{name} takes no value")),
            None => Ok(true),
        };
        match name.as_str() {
            "--" => no_more_options = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            "--size" => {
                let v = parse_size(&value(&name, inline, &mut it)?).map_err(|e| format!("--size: {e}"))?;
                if v == 0 {
                    return Err("--size must be more than 0".into());
                }
                o.size = Some(v);
            }
            "--budget" => {
                let v = parse_size(&value(&name, inline, &mut it)?).map_err(|e| format!("--budget: {e}"))?;
                if v < 4096 {
                    return Err("--budget must be at least 4 KiB".into());
                }
                o.budget = Some(v);
            }
            "--reps" => o.reps = Some(count(&name, &value(&name, inline, &mut it)?)?),
            "--threads" => o.threads = Some(count(&name, &value(&name, inline, &mut it)?)?.min(1024)),
            "--only" => {
                let v = value(&name, inline, &mut it)?;
                let list: Vec<String> =
                    v.split(',').map(|x| x.trim().to_ascii_lowercase()).filter(|x| !x.is_empty()).collect();
                if list.is_empty() {
                    return Err("--only needs at least one strategy name".into());
                }
                for n in &list {
                    let ok = STRATEGY_FAMILIES.iter().any(|f| f == n || f.starts_with(&format!("{n}-")))
                        || n.strip_prefix("ring-").is_some_and(|t| t.parse::<usize>().is_ok_and(|t| t >= 1))
                        || n == "cold";
                    if !ok {
                        return Err(format!(
                            "--only: unknown strategy {n:?}; known: {}, ring-T (T threads), cold",
                            STRATEGY_FAMILIES.join(", ")
                        ));
                    }
                }
                o.only = Some(list);
            }
            "--seed" => o.seed = flag(&inline)?,
            "--overhead" => o.overhead = flag(&inline)?,
            "--emulated" => o.emulated = flag(&inline)?,
            "--json" => o.json = flag(&inline)?,
            "--quick" => o.quick = flag(&inline)?,
            "--no-cold" => o.no_cold = flag(&inline)?,
            "--out" => o.out = Some(PathBuf::from(value(&name, inline, &mut it)?)),
            _ => return Err(format!("unknown option {name:?}")),
        }
    }
    if o.file.is_some() && o.size.is_some() {
        return Err("--size sets the size of the demo file; it cannot be used with FILE".into());
    }
    if let Some(s) = o.size
        && s > 64 * 1024 * GIB
    {
        return Err("--size: more than 64 TiB is surely a typo".into());
    }
    Ok(Parsed::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Options, String> {
        match parse(a.iter().map(OsString::from))? {
            Parsed::Run(o) => Ok(*o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn options() {
        let o = p(&["--size", "1G", "--reps=5", "--only", "ring,auto"]).unwrap();
        assert_eq!(o.size, Some(GIB));
        assert_eq!(o.reps(), 5);
        assert!(o.selected("ring-4") && o.selected("auto") && !o.selected("windows"));
        assert!(p(&["--size", "1G", "data.bin"]).is_err());
        let o = p(&["f.bin", "--only=cold"]).unwrap();
        assert!(o.selected("cold-auto") && o.selected("cold-direct") && !o.selected("auto"));
        assert!(p(&["--only", "nope"]).is_err());
        assert!(p(&["--reps", "0"]).is_err());
        assert!(p(&["--size"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
        assert!(p(&["a", "b"]).is_err());
        assert!(p(&["--json=1"]).is_err());
        assert!(p(&["-h"]).is_err());
        let o = p(&["--quick", "--no-cold"]).unwrap();
        assert_eq!(o.reps(), 1);
        assert!(!o.selected("cold-direct") && !o.selected("disk-direct") && o.selected("pageable"));
        assert!(p(&["--seed"]).is_ok_and(|o| !o.streams()));
        assert!(p(&[]).is_ok_and(|o| o.streams()));
    }
}
