//! The run every transfer shares: plan, prepare what the strategy pins, run
//! its agents (on threads, or a lone whole-file pass on the calling thread),
//! wait for what is still in flight, and report.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use wirespeed_cuda::locks::{lock, write};
use wirespeed_cuda::{DetachedSliceMut, Event};

use super::cache::{State, drop_overlapping};
use super::checks::check_budget;
use super::claims::{Claims, Feed};
use super::config::CopyStreams;
use super::ctx::{Ctx, TAIL_SPIN, channel, panic_message, wait_tail};
use super::lanes::{AgentStreamSet, join_agents};
use super::report::{Breakdown, Report, WindowContext};
use super::reserve::{Joining, Running, reserve_agent};
use super::ring::{AgentLane, Fill, ring_agent};
use super::shared::Shared;
use super::sink::{DevicesSink, Enqueued, Sink};
use super::stats::{PassStats, Step};
use super::windows::{WindowSrc, window_agent};
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::PinnedRange;
use crate::ring::PinnedRing;
use crate::strategy::{HYBRID_IN_FLIGHT, Strategy};
use crate::util::{align_up, page_size, process_cpu_seconds};

/// What a strategy holds for one transfer, made ready before any copy.
struct Prepared {
    /// Where the cached whole-file registration is in the streamer's cache.
    whole: Option<usize>,
    /// The `O_DIRECT` descriptor (direct).
    direct: Option<File>,
    /// The streamer's ring (ring, hybrid, direct).
    ring: Option<PinnedRing>,
}

/// The agents a strategy runs: at most one window agent, and ring agents.
struct Agents<'a> {
    windows: Option<WindowSrc<'a>>,
    ring: Option<RingAgents<'a>>,
}

/// The ring agents of a transfer: `threads` of them over `ring`, claiming
/// `slot`-sized parts from the front, or from the back (hybrid).
#[derive(Clone, Copy)]
struct RingAgents<'a> {
    ring: &'a PinnedRing,
    fill: Fill<'a>,
    slot: u64,
    threads: usize,
    from_back: bool,
    /// Reserve threads beside them (`Auto`'s hybrid only: `run_fed` gives
    /// none to anything else; `reserve.rs`), and the slot-wait share under
    /// which they join.
    reserve: usize,
    room: f64,
}

impl Shared {
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

    /// As [`Shared::run`], with `feed` adding ranges to the pass while it
    /// runs when the strategy streams through windows or the ring (see
    /// `chain.rs`); the report covers the whole pass.
    pub(super) fn run_fed<S: Sink>(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        sink: S,
        on_msg: impl FnMut(S::Msg) -> Result<()>,
        feed: Option<&dyn Feed>,
    ) -> Result<(Report, S)> {
        let len = range.end - range.start;
        // An empty range moves nothing: no plan (which could refuse the budget).
        let strategy = if len == 0 { self.config.strategy.normalized()? } else { self.pick(st, file, &range)? };
        let watch = self.config.budget.watch();
        let (t0, cpu0) = (Instant::now(), process_cpu_seconds());
        let stats = Arc::new(PassStats::default());
        if len == 0 {
            let report = Report {
                strategy,
                bytes: 0,
                seconds: 0.0,
                cpu_seconds: 0.0,
                peak_pinned: watch.peak(),
                registrations: 0,
                verified: sink.verified(),
                windows: WindowContext::None,
                chained: false,
                breakdown: Breakdown::default(),
            };
            return Ok((report, sink));
        }

        // Prepare what the strategy pins, within the budget, before any copy.
        self.check_fits(st, file, &range, strategy)?;
        let (strategy, held) = match self.prepare(st, file, &range, strategy, &stats) {
            // Someone else (the caller's own `PinnedRange`, say) holds a
            // registration across the range's edge: one registration of the
            // range cannot be made, so this pass runs as sliding windows, cut
            // at that registration's edges and sharing it inside. The report
            // says what ran.
            Err(Error::Overlap { .. }) if strategy == Strategy::WholeFile => {
                let page = page_size();
                let window = (self.config.budget.available() / 2 / page * page).clamp(page, 256 << 20) as usize;
                let windows = Strategy::Windows { window, in_flight: 2 };
                self.check_fits(st, file, &range, windows)?;
                (windows, self.prepare(st, file, &range, windows, &stats)?)
            }
            other => (strategy, other?),
        };
        let whole = held.whole.and_then(|i| st.cache.get(i));

        let (window_ctx, windows) = match strategy {
            Strategy::Windows { .. } | Strategy::Hybrid { .. } => stats.time(Step::Setup, || self.window_context()),
            _ => (None, WindowContext::None),
        };
        let mut ctx = self.ctx(file, len, stats);
        ctx.window_ctx = window_ctx;
        // Only windows and the ring take ranges added to a running pass.
        let feed = feed
            .filter(|_| matches!(strategy, Strategy::Windows { .. } | Strategy::Ring { .. } | Strategy::Hybrid { .. }));
        let claims = Claims::new(range.clone(), feed);
        let mut sink = sink;
        sink.begin(strategy, &windows, &ctx.stats);
        let mut sink = RwLock::new(sink);
        // Auto's hybrid keeps ring threads in reserve; a strategy given
        // explicitly runs exactly its threads.
        let auto = matches!(self.config.strategy.normalized(), Ok(Strategy::Auto));
        let reserve = match strategy {
            Strategy::Hybrid { .. } if auto => self.config.reserve_threads,
            _ => 0,
        };
        let agents = agents(strategy, whole, &held, (reserve, self.config.reserve_room));
        // With `CopyStreams::RingApart` or `PerThread`, ring agents copy on
        // streams of their own, each through a lane of the sink (the window
        // agent has lane 0, on the streamer's streams); by default all copy
        // on the streamer's streams through the sink's lock.
        let mut pool = lock(&self.agent_streams);
        let sets = match self.config.copy_streams {
            CopyStreams::One => 0,
            CopyStreams::RingApart => 1,
            CopyStreams::PerThread => agents.ring.as_ref().map_or(0, |r| r.threads + r.reserve),
        };
        let lanes = match &agents.ring {
            Some(r) if S::LANES && sets > 0 => match pool.fork(&self.devices, &self.streams, sets) {
                Ok(()) => {
                    write(&sink).open_lanes(1 + r.threads + r.reserve);
                    ctx.lanes = true;
                    Some(&pool.agents[..sets])
                }
                Err(e) => {
                    ctx.fail(e);
                    None
                }
            },
            _ => None,
        };
        match agents.windows {
            // A whole-file pass (from the registration the streamer keeps, made
            // above if it was missing) to devices needs one agent and no
            // messages: it runs on this thread. A thread's start and its join
            // would otherwise be a fixed cost of every such pass.
            Some(src) if S::SILENT && matches!(strategy, Strategy::WholeFile) => {
                run_inline(&ctx, &claims, &sink, src);
            }
            _ if ctx.aborted() => {}
            _ => run_threads(&ctx, &claims, &sink, agents, lanes, on_msg),
        }
        if let Some(lanes) = lanes {
            // The streamer's streams now follow every agent's copies, so
            // what waits on them (the drain below, a `Transfer`) covers all.
            join_agents(&ctx, lanes, &self.streams);
            if let Err(e) = sink.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).close_lanes(&self.streams)
            {
                ctx.fail(e);
            }
        }
        drop(pool);
        self.drain(&ctx, held.ring.as_ref());

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
            registrations: ctx.stats.registrations(),
            verified: sink.verified(),
            windows,
            chained: false,
            breakdown: ctx.stats.snapshot(),
        };
        Ok((report, sink))
    }

    /// Makes ready what `strategy` pins (once [`Shared::check_fits`] passed):
    /// gives back the streamer's registrations that would overlap this pass's
    /// windows, then makes (or reuses) the whole-file registration or the ring,
    /// opens the `O_DIRECT` descriptor, or makes room for the windows.
    fn prepare(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        strategy: Strategy,
        stats: &PassStats,
    ) -> Result<Prepared> {
        let budget = &self.config.budget;
        if matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. } | Strategy::Hybrid { .. }) {
            drop_overlapping(st, file, range);
        }
        let mut held = Prepared { whole: None, direct: None, ring: None };
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
                held.direct = Some(file.open_direct()?);
                held.ring = stats.time(Step::Setup, || self.ring_of(st, strategy))?;
            }
        }
        Ok(held)
    }

    /// The context of a transfer of `len` bytes of `file`.
    fn ctx<'a>(&'a self, file: &'a Arc<MappedFile>, len: u64, stats: Arc<PassStats>) -> Ctx<'a> {
        Ctx {
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
            window_ctx: None,
            lanes: false,
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

/// The agents `strategy` runs, over what [`Shared::prepare`] made ready.
fn agents<'a>(
    strategy: Strategy,
    whole: Option<&'a PinnedRange>,
    held: &'a Prepared,
    (reserve, room): (usize, f64),
) -> Agents<'a> {
    let windows = match strategy {
        Strategy::WholeFile => whole.map(|reg| WindowSrc::Whole { reg }),
        Strategy::Windows { window, in_flight } => {
            Some(WindowSrc::Register { window: window as u64, in_flight, leave: 0 })
        }
        // The end of the range goes to the ring: a window claimed there
        // would be registered while the ring has nothing left to copy, and
        // the copy engine would wait for it (measured: a fixed cost of a
        // few ms per pass, a tenth of a 4 GiB pass).
        Strategy::Hybrid { window, .. } => Some(WindowSrc::Register {
            window: window as u64,
            in_flight: HYBRID_IN_FLIGHT,
            leave: (window as u64).saturating_mul(HYBRID_LEAVE_WINDOWS),
        }),
        _ => None,
    };
    let ring_threads = match strategy {
        Strategy::Ring { slot, threads, .. } => Some((threads, slot as u64, false)),
        Strategy::Hybrid { slot, threads, .. } => Some((threads, slot as u64, true)),
        Strategy::Direct { slot, threads, .. } => Some((threads, slot as u64, false)),
        _ => None,
    };
    let ring = match (ring_threads, held.ring.as_ref()) {
        (Some((threads, slot, from_back)), Some(ring)) => {
            let fill = match &held.direct {
                Some(f) => Fill::Direct(f),
                None => Fill::Copy,
            };
            Some(RingAgents { ring, fill, slot, threads, from_back, reserve, room })
        }
        _ => None,
    };
    Agents { windows, ring }
}

/// Runs one window agent on the calling thread: a lone agent with a SILENT
/// sink, which sends no message.
fn run_inline<S: Sink>(ctx: &Ctx<'_>, claims: &Claims, sink: &RwLock<S>, src: WindowSrc<'_>) {
    // Nobody reads the channel: a SILENT sink never sends on it.
    let (tx, _rx) = channel::<S::Msg>(ctx);
    let agent = std::panic::AssertUnwindSafe(|| window_agent(ctx, claims, src, sink, &tx));
    match std::panic::catch_unwind(agent) {
        Ok(r) => ctx.outcome(r),
        // A panic in the agent itself, reported as an agent thread's.
        Err(p) => ctx.fail(Error::WorkerPanicked { message: panic_message(p.as_ref()) }),
    }
}

/// Runs the agents on threads of their own while the calling thread hands
/// their messages to `on_msg`, and returns once every agent has ended.
fn run_threads<S: Sink>(
    ctx: &Ctx<'_>,
    claims: &Claims,
    sink: &RwLock<S>,
    agents: Agents<'_>,
    lanes: Option<&[AgentStreamSet]>,
    mut on_msg: impl FnMut(S::Msg) -> Result<()>,
) {
    let running = Running::default();
    std::thread::scope(|s| {
        let (tx, rx) = channel::<S::Msg>(ctx);
        let mut handles = Vec::new();
        if let Some(src) = agents.windows {
            let tx = tx.clone();
            handles.push(s.spawn(move || ctx.outcome(window_agent(ctx, claims, src, sink, &tx))));
        }
        if let Some(RingAgents { ring, fill, slot, threads, from_back, reserve, room }) = agents.ring {
            // Each thread its own lane; the stream sets shared round-robin.
            let lane = |k: usize| match lanes.and_then(|l| l.get(k % l.len().max(1))) {
                Some(set) => AgentLane::Own { lane: k + 1, streams: &set.streams },
                None => AgentLane::Shared,
            };
            for k in 0..threads {
                let tx = tx.clone();
                let lane = lane(k);
                // Counted in before the reserve can look (it stops once none runs).
                let counted = running.enter();
                handles.push(s.spawn(move || {
                    let _counted = counted;
                    ctx.outcome(ring_agent(ctx, claims, ring, fill, slot, from_back, lane, sink, &tx));
                }));
            }
            for k in threads..threads + reserve {
                let tx = tx.clone();
                let joining = Joining { ring, fill, slot, threads, room, lane: lane(k) };
                let running = &running;
                handles.push(s.spawn(move || ctx.outcome(reserve_agent(ctx, claims, running, joining, sink, &tx))));
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

/// In the hybrid, the window agent leaves the last this many windows' worth
/// of the range to the ring agents.
const HYBRID_LEAVE_WINDOWS: u64 = 2;

impl Shared {
    /// Moves file bytes `range` into each of `dsts` (stream index, bytes of
    /// the range's length), taking the streamer for `what`: the run shared by
    /// [`Streamer::to_device`], [`Streamer::to_devices`] and the worker's
    /// transfers. `after` is waited for on the destinations' streams before
    /// the first copy; `enqueued` is called once every copy is enqueued.
    /// Each destination's earlier detached writers are waited for first,
    /// before the streamer is taken (one may be a transfer the worker has
    /// still to run); the destinations are released when it returns.
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
}
