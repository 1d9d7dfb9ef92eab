//! pinned-mem: an exhaustive model of the pinned ring's slot state machine
//! (our stand-in for loom, which this workspace cannot use), a mutation check
//! proving the checker catches wrong rings, and stress tests of the real
//! [`PinnedRing`] with concurrent producers.
//!
//! # The model
//!
//! K slots, P producer threads, one consumer thread and the device are actors
//! over one shared state. Every step of an actor is one atomic step of
//! `pinned-mem/src/ring.rs` (a critical section of the ring's mutex, or a wait
//! outside it), mirrored as follows:
//!
//! * `acquire_until`: under the lock, pop the free list (a stack: `Vec::pop`);
//!   else pop the **front** of the in-flight queue and, with the lock released,
//!   wait for that slot's events (`Slot::wait`; on a CUDA error the slot goes
//!   back to the **front**, `notify_one`, and the call fails); else wait on the
//!   condvar (`acquire`), wait with a deadline (`acquire_timeout`) or return
//!   `None` (`try_acquire`), and loop when woken.
//! * `FreeSlot` and `FullSlot` drop: `put_free` (push under the lock, then
//!   `notify_one` after releasing it: a separate step).
//! * `FullSlot::submit` / `copy_to_device`: the copy is enqueued and the slot's
//!   event recorded; the slot is now in flight (the device may read it). A
//!   producer may also hand its `FullSlot` to the consumer, which submits it.
//! * `InFlightSlot` drop: `put_back_in_flight(back)` + `notify_one`;
//!   `InFlightSlot::wait`: waits for the events and gives a `FreeSlot` (on a
//!   CUDA error the slot goes back to the front of the queue).
//! * `drain` (the consumer): pop the front, unlock, wait for its events,
//!   `put_free`, loop; on error push it back to the front and stop.
//! * `mem::forget` of each handle type: the slot leaves the model for good.
//! * The condvar: `notify_one` wakes one waiter, the scheduler's choice (every
//!   choice is explored), or nobody when nobody waits (the wake-up is lost).
//!   Spurious wake-ups are explored (safety must hold with them) but progress
//!   never counts on them, nor on CUDA errors.
//! * The device completes any recorded copy at any time (several streams:
//!   in any order), also the copy of a forgotten slot.
//!
//! Every reachable state is explored (BFS with a visited set), each producer
//! bounded to a number of slot lifecycles (one acquire to the last drop or
//! forget), and checked for:
//!
//! * (a) no slot is writable (a `FreeSlot`) while its copy is in flight;
//! * (b) no slot is in the free list while its copy is in flight;
//! * (c) slots are conserved: free + held + queued + in flight + forgotten == K;
//! * (d) progress: from every state where an actor waits (for a slot, an event
//!   or the device) and not every slot was forgotten, a state where it no
//!   longer waits is reachable through fair steps (no spurious wake-up, no
//!   error), e.g. a blocked `acquire` with every slot in flight proceeds once
//!   the device completes;
//! * (e) no slot is in two places at once (held twice, or queued while held),
//!   forgotten ones included: a forgotten handle never makes the ring hand its
//!   memory out again.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{PinBudget, PinnedRing};
use wirespeed_tests::{Ctx, pattern, start};

// ====================================================================== the model

const MAX_K: usize = 3;
const MAX_P: usize = 2;
/// Room in each sequence: K, plus what one wrong step of a mutant may add
/// before the checker stops at the violation.
const SEQ_CAP: usize = MAX_K + 2;

/// A small sequence of slot indices (the free stack, the in-flight queue, the
/// hand-over queue), kept normalized (unused items 0) so equal sequences hash equal.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Seq {
    len: u8,
    items: [u8; SEQ_CAP],
}

impl Seq {
    const EMPTY: Seq = Seq { len: 0, items: [0; SEQ_CAP] };

    fn as_slice(&self) -> &[u8] {
        &self.items[..self.len as usize]
    }

    fn push(&mut self, s: u8) {
        assert!((self.len as usize) < SEQ_CAP, "model sequence overflow");
        self.items[self.len as usize] = s;
        self.len += 1;
    }

    fn push_front(&mut self, s: u8) {
        assert!((self.len as usize) < SEQ_CAP, "model sequence overflow");
        self.items.copy_within(0..self.len as usize, 1);
        self.items[0] = s;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<u8> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(std::mem::take(&mut self.items[self.len as usize]))
    }

    fn pop_front(&mut self) -> Option<u8> {
        if self.len == 0 {
            return None;
        }
        let s = self.items[0];
        self.items.copy_within(1..self.len as usize, 0);
        self.len -= 1;
        self.items[self.len as usize] = 0;
        Some(s)
    }
}

/// The slot's last copy, as the ring's `recorded` events see it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Ev {
    /// No copy since the last wait (never submitted, or waited for).
    Idle,
    /// Submitted, its event recorded, not complete: the device may read the slot.
    Pending,
    /// Complete, not yet waited for (completed but not reclaimed).
    Done,
}

/// How an acquire waits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Mode {
    /// `acquire`: waits on the condvar until a slot comes back.
    Block,
    /// `acquire_timeout`: waits, may time out.
    Timeout,
    /// `try_acquire`, or a timed-out `acquire_timeout` taking its last look.
    Try,
}

/// Where an actor is in its program (the slot it holds, if any).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum At {
    /// Between slot lifecycles.
    Idle,
    /// In `acquire_until`, blocked on the condvar.
    Waiting(Mode),
    /// In `acquire_until`, woken: retakes the lock and loops.
    Woken(Mode),
    /// In `acquire_until`, holding the oldest in-flight slot, waiting for its events.
    Reclaiming(u8),
    /// Holds a `FreeSlot` (writable).
    Free(u8),
    /// Holds a `FullSlot` (host-readable).
    Full(u8),
    /// Holds an `InFlightSlot` (no access).
    InFlight(u8),
    /// In `InFlightSlot::wait`.
    WaitingOwn(u8),
    /// In `drain` (consumer only): `None` about to pop, `Some` waiting for that slot.
    Draining(Option<u8>),
}

impl At {
    fn slot(self) -> Option<u8> {
        match self {
            At::Reclaiming(s) | At::Free(s) | At::Full(s) | At::InFlight(s) | At::WaitingOwn(s) => Some(s),
            At::Draining(s) => s,
            At::Idle | At::Waiting(_) | At::Woken(_) => None,
        }
    }

    /// Waiting for something (a slot, an event, the device) rather than acting.
    fn waits(self) -> bool {
        matches!(self, At::Waiting(_) | At::Woken(_) | At::Reclaiming(_) | At::WaitingOwn(_) | At::Draining(_))
    }

    /// Waiting for a slot to come back to the ring.
    fn wants_slot(self) -> bool {
        matches!(self, At::Waiting(_) | At::Woken(_))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Actor {
    at: At,
    /// Slot lifecycles left (producers) or drains left (the consumer).
    left: u8,
    /// Put a slot back and released the lock: `notify_one` is its next step.
    owe_notify: bool,
}

impl Actor {
    const DONE: Actor = Actor { at: At::Idle, left: 0, owe_notify: false };
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct State {
    /// `RingState::free`: a stack (push and pop at the end).
    free: Seq,
    /// `RingState::in_flight`: a queue (pop the front, drop pushes the back).
    in_flight: Seq,
    /// Full slots handed from producers to the consumer (a channel).
    handoff: Seq,
    ev: [Ev; MAX_K],
    /// Bit s: slot s's handle was forgotten.
    forgotten: u8,
    prod: [Actor; MAX_P],
    cons: Actor,
    /// CUDA errors still allowed while waiting on an event.
    faults: u8,
}

/// Deliberately wrong rings, each of which the checker must reject.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mutation {
    /// `acquire` hands out the oldest in-flight slot without waiting for its events.
    ReclaimWithoutWait,
    /// Dropping an `InFlightSlot` puts it on the free list.
    InFlightDropToFree,
    /// Dropping an `InFlightSlot` queues it without `notify_one`.
    InFlightDropWithoutNotify,
    /// `submit` forgets to take the slot out of the `FullSlot`, whose drop then
    /// returns it to the free list while it is also in flight.
    SubmitKeepsSlot,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    k: usize,
    p: usize,
    /// Slot lifecycles per producer.
    ops: u8,
    /// `drain` calls by the consumer.
    drains: u8,
    /// CUDA errors while waiting on events, in all.
    faults: u8,
    mutation: Option<Mutation>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Producer(usize),
    Consumer,
    Device,
}

#[derive(Clone, Copy, Debug)]
struct Edge {
    who: Who,
    what: &'static str,
    /// False for a spurious wake-up or a CUDA error: progress may not count on them.
    fair: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Property {
    NoWriteWhileInFlight,
    NeverFreeBeforeComplete,
    Conservation,
    Progress,
    NoDoubleHandOut,
}

#[derive(Debug)]
struct Violation {
    property: Property,
    message: String,
    trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:?}: {}", self.property, self.message)?;
        for (i, step) in self.trace.iter().enumerate() {
            writeln!(f, "  {:3}. {step}", i + 1)?;
        }
        Ok(())
    }
}

/// What the exploration saw (to show the model is not vacuous).
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    states: usize,
    edges: usize,
    depth: usize,
    /// A producer blocked while every slot not forgotten is in flight.
    blocked_all_in_flight: usize,
    /// A slot whose copy completed, still in the in-flight queue.
    completed_not_reclaimed: usize,
    /// A producer waiting for the oldest in-flight slot's events.
    reclaiming: usize,
    /// A forgotten slot whose copy is still running.
    forgotten_in_flight: usize,
    /// Two producers blocked at once.
    two_blocked: usize,
    /// Every slot forgotten.
    all_forgotten: usize,
}

impl State {
    fn initial(cfg: &Config) -> State {
        let mut free = Seq::EMPTY;
        for s in (0..cfg.k as u8).rev() {
            free.push(s); // `free.reverse()`: slot 0 is handed out first
        }
        let mut prod = [Actor::DONE; MAX_P];
        for p in prod.iter_mut().take(cfg.p) {
            p.left = cfg.ops;
        }
        State {
            free,
            in_flight: Seq::EMPTY,
            handoff: Seq::EMPTY,
            ev: [Ev::Idle; MAX_K],
            forgotten: 0,
            prod,
            cons: Actor { at: At::Idle, left: cfg.drains, owe_notify: false },
            faults: cfg.faults,
        }
    }

    fn actor(&mut self, who: Who) -> &mut Actor {
        match who {
            Who::Producer(i) => &mut self.prod[i],
            Who::Consumer => &mut self.cons,
            Who::Device => unreachable!("the device holds no slot"),
        }
    }

    fn forgotten_count(&self) -> usize {
        self.forgotten.count_ones() as usize
    }

    /// `put_free`: push under the lock; `notify_one` follows as the next step.
    fn put_free(&mut self, who: Who, s: u8) {
        self.free.push(s);
        self.actor(who).owe_notify = true;
    }

    /// `put_back_in_flight`, then `notify_one` as the next step.
    fn put_back_in_flight(&mut self, who: Who, s: u8, front: bool, notify: bool) {
        if front {
            self.in_flight.push_front(s);
        } else {
            self.in_flight.push(s);
        }
        self.actor(who).owe_notify = notify;
    }

    /// One pass of the loop of `acquire_until`, under the lock.
    fn acquire_step(&mut self, who: Who, mode: Mode, cfg: &Config) {
        let at = if let Some(s) = self.free.pop() {
            At::Free(s)
        } else if let Some(s) = self.in_flight.pop_front() {
            if cfg.mutation == Some(Mutation::ReclaimWithoutWait) { At::Free(s) } else { At::Reclaiming(s) }
        } else {
            match mode {
                Mode::Try => At::Idle,
                m => At::Waiting(m),
            }
        };
        self.actor(who).at = at;
    }
}

/// Every step from `s`.
fn successors(s: &State, cfg: &Config) -> Vec<(Edge, State)> {
    let mut out = Vec::new();
    let mut push = |who: Who, what: &'static str, fair: bool, n: State| out.push((Edge { who, what, fair }, n));

    let actors: Vec<Who> = (0..cfg.p).map(Who::Producer).chain([Who::Consumer]).collect();
    for who in actors {
        let mut base = *s;
        let a = *base.actor(who);
        if a.owe_notify {
            // notify_one: wakes one waiter (each choice), or nobody.
            base.actor(who).owe_notify = false;
            let mut any = false;
            for q in 0..cfg.p {
                if let At::Waiting(m) = base.prod[q].at {
                    let mut n = base;
                    n.prod[q].at = At::Woken(m);
                    push(who, "notify_one (wakes a waiter)", true, n);
                    any = true;
                }
            }
            if !any {
                push(who, "notify_one (nobody waits)", true, base);
            }
            continue;
        }
        // A CUDA error while waiting on `x`'s events: the slot goes back to the
        // front of the in-flight queue (notified), the call fails.
        let fault = |x: u8, what: &'static str, push: &mut dyn FnMut(Who, &'static str, bool, State)| {
            if s.faults > 0 {
                let mut n = *s;
                n.faults -= 1;
                n.put_back_in_flight(who, x, true, true);
                n.actor(who).at = At::Idle;
                push(who, what, false, n);
            }
        };
        match a.at {
            At::Idle => match who {
                Who::Producer(_) if a.left > 0 => {
                    for (mode, what) in
                        [(Mode::Block, "acquire"), (Mode::Timeout, "acquire_timeout"), (Mode::Try, "try_acquire")]
                    {
                        let mut n = base;
                        n.actor(who).left -= 1;
                        n.acquire_step(who, mode, cfg);
                        push(who, what, true, n);
                    }
                }
                Who::Consumer => {
                    let mut n = base;
                    if let Some(x) = n.handoff.pop_front() {
                        n.ev[x as usize] = Ev::Pending;
                        n.cons.at = At::InFlight(x);
                        push(who, "takes a full slot and submits it", true, n);
                    }
                    if a.left > 0 {
                        let mut n = base;
                        n.cons.left -= 1;
                        n.cons.at = At::Draining(None);
                        push(who, "drain", true, n);
                    }
                }
                _ => {}
            },
            At::Waiting(m) => {
                let mut n = base;
                n.actor(who).at = At::Woken(m);
                push(who, "spurious wake-up", false, n);
                if m == Mode::Timeout {
                    let mut n = base;
                    n.actor(who).at = At::Woken(Mode::Try);
                    push(who, "times out", true, n);
                }
            }
            At::Woken(m) => {
                let mut n = base;
                n.acquire_step(who, m, cfg);
                push(who, "retakes the lock", true, n);
            }
            At::Reclaiming(x) => {
                if s.ev[x as usize] != Ev::Pending {
                    let mut n = base;
                    n.ev[x as usize] = Ev::Idle;
                    n.actor(who).at = At::Free(x);
                    push(who, "reclaimed the oldest in-flight slot (events waited for)", true, n);
                }
                fault(x, "event wait fails in acquire", &mut push);
            }
            At::Free(x) => {
                if matches!(who, Who::Producer(_)) {
                    let mut n = base;
                    n.actor(who).at = At::Full(x);
                    push(who, "fills", true, n);
                }
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.put_free(who, x);
                push(who, "drops the FreeSlot", true, n);
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.forgotten |= 1 << x;
                push(who, "forgets the FreeSlot", true, n);
            }
            At::Full(x) => {
                let mut n = base;
                n.ev[x as usize] = Ev::Pending;
                n.actor(who).at = At::InFlight(x);
                if cfg.mutation == Some(Mutation::SubmitKeepsSlot) {
                    n.free.push(x);
                }
                push(who, "submits (copy enqueued, event recorded)", true, n);
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.handoff.push(x);
                push(who, "hands the FullSlot to the consumer", true, n);
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.put_free(who, x);
                push(who, "drops the FullSlot unused", true, n);
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.forgotten |= 1 << x;
                push(who, "forgets the FullSlot", true, n);
            }
            At::InFlight(x) => {
                let mut n = base;
                n.actor(who).at = At::Idle;
                match cfg.mutation {
                    Some(Mutation::InFlightDropToFree) => n.put_free(who, x),
                    Some(Mutation::InFlightDropWithoutNotify) => n.put_back_in_flight(who, x, false, false),
                    _ => n.put_back_in_flight(who, x, false, true),
                }
                push(who, "drops the InFlightSlot", true, n);
                let mut n = base;
                n.actor(who).at = At::WaitingOwn(x);
                push(who, "InFlightSlot::wait", true, n);
                let mut n = base;
                n.actor(who).at = At::Idle;
                n.forgotten |= 1 << x;
                push(who, "forgets the InFlightSlot", true, n);
            }
            At::WaitingOwn(x) => {
                if s.ev[x as usize] != Ev::Pending {
                    let mut n = base;
                    n.ev[x as usize] = Ev::Idle;
                    n.actor(who).at = At::Free(x);
                    push(who, "InFlightSlot::wait returns the FreeSlot", true, n);
                }
                fault(x, "event wait fails in InFlightSlot::wait", &mut push);
            }
            At::Draining(None) => {
                let mut n = base;
                match n.in_flight.pop_front() {
                    Some(x) => {
                        n.actor(who).at = At::Draining(Some(x));
                        push(who, "drain pops the oldest in-flight slot", true, n);
                    }
                    None => {
                        n.actor(who).at = At::Idle;
                        push(who, "drain returns", true, n);
                    }
                }
            }
            At::Draining(Some(x)) => {
                if s.ev[x as usize] != Ev::Pending {
                    let mut n = base;
                    n.ev[x as usize] = Ev::Idle;
                    n.actor(who).at = At::Draining(None);
                    n.put_free(who, x);
                    push(who, "drain waited and frees the slot", true, n);
                }
                fault(x, "event wait fails in drain", &mut push);
            }
        }
    }
    for x in 0..cfg.k {
        if s.ev[x] == Ev::Pending {
            let mut n = *s;
            n.ev[x] = Ev::Done;
            push(
                Who::Device,
                ["completes slot 0's copy", "completes slot 1's copy", "completes slot 2's copy"][x],
                true,
                n,
            );
        }
    }
    out
}

/// The safety properties (a), (b), (c), (e) of one state.
fn check_state(s: &State, cfg: &Config) -> Result<(), (Property, String)> {
    let mut places = [0usize; MAX_K];
    let mut count = |x: u8| {
        if let Some(c) = places.get_mut(x as usize) {
            *c += 1;
        }
    };
    s.free.as_slice().iter().for_each(|&x| count(x));
    s.in_flight.as_slice().iter().for_each(|&x| count(x));
    s.handoff.as_slice().iter().for_each(|&x| count(x));
    for a in s.prod[..cfg.p].iter().chain([&s.cons]) {
        if let Some(x) = a.at.slot() {
            count(x);
        }
    }
    for x in 0..cfg.k {
        if s.forgotten & (1 << x) != 0 {
            count(x as u8);
        }
    }
    for (x, &n) in places.iter().enumerate().take(cfg.k) {
        if n > 1 {
            return Err((Property::NoDoubleHandOut, format!("slot {x} is in {n} places at once: {s:?}")));
        }
    }
    let total: usize = places.iter().sum();
    if total != cfg.k {
        return Err((Property::Conservation, format!("{total} slots accounted for, not {}: {s:?}", cfg.k)));
    }
    if let Some(&x) = s.free.as_slice().iter().find(|&&x| s.ev[x as usize] == Ev::Pending) {
        return Err((Property::NeverFreeBeforeComplete, format!("slot {x} is free while its copy runs: {s:?}")));
    }
    for a in s.prod[..cfg.p].iter().chain([&s.cons]) {
        if let At::Free(x) = a.at
            && s.ev[x as usize] == Ev::Pending
        {
            return Err((Property::NoWriteWhileInFlight, format!("slot {x} is writable while its copy runs: {s:?}")));
        }
    }
    Ok(())
}

/// A fast hasher for the visited set (FxHash's mixing step).
#[derive(Default)]
struct Fx(u64);

impl Fx {
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.add(u64::from(b)));
    }
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The steps from the initial state to state `i`, named.
fn trace(states: &[State], parents: &[u32], mut i: u32, cfg: &Config) -> Vec<String> {
    let mut steps = Vec::new();
    while i != 0 {
        let p = parents[i as usize];
        let (from, to) = (&states[p as usize], &states[i as usize]);
        let e = successors(from, cfg).into_iter().find(|(_, n)| n == to).expect("a step to the child").0;
        let who = match e.who {
            Who::Producer(p) => format!("producer {p}"),
            Who::Consumer => "consumer".into(),
            Who::Device => "device".into(),
        };
        steps.push(format!("{who}: {}", e.what));
        i = p;
    }
    steps.reverse();
    steps
}

/// Explores every state of `cfg`; the first violation found, or what was seen.
fn explore(cfg: &Config) -> Result<Stats, Violation> {
    assert!((1..=MAX_K).contains(&cfg.k) && (1..=MAX_P).contains(&cfg.p));
    let init = State::initial(cfg);
    let mut index: HashMap<State, u32, BuildHasherDefault<Fx>> = HashMap::default();
    // States in BFS order (index = discovery order), their parent, depth, and
    // the fair steps out of each (CSR: state i's are succ[succ_start[i]..succ_start[i + 1]]).
    let mut states: Vec<State> = vec![init];
    let mut parents: Vec<u32> = vec![0];
    let mut depth: Vec<u8> = vec![0];
    let mut succ_start: Vec<u32> = Vec::new();
    let mut succ: Vec<u32> = Vec::new();
    // Per state, bit a: actor a (producers, then the consumer) does not wait.
    // Bit 7: a waiting actor is exempt (every slot forgotten).
    let mut free_of_wait: Vec<u8> = Vec::new();
    let mut exempt: Vec<u8> = Vec::new();
    let who: Vec<Who> = (0..cfg.p).map(Who::Producer).chain([Who::Consumer]).collect();
    let mut stats = Stats::default();
    index.insert(states[0], 0);
    let mut i = 0usize;
    while i < states.len() {
        let s = states[i];
        if let Err((property, message)) = check_state(&s, cfg) {
            return Err(Violation { property, message, trace: trace(&states, &parents, i as u32, cfg) });
        }
        // Coverage.
        let live = cfg.k - s.forgotten_count();
        let blocked = s.prod[..cfg.p].iter().filter(|a| matches!(a.at, At::Waiting(_))).count();
        stats.blocked_all_in_flight += usize::from(blocked > 0 && live > 0 && s.in_flight.len as usize == live);
        stats.completed_not_reclaimed +=
            usize::from(s.in_flight.as_slice().iter().any(|&x| s.ev[x as usize] == Ev::Done));
        stats.reclaiming += usize::from(s.prod[..cfg.p].iter().any(|a| matches!(a.at, At::Reclaiming(_))));
        stats.forgotten_in_flight +=
            usize::from((0..cfg.k).any(|x| s.forgotten & (1 << x) != 0 && s.ev[x] == Ev::Pending));
        stats.two_blocked += usize::from(blocked == 2);
        stats.all_forgotten += usize::from(live == 0);
        stats.depth = stats.depth.max(usize::from(depth[i]));
        let (mut fw, mut ex) = (0u8, 0u8);
        for (a, &w) in who.iter().enumerate() {
            let at = match w {
                Who::Producer(p) => s.prod[p].at,
                _ => s.cons.at,
            };
            fw |= u8::from(!at.waits()) << a;
            ex |= u8::from(at.wants_slot() && live == 0) << a;
        }
        free_of_wait.push(fw);
        exempt.push(ex);

        succ_start.push(succ.len() as u32);
        for (edge, n) in successors(&s, cfg) {
            stats.edges += 1;
            let j = *index.entry(n).or_insert_with(|| {
                states.push(n);
                parents.push(i as u32);
                depth.push(depth[i] + 1);
                (states.len() - 1) as u32
            });
            if edge.fair {
                succ.push(j);
            }
        }
        i += 1;
    }
    succ_start.push(succ.len() as u32);
    stats.states = states.len();
    drop(index);

    // (d) Progress: the states from which each actor can stop waiting through
    // fair steps (a least fixpoint; passes in reverse BFS order converge fast).
    let mut ok = free_of_wait;
    loop {
        let mut changed = false;
        for i in (0..states.len()).rev() {
            let mut bits = ok[i];
            for &j in &succ[succ_start[i] as usize..succ_start[i + 1] as usize] {
                bits |= ok[j as usize];
            }
            if bits != ok[i] {
                ok[i] = bits;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let all = (1u8 << who.len()) - 1;
    if let Some(i) = (0..states.len()).find(|&i| (ok[i] | exempt[i]) != all) {
        let s = states[i];
        let a = (0..who.len()).find(|&a| (ok[i] | exempt[i]) & (1 << a) == 0).unwrap_or(0);
        return Err(Violation {
            property: Property::Progress,
            message: format!("{:?} waits forever although not every slot was forgotten: {s:?}", who[a]),
            trace: trace(&states, &parents, i as u32, cfg),
        });
    }
    Ok(stats)
}

/// The bounds: enough slot lifecycles for the producers to put every slot in
/// flight and still ask for one more (K + 1, at least 3, for one producer; 3 each for two).
fn config(k: usize, p: usize) -> Config {
    let ops = if p == 1 { (k as u8 + 1).max(3) } else { 3 };
    Config { k, p, ops, drains: 1, faults: 1, mutation: None }
}

#[test]
fn the_ring_model_is_safe_and_live_for_every_interleaving() {
    let mut total = 0;
    for k in 1..=MAX_K {
        for p in 1..=MAX_P {
            let cfg = config(k, p);
            let t0 = std::time::Instant::now();
            let stats = explore(&cfg).unwrap_or_else(|v| panic!("K={k} P={p}: {v}"));
            eprintln!(
                "ring model K={k} P={p} (+consumer, device; {} lifecycles per producer, {} drain, {} CUDA error): \
                 {} states, {} transitions, depth {}, {:.1} s; {stats:?}",
                cfg.ops,
                cfg.drains,
                cfg.faults,
                stats.states,
                stats.edges,
                stats.depth,
                t0.elapsed().as_secs_f64()
            );
            assert!(stats.states > 0);
            // The interesting situations were reached, so the properties were checked on them.
            assert!(stats.blocked_all_in_flight > 0, "K={k} P={p}: a blocked acquire with every slot in flight");
            assert!(stats.completed_not_reclaimed > 0 && stats.reclaiming > 0, "K={k} P={p}");
            assert!(stats.forgotten_in_flight > 0 && stats.all_forgotten > 0, "K={k} P={p}");
            if p == 2 {
                assert!(stats.two_blocked > 0, "K={k} P={p}: both producers blocked at once");
            }
            total += stats.states;
        }
    }
    eprintln!("ring model: {total} states in all");
}

#[test]
fn the_checker_catches_wrong_rings() {
    for (mutation, property) in [
        (Mutation::ReclaimWithoutWait, Property::NoWriteWhileInFlight),
        (Mutation::InFlightDropToFree, Property::NeverFreeBeforeComplete),
        (Mutation::InFlightDropWithoutNotify, Property::Progress),
        (Mutation::SubmitKeepsSlot, Property::NoDoubleHandOut),
    ] {
        let mut caught = Vec::new();
        for k in 1..=MAX_K {
            for p in 1..=MAX_P {
                // Smaller bounds than above (a progress violation is only known once
                // every state was explored): still enough to put every slot in flight.
                let ops = if p == 1 { k as u8 + 1 } else { 2 };
                let cfg = Config { mutation: Some(mutation), ops, ..config(k, p) };
                match explore(&cfg) {
                    Ok(stats) => panic!("{mutation:?} not caught with K={k} P={p} ({} states)", stats.states),
                    Err(v) => {
                        assert_eq!(v.property, property, "{mutation:?}, K={k} P={p}: {v}");
                        if caught.is_empty() {
                            eprintln!("{mutation:?} caught (K={k} P={p}) in {} steps:\n{v}", v.trace.len());
                        }
                        caught.push((k, p));
                    }
                }
            }
        }
        assert_eq!(caught.len(), MAX_K * MAX_P, "{mutation:?}");
    }
}

#[test]
fn the_model_mirrors_the_ring_orders() {
    // Slot 0 first (`free.reverse()`), the free list is a stack, the in-flight
    // queue is FIFO with errors putting the slot back in front.
    let cfg = config(3, 1);
    let mut s = State::initial(&cfg);
    s.acquire_step(Who::Producer(0), Mode::Block, &cfg);
    assert_eq!(s.prod[0].at, At::Free(0));
    s.put_free(Who::Producer(0), 0);
    s.acquire_step(Who::Producer(0), Mode::Block, &cfg);
    assert_eq!(s.prod[0].at, At::Free(0), "the slot just returned is reused first");
    let mut q = Seq::EMPTY;
    q.push(1);
    q.push(2);
    q.push_front(0);
    assert_eq!(q.as_slice(), [0, 1, 2]);
    assert_eq!((q.pop_front(), q.pop(), q.as_slice()), (Some(0), Some(2), &[1u8][..]));
    assert_eq!(q, {
        let mut r = Seq::EMPTY;
        r.push(1);
        r
    });
}

// ====================================================================== the real ring

fn host_allocs(t: &Ctx) -> Option<u64> {
    t.emulated().then(|| t.emu().call_count("cudaHostAlloc").unwrap())
}

const NOBODY: usize = usize::MAX;

/// Marks slot `i` as held by `tid`: fails if another handle holds it.
#[track_caller]
fn claim(owners: &[AtomicUsize], i: usize, tid: usize) {
    if let Err(other) = owners[i].compare_exchange(NOBODY, tid, Ordering::AcqRel, Ordering::Acquire) {
        panic!("slot {i} handed to thread {tid} while thread {other} holds it");
    }
}

#[track_caller]
fn release(owners: &[AtomicUsize], i: usize, tid: usize) {
    assert_eq!(owners[i].swap(NOBODY, Ordering::AcqRel), tid, "slot {i}");
}

#[test]
fn producer_threads_share_the_real_ring_under_delays() {
    let t = start();
    {
        if t.emulated() {
            t.set_delay_us(50); // copies complete well after they are enqueued
        }
        const SLOTS: usize = 3;
        const SLOT: usize = 8 << 10;
        const CHUNKS: usize = 480;
        const THREADS: usize = 4;
        let dev = Device::get(0).unwrap();
        let streams = [Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap()];
        let total = CHUNKS * SLOT - 1234; // the last chunk is partial
        let chunk = |c: usize| (c * SLOT, SLOT.min(total - c * SLOT));
        let expected: Vec<u8> = (0..CHUNKS).flat_map(|c| pattern(1000 + c as u64, chunk(c).1)).collect();
        // The slots, and their alignment slack (a page each at most) if any.
        let budget = PinBudget::new((SLOTS * (SLOT + 65536)) as u64);
        let allocs0 = host_allocs(&t);
        let ring = PinnedRing::new(SLOTS, SLOT, &budget).unwrap();
        let allocs1 = host_allocs(&t);
        // An unaligned first block was given back for a padded one.
        let padded = u64::from(ring.pinned_bytes() > (SLOTS * SLOT) as u64);
        let dst = Mutex::new(DeviceBuffer::<u8>::new(&dev, total).unwrap());
        let next = AtomicUsize::new(0);
        let owners: [AtomicUsize; SLOTS] = std::array::from_fn(|_| AtomicUsize::new(NOBODY));
        let (submitted, reported, misses) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for tid in 0..THREADS {
                let (ring, dst, next, owners, streams) = (&ring, &dst, &next, &owners, &streams);
                let (submitted, reported, misses) = (&submitted, &reported, &misses);
                s.spawn(move || {
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= CHUNKS {
                            break;
                        }
                        let (off, len) = chunk(c);
                        let get = |how: usize| {
                            let f = match how % 3 {
                                0 => ring.acquire().unwrap(),
                                1 => loop {
                                    if let Some(f) = ring.try_acquire().unwrap() {
                                        break f;
                                    }
                                    misses.fetch_add(1, Ordering::Relaxed);
                                    std::thread::yield_now();
                                },
                                _ => loop {
                                    if let Some(f) = ring.acquire_timeout(Duration::from_micros(300)).unwrap() {
                                        break f;
                                    }
                                    misses.fetch_add(1, Ordering::Relaxed);
                                },
                            };
                            claim(owners, f.index(), tid);
                            reported.fetch_add(f.completed_bytes(), Ordering::Relaxed);
                            f
                        };
                        let mut free = get(c);
                        if c % 5 == 0 {
                            // Filled, then dropped unused: back to the free list.
                            let i0 = free.index();
                            let junk = free
                                .fill_with(|b| {
                                    b.fill(0xEE);
                                    Ok(b.len())
                                })
                                .unwrap();
                            release(owners, i0, tid);
                            drop(junk);
                            free = get(c + 1);
                        }
                        let idx = free.index();
                        let data = pattern(1000 + c as u64, len);
                        let full = free
                            .fill_with(|b| {
                                b[..len].copy_from_slice(&data);
                                Ok(len)
                            })
                            .unwrap();
                        assert_eq!(full.data().unwrap(), &data[..]);
                        let in_flight = {
                            let mut d = dst.lock().unwrap();
                            if c % 4 == 3 {
                                let half = len / 2;
                                full.submit(&[&streams[0], &streams[1]], |src| {
                                    let mut a = d.slice_mut(off..off + half)?;
                                    streams[0].copy_to_device(&src.slice(0..half)?, &mut a)?.detach();
                                    let mut b = d.slice_mut(off + half..off + len)?;
                                    streams[1].copy_to_device(&src.slice(half..len)?, &mut b)?.detach();
                                    Ok(())
                                })
                                .unwrap()
                            } else {
                                let mut part = d.slice_mut(off..off + len).unwrap();
                                full.copy_to_device(&streams[c % 2], &mut part).unwrap()
                            }
                        };
                        submitted.fetch_add(len as u64, Ordering::Relaxed);
                        if c % 7 == 0 {
                            let f = in_flight.wait().unwrap();
                            assert_eq!(f.completed_bytes(), len as u64);
                            reported.fetch_add(len as u64, Ordering::Relaxed);
                            release(owners, idx, tid);
                            drop(f);
                        } else {
                            release(owners, idx, tid);
                            drop(in_flight);
                        }
                        if c % 29 == 0 {
                            reported.fetch_add(ring.drain().unwrap(), Ordering::Relaxed);
                        }
                        assert!(ring.free_slots() + ring.in_flight_slots() <= SLOTS);
                    }
                });
            }
        });
        reported.fetch_add(ring.drain().unwrap(), Ordering::Relaxed);
        eprintln!(
            "{THREADS} producers, {SLOTS} slots, {CHUNKS} chunks: {} bytes; try_acquire/acquire_timeout came back empty {} times",
            submitted.load(Ordering::Relaxed),
            misses.load(Ordering::Relaxed)
        );
        assert_eq!(
            reported.load(Ordering::Relaxed),
            submitted.load(Ordering::Relaxed),
            "every copy's bytes reported complete exactly once"
        );
        assert_eq!((ring.free_slots(), ring.in_flight_slots()), (SLOTS, 0));
        assert!(owners.iter().all(|o| o.load(Ordering::Relaxed) == NOBODY));
        assert!(dst.lock().unwrap().to_vec().unwrap() == expected, "device data differs");
        assert_eq!(ring.allocations(), SLOTS as u64);
        if let (Some(a0), Some(a1)) = (allocs0, allocs1) {
            assert_eq!(a1 - a0, SLOTS as u64 + padded, "one cudaHostAlloc per slot at start-up");
            assert_eq!(host_allocs(&t), Some(a1), "no allocation after start-up");
        }
        drop((ring, dst, streams));
        assert_eq!(budget.used(), 0);
    }
    t.assert_clean();
}

/// `mem::forget` of each handle type only loses that slot: the ring never hands
/// it out again and goes on with the others. The forgotten slots' pinned memory
/// is leaked by design (never freed under a copy), so this runs in a child
/// process whose leaks do not matter.
#[test]
fn forgetting_handles_only_loses_their_slots() {
    let t = start();
    wirespeed_tests::run_child("forget_child", &[]);
    t.assert_clean();
}

/// Runs only in the child process started above.
#[test]
#[ignore = "runs in a child process started by forgetting_handles_only_loses_their_slots"]
fn forget_child() {
    if !wirespeed_tests::is_child("forget_child") {
        return;
    }
    let t = start();
    if t.emulated() {
        t.set_delay_us(2_000);
    }
    let dev = Device::get(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let budget = PinBudget::new(3 * (4096 + 65536)); // the slots, and their alignment slack if any
    let ring = PinnedRing::new(3, 4096, &budget).unwrap();
    let pinned = ring.pinned_bytes();
    let mut dst = DeviceBuffer::<u8>::new(&dev, 4096).unwrap();

    let a = ring.acquire().unwrap();
    let ia = a.index();
    std::mem::forget(a); // a FreeSlot
    let b = ring.acquire().unwrap();
    let ib = b.index();
    std::mem::forget(b.copy_from(b"forgotten").unwrap()); // a FullSlot
    assert_eq!(ring.free_slots() + ring.in_flight_slots(), 1);
    let mut ic = None;
    for i in 0..6u8 {
        let f = ring.acquire().unwrap();
        assert!(f.index() != ia && f.index() != ib, "a forgotten slot was handed out again");
        assert_eq!(*ic.get_or_insert(f.index()), f.index());
        assert!(ring.try_acquire().unwrap().is_none(), "only one slot is left");
        drop(f.copy_from(&[i; 4096]).unwrap().copy_to_device(&stream, &mut dst).unwrap());
    }
    // An InFlightSlot forgotten while its copy may still run: the copy completes
    // from the leaked (still allocated) memory.
    let f = ring.acquire().unwrap();
    std::mem::forget(f.copy_from(&[77; 4096]).unwrap().copy_to_device(&stream, &mut dst).unwrap());
    assert!(ring.try_acquire().unwrap().is_none());
    assert!(ring.acquire_timeout(Duration::from_millis(20)).unwrap().is_none());
    assert_eq!((ring.free_slots(), ring.in_flight_slots(), ring.drain().unwrap()), (0, 0, 0));
    assert_eq!(dst.to_vec().unwrap(), vec![77; 4096]);
    assert_eq!(ring.allocations(), 3);
    drop(ring);
    // Each forgotten handle also holds the ring's shared state (an `Arc`), so the
    // whole ring is leaked with it, and its budget stays drawn: the budget keeps
    // counting memory that stays pinned, it never under-counts.
    assert_eq!(budget.used(), pinned);
    if let Some(c) = t.counters() {
        assert_eq!(c.pinned_allocs, 3, "the slots are leaked, never freed under a copy: {c:?}");
    }
    wirespeed_tests::child_ran("forget_child");
}
