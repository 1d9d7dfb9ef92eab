//! Where a pass's time goes: counters its agents add to as they run
//! (`PassStats`), read into a [`Breakdown`] for its report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::report::Breakdown;

/// What the agents of one pass count, shared with a chained pass's sink
/// (which reports each transfer's share).
#[derive(Default, Debug)]
pub(super) struct PassStats {
    /// Fresh `cudaHostRegister` (or driver) registrations.
    pub(super) registrations: AtomicU64,
    pub(super) in_place_bytes: AtomicU64,
    pub(super) ring_bytes: AtomicU64,
    /// Of those, read through the page cache (a cold file read buffered).
    pub(super) buffered_bytes: AtomicU64,
    register_ns: AtomicU64,
    unregister_ns: AtomicU64,
    window_wait_ns: AtomicU64,
    fill_ns: AtomicU64,
    slot_wait_ns: AtomicU64,
    setup_ns: AtomicU64,
    /// Reserve ring threads that joined the pass.
    pub(super) reserve_joined: AtomicU64,
    /// Ring bytes filled before their transfer came, and taken by it.
    pub(super) read_ahead_bytes: AtomicU64,
    /// Bytes read ahead that no transfer took.
    pub(super) read_ahead_dropped: AtomicU64,
}

/// The timed steps of the agents.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    /// The window agent registering a window.
    Register,
    /// The window agent unregistering a window whose copies completed.
    Unregister,
    /// The window agent waiting for a window's copies to complete.
    WindowWait,
    /// A ring agent filling a slot (`memcpy` from the mapping, or `O_DIRECT` reads).
    Fill,
    /// A ring agent waiting for a free slot (its copies to complete).
    SlotWait,
    /// Making ready before the copies: allocating the pinned ring, creating
    /// the registration context.
    Setup,
}

impl PassStats {
    fn counter(&self, step: Step) -> &AtomicU64 {
        match step {
            Step::Register => &self.register_ns,
            Step::Unregister => &self.unregister_ns,
            Step::WindowWait => &self.window_wait_ns,
            Step::Fill => &self.fill_ns,
            Step::SlotWait => &self.slot_wait_ns,
            Step::Setup => &self.setup_ns,
        }
    }

    /// Runs `f`, adding its wall time to `step`'s count (whatever it answers).
    pub(super) fn time<T>(&self, step: Step, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counter(step).fetch_add(ns, Ordering::Relaxed);
        out
    }

    pub(super) fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Relaxed)
    }

    /// The counts so far.
    pub(super) fn snapshot(&self) -> Breakdown {
        let s = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e9;
        Breakdown {
            in_place_bytes: self.in_place_bytes.load(Ordering::Relaxed),
            ring_bytes: self.ring_bytes.load(Ordering::Relaxed),
            buffered_bytes: self.buffered_bytes.load(Ordering::Relaxed),
            register_seconds: s(&self.register_ns),
            unregister_seconds: s(&self.unregister_ns),
            window_wait_seconds: s(&self.window_wait_ns),
            fill_seconds: s(&self.fill_ns),
            slot_wait_seconds: s(&self.slot_wait_ns),
            setup_seconds: s(&self.setup_ns),
            reserve_threads: self.reserve_joined.load(Ordering::Relaxed),
            read_ahead_bytes: self.read_ahead_bytes.load(Ordering::Relaxed),
            read_ahead_dropped_bytes: self.read_ahead_dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_steps_add_up_and_snapshots_subtract() {
        let st = PassStats::default();
        let before = st.snapshot();
        assert_eq!(st.time(Step::Fill, || 7), 7);
        st.time(Step::Register, || std::thread::sleep(std::time::Duration::from_millis(2)));
        st.ring_bytes.fetch_add(10, Ordering::Relaxed);
        let d = st.snapshot().since(&before);
        assert_eq!(d.ring_bytes, 10);
        assert!(d.register_seconds >= 0.002, "{d:?}");
        assert_eq!(d.unregister_seconds, 0.0);
    }
}
