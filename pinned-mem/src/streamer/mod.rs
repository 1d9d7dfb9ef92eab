//! Streaming a file range of any size to one or more GPUs.
//!
//! Every transfer splits the range between *agents* that claim parts of it
//! from a shared cursor pair: one **in-place agent** claims from the front
//! and makes the bytes pinned in place (a sliding registered window, or a
//! piece of the whole-file registration the streamer keeps); **ring agents**
//! (N threads) claim from the front (ring, direct) or from the back (hybrid),
//! copy the bytes into a pinned ring slot (or read them with `O_DIRECT`), and
//! copy the slot. In the hybrid both run at once and meet wherever their
//! actual rates put them, which splits the file in proportion to those rates
//! without measuring them beforehand.
//!
//! By default all copies to one device go to one stream, in enqueue order:
//! each copy runs whole, one after the other, so a ring slot comes back as
//! early as it can ([`CopyStreams`] lets the ring threads copy on streams of
//! their own instead, each writing through a lane of the destination:
//! [`wirespeed_cuda::Lanes`]). A window or slot is reused or unregistered
//! only after the event recorded after its copies has completed (events are
//! blocking-sync: waiting sleeps, it does not spin a core).
//!
//! In the primary context `cudaHostUnregister` waits for every copy in flight
//! on the device, and registering blocks other threads' copies; in a second
//! context ([`StreamConfig::second_context`], the default) neither happens.
//! So windows (and the whole-range registrations the streamer keeps) are
//! registered there, and a window retires as soon as its copies are done; in
//! the primary context (the fallback) the window agent registers windows
//! ahead while earlier ones copy and unregisters them a batch at a time (one
//! drain per batch, not per window). In the hybrid, ring copies keep the copy
//! engine busy meanwhile, and the ring takes the end of the range, where a
//! window would be registered with nothing else left to copy.
//!
//! # Where things are
//!
//! From the top down; a file uses only files below it.
//!
//! * here: [`Streamer`] and its whole public API (constructor, accessors,
//!   [`Streamer::resolve`], [`Streamer::release_pins`], the transfers), so
//!   that its documentation reads in one order;
//! * `worker.rs`: the worker thread that runs [`Streamer::start`]'s
//!   transfers in order; `chain.rs`: transfers queued back to back, run as
//!   one pass; `transfer.rs`: the [`Transfer`] handle and [`StartOptions`];
//! * `run.rs`: a transfer's run (plan, prepare, agents, drain, report), and
//!   `shared.rs`: the state the streamer shares with its worker (`Shared`)
//!   and what it does around a run (one call at a time, choosing the
//!   strategy, what it keeps between calls): every method of `Shared` is in
//!   these two files;
//! * `agents/`: one file per strategy's agent (`whole.rs`, `windows.rs`,
//!   `ring.rs`, `direct.rs`, `reserve.rs`);
//! * `lanes.rs`: the ring agents' own streams ([`CopyStreams`]);
//! * `ctx.rs`: what the agents of a transfer share (`Ctx`), `claims.rs`: the
//!   parts of the range they claim (`Claims`), `sink.rs`: where the pieces
//!   go (destinations, a scratch buffer, chunks), `stream_set.rs`,
//!   `spans.rs`: ranges that share no byte, found by offset (`Spans`);
//! * `cache.rs`: what the streamer keeps between calls (registrations, ring,
//!   the ranges it streamed last),
//!   `checks.rs`: the checks of a transfer's arguments;
//! * `config.rs`, `report.rs`: [`StreamConfig`] and [`Progress`], [`Report`]
//!   and its [`Breakdown`]; `stats.rs`: the counters a pass's agents add to.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Pod, Stream};

use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::strategy::Strategy;

mod agents;
mod cache;
mod chain;
mod checks;
mod claims;
mod config;
mod ctx;
mod lanes;
mod queue;
mod report;
mod run;
mod shared;
mod sink;
mod spans;
mod stats;
mod stream_set;
mod transfer;
mod worker;

pub use config::{CopyStreams, MAX_READ_AHEAD, Progress, StreamConfig};
pub use report::{Breakdown, Report, WindowContext};
pub(crate) use transfer::Outcome;
pub use transfer::{StartOptions, Transfer};

use cache::kept;
use checks::{bytes_of_range, check_range};
use shared::Shared;
use sink::{Chunk, ChunkPool, ChunkSink, ScratchSink};
use transfer::{Job, TransferState};
use worker::Worker;

/// Moves byte ranges of mapped files to device memory on one or more GPUs,
/// choosing (or being told) a strategy from the pin budget and the file.
///
/// It keeps one stream per device, the whole-file registrations it made (so a
/// second pass over the same file costs no registration) and its pinned ring
/// (allocated once), all drawn from the budget until
/// [`Streamer::release_pins`] or drop. Windows are registered in the
/// process's registration context of the first device, which every streamer
/// shares ([`RegistrationContext::shared`](wirespeed_cuda::RegistrationContext::shared)).
/// A streamer dropped while the program still holds its budget parks its
/// ring and that context with the budget, and the next streamer on the
/// budget takes them up: a program that makes a streamer per file pays for
/// them once (see [`PinBudget`](crate::PinBudget)). Calls are serialized: transfers
/// started with [`Streamer::start`] run on a worker thread of the streamer,
/// in order (those queued back to back as one pass), blocking calls on the
/// calling thread in between. Dropping the streamer waits for the transfers it started.
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// # let path = std::env::temp_dir().join(format!("wirespeed-doc-streamer-{}", std::process::id()));
/// # std::fs::write(&path, vec![7u8; 3 << 20])?;
/// use wirespeed_cuda::Device;
/// use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
/// let dev = Device::get(0)?;
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30)))?;
/// let mut dst = file.device_buffer::<u8>(&dev, 0..file.len())?;
/// let report = streamer.to_device(&file, 0..file.len(), &mut dst)?;
/// println!("{report}");
/// assert_eq!(dst.to_vec()?[12345], 7);
/// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
/// ```
pub struct Streamer {
    shared: Arc<Shared>,
    /// The thread that runs [`Streamer::start`]'s transfers, once there was one.
    worker: Mutex<Option<Worker>>,
}

impl std::fmt::Debug for Streamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamer").field("devices", &self.shared.devices).field("config", &self.shared.config).finish()
    }
}

impl Drop for Streamer {
    /// Waits for the transfers [`Streamer::start`] queued (every one runs to
    /// its end; their handles may have been dropped or leaked), then ends the
    /// worker thread.
    fn drop(&mut self) {
        let worker = self.worker.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(w) = worker {
            w.finish();
        }
    }
}

impl Streamer {
    /// A streamer for `devices` (one stream each, non-blocking); more than one
    /// device makes every registration portable.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy, Streamer};
    /// let devices = wirespeed_cuda::Device::all()?;
    /// let s = Streamer::new(&devices, StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.devices(), &devices[..]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no device, a repeated one, more than 64,
    /// a bad strategy, more than 1024 [`StreamConfig::reserve_threads`] or a
    /// [`StreamConfig::reserve_room`] that is not a number; CUDA's error
    /// creating streams and events.
    pub fn new(devices: &[Device], config: StreamConfig) -> Result<Streamer> {
        config.check()?;
        Ok(Streamer { shared: Arc::new(Shared::new(devices, config)?), worker: Mutex::new(None) })
    }

    /// The devices, in the order given.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.devices().len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn devices(&self) -> &[Device] {
        &self.shared.devices
    }

    /// The stream of each device (copies are enqueued there).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// s.streams()[0].synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn streams(&self) -> &[Stream] {
        &self.shared.streams
    }

    /// The configuration.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.config().strategy, Strategy::Auto);
    /// # Ok(()) }
    /// ```
    pub fn config(&self) -> &StreamConfig {
        &self.shared.config
    }

    /// Bytes of registrations and ring the streamer keeps between calls.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.kept_pinned_bytes(), 0);
    /// s.prepare(4 << 30)?; // a ring for files of about 4 GiB
    /// assert!(s.kept_pinned_bytes() > 0);
    /// # Ok(()) }
    /// ```
    pub fn kept_pinned_bytes(&self) -> u64 {
        match self.shared.state.try_lock() {
            Ok(st) => kept(&st),
            Err(_) => 0,
        }
    }

    /// Where the agents' time went over every pass this streamer ran so far
    /// (each pass's [`Report::breakdown`] added up, the passes that failed
    /// left out): the share of the bytes copied in place over a long run of
    /// transfers, say, which each transfer's own report does not give when
    /// transfers run chained in one pass (their breakdowns overlap). Take it
    /// before and after the work and subtract.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-totals-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 20])?;
    /// use wirespeed_pinned::*;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
    /// s.to_device(&file, 0..1 << 19, &mut dst.slice_mut(..1 << 19)?)?;
    /// s.to_device(&file, 1 << 19..1 << 20, &mut dst.slice_mut(1 << 19..)?)?;
    /// let t = s.totals();
    /// assert_eq!(t.in_place_bytes + t.ring_bytes, 1 << 20);
    /// println!("over both passes: {t}");
    /// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn totals(&self) -> Breakdown {
        *lock(&self.shared.totals)
    }

    /// Drops the cached registrations and the ring (unregistering and freeing
    /// them, returning their bytes to the budget), and what streamers dropped
    /// earlier parked with the budget ([`PinBudget::release_parked`]).
    ///
    /// [`PinBudget::release_parked`]: crate::PinBudget::release_parked
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// s.prepare(4 << 30)?;
    /// s.release_pins()?;
    /// assert_eq!(s.kept_pinned_bytes(), 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `cudaHostUnregister`'s error (the first one; the rest are still released),
    /// or [`Error::InvalidArgument`] from inside a callback of this streamer.
    pub fn release_pins(&self) -> Result<()> {
        let (_owner, mut st) = self.shared.enter("Streamer::release_pins")?;
        st.ring = None;
        self.shared.config.budget.release_parked();
        let mut first = Ok(());
        for r in std::mem::take(&mut st.cache) {
            if let Err(e) = r.release() {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// What [`Strategy::Auto`] picks for `file_len` bytes of a page-cached file
    /// with the budget as it is now (the configured strategy, when not `Auto`).
    /// When nothing fits it answers the smallest ring, which then fails with
    /// [`Error::BudgetExceeded`]. Transfers also look at the page cache: a cold
    /// range larger than the budget gets [`Strategy::Direct`], whose reads
    /// `Auto` takes with `O_DIRECT` or, per file, through the page cache with
    /// readahead where the file system refuses `O_DIRECT` or those reads prove
    /// clearly faster ([`Breakdown::buffered_bytes`] says). Auto's hybrid
    /// also keeps [`StreamConfig::reserve_threads`] ring threads in reserve,
    /// which join during a pass once the copy engine shows room
    /// ([`Breakdown::reserve_threads`] says how many did).
    ///
    /// A lone range that fits the budget, of a file that does not, streams
    /// through the ring (the hybrid's, with more threads) unless it was among
    /// the streamer's last 64 transfers; then it is registered whole and kept.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.resolve(1 << 20), Strategy::WholeFile);
    /// println!("{}", s.resolve(68 << 30)); // e.g. "hybrid 224 MiB windows + 16 MiB slots, 4 threads"
    /// # Ok(()) }
    /// ```
    pub fn resolve(&self, file_len: u64) -> Strategy {
        self.shared.resolve(file_len)
    }

    /// Makes ready now what the first transfer of `file_len` bytes would make
    /// (for the plan [`Streamer::resolve`] answers): the pinned ring, and the
    /// second context windows are registered in
    /// ([`StreamConfig::second_context`]). A streamer keeps both, so only its
    /// first transfer pays for them, and this moves that cost to when you
    /// choose (start-up, say, or another thread: a `Streamer` is `Sync`).
    /// Returns the plan. For pieces of a file larger than the budget, pass
    /// the file's length: a piece read once streams through that plan's ring
    /// (see [`Streamer::resolve`]). A streamer dropped while the program holds its
    /// budget parks both with the budget for the next streamer on it (see
    /// [`PinBudget`](crate::PinBudget)); otherwise dropping it gives both
    /// back.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy, Streamer};
    /// let budget = PinBudget::new(512 << 20);
    /// let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, budget.clone()))?;
    /// let plan = s.prepare(4 << 30)?; // the files to come are about 4 GiB each
    /// assert!(matches!(plan, Strategy::Hybrid { .. }));
    /// assert!(budget.used() > 0); // its ring is pinned already
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] when the ring does not fit the budget; the
    /// runtime's error allocating it; [`Error::InvalidArgument`] from inside
    /// a callback of this streamer. A context that cannot be made is no
    /// error: windows then use the primary context, as a transfer would.
    pub fn prepare(&self, file_len: u64) -> Result<Strategy> {
        let plan = self.resolve(file_len);
        let (_owner, mut st) = self.shared.enter("Streamer::prepare")?;
        let s = &*self.shared;
        let runs = plan.normalized()?;
        if matches!(runs, Strategy::Ring { .. } | Strategy::Hybrid { .. }) {
            s.ring_of(&mut st, runs)?;
        }
        if matches!(runs, Strategy::Hybrid { .. } | Strategy::Windows { .. } | Strategy::WholeFile) {
            s.window_context();
        }
        Ok(plan)
    }

    /// Moves file bytes `range` to `dst` on its device, and returns once they
    /// have landed. `dst` is a whole buffer (`&mut DeviceBuffer<T>`) or any
    /// writable view ([`DeviceSliceMut`]: part of a larger buffer, a part from
    /// `split_at_mut`, or device memory allocated elsewhere, through
    /// [`DeviceSliceMut::from_raw_parts`]); its element type is any
    /// [`Pod`] type, filled with the file's bytes as they are (native byte
    /// order), and it holds exactly the range's bytes. An empty range moves
    /// nothing and answers an empty report (0 bytes, no registration).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-to-device-{}", std::process::id()));
    /// # std::fs::write(&path, vec![0u8; 2 << 20])?;
    /// use wirespeed_pinned::*;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
    /// let report = s.to_device(&file, 4096..4096 + (1 << 20), &mut dst)?;
    /// // 256 f32 values of the file into the second half of a typed buffer:
    /// let mut weights = wirespeed_cuda::DeviceBuffer::<f32>::zeroed(&dev, 512)?;
    /// s.to_device(&file, 0..1024, weights.slice_mut(256..)?)?;
    /// # let _ = report; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`], [`Error::InvalidArgument`] (a range that is not a
    /// whole number of `T`, a zero-sized `T`, a destination of another length,
    /// a device the streamer has no stream for, a call from inside one of the
    /// streamer's callbacks), [`Error::BudgetExceeded`],
    /// [`Error::DirectUnsupported`], and any CUDA or I/O error on the way. On
    /// error nothing is left in flight, and nothing pinned beyond what the
    /// streamer keeps between calls (its ring and whole-file registrations,
    /// which [`Streamer::release_pins`] gives back).
    pub fn to_device<'d, T: Pod>(
        &self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        dst: impl Into<DeviceSliceMut<'d, T>>,
    ) -> Result<Report> {
        const WHAT: &str = "Streamer::to_device";
        let s = &*self.shared;
        let len = check_range(file, &range)?;
        let dst = bytes_of_range(WHAT, dst.into(), len)?;
        let stream = s.stream_of(dst.device())?;
        if len == 0 {
            return self.nothing(WHAT);
        }
        s.fill(WHAT, file, range, vec![(stream, dst.detach())], None, None)
    }

    /// Moves file bytes `range` to every buffer of `dsts` at once (each of the
    /// range's length, each on a device of the streamer): each piece is pinned
    /// or read once and copied to every device.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-to-devices-{}", std::process::id()));
    /// # std::fs::write(&path, vec![9u8; 1 << 20])?;
    /// use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
    /// let devices = wirespeed_cuda::Device::all()?;
    /// let s = Streamer::new(&devices, StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dsts = devices.iter().map(|d| file.device_buffer::<u8>(d, 0..file.len())).collect::<Result<Vec<_>, _>>()?;
    /// let report = s.to_devices(&file, 0..file.len(), &mut dsts)?;
    /// assert_eq!(report.bytes, file.len() * devices.len() as u64);
    /// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Streamer::to_device`].
    pub fn to_devices(
        &self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        dsts: &mut [DeviceBuffer<u8>],
    ) -> Result<Report> {
        let s = &*self.shared;
        let len = check_range(file, &range)?;
        if dsts.is_empty() {
            return Err(Error::invalid("Streamer::to_devices", "no destination"));
        }
        let mut targets = Vec::with_capacity(dsts.len());
        for d in dsts.iter_mut() {
            if d.len() as u64 != len {
                return Err(Error::invalid(
                    "Streamer::to_devices",
                    format!("destination holds {} bytes, the range {len}", d.len()),
                ));
            }
            targets.push((s.stream_of(d.device())?, d));
        }
        if len == 0 {
            return self.nothing("Streamer::to_devices");
        }
        let targets = targets.into_iter().map(|(i, d)| (i, DeviceSliceMut::from(d).detach())).collect();
        s.fill("Streamer::to_devices", file, range, targets, None, None)
    }

    /// Starts moving file bytes `range` to `dst` (as [`Streamer::to_device`])
    /// and returns at once, with a [`Transfer`] to poll, wait for, await, or
    /// order work on your own streams after ([`Transfer::then_on`]).
    ///
    /// The streamer runs its transfers on a worker thread of its own (started
    /// by the first call), in the order they were started; calls that block
    /// ([`Streamer::to_device`], ...) run on the calling thread in between.
    /// Transfers queued back to back run as one pass when they can: once the
    /// running transfer is claimed, its agents go on with the next one (same
    /// file, a range that shares no byte with the pass's others, in any
    /// order, gaps allowed) with no drain between them, when the strategy streams through
    /// windows or the ring, without [`StreamConfig::verify`], a progress
    /// callback or [`CopyStreams`] other than `One`. `Auto` plans such a pass
    /// for the transfers queued when it starts taken together, as it would
    /// one range of their total length: pieces that each fit the budget
    /// stream through windows and the ring when their total does not,
    /// rather than being registered whole one by one. A transfer whose
    /// [`StartOptions::after`] has not completed still joins: its copies wait
    /// for it on the device, once those of the transfers before it are all
    /// enqueued (theirs never wait for it). Each keeps its own handle, event
    /// and [`Report`] ([`Report::chained`]). The transfer borrows `dst` for as long as the handle lives;
    /// dropping or leaking the handle does not stop the transfer, and `dst`'s
    /// owner stays safe to drop or read: it waits for the transfer (see
    /// [`wirespeed_cuda::DetachedSliceMut`]). Dropping the streamer waits for
    /// every transfer it started. An empty range ends at once, as through
    /// [`Streamer::to_device`]: its handle answers an empty report.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-start-{}", std::process::id()));
    /// # std::fs::write(&path, vec![0u8; 8 << 20])?;
    /// use wirespeed_pinned::*;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 8 << 20)?;
    /// let transfer = s.start(&file, 0..8 << 20, &mut dst)?;
    /// // ... other work meanwhile ...
    /// let report = transfer.wait()?;
    /// # let _ = report; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`], [`Error::InvalidArgument`] (as for
    /// [`Streamer::to_device`]); [`Error::Io`] when the worker thread cannot be
    /// started; [`Error::WorkerPanicked`] when it has ended. Errors of the
    /// transfer itself come from [`Transfer::wait`].
    pub fn start<'a, T: Pod>(
        &'a self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        dst: impl Into<DeviceSliceMut<'a, T>>,
    ) -> Result<Transfer<'a>> {
        self.start_with(file, range, dst, StartOptions::new())
    }

    /// [`Streamer::start`] with options: [`StartOptions::after`] orders the
    /// transfer's copies after the work given so far to a stream of yours
    /// (the stream that allocated or cleared `dst`, say).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-start-with-{}", std::process::id()));
    /// # std::fs::write(&path, vec![0u8; 4096])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let mine = wirespeed_cuda::Stream::new(&dev)?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// // ... work on `mine` that must run before the copies ...
    /// let t = s.start_with(&file, 0..4096, &mut dst, StartOptions::new().after(&mine))?;
    /// t.then_on(&mine)?; // and work on `mine` from now on runs after them
    /// # t.wait()?; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Streamer::start`]; CUDA's error recording an event on the `after` stream.
    pub fn start_with<'a, T: Pod>(
        &'a self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        dst: impl Into<DeviceSliceMut<'a, T>>,
        options: StartOptions<'_>,
    ) -> Result<Transfer<'a>> {
        const WHAT: &str = "Streamer::start";
        let s = &*self.shared;
        s.refuse_inside_callback(WHAT)?;
        let len = check_range(file, &range)?;
        let dst = bytes_of_range(WHAT, dst.into(), len)?;
        let stream = s.stream_of(dst.device())?;
        let state = Arc::new(TransferState::default());
        if len == 0 {
            // Nothing to move, nothing to order: it ends now, as `to_device`
            // of an empty range does (queued, it would wait for the
            // transfers before it for nothing).
            state.finish(empty_report(&s.config));
            return Ok(Transfer::new(state, s));
        }
        let after = options.after_event()?;
        let job = Job { file: file.clone(), range, dst: dst.detach(), stream, after, state: state.clone() };
        self.submit(vec![job])?;
        Ok(Transfer::new(state, s))
    }

    /// Starts moving several ranges of `file`, each into its own destination
    /// (as [`Streamer::start`] each), queued together: the worker sees them all
    /// at once, so that ranges that share no byte (in any order, gaps
    /// allowed) run as one pass, planned as `Auto` plans one range of their
    /// total. Started one by
    /// one, the first of many pieces may be taken up, and planned, alone.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-start-many-{}", std::process::id()));
    /// # std::fs::write(&path, (0..=255u8).cycle().take(1 << 20).collect::<Vec<_>>())?;
    /// use wirespeed_pinned::*;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 8192)?;
    /// let (a, b) = dst.split_at_mut(4096)?;
    /// let transfers = s.start_many(&file, vec![(0..4096, a), (65536..69632, b)])?;
    /// for t in transfers {
    ///     t.wait()?;
    /// }
    /// assert_eq!(dst.to_vec()?[4096], 0); // byte 65536 of the file
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Streamer::start`], for any of the ranges: then none is started.
    pub fn start_many<'a, T: Pod>(
        &'a self,
        file: &Arc<MappedFile>,
        pieces: Vec<(Range<u64>, DeviceSliceMut<'a, T>)>,
    ) -> Result<Vec<Transfer<'a>>> {
        const WHAT: &str = "Streamer::start_many";
        let s = &*self.shared;
        s.refuse_inside_callback(WHAT)?;
        let mut checked = Vec::with_capacity(pieces.len());
        for (range, dst) in pieces {
            let len = check_range(file, &range)?;
            let dst = bytes_of_range(WHAT, dst, len)?;
            let stream = s.stream_of(dst.device())?;
            checked.push((range, dst, stream, len));
        }
        let mut jobs = Vec::new();
        let mut transfers = Vec::with_capacity(checked.len());
        for (range, dst, stream, len) in checked {
            let state = Arc::new(TransferState::default());
            if len == 0 {
                state.finish(empty_report(&s.config));
            } else {
                jobs.push(Job {
                    file: file.clone(),
                    range,
                    dst: dst.detach(),
                    stream,
                    after: None,
                    state: state.clone(),
                });
            }
            transfers.push(Transfer::new(state, s));
        }
        self.submit(jobs)?;
        Ok(transfers)
    }

    /// Moves file bytes `range`, of any size, through `scratch`: the byte at
    /// `range.start + i` is written to `scratch[i % scratch.len()]` (for files
    /// larger than device memory, and benchmarks). With verification every part
    /// is read back right after its copy.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-to-scratch-{}", std::process::id()));
    /// # std::fs::write(&path, vec![5u8; 3 << 20])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?; // 3 MiB, larger than the scratch
    /// let mut scratch = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
    /// let report = s.to_scratch(&file, 0..file.len(), &mut scratch)?;
    /// assert_eq!(report.bytes, 3 << 20);
    /// println!("{report}");
    /// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Streamer::to_device`]; an empty scratch buffer is refused.
    pub fn to_scratch(
        &self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        scratch: &mut DeviceBuffer<u8>,
    ) -> Result<Report> {
        let s = &*self.shared;
        let len = check_range(file, &range)?;
        if scratch.is_empty() {
            return Err(Error::invalid("Streamer::to_scratch", "the scratch buffer is empty"));
        }
        let stream = s.stream_of(scratch.device())?;
        if len == 0 {
            return self.nothing("Streamer::to_scratch");
        }
        // Detached (and settled) before taking the streamer: an earlier
        // transfer into it that is still queued can then run.
        let mut dst = DeviceSliceMut::from(scratch).detach();
        dst.settle();
        let (_owner, mut st) = s.enter("Streamer::to_scratch")?;
        let verify = s.verifier(&mut st, len)?.map(|v| (file.as_bytes(), v));
        let sink = ScratchSink { start: range.start, stream, dst, verify, ok: true };
        let (report, _) = s.run(&mut st, file, range, sink, |()| Ok(()))?;
        Ok(report)
    }

    /// Moves file bytes `range` to the devices in chunks of `chunk` bytes (the
    /// last one shorter) and calls `f(stream, chunk_buffer, file_offset, len)`
    /// on the calling thread for each chunk once its copies are enqueued on
    /// `stream`: work `f` enqueues on `stream` runs after them. Chunk `k` goes to
    /// device `k % devices`. Chunks arrive in the order they complete (in file
    /// order for whole-file and windows, roughly so for the ring strategies).
    /// Chunk buffers hold `min(chunk, range length)` bytes (the first `len` are
    /// the chunk's) and are reused once `f` returns: work on `stream` is ordered
    /// before the next write into them, and so is work through this crate's safe
    /// API on other streams; work on other streams through raw pointers must be
    /// synchronized by `f`.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-for-each-chunk-{}", std::process::id()));
    /// # std::fs::write(&path, vec![1u8; (4 << 20) + 100])?;
    /// # use wirespeed_pinned::*;
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mut seen = Vec::new();
    /// s.for_each_chunk(&file, 0..file.len(), 1 << 20, |stream, chunk, offset, len| {
    ///     // e.g. launch a kernel on `stream` reading chunk[..len]
    ///     let _ = (stream, chunk);
    ///     seen.push((offset, len));
    ///     Ok(())
    /// })?;
    /// seen.sort();
    /// assert_eq!(seen.len(), 5); // four chunks of 1 MiB, and the last 100 bytes
    /// assert_eq!(seen[4], (4 << 20, 100));
    /// # drop(file); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Streamer::to_device`]; `f`'s error stops the transfer and is returned.
    pub fn for_each_chunk(
        &self,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        chunk: usize,
        mut f: impl FnMut(&Stream, &DeviceBuffer<u8>, u64, usize) -> Result<()>,
    ) -> Result<Report> {
        let len = check_range(file, &range)?;
        if chunk == 0 {
            return Err(Error::invalid("Streamer::for_each_chunk", "chunk must be > 0"));
        }
        if len == 0 {
            return self.nothing("Streamer::for_each_chunk");
        }
        let s = &*self.shared;
        let (_owner, mut st) = s.enter("Streamer::for_each_chunk")?;
        let mut verifier = s.verifier(&mut st, len)?;
        let mut ok = true;
        let pool: ChunkPool = Mutex::new(s.devices.iter().map(|_| Vec::new()).collect());
        let sink = ChunkSink {
            start: range.start,
            end: range.end,
            // A chunk larger than the range is the range (and no offset sum can overflow).
            chunk: (chunk as u64).min(len.max(1)),
            devices: s.devices.clone(),
            pool: &pool,
            partial: HashMap::new(),
        };
        let bytes = file.as_bytes();
        let streams = &s.streams;
        let (mut report, _) = s.run(&mut st, file, range, sink, |c: Chunk| {
            let stream = streams.get(c.stream).ok_or_else(|| Error::invalid("for_each_chunk", "no stream"))?;
            if let Some(v) = &mut verifier {
                let expected = &bytes[c.off as usize..c.off as usize + c.len];
                ok &= v.check(stream, &c.buf.slice(..c.len)?, expected)?;
            }
            let res = f(stream, &c.buf, c.off, c.len);
            if let Some(p) = lock(&pool).get_mut(c.stream) {
                p.push(c.buf);
            }
            res
        })?;
        if verifier.is_some() {
            report.verified = Some(ok);
        }
        Ok(report)
    }

    // ------------------------------------------------------------ internals

    /// A blocking call's answer for an empty range: the streamer is taken
    /// (the call comes after the transfers started before it, as any other),
    /// and nothing is planned, pinned or allocated (no verification buffer:
    /// an empty range cannot fail for the budget).
    fn nothing(&self, what: &'static str) -> Result<Report> {
        let _taken = self.shared.enter(what)?;
        empty_report(&self.shared.config)
    }

    /// Queues `job` for the worker thread, starting it on the first call.
    fn submit(&self, jobs: Vec<Job>) -> Result<()> {
        let Some(first) = jobs.first() else { return Ok(()) };
        let mut worker = lock(&self.worker);
        let w = match &mut *worker {
            Some(w) => w,
            None => worker.insert(Worker::spawn(self.shared.clone(), first.file.path())?),
        };
        w.send(jobs)
    }
}

/// The report of a transfer of an empty range with `config`: nothing moved,
/// the configured strategy, verified (nothing differs) when verifying.
fn empty_report(config: &StreamConfig) -> Result<Report> {
    let verified = config.verify.then_some(true);
    Ok(Report::nothing(config.strategy.normalized()?, config.budget.used(), verified))
}
