//! pinned-mem: what a streamer costs after the first one in a process. Every
//! streamer registers in the process's one registration context of a device,
//! and a streamer dropped while the program holds its budget parks its ring
//! (and that context) with the budget for the next streamer on it; what is
//! parked gives way to a reservation that needs its room, and goes with the
//! budget's last handle or `release_parked`. Counts come from the emulator;
//! no timing is asserted.

use std::sync::Arc;

use wirespeed_cuda::{Device, DeviceBuffer};
use wirespeed_pinned::{MappedFile, PinBudget, PinOptions, PinnedRange, Strategy, StreamConfig, Streamer};
use wirespeed_tests::{Ctx, TempDir, Watchdog, open_mapped, start, write_pattern_file};

const LEN: usize = (2 << 20) + 4321;

/// Windows from the front and a ring of 8 slots from the back: a pass needs
/// both the registration context and the ring.
const HYBRID: Strategy = Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 2 };

fn data_file(dir: &TempDir, seed: u64) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("warm-{seed}.bin"));
    let data = write_pattern_file(&path, seed, LEN);
    (open_mapped(&path).unwrap(), data)
}

/// Calls of `function` so far (the emulator's count; `None` on a GPU).
fn calls(t: &Ctx, function: &str) -> Option<u64> {
    t.emulated().then(|| t.emu().call_count(function).unwrap_or(0))
}

/// One pass of `s` over the whole file, checked.
fn pass(s: &Streamer, file: &Arc<MappedFile>, data: &[u8]) {
    let dev = s.devices()[0];
    let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    let r = s.to_device(file, 0..LEN as u64, &mut dst).unwrap();
    assert!(dst.to_vec().unwrap() == data, "{r}");
}

#[test]
fn streamers_made_in_turn_make_one_context_and_one_ring() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("warm-in-turn");
    let (file, data) = data_file(&dir, 1);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(8 << 20);
    let contexts0 = calls(&t, "cuCtxCreate_v2");
    let mut allocs0 = None;
    for i in 0..4 {
        let s = Streamer::new(&[dev], StreamConfig::new(HYBRID, budget.clone())).unwrap();
        pass(&s, &file, &data);
        drop(s);
        if i == 0 {
            allocs0 = calls(&t, "cudaHostAlloc"); // the first one made the ring
        }
        // The program holds the budget: the ring stays, parked with it.
        assert!(budget.parked_bytes() > 0, "streamer {i}");
        assert_eq!(budget.used(), budget.parked_bytes(), "streamer {i}: only what is parked");
    }
    if let (Some(c0), Some(a0)) = (contexts0, allocs0) {
        assert_eq!(calls(&t, "cuCtxCreate_v2").unwrap() - c0, 1, "one context for four streamers");
        assert_eq!(calls(&t, "cudaHostAlloc").unwrap(), a0, "the later streamers took the first one's ring up");
        assert_eq!(t.counters().unwrap().contexts, 1);
    }
    drop(budget); // the last handle: what is parked goes with it
    t.assert_clean();
}

#[test]
fn streamers_alive_at_once_share_one_context() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("warm-at-once");
    let (file, data) = data_file(&dir, 2);
    let dev = Device::get(0).unwrap();
    let contexts0 = calls(&t, "cuCtxCreate_v2");
    // Each with a budget of its own, made inline: nothing is parked.
    let window = Strategy::Windows { window: 256 << 10, in_flight: 2 };
    let streamers: Vec<Streamer> =
        (0..3).map(|_| Streamer::new(&[dev], StreamConfig::new(window, PinBudget::new(4 << 20))).unwrap()).collect();
    for s in &streamers {
        pass(s, &file, &data);
    }
    if let Some(c0) = contexts0 {
        assert_eq!(calls(&t, "cuCtxCreate_v2").unwrap() - c0, 1, "one context for three streamers");
        assert_eq!(t.counters().unwrap().contexts, 1);
    }
    drop(streamers); // the last holders: the context is destroyed
    t.assert_clean();
}

#[test]
fn a_parked_ring_is_taken_up_given_way_and_released() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("warm-park");
    let (file, data) = data_file(&dir, 3);
    let dev = Device::get(0).unwrap();
    let ring = Strategy::Ring { slots: 4, slot: 256 << 10, threads: 2 };
    let budget = PinBudget::new(2 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(ring, budget.clone())).unwrap();
    pass(&s, &file, &data);
    drop(s);
    let parked = budget.parked_bytes();
    assert!(parked >= 1 << 20, "{parked}");

    // The next streamer on the budget takes the ring up: no allocation.
    let allocs0 = calls(&t, "cudaHostAlloc");
    let s = Streamer::new(&[dev], StreamConfig::new(ring, budget.clone())).unwrap();
    pass(&s, &file, &data);
    if let Some(a0) = allocs0 {
        assert_eq!(calls(&t, "cudaHostAlloc").unwrap(), a0, "the parked ring was taken up");
    }
    assert_eq!((budget.parked_bytes(), s.kept_pinned_bytes()), (0, parked));
    drop(s);
    assert_eq!(budget.parked_bytes(), parked);

    // A reservation that needs its room frees it, and succeeds.
    let whole = budget.reserve(2 << 20).unwrap();
    assert_eq!((budget.parked_bytes(), budget.used()), (0, 2 << 20));
    drop(whole);

    // So does a registration in place.
    let s = Streamer::new(&[dev], StreamConfig::new(ring, budget.clone())).unwrap();
    pass(&s, &file, &data);
    drop(s);
    assert_eq!(budget.parked_bytes(), parked);
    let range = PinnedRange::new(&file, 0..(1 << 20) + 4096, PinOptions::default(), &budget).unwrap();
    assert_eq!(budget.parked_bytes(), 0);
    drop(range);

    // release_pins and release_parked give back what is parked.
    let s = Streamer::new(&[dev], StreamConfig::new(ring, budget.clone())).unwrap();
    pass(&s, &file, &data);
    let other = Streamer::new(&[dev], StreamConfig::new(ring, budget.clone())).unwrap();
    drop(s);
    assert_eq!(budget.parked_bytes(), parked);
    other.release_pins().unwrap();
    assert_eq!(budget.used(), 0);
    pass(&other, &file, &data);
    drop(other);
    budget.release_parked();
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

#[test]
fn a_streamer_dropped_with_its_budget_parks_nothing() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("warm-alone");
    let (file, data) = data_file(&dir, 4);
    let dev = Device::get(0).unwrap();
    // The budget only in the configuration: the streamer's drop is its last handle.
    let s = Streamer::new(&[dev], StreamConfig::new(HYBRID, PinBudget::new(8 << 20))).unwrap();
    pass(&s, &file, &data);
    drop(s);
    t.assert_clean();
    // A clone of the budget held elsewhere keeps it: dropping that clone frees it.
    let budget = PinBudget::new(8 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(HYBRID, budget.clone())).unwrap();
    pass(&s, &file, &data);
    drop(s);
    let kept = budget.clone();
    drop(budget);
    assert!(kept.parked_bytes() > 0);
    drop(kept);
    t.assert_clean();
}
