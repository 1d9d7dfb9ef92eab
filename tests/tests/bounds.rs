//! pinned-mem: every number a caller can pass to the public API, at 0, 1,
//! 2^40 (and just past it) and the largest its type holds, gives a typed
//! error or a working call: never an abort, a panic or a hang, and nothing
//! stays pinned, registered or allocated afterwards.
//!
//! | parameter                                           | test |
//! |-----------------------------------------------------|------|
//! | `PinBudget::new`, `PinBudget::reserve`              | `budgets_at_every_bound` |
//! | `PinnedRing::new` (slots, slot bytes), `acquire_timeout`, `FreeSlot::fill`, `read_from`, `SlotSource::slice` | `rings_at_every_bound`, `a_ring_of_2_pow_40_slots_is_a_typed_error` |
//! | `Strategy` (windows, in flight, slots, slot bytes, threads) | `strategies_at_every_bound` |
//! | `StreamConfig::reserve_threads`, `reserve_room`     | `stream_config_knobs_at_every_bound`, `reserve_threads_are_bounded` |
//! | `Streamer::resolve`, `prepare` (file lengths)       | `resolve_and_prepare_of_any_length_are_overflow_free` |
//! | transfer ranges, `for_each_chunk`'s chunk, scratch sizes, `Transfer` timeouts | `streamer_calls_at_every_bound` |
//! | `PinnedRange` ranges and slices, `PinOptions`, `MappedFile` ranges and `device_buffer` sizes | `ranges_and_mappings_at_every_bound` |
//! | `Permutation`, `Sharding`, `Records`                | `shuffle_at_every_bound` |
//!
//! Three of the defects a downstream crate found are here, each with the
//! test that failed before its fix: a ring of 2^40 slots aborted the process
//! (its slot state was sized before any bound was checked), 2^40 reserve
//! threads spawned threads until spawning failed, and `resolve`/`prepare` of
//! `u64::MAX` bytes planned whole-file within a 16 MiB budget (page rounding
//! wrapped).
//!
//! No size here is ever allocated on a device or pinned: where a size could
//! be granted, the budget is small, so that the real runtime on the GPU
//! machine runs the same checks.

use wirespeed_cuda::Device;
use wirespeed_pinned::{Error, PinBudget, PinnedRing, Strategy, StreamConfig, Streamer};
use wirespeed_tests::{Ctx, Watchdog, start};

/// 2^40.
const TIB: u64 = 1 << 40;
/// The sizes every `u64` parameter is tried at.
const U64S: [u64; 5] = [0, 1, TIB, TIB + 1, u64::MAX];
/// A budget that grants no size of 2^40.
const SMALL: u64 = 64 << 20;

fn dev() -> Device {
    Device::get(0).unwrap()
}

fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { .. })
}

fn over_budget(e: &Error) -> bool {
    matches!(e, Error::BudgetExceeded { .. })
}

/// `r` is an error that `is` accepts.
#[track_caller]
fn refused<T>(what: &str, r: wirespeed_pinned::Result<T>, is: fn(&Error) -> bool) {
    match r {
        Err(e) => assert!(is(&e), "{what}: unexpected error {e:?} ({e})"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

fn clean(t: &Ctx, budget: &PinBudget) {
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

// ------------------------------------------------------------------ the defects

/// A ring of 2^40 slots sized its slot state before any bound was checked:
/// "memory allocation of 211106232532992 bytes failed", and the process
/// aborted. Counts and sizes are bounded first now, whatever the budget.
#[test]
fn a_ring_of_2_pow_40_slots_is_a_typed_error() {
    let t = start();
    for budget in [PinBudget::unlimited(), PinBudget::new(SMALL)] {
        refused("2^40 slots", PinnedRing::new(1 << 40, 4096, &budget), invalid);
        refused("usize::MAX slots", PinnedRing::new(usize::MAX, 1, &budget), invalid);
        refused("2^40 + 1 bytes a slot", PinnedRing::new(1, (1 << 40) + 1, &budget), invalid);
        clean(&t, &budget);
    }
}

/// `reserve_threads` had no bound: `Auto`'s hybrid spawned threads until
/// spawning failed (a panic, an abort, or a hang for more than a minute).
/// It is refused with the other bounds of the configuration now.
#[test]
fn reserve_threads_are_bounded() {
    let t = start();
    let _w = Watchdog::new(60);
    let budget = PinBudget::new(SMALL);
    for threads in [1 << 40, usize::MAX, 1025] {
        let cfg = StreamConfig::new(Strategy::Auto, budget.clone()).with_reserve_threads(threads);
        refused(&format!("{threads} reserve threads"), Streamer::new(&[dev()], cfg), invalid);
    }
    clean(&t, &budget);
}

/// `resolve(u64::MAX)` planned whole-file within a 16 MiB budget: rounding
/// `u64::MAX` up to pages and adding a page wrapped to 0 in release builds
/// (and panicked in debug builds). Every length plans within the budget now.
#[test]
fn resolve_and_prepare_of_any_length_are_overflow_free() {
    let t = start();
    let _w = Watchdog::new(60);
    for limit in [16 << 20, SMALL, 0, 1, TIB, u64::MAX] {
        let budget = PinBudget::new(limit);
        let s = Streamer::new(&[dev()], StreamConfig::new(Strategy::Auto, budget.clone())).unwrap();
        for len in U64S.into_iter().chain([u64::MAX - 4095, u64::MAX - 4096, (u64::MAX >> 1) + 1]) {
            let plan = s.resolve(len);
            if let Some(need) = plan.pinned_bytes(len)
                && need <= limit
            {
                // A plan that fits is one whose pins fit (whole-file: the range's pages).
                assert!(plan != Strategy::WholeFile || len <= limit, "{limit}: {len} bytes: {plan}");
            } else {
                assert!(plan != Strategy::WholeFile, "{limit}: {len} bytes planned whole-file: {plan}");
            }
            // Only limits that grant no size of 2^40 make the ring now.
            if limit <= SMALL {
                match s.prepare(len) {
                    Ok(p) => assert_eq!(p, plan, "{limit}: {len}"),
                    Err(e) => assert!(over_budget(&e), "{limit}: {len}: {e}"),
                }
            }
        }
        drop(s);
        clean(&t, &budget);
    }
}
