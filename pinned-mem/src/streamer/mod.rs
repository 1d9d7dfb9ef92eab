//! Streaming a file range of any size to one or more GPUs.
//!
//! Every transfer splits the range between *agents* that claim parts of it
//! from a shared cursor pair: the **window agent** (one thread) claims from the
//! front and makes the bytes pinned in place (a sliding registered window, or a
//! piece of a cached whole-file registration); **ring agents** (N threads)
//! claim from the front (ring, direct) or from the back (hybrid), `pread` the
//! bytes into a pinned ring slot (or read them with `O_DIRECT`), and copy the
//! slot. In the hybrid both run at once and meet wherever their actual rates
//! put them, which splits the file in proportion to those rates without
//! measuring them beforehand.
//!
//! All copies to one device go to one stream in enqueue order (the
//! destination's fence would serialize two streams writing one buffer anyway),
//! so the copy engine is fed from both sources. A window or slot is reused or
//! unregistered only after the event recorded after its copies has completed
//! (events are blocking-sync: waiting sleeps, it does not spin a core).
//!
//! Measured on the H200: `cudaHostRegister` runs alongside copies, but
//! `cudaHostUnregister` waits for every copy in flight on the device. So the
//! window agent registers windows ahead while earlier ones copy, up to the
//! strategy's count, and then unregisters the whole batch at once (one drain
//! per batch, not per window); in the hybrid, ring copies keep the copy engine
//! busy meanwhile.
//!
//! # Where things are
//!
//! * here: [`Streamer`] and its whole public API (constructor, accessors,
//!   [`Streamer::resolve`], [`Streamer::release_pins`], the transfers), so
//!   that its documentation reads in one order;
//! * `config.rs`, `report.rs`: [`StreamConfig`] and [`Progress`], [`Report`];
//! * `enter.rs`: one call at a time, none from inside the streamer's callbacks;
//! * `plan.rs`: the strategy a transfer uses, and the range and budget checks;
//! * `cache.rs`: what the streamer keeps between calls (registrations, ring);
//! * `pipeline.rs`: the run every transfer shares (prepare, the agents, drain,
//!   report), what the agents share (`Ctx`) and the claims they take (`Claims`);
//! * the agents and what each strategy adds: `windows.rs` (the window agent:
//!   windows, hybrid, whole file), `whole.rs` (the kept whole-file
//!   registration), `ring.rs` (the ring and its agents: ring, hybrid, direct),
//!   `direct.rs` (`O_DIRECT` reads).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use wirespeed_cuda::{Device, DeviceBuffer, Event, EventOptions, Stream};

use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinOptions;
use crate::sink::{Chunk, ChunkPool, ChunkSink, DevicesSink, ScratchSink, Verifier};
use crate::strategy::{Strategy, plan};
use crate::util::{align_up, cpus, page_size};

mod cache;
mod config;
mod direct;
mod enter;
mod pipeline;
mod plan;
mod report;
mod ring;
mod whole;
mod windows;

use cache::{State, kept};
use plan::check_range;

pub use config::{Progress, StreamConfig};
pub use report::{Report, WindowContext};

/// Locks `m`, also when a panic poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pinned bounce buffer of verification.
const VERIFY_BOUNCE: u64 = 1 << 20;

/// Moves byte ranges of mapped files to device memory on one or more GPUs,
/// choosing (or being told) a strategy from the pin budget and the file.
///
/// It keeps one stream per device, the whole-file registrations it made (so a
/// second pass over the same file costs no registration) and its pinned ring
/// (allocated once), all drawn from the budget until
/// [`Streamer::release_pins`] or drop. Calls are serialized.
///
/// ```no_run
/// use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
/// use wirespeed_cuda::{Device, DeviceBuffer};
/// # fn main() -> wirespeed_pinned::Result<()> {
/// let dev = Device::get(0)?;
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open("/data/train.bin") }?;
/// let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30)))?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, file.len() as usize)?;
/// let report = streamer.to_device(&file, 0..file.len(), &mut dst)?;
/// println!("{report}");
/// # Ok(()) }
/// ```
pub struct Streamer {
    devices: Vec<Device>,
    streams: Vec<Stream>,
    done_events: Vec<Event>,
    /// Events of the window agent, per stream, kept between passes (creating
    /// them is a fixed cost every pass would pay).
    window_events: Mutex<Vec<Vec<Event>>>,
    config: StreamConfig,
    portable: bool,
    owner: Mutex<Option<ThreadId>>,
    state: Mutex<State>,
    /// The second context windows are registered in, made at the first
    /// transfer that registers windows (or why there is none).
    window_context: std::sync::OnceLock<std::result::Result<Arc<wirespeed_cuda::RegistrationContext>, String>>,
}

impl std::fmt::Debug for Streamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamer").field("devices", &self.devices).field("config", &self.config).finish()
    }
}

impl Streamer {
    /// A streamer for `devices` (one stream each, non-blocking); more than one
    /// device makes every registration portable.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// let devices = wirespeed_cuda::Device::all()?;
    /// let s = Streamer::new(&devices, StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no device, a repeated one, more than 64,
    /// or a bad strategy; CUDA's error creating streams and events.
    pub fn new(devices: &[Device], config: StreamConfig) -> Result<Streamer> {
        if devices.is_empty() || devices.len() > 64 {
            return Err(Error::invalid("Streamer::new", format!("{} devices: give 1 to 64", devices.len())));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::invalid("Streamer::new", format!("device {} is given twice", d.ordinal())));
            }
        }
        config.strategy.normalized()?;
        let mut streams = Vec::with_capacity(devices.len());
        let mut done_events = Vec::with_capacity(devices.len());
        for d in devices {
            streams.push(Stream::new(d)?);
            done_events.push(Event::new(d, EventOptions { timing: false, blocking_sync: true })?);
        }
        Ok(Streamer {
            devices: devices.to_vec(),
            window_events: Mutex::new(streams.iter().map(|_| Vec::new()).collect()),
            streams,
            done_events,
            portable: devices.len() > 1,
            config,
            owner: Mutex::new(None),
            state: Mutex::new(State::default()),
            window_context: std::sync::OnceLock::new(),
        })
    }

    /// The devices, in the order given.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.devices().len(), 1);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The stream of each device (copies are enqueued there).
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// s.streams()[0].synchronize()?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// The configuration.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.config().strategy, Strategy::Auto);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// Bytes of registrations and ring the streamer keeps between calls.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.kept_pinned_bytes(), 0);
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn kept_pinned_bytes(&self) -> u64 {
        match self.state.try_lock() {
            Ok(st) => kept(&st),
            Err(_) => 0,
        }
    }

    /// Drops the cached registrations and the ring (unregistering and freeing
    /// them, returning their bytes to the budget).
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// s.release_pins()?;
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    ///
    /// # Errors
    /// `cudaHostUnregister`'s error (the first one; the rest are still released),
    /// or [`Error::InvalidArgument`] from inside a callback of this streamer.
    pub fn release_pins(&self) -> Result<()> {
        let (_owner, mut st) = self.enter("Streamer::release_pins")?;
        st.ring = None;
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
    /// range larger than the budget gets [`Strategy::Direct`].
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # let s = Streamer::new(&[wirespeed_cuda::Device::get(0)?], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// assert_eq!(s.resolve(1 << 20), Strategy::WholeFile);
    /// println!("{}", s.resolve(68 << 30)); // e.g. "hybrid 224 MiB windows + 16 MiB slots, 4 threads"
    /// # Ok::<(), wirespeed_pinned::Error>(())
    /// ```
    pub fn resolve(&self, file_len: u64) -> Strategy {
        let strategy = self.config.strategy.normalized().unwrap_or(self.config.strategy);
        if strategy != Strategy::Auto {
            return strategy;
        }
        let kept = self.state.try_lock().map(|st| kept(&st)).unwrap_or(0);
        let avail = self.usable(kept);
        plan(file_len, avail, cpus(), false).unwrap_or(Strategy::Ring { slots: 2, slot: 64 << 10, threads: 1 })
    }

    /// Moves file bytes `range` to `dst` (of the range's length) on its device.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # fn main() -> Result<()> {
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open("/data/train.bin") }?;
    /// let mut dst = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
    /// let report = s.to_device(&file, 4096..4096 + (1 << 20), &mut dst)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`], [`Error::InvalidArgument`] (length, or a device the
    /// streamer has no stream for), [`Error::BudgetExceeded`],
    /// [`Error::DirectUnsupported`], and any CUDA or I/O error on the way. On
    /// error nothing is left in flight, and nothing pinned beyond what the
    /// streamer keeps between calls (its ring and whole-file registrations,
    /// which [`Streamer::release_pins`] gives back).
    pub fn to_device(&self, file: &Arc<MappedFile>, range: Range<u64>, dst: &mut DeviceBuffer<u8>) -> Result<Report> {
        self.to_devices(file, range, std::slice::from_mut(dst))
    }

    /// Moves file bytes `range` to every buffer of `dsts` at once (each of the
    /// range's length, each on a device of the streamer): each piece is pinned
    /// or read once and copied to every device.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # fn main() -> Result<()> {
    /// let devices = wirespeed_cuda::Device::all()?;
    /// let s = Streamer::new(&devices, StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open("/data/train.bin") }?;
    /// let mut dsts = devices.iter().map(|d| wirespeed_cuda::DeviceBuffer::<u8>::new(d, file.len() as usize)).collect::<Result<Vec<_>, _>>()?;
    /// s.to_devices(&file, 0..file.len(), &mut dsts)?;
    /// # Ok(()) }
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
            targets.push((self.stream_of(d.device())?, d));
        }
        let n = targets.len() as u64;
        let (_owner, mut st) = self.enter("Streamer::to_devices")?;
        let mut verifier = self.verifier(&mut st, len)?;
        let sink = DevicesSink { start: range.start, dsts: targets };
        let (mut report, _) = self.run(&mut st, file, range.clone(), sink, |()| Ok(()))?;
        report.bytes = len * n;
        if let Some(v) = &mut verifier {
            let mut ok = true;
            let expected = &file.as_bytes()[range.start as usize..range.end as usize];
            for d in dsts.iter() {
                let stream = &self.streams[self.stream_of(d.device())?];
                ok &= v.check(stream, d, 0, expected)?;
            }
            report.verified = Some(ok);
        }
        Ok(report)
    }

    /// Moves file bytes `range`, of any size, through `scratch`: the byte at
    /// `range.start + i` is written to `scratch[i % scratch.len()]` (for files
    /// larger than device memory, and benchmarks). With verification every part
    /// is read back right after its copy.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # fn main() -> Result<()> {
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open("/data/train.bin") }?; // 68 GB
    /// let mut scratch = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 4 << 30)?;
    /// println!("{}", s.to_scratch(&file, 0..file.len(), &mut scratch)?);
    /// # Ok(()) }
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
        let len = check_range(file, &range)?;
        if scratch.is_empty() {
            return Err(Error::invalid("Streamer::to_scratch", "the scratch buffer is empty"));
        }
        let stream = self.stream_of(scratch.device())?;
        let (_owner, mut st) = self.enter("Streamer::to_scratch")?;
        let verify = self.verifier(&mut st, len)?.map(|v| (file.as_bytes(), v));
        let sink = ScratchSink { start: range.start, stream, dst: scratch, verify, ok: true };
        let (report, _) = self.run(&mut st, file, range, sink, |()| Ok(()))?;
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
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # fn main() -> Result<()> {
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open("/data/train.bin") }?;
    /// let mut sum = wirespeed_cuda::DeviceBuffer::<u8>::new(&dev, 64 << 20)?;
    /// s.for_each_chunk(&file, 0..file.len(), 64 << 20, |stream, chunk, offset, len| {
    ///     // e.g. launch a kernel on `stream` reading chunk[..len]
    ///     let _ = (stream, chunk, offset, len);
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
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
        let (_owner, mut st) = self.enter("Streamer::for_each_chunk")?;
        let mut verifier = self.verifier(&mut st, len)?;
        let mut ok = true;
        let pool: ChunkPool = Mutex::new(self.devices.iter().map(|_| Vec::new()).collect());
        let sink = ChunkSink {
            start: range.start,
            end: range.end,
            // A chunk larger than the range is the range (and no offset sum can overflow).
            chunk: (chunk as u64).min(len.max(1)),
            devices: self.devices.clone(),
            pool: &pool,
            partial: HashMap::new(),
        };
        let bytes = file.as_bytes();
        let streams = &self.streams;
        let (mut report, _) = self.run(&mut st, file, range, sink, |c: Chunk| {
            let stream = streams.get(c.stream).ok_or_else(|| Error::invalid("for_each_chunk", "no stream"))?;
            if let Some(v) = &mut verifier {
                let expected = &bytes[c.off as usize..c.off as usize + c.len];
                ok &= v.check(stream, &c.buf, 0, expected)?;
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

    fn stream_of(&self, d: Device) -> Result<usize> {
        self.devices.iter().position(|x| *x == d).ok_or_else(|| {
            Error::invalid(
                "Streamer",
                format!("the buffer is on device {}, which this streamer does not use", d.ordinal()),
            )
        })
    }

    fn opts(&self) -> PinOptions {
        PinOptions { mlock: self.config.mlock, portable: self.portable }
    }

    fn verifier(&self, st: &mut State, len: u64) -> Result<Option<Verifier>> {
        if !self.config.verify {
            return Ok(None);
        }
        let bytes = align_up(len.clamp(1, VERIFY_BOUNCE), page_size());
        self.make_room(st, bytes, false, None);
        Ok(Some(Verifier::new(&self.config.budget, bytes as usize)?))
    }

    /// Registrations belong to the calling thread's current device unless portable.
    fn device_for_registration(&self) -> Result<()> {
        if !self.portable {
            self.devices[0].make_current()?;
        }
        Ok(())
    }
}
