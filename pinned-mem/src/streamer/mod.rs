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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::Instant;

use wirespeed_cuda::{Device, DeviceBuffer, Event, EventOptions, Stream};

use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinOptions;
use crate::sink::{Chunk, ChunkPool, ChunkSink, DevicesSink, ScratchSink, Sink, Verifier};
use crate::strategy::{HYBRID_IN_FLIGHT, HYBRID_SLOTS_PER_THREAD, Strategy};
use crate::util::{align_up, page_size, process_cpu_seconds};

mod cache;
mod config;
mod direct;
mod enter;
mod plan;
mod report;
mod ring;
mod whole;
mod windows;

use cache::{State, cached, drop_overlapping, kept};
use enter::IN_CALLBACK;
use plan::{check_budget, check_range};
use ring::{Fill, ring_agent};
use windows::{WindowSrc, window_agent};

pub use config::{Progress, StreamConfig};
pub use report::Report;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pinned bounce buffer of verification.
const VERIFY_BOUNCE: u64 = 1 << 20;
/// How long the tail of a pass polls its last event before sleeping on it: a
/// blocking-sync event wakes its waiter late, a fixed cost on every pass.
const TAIL_SPIN: std::time::Duration = std::time::Duration::from_micros(300);

/// The last piece of a pass is polled for as long as it takes to copy at this
/// rate (a low one: a slower copy outlasts the polling and is slept on).
const TAIL_POLL_RATE: f64 = 20e9;
/// The longest the last piece is polled for.
const TAIL_SPIN_MAX: std::time::Duration = std::time::Duration::from_millis(10);

/// How long to poll for the last `bytes` of a pass: [`TAIL_SPIN`] plus their
/// copy time at [`TAIL_POLL_RATE`], at most [`TAIL_SPIN_MAX`]. Polling one
/// core for the last piece (about 1 ms of CPU for 64 MiB, once per pass) buys
/// the pass the sleeping wake-up's latency, a fixed cost that shows most on
/// passes over a kept registration.
fn tail_spin(bytes: u64) -> std::time::Duration {
    let copy = std::time::Duration::from_secs_f64(bytes as f64 / TAIL_POLL_RATE);
    (TAIL_SPIN + copy).min(TAIL_SPIN_MAX)
}

/// Waits for `ev`, polling it for `spin` before sleeping on it. Used only for
/// the last waits of a pass, where nothing else hides the wake-up.
fn wait_tail(ev: &Event, spin: std::time::Duration) -> wirespeed_cuda::Result<()> {
    let t = Instant::now();
    while t.elapsed() < spin {
        if ev.query()? {
            return ev.synchronize(); // at once; it also notes the streams' progress
        }
        std::hint::spin_loop();
    }
    ev.synchronize()
}

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
/// let file = unsafe { MappedFile::open("/data/seed.bin") }?;
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

    /// Moves file bytes `range` to `dst` (of the range's length) on its device.
    ///
    /// ```no_run
    /// # use wirespeed_pinned::*;
    /// # fn main() -> Result<()> {
    /// # let dev = wirespeed_cuda::Device::get(0)?;
    /// # let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)))?;
    /// let file = unsafe { MappedFile::open("/data/seed.bin") }?;
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
    /// let file = unsafe { MappedFile::open("/data/seed.bin") }?;
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
    /// let file = unsafe { MappedFile::open("/data/seed.bin") }?; // 68 GB
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
    /// let file = unsafe { MappedFile::open("/data/seed.bin") }?;
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

    /// The transfer itself: plan, prepare, run the agents, drain, report.
    fn run<S: Sink>(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        sink: S,
        mut on_msg: impl FnMut(S::Msg) -> Result<()>,
    ) -> Result<(Report, S)> {
        let len = range.end - range.start;
        // An empty range moves nothing: no plan (which could refuse the budget).
        let strategy = if len == 0 { self.config.strategy.normalized()? } else { self.pick(st, file, &range)? };
        let budget = &self.config.budget;
        let watch = budget.watch();
        let (t0, cpu0) = (Instant::now(), process_cpu_seconds());
        let registrations = AtomicU64::new(0);
        if len == 0 {
            let report = Report {
                strategy,
                bytes: 0,
                seconds: 0.0,
                cpu_seconds: 0.0,
                peak_pinned: watch.peak(),
                registrations: 0,
                verified: sink.verified(),
            };
            return Ok((report, sink));
        }

        // Prepare what the strategy pins, within the budget, before any copy;
        // refuse at once (allocating nothing) what cannot fit even after giving
        // back what the streamer keeps.
        let need = |s: Strategy| s.pinned_bytes(len).unwrap_or(0);
        let held = match (strategy, &st.ring) {
            (Strategy::WholeFile, _) => cached(st, file, &range, self.portable).is_some(),
            (Strategy::Ring { slots, slot, .. } | Strategy::Direct { slots, slot, .. }, Some(r)) => {
                r.slots() == slots && r.slot_bytes() == slot
            }
            _ => false,
        };
        let usable = budget.available().saturating_add(kept(st));
        if !held && need(strategy) > usable {
            return Err(Error::BudgetExceeded { requested: need(strategy), available: usable, limit: budget.limit() });
        }
        if matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. } | Strategy::Hybrid { .. }) {
            drop_overlapping(st, file, &range);
        }
        let mut whole_idx = None;
        let mut ring = None;
        let mut direct_file = None;
        match strategy {
            Strategy::Auto => return Err(Error::invalid("Streamer", "Auto was not resolved")),
            Strategy::WholeFile => whole_idx = Some(self.whole(st, file, &range, &registrations)?),
            Strategy::Windows { .. } => {
                self.make_room(st, need(strategy), false, None);
                check_budget(budget, need(strategy))?;
            }
            Strategy::Ring { slots, slot, .. } => ring = Some(self.ring_for(st, slots, slot)?),
            Strategy::Hybrid { window, slot, threads } => {
                let r = self.ring_for(st, threads * HYBRID_SLOTS_PER_THREAD, slot)?;
                let w = align_up(window as u64, page_size()) * HYBRID_IN_FLIGHT as u64;
                self.make_room(st, w, true, None);
                check_budget(budget, w)?;
                ring = Some(r);
            }
            Strategy::Direct { slots, slot, .. } => {
                direct_file = Some(file.open_direct()?);
                let r = self.ring_for(st, slots, slot)?;
                ring = Some(r);
            }
        }
        let whole = whole_idx.and_then(|i| st.cache.get(i));

        let ctx = Ctx {
            window_events: &self.window_events,
            file,
            streams: &self.streams,
            opts: self.opts(),
            portable: self.portable,
            device0: self.devices[0],
            budget,
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            registrations,
            done: AtomicU64::new(0),
            total: len,
            progress: self.config.progress.as_deref(),
            streamer: self.id(),
        };
        let claims = Claims::new(range.clone());
        let sink = Mutex::new(sink);
        let depth = 2 * self.streams.len() + 2;

        // A whole-file pass (from the registration the streamer keeps, made
        // above if it was missing) to devices needs one agent and no messages:
        // it runs on this thread. A thread's start and its join would otherwise
        // be a fixed cost of every such pass.
        let inline = match (strategy, whole) {
            (Strategy::WholeFile, Some(reg)) if S::SILENT => Some(WindowSrc::Whole { reg }),
            _ => None,
        };
        if let Some(src) = inline {
            // Nobody reads the channel: a SILENT sink never sends on it.
            let (tx, _rx) = sync_channel::<S::Msg>(depth);
            let agent = std::panic::AssertUnwindSafe(|| window_agent(&ctx, &claims, src, &sink, &tx));
            match std::panic::catch_unwind(agent) {
                Ok(r) => ctx.outcome(r),
                // A panic in the agent itself, reported as an agent thread's.
                Err(p) => ctx.fail(Error::WorkerPanicked { message: panic_message(p.as_ref()) }),
            }
        } else {
            std::thread::scope(|s| {
                let (tx, rx) = sync_channel::<S::Msg>(depth);
                let mut handles = Vec::new();
                let windows = match strategy {
                    Strategy::WholeFile => whole.map(|reg| WindowSrc::Whole { reg }),
                    Strategy::Windows { window, in_flight } => {
                        Some(WindowSrc::Register { window: window as u64, in_flight })
                    }
                    Strategy::Hybrid { window, .. } => {
                        Some(WindowSrc::Register { window: window as u64, in_flight: HYBRID_IN_FLIGHT })
                    }
                    _ => None,
                };
                if let Some(src) = windows {
                    let (ctx, claims, sink, tx) = (&ctx, &claims, &sink, tx.clone());
                    handles.push(s.spawn(move || ctx.outcome(window_agent(ctx, claims, src, sink, &tx))));
                }
                let ring_threads = match strategy {
                    Strategy::Ring { slot, threads, .. } => Some((threads, slot as u64, false)),
                    Strategy::Hybrid { slot, threads, .. } => Some((threads, slot as u64, true)),
                    Strategy::Direct { slot, threads, .. } => Some((threads, slot as u64, false)),
                    _ => None,
                };
                if let (Some((threads, slot, from_back)), Some(ring)) = (ring_threads, ring.as_ref()) {
                    let fill = match &direct_file {
                        Some(f) => Fill::Direct(f),
                        None => Fill::Read,
                    };
                    for _ in 0..threads {
                        let (ctx, claims, sink, tx) = (&ctx, &claims, &sink, tx.clone());
                        handles.push(s.spawn(move || {
                            ctx.outcome(ring_agent(ctx, claims, ring, fill, slot, from_back, sink, &tx));
                        }));
                    }
                }
                drop(tx);
                for msg in rx.iter() {
                    if let Err(e) = on_msg(msg) {
                        ctx.fail(e);
                        break;
                    }
                }
                drop(rx); // senders blocked on a full channel now fail and stop
                for h in handles {
                    if let Err(p) = h.join() {
                        ctx.fail(Error::WorkerPanicked { message: panic_message(p.as_ref()) });
                    }
                }
            });
        }

        // Every agent is done: wait for what is still in flight.
        if let Some(r) = &ring {
            match r.drain() {
                Ok(n) => ctx.progress(n),
                Err(e) => ctx.fail(e),
            }
        }
        for (stream, ev) in self.streams.iter().zip(&self.done_events) {
            // Waits on an event (sleeping, not spinning); if that fails, the
            // stream itself is synchronized so nothing stays in flight, and the
            // first error is still reported.
            if let Err(e) = stream.record(ev).and_then(|()| wait_tail(ev, TAIL_SPIN)) {
                ctx.fail(e.into());
                if let Err(e) = stream.synchronize() {
                    ctx.fail(e.into());
                }
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        let cpu_seconds = (process_cpu_seconds() - cpu0).max(0.0);
        if let Some(e) = lock(&ctx.error).take() {
            return Err(e);
        }
        let sink = sink.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        let report = Report {
            strategy,
            bytes: len,
            seconds,
            cpu_seconds,
            peak_pinned: watch.peak(),
            registrations: ctx.registrations.load(Ordering::Relaxed),
            verified: sink.verified(),
        };
        Ok((report, sink))
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// What the agents of one transfer share.
struct Ctx<'a> {
    file: &'a Arc<MappedFile>,
    streams: &'a [Stream],
    opts: PinOptions,
    portable: bool,
    device0: Device,
    budget: &'a PinBudget,
    abort: AtomicBool,
    error: Mutex<Option<Error>>,
    registrations: AtomicU64,
    done: AtomicU64,
    total: u64,
    progress: Option<&'a (dyn Fn(u64, u64) + Send + Sync)>,
    window_events: &'a Mutex<Vec<Vec<Event>>>,
    /// [`Streamer::id`] of the streamer running the transfer.
    streamer: usize,
}

impl Ctx<'_> {
    /// Records the first error and tells every agent to stop.
    fn fail(&self, e: Error) {
        lock(&self.error).get_or_insert(e);
        self.abort.store(true, Ordering::Release);
    }

    fn outcome(&self, r: Result<()>) {
        if let Err(e) = r {
            self.fail(e);
        }
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Counts `bytes` as landed and calls the progress callback, on whichever
    /// thread landed them. A panic in the callback is this transfer's error
    /// ([`Error::WorkerPanicked`]); the callback calling back into this
    /// streamer gets [`Error::InvalidArgument`] (see [`Streamer::enter`]).
    fn progress(&self, bytes: u64) {
        if bytes == 0 || self.aborted() {
            return; // nothing landed, or the transfer has failed: no progress to tell
        }
        let done = self.done.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if let Some(p) = self.progress {
            IN_CALLBACK.with(|c| c.borrow_mut().push(self.streamer));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p(done.min(self.total), self.total)));
            IN_CALLBACK.with(|c| c.borrow_mut().pop());
            if let Err(panic) = r {
                self.fail(Error::WorkerPanicked { message: panic_message(panic.as_ref()) });
            }
        }
    }
}

/// The part of the range not claimed yet: the window agent takes from the
/// front, hybrid ring agents from the back. Claims end on multiples of their
/// size (absolute file offsets), so windows never share a page and direct
/// reads stay aligned.
struct Claims {
    cursor: Mutex<Range<u64>>,
}

impl Claims {
    fn new(range: Range<u64>) -> Claims {
        Claims { cursor: Mutex::new(range) }
    }

    fn front(&self, size: u64) -> Option<Range<u64>> {
        let mut c = lock(&self.cursor);
        if c.start >= c.end {
            return None;
        }
        let end = ((c.start / size).saturating_add(1)).saturating_mul(size).min(c.end);
        let r = c.start..end;
        c.start = end;
        Some(r)
    }

    fn back(&self, size: u64) -> Option<Range<u64>> {
        let mut c = lock(&self.cursor);
        if c.start >= c.end {
            return None;
        }
        let start = ((c.end - 1) / size * size).max(c.start);
        let r = start..c.end;
        c.end = start;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_meet_in_the_middle_on_boundaries() {
        let c = Claims::new(100..10_000);
        assert_eq!(c.front(4096), Some(100..4096));
        assert_eq!(c.back(1000), Some(9000..10_000));
        assert_eq!(c.back(1000), Some(8000..9000));
        assert_eq!(c.front(4096), Some(4096..8000));
        assert_eq!(c.front(4096), None);
        assert_eq!(c.back(1000), None);
    }

    #[test]
    fn claims_cover_everything_once() {
        let c = Claims::new(7..1_000_003);
        let mut parts = Vec::new();
        let mut flip = false;
        loop {
            flip = !flip;
            let r = if flip { c.front(65536) } else { c.back(10_000) };
            match r {
                Some(r) => parts.push(r),
                None => break,
            }
        }
        parts.sort_by_key(|r| r.start);
        assert_eq!(parts[0].start, 7);
        for w in parts.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert_eq!(parts.last().map(|r| r.end), Some(1_000_003));
    }
}
