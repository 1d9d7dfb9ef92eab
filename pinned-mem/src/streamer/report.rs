//! What a transfer did: [`Report`], its rates and its one-line `Display`.

use crate::strategy::Strategy;
use crate::util::Bytes;

/// What a transfer did.
///
/// A report comes from a transfer; it can grow fields in later versions
/// (`#[non_exhaustive]`), so match it with `..`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?;
/// # let path = std::env::temp_dir().join(format!("wirespeed-doc-report-{}", std::process::id()));
/// # std::fs::write(&path, vec![7u8; 1 << 20])?;
/// use wirespeed_pinned::*;
/// let dev = wirespeed_cuda::Device::get(0)?;
/// let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// let r = s.to_device(&file, 0..1 << 20, &mut dst)?;
/// let Report { strategy, bytes, .. } = &r;
/// assert_eq!((*strategy, *bytes), (Strategy::WholeFile, 1 << 20));
/// println!("{r}: {:.2} GB/s, {:.3} CPU s/GB", r.gbps(), r.cpu_per_gb());
/// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// The strategy used (what `Auto` resolved to, sizes rounded).
    pub strategy: Strategy,
    /// Bytes moved to devices (the range's length times the number of destinations).
    pub bytes: u64,
    /// Wall time of the transfer, up to all copies complete (without verification).
    pub seconds: f64,
    /// CPU time of the whole process meanwhile (user + system, all threads).
    pub cpu_seconds: f64,
    /// The most bytes pinned through the budget at once during the call
    /// (including the streamer's cached registrations and ring).
    pub peak_pinned: u64,
    /// `cudaHostRegister` calls made (0 on a pass served by a cached registration).
    pub registrations: u64,
    /// With [`StreamConfig::verify`](super::StreamConfig::verify): whether the
    /// device data equals the file.
    pub verified: Option<bool>,
    /// Where sliding windows were registered, and why there.
    pub windows: WindowContext,
    /// The transfer ran in the same pass as the one queued before it
    /// ([`Streamer::start`](super::Streamer::start)), with no drain between
    /// them: its `seconds` and `cpu_seconds` count from when the pass took it
    /// up, and overlap the earlier transfer's.
    pub chained: bool,
    /// Where the time of the agents went: bytes copied in place and through
    /// the ring, time spent registering, unregistering, filling slots and
    /// waiting for copies. For a chained transfer, counted from when the pass
    /// took it up (so it overlaps the earlier transfer's).
    pub breakdown: Breakdown,
}

/// Where the agents of a transfer spent their time, to tell what bounds it:
/// registering windows (the window agent is one thread: its steps add up to
/// at most the wall time), filling ring slots (the ring agents' threads added
/// up), or the copy engine (agents mostly waiting for copies to complete).
///
/// Times are wall-clock seconds summed over the threads that spent them.
///
/// ```
/// use wirespeed_pinned::Breakdown;
/// // As a report has it (`report.breakdown`): 3 GiB in place, 1 GiB through the ring.
/// let mut b = Breakdown::default();
/// (b.in_place_bytes, b.ring_bytes, b.fill_seconds) = (3 << 30, 1 << 30, 0.25);
/// assert_eq!(b.in_place_fraction(), 0.75);
/// assert!(b.to_string().starts_with("in place 75%"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Breakdown {
    /// Bytes of the range copied from the file's own pages, registered in
    /// place (sliding windows, or a whole-range registration); each is
    /// copied to every destination.
    pub in_place_bytes: u64,
    /// Bytes of the range staged through the pinned ring (`memcpy` from the
    /// mapping, or `O_DIRECT` reads).
    pub ring_bytes: u64,
    /// Of the ring's bytes, those a cold file's reads took through the page
    /// cache, with readahead, rather than with `O_DIRECT`: `Auto` chooses
    /// per file (a file system that refuses `O_DIRECT`, or buffered reads
    /// that proved clearly faster there).
    pub buffered_bytes: u64,
    /// Registering windows (`cudaHostRegister` or the driver's in a second context).
    pub register_seconds: f64,
    /// Unregistering windows whose copies completed.
    pub unregister_seconds: f64,
    /// The window agent waiting for a window's copies to complete before
    /// unregistering it (time the copy engine, not the agent, set).
    pub window_wait_seconds: f64,
    /// The ring agents filling slots, summed over their threads.
    pub fill_seconds: f64,
    /// The ring agents waiting for a free slot (its copies to complete),
    /// summed over their threads.
    pub slot_wait_seconds: f64,
    /// Making ready before the copies: allocating the pinned ring and
    /// creating the context windows are registered in. A streamer does this
    /// on its first pass and keeps both, so later passes count (almost)
    /// nothing here; a program that makes a streamer per file pays it each
    /// time.
    pub setup_seconds: f64,
    /// Reserve ring threads that joined the pass
    /// ([`StreamConfig::reserve_threads`](super::StreamConfig::reserve_threads));
    /// their filling and waiting are counted above with the others'.
    pub reserve_threads: u64,
    /// Of the ring's bytes, those filled before their transfer was started:
    /// read ahead ([`StreamConfig::read_ahead`](super::StreamConfig::read_ahead))
    /// and taken by it when it came, its first copies enqueued as soon as it
    /// was queued.
    pub read_ahead_bytes: u64,
    /// Bytes read ahead that no transfer took (another transfer came, or
    /// none in time): filled for nothing, and not counted in `ring_bytes`.
    pub read_ahead_dropped_bytes: u64,
}

impl Breakdown {
    /// The share of the bytes copied in place (0 when nothing was counted).
    pub fn in_place_fraction(&self) -> f64 {
        let all = self.in_place_bytes.saturating_add(self.ring_bytes);
        if all == 0 { 0.0 } else { self.in_place_bytes as f64 / all as f64 }
    }

    /// Bytes registered in place per second of registering and unregistering
    /// them: how fast the window agent's one thread pins and unpins on this
    /// machine, the ceiling of what windows carry (the driver registers one
    /// call at a time for the whole device). `None` when nothing was
    /// registered in the pass (a kept registration reused, or no windows).
    ///
    /// ```
    /// use wirespeed_pinned::Breakdown;
    /// let mut b = Breakdown::default();
    /// (b.in_place_bytes, b.register_seconds, b.unregister_seconds) = (3_000_000_000, 1.0, 0.5);
    /// assert_eq!(b.register_rate(), Some(2e9)); // bytes per second
    /// assert_eq!(Breakdown::default().register_rate(), None);
    /// ```
    pub fn register_rate(&self) -> Option<f64> {
        let t = self.register_seconds + self.unregister_seconds;
        (self.in_place_bytes > 0 && t > 0.0).then(|| self.in_place_bytes as f64 / t)
    }

    /// Bytes staged through the ring per second of one ring thread filling
    /// slots (`memcpy` or `O_DIRECT` reads): what each ring thread adds.
    /// `None` when nothing went through the ring.
    ///
    /// ```
    /// use wirespeed_pinned::Breakdown;
    /// let mut b = Breakdown::default();
    /// (b.ring_bytes, b.fill_seconds) = (3_000_000_000, 1.5); // summed over the ring's threads
    /// assert_eq!(b.fill_rate(), Some(2e9)); // bytes per second, a thread
    /// ```
    pub fn fill_rate(&self) -> Option<f64> {
        (self.ring_bytes > 0 && self.fill_seconds > 0.0).then(|| self.ring_bytes as f64 / self.fill_seconds)
    }

    /// Adds `other`'s counts (another pass's) to these.
    pub(crate) fn add(&mut self, other: &Breakdown) {
        self.in_place_bytes = self.in_place_bytes.saturating_add(other.in_place_bytes);
        self.ring_bytes = self.ring_bytes.saturating_add(other.ring_bytes);
        self.buffered_bytes = self.buffered_bytes.saturating_add(other.buffered_bytes);
        self.register_seconds += other.register_seconds;
        self.unregister_seconds += other.unregister_seconds;
        self.window_wait_seconds += other.window_wait_seconds;
        self.fill_seconds += other.fill_seconds;
        self.slot_wait_seconds += other.slot_wait_seconds;
        self.setup_seconds += other.setup_seconds;
        self.reserve_threads = self.reserve_threads.saturating_add(other.reserve_threads);
        self.read_ahead_bytes = self.read_ahead_bytes.saturating_add(other.read_ahead_bytes);
        self.read_ahead_dropped_bytes = self.read_ahead_dropped_bytes.saturating_add(other.read_ahead_dropped_bytes);
    }

    /// What was counted since `earlier`: of a pass, since an earlier
    /// snapshot of it; of [`Streamer::totals`](super::Streamer::totals),
    /// over the passes run between two calls.
    ///
    /// ```
    /// use wirespeed_pinned::Breakdown;
    /// let (mut before, mut after) = (Breakdown::default(), Breakdown::default());
    /// (before.ring_bytes, after.ring_bytes) = (1 << 20, 3 << 20);
    /// assert_eq!(after.since(&before).ring_bytes, 2 << 20);
    /// ```
    pub fn since(&self, earlier: &Breakdown) -> Breakdown {
        Breakdown {
            in_place_bytes: self.in_place_bytes.saturating_sub(earlier.in_place_bytes),
            ring_bytes: self.ring_bytes.saturating_sub(earlier.ring_bytes),
            buffered_bytes: self.buffered_bytes.saturating_sub(earlier.buffered_bytes),
            register_seconds: (self.register_seconds - earlier.register_seconds).max(0.0),
            unregister_seconds: (self.unregister_seconds - earlier.unregister_seconds).max(0.0),
            window_wait_seconds: (self.window_wait_seconds - earlier.window_wait_seconds).max(0.0),
            fill_seconds: (self.fill_seconds - earlier.fill_seconds).max(0.0),
            slot_wait_seconds: (self.slot_wait_seconds - earlier.slot_wait_seconds).max(0.0),
            setup_seconds: (self.setup_seconds - earlier.setup_seconds).max(0.0),
            reserve_threads: self.reserve_threads.saturating_sub(earlier.reserve_threads),
            read_ahead_bytes: self.read_ahead_bytes.saturating_sub(earlier.read_ahead_bytes),
            read_ahead_dropped_bytes: self.read_ahead_dropped_bytes.saturating_sub(earlier.read_ahead_dropped_bytes),
        }
    }
}

impl std::fmt::Display for Breakdown {
    /// `in place P% (registering T ms, unregistering T ms: R GB/s, waiting
    /// for copies T ms), ring P% (filling T ms: R GB/s a thread, waiting for
    /// slots T ms, a reserve thread joined, P% read buffered, P% read ahead),
    /// B read ahead for nothing, setting up T ms`; a part that
    /// moved nothing is left out, and a rate where no time was counted, and
    /// setting up under half a millisecond.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |s: f64| s * 1e3;
        let rate = |r: Option<f64>, what: &str| r.map(|r| format!(": {:.1} GB/s{what}", r / 1e9)).unwrap_or_default();
        let frac = self.in_place_fraction();
        let mut sep = "";
        if self.in_place_bytes > 0 {
            write!(
                f,
                "in place {:.0}% (registering {:.1} ms, unregistering {:.1} ms{}, waiting for copies {:.1} ms)",
                frac * 100.0,
                ms(self.register_seconds),
                ms(self.unregister_seconds),
                rate(self.register_rate(), ""),
                ms(self.window_wait_seconds)
            )?;
            sep = ", ";
        }
        if self.ring_bytes > 0 {
            write!(
                f,
                "{sep}ring {:.0}% (filling {:.1} ms{}, waiting for slots {:.1} ms{}{}{})",
                (1.0 - frac) * 100.0,
                ms(self.fill_seconds),
                rate(self.fill_rate(), " a thread"),
                ms(self.slot_wait_seconds),
                match self.reserve_threads {
                    0 => String::new(),
                    1 => ", a reserve thread joined".to_string(),
                    n => format!(", {n} reserve threads joined"),
                },
                match self.buffered_bytes {
                    0 => String::new(),
                    b => format!(", {:.0}% read buffered", b as f64 * 100.0 / self.ring_bytes as f64),
                },
                match self.read_ahead_bytes {
                    0 => String::new(),
                    b => format!(", {:.0}% read ahead", b as f64 * 100.0 / self.ring_bytes as f64),
                }
            )?;
            sep = ", ";
        }
        if self.read_ahead_dropped_bytes > 0 {
            write!(f, "{sep}{} read ahead for nothing", Bytes(self.read_ahead_dropped_bytes))?;
            sep = ", ";
        }
        if self.setup_seconds >= 0.0005 {
            write!(f, "{sep}setting up {:.1} ms", ms(self.setup_seconds))?;
            sep = ", ";
        }
        if sep.is_empty() {
            write!(f, "nothing counted")?;
        }
        Ok(())
    }
}

/// Where a transfer registered its sliding windows ([`Strategy::Windows`] and
/// [`Strategy::Hybrid`]).
///
/// ```
/// use wirespeed_pinned::WindowContext;
/// assert_eq!(WindowContext::SecondContext.to_string(), "windows in a second context");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowContext {
    /// No windows were registered (whole-file, ring or direct, or nothing to move).
    None,
    /// In a second CUDA context of the device: registering and unregistering
    /// a window neither wait for nor stall the copies of other windows, and
    /// each window is unregistered as soon as the copies that read it completed.
    SecondContext,
    /// In the primary context, where unregistering waits for every copy in
    /// flight on the device, so windows are unregistered in batches; `reason`
    /// says why no second context was used (turned off in the
    /// [`StreamConfig`](super::StreamConfig), or its creation failed: an
    /// exclusive-process compute mode, MPS, an old driver).
    PrimaryContext {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for WindowContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WindowContext::None => write!(f, "no windows"),
            WindowContext::SecondContext => write!(f, "windows in a second context"),
            WindowContext::PrimaryContext { reason } => write!(f, "windows in the primary context ({reason})"),
        }
    }
}

impl Report {
    /// The report of a transfer of an empty range: nothing moved, nothing
    /// registered, `strategy` (the configured one), `peak_pinned` the bytes
    /// pinned when it was asked for, and `verified` as a check of no bytes
    /// answers.
    pub(crate) fn nothing(strategy: Strategy, peak_pinned: u64, verified: Option<bool>) -> Report {
        Report {
            strategy,
            bytes: 0,
            seconds: 0.0,
            cpu_seconds: 0.0,
            peak_pinned,
            registrations: 0,
            verified,
            windows: WindowContext::None,
            chained: false,
            breakdown: Breakdown::default(),
        }
    }

    /// Decimal gigabytes per second (`bytes / seconds / 1e9`); 0 for an
    /// instant transfer. Used in [`Report`]'s example.
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }

    /// CPU seconds per decimal gigabyte moved; 0 when nothing moved. Used in
    /// [`Report`]'s example.
    pub fn cpu_per_gb(&self) -> f64 {
        if self.bytes > 0 { self.cpu_seconds / (self.bytes as f64 / 1e9) } else { 0.0 }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} in {:.3} s ({:.2} GB/s), {:.3} CPU s/GB, peak pinned {}, {} registration{}",
            self.strategy,
            Bytes(self.bytes),
            self.seconds,
            self.gbps(),
            self.cpu_per_gb(),
            Bytes(self.peak_pinned),
            self.registrations,
            if self.registrations == 1 { "" } else { "s" }
        )?;
        if self.windows != WindowContext::None {
            write!(f, ", {}", self.windows)?;
        }
        if self.chained {
            write!(f, ", chained to the transfer before it")?;
        }
        match self.verified {
            Some(true) => write!(f, ", verified"),
            Some(false) => write!(f, ", VERIFICATION FAILED"),
            None => Ok(()),
        }
    }
}
