//! What a [`Streamer`](super::Streamer) shares with its worker thread
//! ([`Shared`]) and what it does around a transfer: taking the streamer for
//! one call, choosing the strategy and checking the budget, and keeping (or
//! giving back) its ring, its whole-file registrations and the second context
//! windows are registered in. The transfer itself is `Shared::run`, in
//! `run.rs`; these two files hold every method of `Shared`.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;

use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, Event, EventOptions, RegistrationContext, Stream};

use super::cache::{State, cached, kept};
use super::claims::feeds;
use super::config::StreamConfig;
use super::ctx::inside_callback;
use super::lanes::AgentStreams;
use super::report::{Breakdown, WindowContext};
use super::sink::Verifier;
use super::stats::{PassStats, Step};
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::range::{PinOptions, PinnedRange};
use crate::ring::PinnedRing;
use crate::strategy::{Strategy, plan, plan_lone};
use crate::util::{align_down, align_up, cpus, page_size};

/// The pinned bounce buffer of verification holds at most this many bytes.
const VERIFY_BOUNCE: u64 = 1 << 20;

/// What a [`Streamer`](super::Streamer) shares with its worker thread:
/// everything but the worker itself.
pub(super) struct Shared {
    pub(super) devices: Vec<Device>,
    /// One per device: the copies are enqueued there.
    pub(super) streams: Vec<Stream>,
    /// One per device: recorded at the end of a pass, and waited for.
    pub(super) done_events: Vec<Event>,
    /// Events of the in-place agents, per stream, kept between passes
    /// (creating them is a fixed cost every pass would pay).
    pub(super) window_events: Mutex<Vec<Vec<Event>>>,
    /// The ring agents' own streams and events, kept between transfers
    /// (see [`StreamConfig::copy_streams`]).
    pub(super) agent_streams: Mutex<AgentStreams>,
    pub(super) config: StreamConfig,
    /// Every registration is portable (more than one device).
    pub(super) portable: bool,
    /// The thread inside a call of the streamer, if any ([`Shared::enter`]).
    owner: Mutex<Option<ThreadId>>,
    /// What the streamer keeps between calls; held for the whole of a call.
    pub(super) state: Mutex<State>,
    /// Threads waiting in [`Shared::enter`] for the streamer: a pass holding
    /// bytes read ahead for a transfer to come drops them for them.
    pub(super) entering: AtomicUsize,
    /// The second context windows are registered in, made at the first
    /// transfer that registers windows (or why there is none).
    window_context: OnceLock<std::result::Result<Arc<RegistrationContext>, String>>,
    /// The breakdowns of every pass that ended well, added up
    /// ([`Streamer::totals`](super::Streamer::totals)).
    pub(super) totals: Mutex<Breakdown>,
}

impl Drop for Shared {
    /// Parks the ring and the registration context with the budget, for the
    /// next streamer on it (given back at once where the program holds the
    /// budget no more: see [`PinBudget`](crate::PinBudget)). The cached
    /// registrations go: they are of this streamer's files.
    fn drop(&mut self) {
        let budget = &self.config.budget;
        let st = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Idle after every pass; one that cannot drain is not parked.
        if let Some(ring) = st.ring.take()
            && ring.drain().is_ok()
        {
            let bytes = ring.pinned_bytes();
            budget.park(Box::new(ring), bytes);
        }
        if let Some(Ok(c)) = self.window_context.take() {
            budget.park(Box::new(c), 0);
        }
    }
}

/// Clears the owner mark when a call ends, however it ends.
pub(super) struct Owner<'a>(&'a Mutex<Option<ThreadId>>, ThreadId);

impl Drop for Owner<'_> {
    fn drop(&mut self) {
        let mut o = lock(self.0);
        if *o == Some(self.1) {
            *o = None;
        }
    }
}

impl Shared {
    /// The state of a streamer for `devices` (one stream each, non-blocking).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no device, a repeated one, more than 64,
    /// or a bad strategy; CUDA's error creating streams and events.
    pub(super) fn new(devices: &[Device], config: StreamConfig) -> Result<Shared> {
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
            done_events.push(Event::new(d, EventOptions::new().blocking_sync(true))?);
        }
        Ok(Shared {
            devices: devices.to_vec(),
            window_events: Mutex::new(streams.iter().map(|_| Vec::new()).collect()),
            agent_streams: Mutex::new(AgentStreams::default()),
            streams,
            done_events,
            portable: devices.len() > 1,
            config,
            owner: Mutex::new(None),
            state: Mutex::new(State::default()),
            entering: AtomicUsize::new(0),
            window_context: OnceLock::new(),
            totals: Mutex::new(Breakdown::default()),
        })
    }

    // ------------------------------------------------ one call at a time

    /// Takes the streamer for one call. A call from inside one of its own
    /// callbacks is refused (it would wait for itself): on the calling thread
    /// (chunk callbacks, the progress callback of an inline pass) the owner
    /// says so, on an agent thread the progress callback's mark does.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (for `what`) from inside a callback.
    pub(super) fn enter(&self, what: &'static str) -> Result<(Owner<'_>, MutexGuard<'_, State>)> {
        let me = std::thread::current().id();
        self.refuse_inside_callback(what)?;
        self.entering.fetch_add(1, Ordering::SeqCst);
        let st = lock(&self.state);
        self.entering.fetch_sub(1, Ordering::SeqCst);
        *lock(&self.owner) = Some(me);
        Ok((Owner(&self.owner, me), st))
    }

    /// Refuses a call from inside one of the streamer's callbacks (see
    /// [`Shared::enter`]), without taking the streamer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (for `what`) from inside a callback.
    pub(super) fn refuse_inside_callback(&self, what: &'static str) -> Result<()> {
        let me = std::thread::current().id();
        if *lock(&self.owner) == Some(me) || inside_callback(self.id()) {
            return Err(Error::invalid(what, "called from inside a callback of the same streamer"));
        }
        Ok(())
    }

    /// This streamer's identity for the callback marks (its address; never 0).
    pub(super) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    // ------------------------------------------------ devices and options

    /// The index of `d`'s stream.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a device the streamer does not use.
    pub(super) fn stream_of(&self, d: Device) -> Result<usize> {
        self.devices.iter().position(|x| *x == d).ok_or_else(|| {
            Error::invalid(
                "Streamer",
                format!("the buffer is on device {}, which this streamer does not use", d.ordinal()),
            )
        })
    }

    /// How the streamer's registrations are made.
    pub(super) fn opts(&self) -> PinOptions {
        PinOptions { mlock: self.config.mlock, portable: self.portable, mapped: false }
    }

    /// Registrations belong to the calling thread's current device unless portable.
    fn device_for_registration(&self) -> Result<()> {
        if !self.portable {
            self.devices[0].make_current()?;
        }
        Ok(())
    }

    // ------------------------------------------------ choosing the strategy

    /// Pinned bytes a plan may use: what the budget has left plus what the
    /// streamer keeps and what is parked with the budget (both would be
    /// given back), within the mlock headroom.
    pub(super) fn usable(&self, kept: u64) -> u64 {
        let budget = &self.config.budget;
        let mut avail = budget.available().saturating_add(kept).saturating_add(budget.parked_bytes());
        if self.config.mlock
            && let Some(h) = crate::memlock::memlock_headroom()
        {
            avail = avail.min(h);
        }
        avail
    }

    /// What [`Strategy::Auto`] picks for `file_len` bytes of a page-cached
    /// file with the budget as it is now (the configured strategy when not
    /// `Auto`; the smallest ring when nothing fits).
    pub(super) fn resolve(&self, file_len: u64) -> Strategy {
        let strategy = self.config.strategy.normalized().unwrap_or(self.config.strategy);
        if strategy != Strategy::Auto {
            return strategy;
        }
        let kept = self.state.try_lock().map(|st| kept(&st)).unwrap_or(0);
        // With `verify`, the bounce buffer is taken from the budget before the
        // plan is made: the plan reported here is the one that will run.
        let bounce = if self.config.verify { bounce_bytes(file_len) } else { 0 };
        let avail = self.usable(kept).saturating_sub(bounce);
        plan(file_len, avail, cpus(), false).unwrap_or(Strategy::Ring { slots: 2, slot: 64 << 10, threads: 1 })
    }

    /// The strategy a transfer of `range` of `file` runs: the configured one,
    /// or what `Auto` picks for `len` bytes (the range's length, or a chained
    /// pass's: see `chain.rs`): the kept registration when there is one of
    /// the range, `O_DIRECT` for a cold range when `len` is larger than the
    /// budget; for a lone range that fits the budget, of a file that does
    /// not, the ring unless the range was streamed recently
    /// ([`plan_lone`], `cache::Recent`).
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] when no strategy fits the budget.
    pub(super) fn pick(&self, st: &State, file: &Arc<MappedFile>, range: &Range<u64>, len: u64) -> Result<Strategy> {
        let strategy = self.config.strategy.normalized()?;
        if strategy != Strategy::Auto {
            return Ok(strategy);
        }
        if cached(st, file, range, self.portable).is_some() {
            return Ok(Strategy::WholeFile);
        }
        let avail = self.usable(kept(st));
        let own = range.end - range.start;
        let cold = || {
            let resident = file.resident_estimate(range.clone()).unwrap_or(own);
            resident < own / 2
        };
        let planned = plan(len, avail, cpus(), len > avail && cold());
        // A lone piece of a file the budget cannot hold, not asked for
        // recently: read once, so through the ring rather than registered.
        if planned == Some(Strategy::WholeFile)
            && len == own
            && file.len() > avail
            && !st.recent.has(file, range, avail)
            && let Some(s) = plan_lone(avail, cpus(), cold())
        {
            return Ok(s);
        }
        planned.ok_or(Error::BudgetExceeded {
            requested: 2 * (64 << 10),
            available: avail,
            limit: self.config.budget.limit(),
        })
    }

    /// The plan of a chained pass that starts with `range` of `file`, for
    /// `len()` bytes (`range`'s and those queued behind it, looked at once the
    /// streamer is free to plan), when it streams through windows or the
    /// ring; then answers that length. `None` where a pass would register
    /// the range whole (or use the registration the streamer keeps): the
    /// transfer then runs alone.
    pub(super) fn chain_plan(
        &self,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        len: impl FnOnce() -> u64,
    ) -> Option<u64> {
        let st = lock(&self.state);
        let len = len();
        self.pick(&st, file, range, len).ok().filter(|s| feeds(*s)).map(|_| len)
    }

    /// Refuses at once (allocating nothing) a strategy whose pins cannot fit
    /// in the budget even after giving back what the streamer keeps, unless
    /// the streamer holds them already (the cached registration of the range,
    /// or a ring of the strategy's shape).
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`].
    pub(super) fn check_fits(
        &self,
        st: &State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        strategy: Strategy,
    ) -> Result<()> {
        let budget = &self.config.budget;
        let need = strategy.nominal_bytes(range.end - range.start).unwrap_or(0);
        let held = match (strategy, &st.ring) {
            (Strategy::WholeFile, _) => cached(st, file, range, self.portable).is_some(),
            (Strategy::Ring { slots, slot, .. } | Strategy::Direct { slots, slot, .. }, Some(r)) => {
                r.slots() == slots && r.slot_bytes() == slot
            }
            _ => false,
        };
        let usable = budget.available().saturating_add(kept(st)).saturating_add(budget.parked_bytes());
        if !held && need > usable {
            return Err(Error::BudgetExceeded { requested: need, available: usable, limit: budget.limit() });
        }
        Ok(())
    }

    // ------------------------------------------------ what it keeps

    /// Gives back what is parked with the budget, then cached registrations
    /// (least recently used first) and then the ring until `need` bytes are
    /// available, keeping what is asked.
    pub(super) fn make_room(&self, st: &mut State, need: u64, keep_ring: bool, keep_cache: Option<usize>) {
        let budget = &self.config.budget;
        if budget.available() < need {
            budget.reclaim(need);
        }
        let mut i = 0;
        while budget.available() < need && i < st.cache.len() {
            if Some(i) == keep_cache {
                i += 1;
                continue;
            }
            drop(st.cache.remove(i));
        }
        if budget.available() < need && !keep_ring {
            st.ring = None;
        }
    }

    /// The streamer's ring of `slots` slots of `slot` bytes: the one it keeps
    /// if it has that shape, else one of that shape parked with the budget
    /// by a streamer dropped earlier, else a new one (the old one given back
    /// first, then cached registrations as the budget needs), kept in its
    /// place.
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`]; the runtime's error allocating the slots.
    pub(super) fn ring_for(&self, st: &mut State, slots: usize, slot: usize) -> Result<PinnedRing> {
        if let Some(r) = &st.ring
            && r.slots() == slots
            && r.slot_bytes() == slot
        {
            return Ok(r.clone());
        }
        st.ring = None;
        let budget = &self.config.budget;
        if let Some(r) = budget.take_parked::<PinnedRing>(|r| r.slots() == slots && r.slot_bytes() == slot) {
            st.ring = Some(r.clone());
            return Ok(r);
        }
        // The slots and, at most, a page each of alignment slack (see PinnedRing::new).
        let most = (slots as u64).saturating_mul((slot as u64).saturating_add(page_size() - 1));
        self.make_room(st, most, true, None);
        let ring = PinnedRing::new(slots, slot, &self.config.budget)?;
        st.ring = Some(ring.clone());
        Ok(ring)
    }

    /// [`Shared::ring_for`] the shape `strategy` streams through
    /// ([`Strategy::ring_shape`]); `None` for a strategy without a ring.
    ///
    /// # Errors
    /// As [`Shared::ring_for`].
    pub(super) fn ring_of(&self, st: &mut State, strategy: Strategy) -> Result<Option<PinnedRing>> {
        strategy.ring_shape().map(|(slots, slot)| self.ring_for(st, slots, slot)).transpose()
    }

    /// The cached registration for `range` (its index in the cache), made
    /// when missing: of the whole file if it fits, else of the range.
    ///
    /// # Errors
    /// [`Error::FileChanged`] for a file truncated since; the registration's
    /// errors ([`Error::Overlap`] where someone else holds a registration
    /// across the range's edge, [`Error::BudgetExceeded`], CUDA's).
    pub(super) fn whole(
        &self,
        st: &mut State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        stats: &PassStats,
    ) -> Result<usize> {
        if let Some(i) = cached(st, file, range, self.portable) {
            // As a fresh registration would: refuse a file truncated since
            // (its lost pages would fault, or copy stale bytes).
            file.check_has(range.end)?;
            let r = st.cache.remove(i);
            st.cache.push(r);
            return Ok(st.cache.len() - 1);
        }
        let page = page_size();
        let pages = |r: &Range<u64>| align_up(r.end, page) - align_down(r.start, page);
        let all = 0..file.len();
        let whole_file = pages(&all) <= self.usable(kept(st));
        let target = if whole_file { all } else { range.clone() };
        self.make_room(st, pages(&target), false, None);
        self.device_for_registration()?;
        // In the second context when there is one, as windows are: dropping
        // the registration later (to make room) then waits only for its own
        // copies, not for every copy in flight on the device.
        let (regctx, _) = stats.time(Step::Setup, || self.window_context());
        let create = |r: Range<u64>| PinnedRange::create_in(regctx.as_ref(), file, r, self.opts(), &self.config.budget);
        let (reg, fresh) = stats.time(Step::Register, || match create(target) {
            // A range of the file is registered elsewhere: register just what is asked.
            Err(Error::Overlap { .. }) if whole_file => create(range.clone()),
            r => r,
        })?;
        if fresh {
            stats.registrations.fetch_add(1, Ordering::Relaxed);
        }
        st.cache.push(reg);
        Ok(st.cache.len() - 1)
    }

    /// The second context sliding windows are registered in, taken on first
    /// use and kept (the process's context on the first device, shared by
    /// every streamer: [`RegistrationContext::shared`]), with what
    /// [`Report::windows`](super::Report::windows) says; `None` (the primary
    /// context) when the configuration turns it off or the context cannot be
    /// made, with the reason.
    pub(super) fn window_context(&self) -> (Option<Arc<RegistrationContext>>, WindowContext) {
        if !self.config.second_context {
            let reason = "StreamConfig::second_context is off".to_string();
            return (None, WindowContext::PrimaryContext { reason });
        }
        let made = self.window_context.get_or_init(|| {
            let dev = self.devices[0];
            // The process's context on the device: one parked with the budget
            // by a streamer dropped earlier, or the one other streamers share.
            match self.config.budget.take_parked::<Arc<RegistrationContext>>(|c| c.device() == dev) {
                Some(c) => Ok(c),
                None => RegistrationContext::shared(&dev).map_err(|e| e.to_string()),
            }
        });
        match made {
            Ok(c) => (Some(Arc::clone(c)), WindowContext::SecondContext),
            Err(reason) => (None, WindowContext::PrimaryContext { reason: reason.clone() }),
        }
    }

    /// The verifier of a transfer of `len` bytes, with
    /// [`StreamConfig::verify`]: its bounce buffer drawn from the budget.
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`]; the runtime's error allocating the buffer.
    pub(super) fn verifier(&self, st: &mut State, len: u64) -> Result<Option<Verifier>> {
        if !self.config.verify {
            return Ok(None);
        }
        let bytes = bounce_bytes(len);
        self.make_room(st, bytes, false, None);
        Ok(Some(Verifier::new(&self.config.budget, bytes as usize)?))
    }
}

/// The bounce buffer verifying a transfer of `len` bytes holds.
fn bounce_bytes(len: u64) -> u64 {
    align_up(len.clamp(1, VERIFY_BOUNCE), page_size())
}
