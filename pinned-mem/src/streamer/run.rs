//! A transfer's run, shared by every transfer ([`Shared::run`]): plan the
//! strategy, prepare what it pins, run its agents (on threads of their own,
//! or a lone whole-file agent on the calling thread), drain what is still in
//! flight, and report. [`Shared::fill`] runs one into device buffers.

use std::fs::File;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use wirespeed_cuda::locks::{lock, write};
use wirespeed_cuda::{DetachedSliceMut, Event};

use super::agents::cold::ColdReads;
use super::agents::crew::Crew;
use super::agents::reserve::{Reserve, ReserveAgent, Running, reserve_agent};
use super::agents::ring::{Fill, Lane, RingAgent, ring_agent};
use super::agents::whole::whole_agent;
use super::agents::windows::{Windows, window_agent};
use super::cache::{State, drop_overlapping};
use super::checks::check_budget;
use super::claims::{Claims, Fed, feeds};
use super::config::CopyStreams;
use super::ctx::{Ctx, TAIL_SPIN, channel, panic_message, wait_tail};
use super::lanes::{AgentStreamSet, AgentStreams, join_agents};
use super::report::{Report, WindowContext};
use super::shared::Shared;
use super::sink::{DevicesSink, Enqueued, Sink};
use super::stats::{PassStats, Step};
use crate::budget::{PeakWatch, PinBudget};
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinnedRange;
use crate::ring::PinnedRing;
use crate::strategy::{HYBRID_IN_FLIGHT, Strategy};
use crate::util::{align_up, page_size, process_cpu_seconds};

/// In the hybrid, the window agent leaves the last this many windows' worth
/// of the range to the ring agents.
const HYBRID_LEAVE_WINDOWS: u64 = 2;

/// What a strategy holds for one transfer, made ready before any copy.
struct Prepared {
    /// Where the cached whole-file registration is in the streamer's cache.
    whole: Option<usize>,
    /// The `O_DIRECT` descriptor (direct).
    direct: Option<File>,
    /// How `Auto`'s direct pass reads the cold file (`O_DIRECT` or buffered).
    cold: Option<ColdReads>,
    /// The streamer's ring (ring, hybrid, direct).
    ring: Option<PinnedRing>,
}

impl Shared {
    /// Moves file bytes `range` into each of `dsts` (stream index, bytes of
    /// the range's length), taking the streamer for `what`: the run shared by
    /// [`Streamer::to_device`], [`Streamer::to_devices`] and the worker's
    /// transfers. `after` is waited for on the destinations' streams before
    /// the first copy; `enqueued` is called once every copy is enqueued.
    /// Each destination's earlier detached writers are waited for first,
    /// before the streamer is taken (one may be a transfer the worker has
    /// still to run); the destinations are released when it returns.
    ///
    /// [`Streamer::to_device`]: super::Streamer::to_device
    /// [`Streamer::to_devices`]: super::Streamer::to_devices
    pub(super) fn fill(
        &self,
        what: &'static str,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        mut dsts: Vec<(usize, DetachedSliceMut<u8>)>,
        after: Option<&Event>,
        enqueued: Option<&Enqueued<'_>>,
    ) -> Result<Report> {
        for (_, d) in &mut dsts {
            d.settle();
        }
        let len = range.end - range.start;
        let n = dsts.len() as u64;
        let (_owner, mut st) = self.enter(what)?;
        if let Some(ev) = after {
            for (i, _) in &dsts {
                self.streams[*i].wait_event(ev)?;
            }
        }
        let mut verifier = self.verifier(&mut st, len)?;
        let sink = DevicesSink::new(range.start, dsts, len, enqueued);
        let (mut report, sink) = self.run(&mut st, file, range.clone(), sink, |()| Ok(()))?;
        report.bytes = len * n;
        if let Some(v) = &mut verifier {
            let mut ok = true;
            let expected = &file.as_bytes()[range.start as usize..range.end as usize];
            for (i, d) in &sink.dsts {
                ok &= v.check(&self.streams[*i], &d.slice(..)?, expected)?;
            }
            report.verified = Some(ok);
        }
        Ok(report)
    }

    /// The transfer itself: plan, prepare, run the agents, drain, report.
    pub(super) fn run<S: Sink>(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        sink: S,
        on_msg: impl FnMut(S::Msg) -> Result<()>,
    ) -> Result<(Report, S)> {
        self.run_fed(st, file, range, sink, on_msg, None)
    }

    /// As [`Shared::run`], with `fed` adding ranges to the pass while it
    /// runs when the strategy streams through windows or the ring (see
    /// `chain.rs`), planned (with `Auto`) for `fed`'s length; the report
    /// covers the whole pass.
    pub(super) fn run_fed<S: Sink>(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        mut sink: S,
        on_msg: impl FnMut(S::Msg) -> Result<()>,
        fed: Option<Fed<'_>>,
    ) -> Result<(Report, S)> {
        let len = range.end - range.start;
        if len == 0 {
            // An empty range moves nothing: no plan (which could refuse the budget).
            let strategy = self.config.strategy.normalized()?;
            let clock = Clock::start(&self.config.budget);
            return Ok((clock.nothing(strategy, sink.verified()), sink));
        }
        // Plan (a chained pass for every transfer queued when it starts).
        let strategy = self.pick(st, file, &range, fed.map_or(len, |f| f.len.max(len)))?;
        st.recent.note(file, &range);
        let clock = Clock::start(&self.config.budget);
        let stats = Arc::new(PassStats::default());
        // Prepare.
        let (strategy, held) = match self.prepare(st, file, &range, strategy, &stats) {
            Err(Error::Overlap { .. }) if strategy == Strategy::WholeFile => {
                let windows = self.windows_around_overlap();
                (windows, self.prepare(st, file, &range, windows, &stats)?)
            }
            other => (strategy, other?),
        };
        // The agents.
        let (mut ctx, windows) = self.ctx(file, len, strategy, stats);
        let agents = Agents::of(strategy, held.whole.and_then(|i| st.cache.get(i)), &held, self.reserve(strategy));
        // Only windows and the ring take ranges added to a running pass.
        let claims = Claims::new(range, fed.filter(|_| feeds(strategy)).map(|f| f.feed));
        sink.begin(strategy, &windows, &ctx.stats);
        let mut sink = RwLock::new(sink);
        self.run_agents(&mut ctx, &claims, agents, &mut sink, on_msg);
        // Drain, remember how a cold file read best, and report.
        self.drain(&ctx, held.ring.as_ref());
        if let Some((id, way)) = held.cold.as_ref().and_then(ColdReads::learned) {
            st.cold.put(id, way);
        }
        let out = clock.report(&ctx, strategy, windows, sink);
        if let Ok((r, _)) = &out {
            lock(&self.totals).add(&r.breakdown);
        }
        out
    }

    /// The strategy a pass runs in place of [`Strategy::WholeFile`] when
    /// someone else (the caller's own `PinnedRange`, say) holds a
    /// registration across the range's edge: one registration of the range
    /// cannot be made, so the pass runs as sliding windows, cut at that
    /// registration's edges and sharing it inside. The report says what ran.
    fn windows_around_overlap(&self) -> Strategy {
        let page = page_size();
        let window = (self.config.budget.available() / 2 / page * page).clamp(page, 256 << 20) as usize;
        Strategy::Windows { window, in_flight: 2 }
    }

    /// Makes ready what `strategy` pins, within the budget, before any copy:
    /// refuses what cannot fit ([`Shared::check_fits`]), gives back the
    /// streamer's registrations that would overlap this pass's windows, then
    /// makes (or reuses) the whole-file registration or the ring, opens the
    /// `O_DIRECT` descriptor, or makes room for the windows.
    fn prepare(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        strategy: Strategy,
        stats: &PassStats,
    ) -> Result<Prepared> {
        self.check_fits(st, file, range, strategy)?;
        let budget = &self.config.budget;
        if matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. } | Strategy::Hybrid { .. }) {
            drop_overlapping(st, file, range);
        }
        let mut held = Prepared { whole: None, direct: None, cold: None, ring: None };
        match strategy {
            Strategy::Auto => return Err(Error::invalid("Streamer", "Auto was not resolved")),
            Strategy::WholeFile => held.whole = Some(self.whole(st, file, range, stats)?),
            Strategy::Windows { .. } => {
                let need = strategy.pinned_bytes(range.end - range.start).unwrap_or(0);
                self.make_room(st, need, false, None);
                check_budget(budget, need)?;
            }
            Strategy::Ring { .. } => held.ring = stats.time(Step::Setup, || self.ring_of(st, strategy))?,
            Strategy::Hybrid { window, .. } => {
                let r = stats.time(Step::Setup, || self.ring_of(st, strategy))?;
                let w = align_up(window as u64, page_size()) * HYBRID_IN_FLIGHT as u64;
                self.make_room(st, w, true, None);
                check_budget(budget, w)?;
                held.ring = r;
            }
            Strategy::Direct { .. } => {
                // `Auto` reads a cold file the way chosen for it; a given
                // strategy reads with `O_DIRECT`.
                if matches!(self.config.strategy.normalized(), Ok(Strategy::Auto)) {
                    held.cold = Some(ColdReads::new(file, range, &st.cold)?);
                } else {
                    held.direct = Some(file.open_direct()?);
                }
                held.ring = stats.time(Step::Setup, || self.ring_of(st, strategy))?;
            }
        }
        Ok(held)
    }

    /// The context of a pass of `strategy` over `len` bytes of `file`, with
    /// the second context its windows are registered in (made on first use,
    /// timed as setting up), and what its report says of that.
    fn ctx<'a>(
        &'a self,
        file: &'a Arc<MappedFile>,
        len: u64,
        strategy: Strategy,
        stats: Arc<PassStats>,
    ) -> (Ctx<'a>, WindowContext) {
        let (window_ctx, windows) = match strategy {
            Strategy::Windows { .. } | Strategy::Hybrid { .. } => stats.time(Step::Setup, || self.window_context()),
            _ => (None, WindowContext::None),
        };
        let ctx = Ctx {
            window_events: &self.window_events,
            file,
            streams: &self.streams,
            opts: self.opts(),
            portable: self.portable,
            device0: self.devices[0],
            budget: &self.config.budget,
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            stats,
            done: AtomicU64::new(0),
            total: len,
            progress: self.config.progress.as_deref(),
            streamer: self.id(),
            window_ctx,
            lanes: false,
        };
        (ctx, windows)
    }

    /// The reserve of a pass of `strategy`: `Auto`'s hybrid keeps
    /// [`StreamConfig::reserve_threads`](super::StreamConfig::reserve_threads)
    /// ring threads in reserve; a strategy given explicitly runs exactly its
    /// threads.
    fn reserve(&self, strategy: Strategy) -> Reserve {
        let auto = self.config.planned_by_auto || matches!(self.config.strategy.normalized(), Ok(Strategy::Auto));
        let threads = match strategy {
            Strategy::Hybrid { .. } if auto => self.config.reserve_threads,
            _ => 0,
        };
        Reserve { threads, room: self.config.reserve_room }
    }

    /// Runs `agents` over `claims` into `sink`, and returns once every one
    /// has ended: a lone whole-file agent with a SILENT sink on the calling
    /// thread (a thread's start and join would otherwise be a fixed cost of
    /// every such pass), the others on threads of their own while the calling
    /// thread hands their messages to `on_msg`.
    fn run_agents<S: Sink>(
        &self,
        ctx: &mut Ctx<'_>,
        claims: &Claims<'_>,
        agents: Agents<'_>,
        sink: &mut RwLock<S>,
        on_msg: impl FnMut(S::Msg) -> Result<()>,
    ) {
        let mut pool = lock(&self.agent_streams);
        let lanes = self.open_lanes(&mut pool, ctx, &agents, sink);
        match agents.in_place {
            Some(InPlace::Whole(reg)) if S::SILENT => run_inline(ctx, claims, sink, reg),
            _ if ctx.aborted() => {}
            _ => run_threads(ctx, claims, sink, agents, lanes, on_msg),
        }
        if let Some(lanes) = lanes {
            // The streamer's streams now follow every agent's copies, so
            // what waits on them (the drain, a `Transfer`) covers all.
            join_agents(ctx, lanes, &self.streams);
            if let Err(e) = sink.get_mut().unwrap_or_else(PoisonError::into_inner).close_lanes(&self.streams) {
                ctx.fail(e);
            }
        }
    }

    /// With [`CopyStreams::RingApart`] or [`CopyStreams::PerThread`], ring
    /// agents copy on streams of their own, each through a lane of the sink
    /// (the in-place agent has lane 0, on the streamer's streams): makes
    /// their stream sets ready from `pool` and opens the sink's lanes. By
    /// default (and for a sink without lanes) every agent copies on the
    /// streamer's streams, through the sink's lock: `None`.
    fn open_lanes<'p, S: Sink>(
        &self,
        pool: &'p mut AgentStreams,
        ctx: &mut Ctx<'_>,
        agents: &Agents<'_>,
        sink: &RwLock<S>,
    ) -> Option<&'p [AgentStreamSet]> {
        let ring = agents.ring.as_ref()?;
        let sets = match self.config.copy_streams {
            CopyStreams::One => 0,
            CopyStreams::RingApart => 1,
            CopyStreams::PerThread => ring.threads + ring.reserve.threads,
        };
        if !S::LANES || sets == 0 {
            return None;
        }
        match pool.fork(&self.devices, &self.streams, sets) {
            Ok(()) => {
                write(sink).open_lanes(1 + ring.threads + ring.reserve.threads);
                ctx.lanes = true;
                Some(&pool.agents[..sets])
            }
            Err(e) => {
                ctx.fail(e);
                None
            }
        }
    }

    /// Every agent is done: waits for what is still in flight, the ring's
    /// slots and then each stream, and tells `ctx` of any failure.
    fn drain(&self, ctx: &Ctx<'_>, ring: Option<&PinnedRing>) {
        if let Some(r) = ring {
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
    }
}

/// When a pass began: its wall and CPU clocks, and the budget's peak since.
struct Clock {
    watch: PeakWatch,
    t0: Instant,
    cpu0: f64,
}

impl Clock {
    /// Starts the clocks, and the watch of the budget's peak, now.
    fn start(budget: &PinBudget) -> Clock {
        Clock { watch: budget.watch(), t0: Instant::now(), cpu0: process_cpu_seconds() }
    }

    /// The report of a pass that moved nothing.
    fn nothing(&self, strategy: Strategy, verified: Option<bool>) -> Report {
        Report::nothing(strategy, self.watch.peak(), verified)
    }

    /// The report of a pass of `strategy` that ran with `ctx` into `sink`
    /// (its windows registered as `windows` says), or its first error.
    fn report<S: Sink>(
        &self,
        ctx: &Ctx<'_>,
        strategy: Strategy,
        windows: WindowContext,
        sink: RwLock<S>,
    ) -> Result<(Report, S)> {
        let seconds = self.t0.elapsed().as_secs_f64();
        let cpu_seconds = (process_cpu_seconds() - self.cpu0).max(0.0);
        if let Some(e) = lock(&ctx.error).take() {
            return Err(e);
        }
        let sink = sink.into_inner().unwrap_or_else(PoisonError::into_inner);
        let report = Report {
            strategy,
            bytes: ctx.total,
            seconds,
            cpu_seconds,
            peak_pinned: self.watch.peak(),
            registrations: ctx.stats.registrations(),
            verified: sink.verified(),
            windows,
            chained: false,
            breakdown: ctx.stats.snapshot(),
        };
        Ok((report, sink))
    }
}

/// Where an in-place agent's bytes are pinned.
#[derive(Clone, Copy)]
enum InPlace<'a> {
    /// The whole-file registration the streamer keeps.
    Whole(&'a PinnedRange),
    /// Sliding windows.
    Windows(Windows),
}

/// The ring agents of a pass: `threads` of them over `ring`, claiming
/// `slot`-sized parts from the front, or from the back (hybrid), and the
/// reserve beside them.
#[derive(Clone, Copy)]
struct RingCrew<'a> {
    ring: &'a PinnedRing,
    fill: Fill<'a>,
    slot: u64,
    threads: usize,
    from_back: bool,
    reserve: Reserve,
}

impl<'a> RingCrew<'a> {
    /// One of them, copying on `lane`.
    fn agent(&self, lane: Lane<'a>) -> RingAgent<'a> {
        RingAgent { ring: self.ring, fill: self.fill, slot: self.slot, from_back: self.from_back, lane }
    }
}

/// The agents a pass runs: at most one in-place agent, and ring agents.
struct Agents<'a> {
    in_place: Option<InPlace<'a>>,
    ring: Option<RingCrew<'a>>,
}

impl<'a> Agents<'a> {
    /// The agents `strategy` runs, over what [`Shared::prepare`] made ready
    /// (`whole`: the kept registration of the range), with `reserve` beside
    /// the ring's.
    fn of(strategy: Strategy, whole: Option<&'a PinnedRange>, held: &'a Prepared, reserve: Reserve) -> Agents<'a> {
        let in_place = match strategy {
            Strategy::WholeFile => whole.map(InPlace::Whole),
            Strategy::Windows { window, in_flight } => {
                Some(InPlace::Windows(Windows { window: window as u64, in_flight, leave: 0 }))
            }
            // The end of the range goes to the ring: a window claimed there
            // would be registered while the ring has nothing left to copy,
            // and the copy engine would wait for it.
            Strategy::Hybrid { window, .. } => Some(InPlace::Windows(Windows {
                window: window as u64,
                in_flight: HYBRID_IN_FLIGHT,
                leave: (window as u64).saturating_mul(HYBRID_LEAVE_WINDOWS),
            })),
            _ => None,
        };
        let shape = match strategy {
            Strategy::Ring { slot, threads, .. } | Strategy::Direct { slot, threads, .. } => {
                Some((threads, slot as u64, false))
            }
            Strategy::Hybrid { slot, threads, .. } => Some((threads, slot as u64, true)),
            _ => None,
        };
        let ring = match (shape, held.ring.as_ref()) {
            (Some((threads, slot, from_back)), Some(ring)) => {
                let fill = match (&held.direct, &held.cold) {
                    (Some(f), _) => Fill::Direct(f),
                    (None, Some(c)) => Fill::Cold(c),
                    (None, None) => Fill::Copy,
                };
                Some(RingCrew { ring, fill, slot, threads, from_back, reserve })
            }
            _ => None,
        };
        Agents { in_place, ring }
    }
}

/// Runs a lone whole-file agent on the calling thread, over the kept
/// registration `reg`: a SILENT sink sends no message, so nobody needs to
/// read the channel.
fn run_inline<S: Sink>(ctx: &Ctx<'_>, claims: &Claims<'_>, sink: &RwLock<S>, reg: &PinnedRange) {
    let (tx, _rx) = channel::<S::Msg>(ctx);
    let crew = Crew::new(ctx, claims, sink, tx);
    match std::panic::catch_unwind(AssertUnwindSafe(move || whole_agent(crew, reg))) {
        Ok(r) => ctx.outcome(r),
        // A panic in the agent itself, reported as an agent thread's.
        Err(p) => ctx.fail(Error::WorkerPanicked { message: panic_message(p.as_ref()) }),
    }
}

/// Runs the agents on threads of their own while the calling thread hands
/// their messages to `on_msg`, and returns once every agent has ended.
fn run_threads<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims<'_>,
    sink: &RwLock<S>,
    agents: Agents<'_>,
    lanes: Option<&[AgentStreamSet]>,
    mut on_msg: impl FnMut(S::Msg) -> Result<()>,
) {
    let running = Running::default();
    std::thread::scope(|s| {
        let (tx, rx) = channel::<S::Msg>(ctx);
        let crew = Crew::new(ctx, claims, sink, tx);
        let handles = spawn_agents(s, &crew, agents, lanes, &running);
        drop(crew); // the channel closes once every agent has ended
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

/// Starts a thread for each of `agents` in `scope`, each with a clone of
/// `crew`; ring agents copy through `lanes` when there are some, and are
/// counted in `running` for the reserve. A thread the system refuses fails
/// the transfer (the agents already started then stop), instead of a panic.
fn spawn_agents<'s, S: Sink>(
    scope: &'s Scope<'s, '_>,
    crew: &Crew<'s, S>,
    agents: Agents<'s>,
    lanes: Option<&'s [AgentStreamSet]>,
    running: &'s Running,
) -> Vec<ScopedJoinHandle<'s, ()>> {
    let ctx = crew.ctx;
    let mut handles = Vec::new();
    let mut spawn = |f: Box<dyn FnOnce() + Send + 's>| {
        if ctx.aborted() {
            return;
        }
        match std::thread::Builder::new().spawn_scoped(scope, f) {
            Ok(h) => handles.push(h),
            Err(e) => ctx.fail(Error::io("starting an agent thread for", ctx.file.path(), e)),
        }
    };
    match agents.in_place {
        Some(InPlace::Whole(reg)) => {
            let crew = crew.clone();
            spawn(Box::new(move || ctx.outcome(whole_agent(crew, reg))));
        }
        Some(InPlace::Windows(windows)) => {
            let crew = crew.clone();
            spawn(Box::new(move || ctx.outcome(window_agent(crew, windows))));
        }
        None => {}
    }
    let Some(ring) = agents.ring else { return handles };
    // Each thread its own lane; the stream sets shared round-robin.
    let lane = |k: usize| match lanes.and_then(|l| l.get(k % l.len().max(1))) {
        Some(set) => Lane::Own { lane: k + 1, streams: &set.streams },
        None => Lane::Shared,
    };
    for k in 0..ring.threads {
        let (crew, agent) = (crew.clone(), ring.agent(lane(k)));
        // Counted in before the reserve can look (it stops once none runs).
        let counted = running.enter();
        spawn(Box::new(move || {
            let _counted = counted;
            ctx.outcome(ring_agent(crew, agent));
        }));
    }
    for k in ring.threads..ring.threads + ring.reserve.threads {
        let crew = crew.clone();
        let agent = ReserveAgent { ring: ring.agent(lane(k)), planned: ring.threads, reserve: ring.reserve, running };
        spawn(Box::new(move || ctx.outcome(reserve_agent(crew, agent))));
    }
    handles
}
