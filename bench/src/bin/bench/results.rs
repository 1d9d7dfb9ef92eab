//! What one measured run produced, and the figures derived from it.

use crate::util::{Stats, stats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A resident pinned buffer copied again and again: nothing goes faster.
    LineRate,
    /// The file streamed to the device.
    Stream,
    /// The disk alone, no GPU.
    Disk,
    /// The PyTorch row-by-row experiment (`--pytorch-rows`).
    Rows,
    /// Another tool's run of the same (KvikIO reading the file), in this run.
    External,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::LineRate => "line-rate",
            Kind::Stream => "stream",
            Kind::Disk => "disk",
            Kind::Rows => "pytorch-rows",
            Kind::External => "external",
        }
    }
}

/// Whether the data that reached the device is what was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intact {
    /// The device's checksum matched (this value).
    Yes(u64),
    No {
        expected: u64,
        got: u64,
    },
    /// Checked by the library instead (it read each part back right after
    /// its copy): needed where parts of a scratch buffer are overwritten out
    /// of order, so that no final image can be predicted.
    Verified(bool),
    /// Spot-checked by another tool: `blocks` blocks compared, all equal or not.
    Spot {
        ok: bool,
        blocks: usize,
    },
    /// Not checked, and why.
    Unchecked(String),
}

impl Intact {
    pub fn compare(expected: u64, got: u64) -> Intact {
        if expected == got { Intact::Yes(got) } else { Intact::No { expected, got } }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Intact::Yes(_) => Some(true),
            Intact::No { .. } => Some(false),
            Intact::Verified(ok) | Intact::Spot { ok, .. } => Some(*ok),
            Intact::Unchecked(_) => None,
        }
    }
    pub fn short(&self) -> String {
        match self {
            Intact::Yes(_) | Intact::Verified(true) => "yes".into(),
            Intact::Spot { ok: true, .. } => "spot".into(),
            Intact::No { .. } | Intact::Verified(false) | Intact::Spot { ok: false, .. } => "NO".into(),
            Intact::Unchecked(_) => "n/a".into(),
        }
    }
}

/// One repetition: wall seconds and process CPU seconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    pub seconds: f64,
    pub cpu_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct Row {
    /// The name `--only` knows it by ("ring-4").
    pub name: String,
    pub kind: Kind,
    /// What it does, in a few words.
    pub what: String,
    /// The strategy the library ran (its Display), or what the bench did.
    pub strategy: String,
    /// The strategy the library ran, where a library run.
    pub resolved: Option<wirespeed_pinned::Strategy>,
    /// Bytes moved per repetition.
    pub bytes: u64,
    pub samples: Vec<Sample>,
    pub peak_pinned: u64,
    pub registrations: Option<u64>,
    /// Where the library's agents spent the median repetition's time (its
    /// wall seconds, and the report's breakdown), where a library run.
    pub breakdown: Option<(f64, wirespeed_pinned::Breakdown)>,
    pub intact: Intact,
    /// The run failed with this message (the bench then exits 1).
    pub error: Option<String>,
    /// The run was skipped, and why (not a failure).
    pub skipped: Option<String>,
    /// More details worth printing (name, value).
    pub notes: Vec<(String, String)>,
}

impl Row {
    pub fn new(name: &str, kind: Kind, what: &str, bytes: u64) -> Row {
        Row {
            name: name.to_string(),
            kind,
            what: what.to_string(),
            strategy: String::new(),
            resolved: None,
            bytes,
            samples: Vec::new(),
            peak_pinned: 0,
            registrations: None,
            breakdown: None,
            intact: Intact::Unchecked("not checked".into()),
            error: None,
            skipped: None,
            notes: Vec::new(),
        }
    }

    pub fn skipped(name: &str, kind: Kind, what: &str, why: impl Into<String>) -> Row {
        let mut r = Row::new(name, kind, what, 0);
        r.skipped = Some(why.into());
        r
    }

    pub fn ok(&self) -> bool {
        self.error.is_none() && self.skipped.is_none() && !self.samples.is_empty()
    }

    /// GB/s (10^9 bytes per second) of each repetition: median, min, max.
    pub fn gbps(&self) -> Stats {
        let v: Vec<f64> = self.samples.iter().map(|s| self.bytes as f64 / s.seconds.max(1e-12) / 1e9).collect();
        stats(&v)
    }

    /// Median wall seconds.
    pub fn seconds(&self) -> f64 {
        stats(&self.samples.iter().map(|s| s.seconds).collect::<Vec<_>>()).median
    }

    /// Median CPU seconds.
    pub fn cpu_seconds(&self) -> f64 {
        stats(&self.samples.iter().map(|s| s.cpu_seconds).collect::<Vec<_>>()).median
    }

    /// Median CPU seconds per GB moved.
    pub fn cpu_per_gb(&self) -> f64 {
        self.cpu_stats().median
    }

    /// CPU seconds per GB of each repetition: median, min, max.
    pub fn cpu_stats(&self) -> Stats {
        let v: Vec<f64> = self.samples.iter().map(|s| s.cpu_seconds / (self.bytes as f64 / 1e9).max(1e-12)).collect();
        stats(&v)
    }

    /// Median GB/s as a fraction of `line_rate` GB/s.
    pub fn fraction(&self, line_rate: f64) -> f64 {
        self.gbps().median / line_rate
    }

    /// Each repetition's GB/s as a fraction of `line_rate`: median, min, max.
    pub fn fractions(&self, line_rate: f64) -> Stats {
        let g = self.gbps();
        Stats { median: g.median / line_rate, min: g.min / line_rate, max: g.max / line_rate }
    }

    /// Cores busy on average (CPU seconds over wall seconds), median of the repetitions.
    pub fn cores_busy(&self) -> f64 {
        stats(&self.samples.iter().map(|s| s.cpu_seconds / s.seconds.max(1e-12)).collect::<Vec<_>>()).median
    }

    /// The value of note `name`, if there is one.
    pub fn note_value(&self, name: &str) -> Option<&str> {
        self.notes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn note(&mut self, name: &str, value: impl Into<String>) {
        self.notes.push((name.to_string(), value.into()));
    }
}

/// The row named `name` in `rows`, where it ran and finished.
pub fn find<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.name == name && r.ok())
}
