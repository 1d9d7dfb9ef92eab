//! `Summary`: what a finished transfer or copy reports to Python.

use wirespeed_pinned::Report;

/// What a finished transfer reports to Python: the library's [`Report`], or
/// the host-array paths' own figures ([`host`]).
#[derive(Clone)]
pub(crate) struct Summary {
    pub(crate) strategy: String,
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) cpu_seconds: f64,
    /// `cudaHostRegister` calls the transfer made.
    pub(crate) registrations: u64,
    /// The most bytes pinned at once meanwhile.
    pub(crate) peak_pinned: u64,
    /// It ran in the pass of the transfer queued before it.
    pub(crate) chained: bool,
    /// Where the streamer's agents spent their time (none for the host-array paths).
    pub(crate) breakdown: Option<wirespeed_pinned::Breakdown>,
    pub(crate) text: String,
}

impl Summary {
    pub(crate) fn gbps(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }

    pub(crate) fn cpu_per_gb(&self) -> f64 {
        if self.bytes > 0 { self.cpu_seconds / (self.bytes as f64 / 1e9) } else { 0.0 }
    }
}

impl From<&Report> for Summary {
    fn from(r: &Report) -> Summary {
        Summary {
            strategy: r.strategy.to_string(),
            bytes: r.bytes,
            seconds: r.seconds,
            cpu_seconds: r.cpu_seconds,
            registrations: r.registrations,
            peak_pinned: r.peak_pinned,
            chained: r.chained,
            breakdown: Some(r.breakdown),
            text: r.to_string(),
        }
    }
}

/// The report of a host source's copy of `nbytes` bytes (`strategy`: how),
/// with (registrations, the most bytes pinned meanwhile).
pub(crate) fn host(strategy: String, nbytes: usize, seconds: f64, cpu_seconds: f64, pins: (u64, u64)) -> Summary {
    let mut s = Summary {
        strategy,
        bytes: nbytes as u64,
        seconds,
        cpu_seconds,
        registrations: pins.0,
        peak_pinned: pins.1,
        chained: false,
        breakdown: None,
        text: String::new(),
    };
    s.text = format!(
        "{}: {nbytes} bytes in {seconds:.3} s ({:.2} GB/s), {:.3} CPU s/GB",
        s.strategy,
        s.gbps(),
        s.cpu_per_gb()
    );
    s
}
