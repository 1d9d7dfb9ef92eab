//! The strategies the rows run, shaped to fit a pin budget (the alignment
//! slack of every slot included).

use crate::util::{GIB, KIB, MIB};
use wirespeed_pinned::Strategy;

/// What a ring slot may pin beyond its size: the library counts up to a page
/// of alignment slack per slot (`Strategy::pinned_bytes`), asked of it here.
fn slot_slack() -> u64 {
    let g = 64 * KIB;
    Strategy::Ring { slots: 1, slot: g as usize, threads: 1 }.pinned_bytes(g).map_or(0, |b| b.saturating_sub(g))
}

/// Bytes per slot for `slots` slots within `budget`, each with its slack:
/// 64 KiB multiples, at most `cap`.
fn slot_within(budget: u64, slots: usize, cap: u64) -> usize {
    let g = 64 * KIB;
    (((budget / slots as u64).saturating_sub(slot_slack()) / g * g).min(cap)).max(g) as usize
}

/// The pinned ring for `threads` filler threads within `budget`: two slots per
/// thread (at least four), at most 64 MiB each.
pub fn ring_for(threads: usize, budget: u64) -> Strategy {
    let slots = (2 * threads).max(4);
    Strategy::Ring { slots, slot: slot_within(budget, slots, 64 * MIB), threads }
}

/// Sliding windows within `budget`: 3 in flight, each a third of it (at most 1 GiB).
pub fn windows_for(budget: u64) -> Strategy {
    let g = if budget / 3 >= 2 * MIB { 2 * MIB } else { 4 * KIB };
    Strategy::Windows { window: (budget / 3 / g * g).clamp(g, GIB) as usize, in_flight: 3 }
}

/// The hybrid with all `threads` ring threads within `budget`: a quarter of it
/// to the ring (4 slots per thread, as the library plans them, at most 16 MiB
/// each), the rest to the 4 windows the library keeps registered at once.
pub fn hybrid_for(threads: usize, budget: u64) -> Strategy {
    let slots = 4 * threads;
    let slot = slot_within(budget / 4, slots, 16 * MIB);
    let rest = budget.saturating_sub((slot as u64 + slot_slack()) * slots as u64) / 4;
    let window = (rest / (64 * KIB) * (64 * KIB)).clamp(64 * KIB, GIB) as usize;
    Strategy::Hybrid { window, slot, threads }
}

/// O_DIRECT reads within `budget`: up to 4 reader threads, 2 slots each, at most 16 MiB.
pub fn direct_for(threads: usize, budget: u64) -> Strategy {
    let t = threads.clamp(1, 4);
    let slots = 2 * t;
    Strategy::Direct { slots, slot: slot_within(budget, slots, 16 * MIB), threads: t }
}

/// The cache-sized ring's own pin budget (its shape is `--ring-cache`,
/// default 8 threads with 4 slots of 4 MiB each): what the target allows it.
pub const RING_CACHE_BUDGET: u64 = 128 * MIB;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_strategies_fit_their_budget_slack_included() {
        for budget in [32 * MIB, 64 * MIB, 512 * MIB, 4 * GIB] {
            for threads in [1, 2, 4, 8, 16, 64] {
                for s in [ring_for(threads, budget), hybrid_for(threads, budget), direct_for(threads, budget)] {
                    let need = s.pinned_bytes(64 * GIB).unwrap();
                    assert!(need <= budget, "{s} needs {need} of a {budget}-byte budget");
                }
            }
            assert!(windows_for(budget).pinned_bytes(64 * GIB).unwrap() <= budget);
        }
    }
}
