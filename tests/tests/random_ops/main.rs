//! pinned-mem: seeded random sequences of public-API operations, on the
//! emulator, with faults.
//!
//! Each seed runs a sequence of operations picked and sized by its random
//! numbers: files of random sizes mapped (and mapped again), `PinnedRange`s
//! made, copied from, dropped, released and forgotten, with and without
//! `mlock`, in the primary context and in a registration context; pinned
//! rings whose slots are acquired, filled, submitted, waited for, dropped and
//! forgotten at every stage; streamers of random strategies, budgets and
//! options moving random ranges (empty and odd ones too) through `to_device`,
//! `to_devices`, `start` (handles waited for, dropped, forgotten),
//! `to_scratch` and `for_each_chunk`; a fault injected into one CUDA call
//! before some of them. Checked:
//!
//! * every byte that arrived equals the file's, and reports count them;
//! * an operation fails only with a typed error its arguments allow
//!   (`BadRange` for a range outside the file, `Overlap` and
//!   `BudgetExceeded` where ranges and budgets collide, ...), and with a CUDA
//!   error only when the injected fault fired;
//! * once the sequence has dropped everything, the emulator's counters (live
//!   allocations, pinned blocks, registrations, streams, events, contexts),
//!   the budgets and `VmLck` are back where they were, but for what the
//!   sequence forgot on purpose, which it accounts for.
//!
//! Faults are one at a time, not sticky, and on calls whose single failure
//! the library must survive without leaking: not on frees and stream waits,
//! where a failure leaks the buffer by design (it may still be in use).
//!
//! `WIRESPEED_RANDOM_SEEDS` seeds run (default [`SEEDS`]) from
//! `WIRESPEED_RANDOM_BASE` (default 1), each printed as it starts;
//! `WIRESPEED_RANDOM_SEED=S` runs seed `S` alone and prints each operation.
//! A seed fixes the operations and their arguments; the library's threads
//! still interleave as the machine runs them, so a failure that needs one
//! interleaving may take a few replays. Nothing asserted depends on timing.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Pod, RegistrationContext, Stream};
use wirespeed_pinned::{
    CopyStreams, Error, FreeSlot, FullSlot, InFlightSlot, MappedFile, PinBudget, PinOptions, PinnedRange, PinnedRing,
    StartOptions, Strategy, StreamConfig, Streamer,
};
use wirespeed_tests::{Ctx, TempDir, Watchdog, open_mapped, start_emulated, vm_lck_kb, write_pattern_file};

mod pins;
mod rings;
mod streamers;

/// Seeds a run tries by default.
const SEEDS: u64 = 150;
/// Operations per seed.
const OPS: usize = 36;
/// A non-sticky error the emulator returns for an injected fault.
const UNKNOWN: u32 = 999;
/// Calls a fault is injected into: one failure of any of them must be
/// survived, cleanly (frees and stream waits leak their buffer by design).
const FAULTS: &[&str] = &[
    "cudaMemcpyAsync",
    "cudaMemcpy",
    "cudaHostRegister",
    "cuMemHostRegister_v2",
    "cudaHostUnregister",
    "cuMemHostUnregister",
    "cudaHostAlloc",
    "cudaMalloc",
    "cudaEventRecord",
    "cudaEventCreateWithFlags",
    "cudaEventSynchronize",
    "cudaEventQuery",
    "cudaStreamWaitEvent",
    "cudaStreamCreateWithFlags",
    "cuCtxCreate_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
];

// ------------------------------------------------------------------ random numbers

/// SplitMix64: small, fast and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn upto(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.upto(xs.len())]
    }

    /// A range of a file of `len` bytes: mostly inside it (empty, one byte,
    /// whole pages, odd edges, all of it), now and then past its end.
    fn range(&mut self, len: u64) -> Range<u64> {
        let a = self.below(len + 1);
        match self.below(10) {
            0 => a..a,
            1 => 0..len,
            2 => a.min(len.saturating_sub(1))..(a + 1).min(len),
            3 => {
                let p = a / 4096 * 4096;
                p..(p + 4096 * (1 + self.below(8))).min(len)
            }
            4 => len.saturating_sub(self.below(100))..len + 1 + self.below(5000), // past the end
            _ => a..a + self.below(len - a + 1),
        }
    }
}

// ------------------------------------------------------------------ what a sequence holds

struct Mapped {
    file: Arc<MappedFile>,
    data: Arc<Vec<u8>>,
    path: PathBuf,
}

struct Pin {
    r: PinnedRange,
    data: Arc<Vec<u8>>,
    /// It made its registration (it shared none): only such a range is
    /// forgotten, so that every copy that read the registration is known.
    fresh: bool,
}

/// A slot of a ring, at some stage, with what it holds.
enum Held {
    Free(FreeSlot),
    Full(FullSlot, Vec<u8>),
    InFlight(InFlightSlot, DeviceBuffer<u8>, Vec<u8>),
}

struct Ring {
    ring: PinnedRing,
    /// The one stream its slots are submitted to.
    stream: Stream,
    held: Vec<(usize, Held)>,
    /// The slots ever submitted: each has an event then, on `stream`.
    submitted: BTreeSet<usize>,
    /// Every submit worked: the events are those of `submitted` (a slot of
    /// a ring is forgotten only then, to count what stays).
    clean: bool,
    /// A slot of it was forgotten: nothing is submitted any more (what stays
    /// was counted then).
    leaked: bool,
}

struct Str {
    s: Streamer,
    what: String,
    mlock: bool,
    verify: bool,
}

/// What the sequence forgot on purpose, and so stays.
#[derive(Default, Debug)]
struct Forgot {
    /// Registrations kept by a forgotten range: (file, first page) to (bytes, context id).
    regs: HashMap<(usize, u64), (u64, Option<u64>)>,
    /// A forgotten range asked for `mlock`: `VmLck` stays up.
    locked: bool,
    /// Rings kept by a forgotten slot: (slots, pinned bytes, events, streams).
    rings: Vec<(u64, u64, u64, u64)>,
    /// Device buffers forgotten: (count, bytes).
    buffers: (u64, u64),
}

/// A fault armed for one operation.
struct Fault {
    call: &'static str,
    nth: u64,
    before: u64,
}

struct World<'t> {
    t: &'t Ctx,
    seed: u64,
    rng: Rng,
    log: Vec<String>,
    verbose: bool,
    dir: TempDir,
    dev: Device,
    files: Vec<Mapped>,
    budgets: Vec<PinBudget>,
    ctxs: Vec<Arc<RegistrationContext>>,
    pins: Vec<Pin>,
    rings: Vec<Ring>,
    streamers: Vec<Str>,
    forgot: Forgot,
    /// Registrations (mapping, first page) that copies have read: their
    /// fences may keep those copies' streams, so they are not forgotten.
    read: BTreeSet<(usize, u64)>,
    fault: Option<Fault>,
    made: u64,
}

/// Which typed errors an operation's arguments allow.
#[derive(Clone, Copy, Default)]
struct Allowed {
    bad_range: bool,
    overlap: bool,
    budget: bool,
    memlock: bool,
    direct: bool,
}

fn same(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} bytes arrived, {} expected", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => Err(format!("byte {i} of {} differs", want.len())),
        None => Ok(()),
    }
}

impl<'t> World<'t> {
    fn new(t: &'t Ctx, seed: u64, verbose: bool) -> World<'t> {
        let mut rng = Rng(seed);
        let limits = [u64::MAX, 64 << 20, 4 << 20, 1 << 20, 300_000];
        let budgets = (0..1 + rng.below(3)).map(|_| PinBudget::new(rng.pick(&limits))).collect();
        World {
            t,
            seed,
            rng,
            log: Vec::new(),
            verbose,
            dir: TempDir::new(&format!("random-{seed}")),
            dev: Device::get(0).unwrap(),
            files: Vec::new(),
            budgets,
            ctxs: Vec::new(),
            pins: Vec::new(),
            rings: Vec::new(),
            streamers: Vec::new(),
            forgot: Forgot::default(),
            read: BTreeSet::new(),
            fault: None,
            made: 0,
        }
    }

    fn note(&mut self, what: String) {
        if self.verbose {
            eprintln!("  {what}");
        }
        self.log.push(what);
    }

    /// Fails the test, naming the seed and the last operations.
    #[track_caller]
    fn fail(&self, what: &str) -> ! {
        let from = self.log.len().saturating_sub(8);
        panic!(
            "seed {}: {what}\nlast operations:\n  {}\nreplay: WIRESPEED_RANDOM_SEED={} cargo test -p wirespeed-tests --test random_ops",
            self.seed,
            self.log[from..].join("\n  "),
            self.seed
        );
    }

    /// True when the armed fault fired.
    fn fired(&self) -> bool {
        self.fault.as_ref().is_some_and(|f| self.t.emu().call_count(f.call).unwrap_or(0) - f.before >= f.nth)
    }

    /// Checks an error against what the arguments allow, and against the
    /// armed fault.
    #[track_caller]
    fn tolerate(&self, op: &str, e: &Error, ok: Allowed) {
        let typed = match e {
            Error::BadRange { .. } => ok.bad_range,
            Error::Overlap { .. } => ok.overlap,
            Error::BudgetExceeded { .. } => ok.budget,
            Error::MemlockLimit { .. } => ok.memlock,
            Error::DirectUnsupported { .. } => ok.direct,
            _ => false,
        };
        if !typed && !self.fired() {
            self.fail(&format!("{op}: {e} ({e:?}), with no fault fired"));
        }
    }

    /// A CUDA error of a call on the safe API: only after a fault.
    #[track_caller]
    fn cuda<T>(&self, op: &str, r: wirespeed_cuda::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) if self.fired() => {
                let _ = e;
                None
            }
            Err(e) => self.fail(&format!("{op}: {e}, with no fault fired")),
        }
    }

    /// The device's bytes of `buf`, read once the armed fault is gone.
    fn read_back<T: Pod>(&self, op: &str, buf: &DeviceBuffer<T>) -> Vec<T> {
        match buf.to_vec() {
            Ok(v) => v,
            Err(e) if self.fired() => {
                self.t.emu().reset();
                buf.to_vec().unwrap_or_else(|e2| self.fail(&format!("{op}: reading back: {e}, then {e2}")))
            }
            Err(e) => self.fail(&format!("{op}: reading back a live buffer: {e}, with no fault fired")),
        }
    }

    #[track_caller]
    fn expect_bytes(&self, op: &str, got: &[u8], want: &[u8]) {
        if let Err(d) = same(got, want) {
            self.fail(&format!("{op}: {d}"));
        }
    }

    /// Notes that copies read bytes `range` of `file`: the live ranges whose
    /// registrations hold them were read.
    fn mark_read(&mut self, file: &Arc<MappedFile>, range: &Range<u64>) {
        for p in &self.pins {
            let pages = p.r.pinned_pages();
            if Arc::ptr_eq(p.r.file(), file) && pages.start < range.end.saturating_add(4096) && range.start < pages.end
            {
                self.read.insert((Arc::as_ptr(file) as usize, pages.start));
            }
        }
    }

    fn budget(&mut self) -> (usize, PinBudget) {
        let i = self.rng.upto(self.budgets.len());
        (i, self.budgets[i].clone())
    }

    fn file(&mut self) -> Option<(Arc<MappedFile>, Arc<Vec<u8>>)> {
        if self.files.is_empty() {
            return None;
        }
        let m = &self.files[self.rng.upto(self.files.len())];
        Some((Arc::clone(&m.file), Arc::clone(&m.data)))
    }

    // -------------------------------------------------------------- one operation

    fn step(&mut self) {
        if self.rng.chance(20) {
            let call = self.rng.pick(FAULTS);
            let nth = 1 + self.rng.below(3);
            let before = self.t.emu().call_count(call).unwrap_or(0);
            assert!(self.t.emu().inject_fault(call, nth as u32, UNKNOWN, false), "{call}");
            self.note(format!("fault: {call} #{nth}"));
            self.fault = Some(Fault { call, nth, before });
        }
        match self.rng.below(100) {
            0..10 => self.map_file(),
            10..22 => self.new_pin(),
            22..30 => self.end_pin(),
            30..34 => self.copy_pin(),
            34..38 => self.new_ring(),
            38..50 => self.ring_step(),
            50..53 => self.drop_ring(),
            53..60 => self.new_streamer(),
            60..72 => self.stream_range(),
            72..82 => self.burst(),
            82..87 => self.chunks(),
            87..91 => self.scratch(),
            91..95 => self.plan(),
            95..98 => self.drop_streamer(),
            _ => self.page_cache(),
        }
        self.t.emu().reset(); // an unfired fault goes
        self.fault = None;
    }
}

// ------------------------------------------------------------------ a sequence, and the books

/// Counters the sequence may leave: what it forgot.
fn expected(base: &wirespeed_cuda_sys::emulator::Counters, f: &Forgot) -> wirespeed_cuda_sys::emulator::Counters {
    let mut c = *base;
    let contexts: BTreeSet<u64> = f.regs.values().filter_map(|(_, ctx)| *ctx).collect();
    c.registrations += f.regs.len() as u64;
    c.registered_bytes += f.regs.values().map(|(b, _)| b).sum::<u64>();
    c.contexts += contexts.len() as u64;
    for (slots, bytes, events, streams) in &f.rings {
        c.pinned_allocs += slots;
        c.pinned_bytes += bytes;
        c.events += events;
        c.streams += streams;
    }
    c.device_allocs += f.buffers.0;
    c.device_bytes += f.buffers.1;
    c
}

/// The live resources of `c` (not the running totals).
fn live(c: &wirespeed_cuda_sys::emulator::Counters) -> [u64; 10] {
    [
        c.device_allocs,
        c.device_bytes,
        c.pinned_allocs,
        c.pinned_bytes,
        c.registrations,
        c.registered_bytes,
        c.streams,
        c.events,
        c.contexts,
        c.libraries,
    ]
}

/// Runs seed `seed`'s sequence, drops everything, and checks the books.
fn run_seed(t: &Ctx, seed: u64, verbose: bool) {
    let base = t.counters().unwrap();
    let locked = vm_lck_kb();
    let mut w = World::new(t, seed, verbose);
    t.set_delay_us(w.rng.pick(&[0, 0, 0, 5, 40]));
    for _ in 0..OPS {
        w.step();
        if w.rng.chance(2) {
            w.forget_buffer();
        }
    }
    w.note("drop everything".into());
    let budgets = std::mem::take(&mut w.budgets);
    while !w.streamers.is_empty() || !w.pins.is_empty() || !w.rings.is_empty() {
        match w.rng.below(3) {
            0 if !w.streamers.is_empty() => drop(w.streamers.swap_remove(w.rng.upto(w.streamers.len()))),
            1 if !w.pins.is_empty() => drop(w.pins.swap_remove(w.rng.upto(w.pins.len()))),
            2 if !w.rings.is_empty() => w.drop_ring(),
            _ => {}
        }
    }
    w.ctxs.clear();
    w.files.clear();
    // What dropped streamers parked with the budgets they shared (rings,
    // contexts), for the next streamer: let it go before counting.
    budgets.iter().for_each(PinBudget::release_parked);
    t.set_delay_us(0);
    let (now, want) = (t.counters().unwrap(), expected(&base, &w.forgot));
    let forgot_rings: u64 = w.forgot.rings.iter().map(|r| r.1).sum();
    let forgot_regs: u64 = w.forgot.regs.values().map(|(b, _)| b).sum();
    let used: u64 = budgets.iter().map(PinBudget::used).sum();
    if used != forgot_rings + forgot_regs {
        w.fail(&format!("{used} bytes stay drawn from the budgets; forgotten: {:?}; now {now:?}", w.forgot));
    }
    if live(&now) != live(&want) {
        w.fail(&format!("left behind:\n  {now:?}\nexpected (forgotten: {:?}):\n  {want:?}", w.forgot));
    }
    if !w.forgot.locked && vm_lck_kb() != locked {
        w.fail(&format!("VmLck went from {locked} KiB to {} KiB", vm_lck_kb()));
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

#[test]
fn random_sequences_of_operations() {
    let t = start_emulated();
    let _w = Watchdog::new(600);
    let seeds: Vec<u64> = match env("WIRESPEED_RANDOM_SEED") {
        Some(s) => vec![s],
        None => {
            let base = env("WIRESPEED_RANDOM_BASE").unwrap_or(1);
            (base..base + env("WIRESPEED_RANDOM_SEEDS").unwrap_or(SEEDS)).collect()
        }
    };
    let verbose = seeds.len() == 1;
    for &seed in &seeds {
        eprintln!("random_ops: seed {seed}");
        run_seed(&t, seed, verbose);
    }
    eprintln!("random_ops: {} seeds, {OPS} operations each", seeds.len());
}
