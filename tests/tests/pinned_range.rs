//! pinned-mem: byte ranges of mapped files registered in place.

use std::sync::Arc;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{Error, MappedFile, PinBudget, PinOptions, PinnedRange};
use wirespeed_tests::{Ctx, TempDir, open_mapped, start, vm_lck_kb, write_pattern_file};

const PAGE: u64 = 4096;

fn file(dir: &TempDir, seed: u64, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("f{seed}.bin"));
    let data = write_pattern_file(&path, seed, len);
    (open_mapped(&path).unwrap(), data)
}

/// Copies the range to the device and back, asynchronously from the registration.
fn round_trip(r: &PinnedRange) -> Vec<u8> {
    let dev = Device::get(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let mut d = DeviceBuffer::<u8>::new(&dev, r.len() as usize).unwrap();
    stream.copy_to_device(&r.source(), &mut d).unwrap().wait().unwrap();
    d.to_vec().unwrap()
}

fn registrations(t: &Ctx) -> Option<(u64, u64)> {
    t.counters().map(|c| (c.registrations, c.registered_bytes))
}

#[test]
fn unaligned_range_is_rounded_out_and_exact() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 1, (2 << 20) + 3333);
    let budget = PinBudget::new(64 << 20);
    let range = 1000..(1 << 20) + 777;
    let r = PinnedRange::new(&f, range.clone(), PinOptions::default(), &budget).unwrap();
    assert_eq!(r.range(), range);
    assert_eq!(r.len(), range.end - range.start);
    assert_eq!(r.source().len() as u64, r.len());
    assert_eq!(r.as_bytes(), &data[range.start as usize..range.end as usize]);
    let pages = r.pinned_pages();
    assert_eq!((pages.start % PAGE, pages.end % PAGE), (0, 0));
    assert!(pages.start <= range.start && range.end <= pages.end && pages.end - pages.start < r.len() + 2 * PAGE);
    assert_eq!(budget.used(), pages.end - pages.start, "the pages are drawn from the budget");
    if let Some((n, bytes)) = registrations(&t) {
        assert_eq!((n, bytes), (1, pages.end - pages.start));
    }
    assert_eq!(round_trip(&r), &data[range.start as usize..range.end as usize]);
    assert_eq!(r.slice(5..10).unwrap().len(), 5);
    assert!(r.slice(0..r.len() as usize + 1).is_err());
    r.release().unwrap();
    assert_eq!(budget.used(), 0);
    assert_eq!(budget.peak(), pages.end - pages.start);
    t.assert_clean();
}

#[test]
fn whole_file_with_a_partial_last_page() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 2, 3 * PAGE as usize + 5);
    let budget = PinBudget::unlimited();
    let r = PinnedRange::new(&f, 0..f.len(), PinOptions::new().portable(true), &budget).unwrap();
    assert!(r.is_portable());
    assert_eq!(r.pinned_pages(), 0..4 * PAGE);
    assert_eq!(round_trip(&r), data);
    drop(r);
    t.assert_clean();
}

#[test]
#[allow(clippy::reversed_empty_ranges)] // on purpose
fn refuses_empty_reversed_and_past_the_end_ranges() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, _) = file(&dir, 3, 10_000);
    let budget = PinBudget::unlimited();
    let opts = PinOptions::default();
    for (range, why) in
        [(5..5, "empty"), (9..3, "empty"), (0..10_001, "past the end"), (20_000..20_001, "past the end")]
    {
        match PinnedRange::new(&f, range.clone(), opts, &budget) {
            Err(e @ Error::BadRange { .. }) => assert!(e.to_string().contains(why), "{range:?}: {e}"),
            other => panic!("{range:?}: {other:?}"),
        }
    }
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

#[test]
fn ranges_inside_a_registration_share_it() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 4, 64 * PAGE as usize);
    let budget = PinBudget::unlimited();
    let opts = PinOptions::default();
    let outer = PinnedRange::new(&f, 100..40_000, opts, &budget).unwrap();
    let used = budget.used();
    let inner = PinnedRange::new(&f, 5000..6000, opts, &budget).unwrap();
    assert_eq!((outer.sharers(), inner.sharers()), (2, 2));
    assert_eq!(inner.pinned_pages(), outer.pinned_pages());
    assert_eq!(budget.used(), used, "sharing draws nothing more");
    if let Some((n, _)) = registrations(&t) {
        assert_eq!(n, 1, "one registration for both");
    }
    drop(outer); // the registration lives on for `inner`
    assert_eq!(inner.sharers(), 1);
    assert_eq!(round_trip(&inner), &data[5000..6000]);
    drop(inner);
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

#[test]
fn partial_overlaps_are_refused_clearly() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 5, 64 * PAGE as usize);
    let budget = PinBudget::unlimited();
    let opts = PinOptions::default();
    let a = PinnedRange::new(&f, 0..5000, opts, &budget).unwrap();
    // 5000..10000 starts in a's last page (4096..8192): CUDA would refuse it.
    match PinnedRange::new(&f, 5000..10_000, opts, &budget) {
        Err(e @ Error::Overlap { .. }) => {
            let s = e.to_string();
            assert!(s.contains("5000..10000") && s.contains("0..8192"), "{s}");
        }
        other => panic!("{other:?}"),
    }
    // A larger range containing `a` cannot share it either.
    assert!(matches!(PinnedRange::new(&f, 0..f.len(), opts, &budget), Err(Error::Overlap { .. })));
    // Inside but asking for portable while `a` is not: refused, not silently downgraded.
    assert!(matches!(PinnedRange::new(&f, 10..20, opts.portable(true), &budget), Err(Error::Overlap { .. })));
    // Disjoint pages are fine.
    let b = PinnedRange::new(&f, 8192..10_000, opts, &budget).unwrap();
    assert_eq!(round_trip(&b), &data[8192..10_000]);
    drop(a);
    // Once `a` is gone its pages are free again.
    let c = PinnedRange::new(&f, 5000..8000, opts, &budget).unwrap();
    assert_eq!(c.sharers(), 1);
    drop((b, c));
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

#[test]
fn separate_mappings_of_one_file_register_independently() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f1, data) = file(&dir, 6, 10 * PAGE as usize);
    let f2 = open_mapped(f1.path()).unwrap();
    let budget = PinBudget::unlimited();
    let a = PinnedRange::new(&f1, 0..f1.len(), PinOptions::default(), &budget).unwrap();
    let b = PinnedRange::new(&f2, 0..f2.len(), PinOptions::default(), &budget).unwrap();
    assert_eq!(round_trip(&a), data);
    assert_eq!(round_trip(&b), data);
    drop((a, b));
    t.assert_clean();
}

#[test]
fn budget_exceeded_is_typed_and_leaves_nothing() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, _) = file(&dir, 7, 1 << 20);
    let budget = PinBudget::new(256 << 10);
    let _held = budget.reserve(100 << 10).unwrap();
    match PinnedRange::new(&f, 0..f.len(), PinOptions::default(), &budget) {
        Err(e @ Error::BudgetExceeded { requested, available, limit }) => {
            assert_eq!((requested, available, limit), (1 << 20, 156 << 10, 256 << 10));
            assert!(e.to_string().contains("pin budget"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(budget.used(), 100 << 10);
    if let Some((n, _)) = registrations(&t) {
        assert_eq!(n, 0);
    }
    // A range that fits is fine.
    let r = PinnedRange::new(&f, 0..100_000, PinOptions::default(), &budget).unwrap();
    drop(r);
    t.assert_clean();
}

#[test]
fn mlock_on_and_off() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 8, 16 * PAGE as usize);
    let budget = PinBudget::unlimited();
    let before = vm_lck_kb();
    let off = PinnedRange::new(&f, 0..8 * PAGE, PinOptions::default(), &budget).unwrap();
    assert!(!off.is_mlocked());
    match PinnedRange::new(&f, 8 * PAGE..16 * PAGE, PinOptions::new().mlock(true), &budget) {
        Ok(on) => {
            assert!(on.is_mlocked());
            assert!(vm_lck_kb() >= before + 32, "8 pages locked");
            assert_eq!(round_trip(&on), &data[8 * PAGE as usize..]);
            // Part of the mapping is locked: dropping the page cache still works
            // (the kernel refuses MADV_DONTNEED then; the locked pages stay).
            f.drop_page_cache().unwrap();
            assert_eq!(round_trip(&on), &data[8 * PAGE as usize..]);
            drop(on);
            assert_eq!(vm_lck_kb(), before, "munlock when it ends");
        }
        // Without CAP_IPC_LOCK and a low limit: the typed error.
        Err(Error::MemlockLimit { requested, .. }) => assert_eq!(requested, 8 * PAGE),
        Err(e) => panic!("{e}"),
    }
    drop(off);
    t.assert_clean();
}

#[test]
fn memlock_limit_too_low_is_a_typed_error() {
    let t = start();
    wirespeed_tests::run_child("memlock_child", &[]);
    t.assert_clean();
}

/// Drops CAP_IPC_LOCK from this thread (root in CI has it, which exempts mlock from the limit).
fn drop_cap_ipc_lock() {
    wirespeed_tests::drop_capabilities(&[wirespeed_tests::CAP_IPC_LOCK]).expect("drop CAP_IPC_LOCK");
}

/// Runs only in the child process started above.
#[test]
#[ignore = "runs in a child process started by memlock_limit_too_low_is_a_typed_error"]
fn memlock_child() {
    if !wirespeed_tests::is_child("memlock_child") {
        return;
    }
    let t = start();
    let limit = 64u64 << 10;
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid rlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut cur) }, 0);
    let new = libc::rlimit { rlim_cur: limit, rlim_max: cur.rlim_max };
    // SAFETY: lowering our own soft limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &new) }, 0);
    drop_cap_ipc_lock();
    assert_eq!(wirespeed_pinned::memlock_limit(), Some(limit));

    let dir = TempDir::new("pm-memlock");
    let (f, data) = file(&dir, 9, 1 << 20);
    let budget = PinBudget::unlimited();
    match PinnedRange::new(&f, 0..f.len(), PinOptions::new().mlock(true), &budget) {
        Err(e @ Error::MemlockLimit { .. }) => {
            let Error::MemlockLimit { limit: l, requested, .. } = &e else { unreachable!() };
            assert_eq!((*l, *requested), (limit, 1 << 20));
            let s = e.to_string();
            for needle in ["64 KiB", "1 MiB", "ulimit -l", "CAP_IPC_LOCK", "smaller windows"] {
                assert!(s.contains(needle), "{needle:?} missing from: {s}");
            }
        }
        other => panic!("expected MemlockLimit, got {other:?}"),
    }
    assert_eq!(budget.used(), 0, "nothing drawn on error");
    t.assert_clean();
    // Within the limit it works; without mlock the limit does not apply.
    let small = PinnedRange::new(&f, 0..4 * PAGE, PinOptions::new().mlock(true), &budget).unwrap();
    assert!(small.is_mlocked());
    drop(small);
    let r = PinnedRange::new(&f, 0..f.len(), PinOptions::default(), &budget).unwrap();
    assert_eq!(round_trip(&r), data);
    drop(r);
    t.assert_clean();
    wirespeed_tests::child_ran("memlock_child");
}

#[test]
fn new_on_registers_for_the_device_it_names() {
    let t = start();
    let dir = TempDir::new("pm-range");
    let (f, data) = file(&dir, 9, (1 << 20) + 5);
    let budget = PinBudget::new(8 << 20);
    let dev = Device::get(0).unwrap();
    let r = PinnedRange::new_on(&dev, &f, 10..(1 << 20), PinOptions::default(), &budget).unwrap();
    assert!(!r.is_portable() && r.context().is_none());
    assert_eq!(round_trip(&r), &data[10..1 << 20]);
    // A part of it shares it, named device or not.
    let part = PinnedRange::new_on(&dev, &f, 4096..8192, PinOptions::default(), &budget).unwrap();
    assert_eq!(part.sharers(), 2);
    drop(part);
    r.release().unwrap();
    assert_eq!(budget.used(), 0);
    // On the last device (the same one with a single GPU), portable: for every device.
    let last = Device::get(Device::count().unwrap() - 1).unwrap();
    let p = PinnedRange::new_on(&last, &f, 0..4096, PinOptions::new().portable(true), &budget).unwrap();
    assert!(p.is_portable());
    assert_eq!(round_trip(&p), &data[..4096]);
    drop(p);
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

/// A range asking for `mlock` inside a live registration made without it
/// shares that registration and locks its own pages (each page stays locked
/// while any range that asked for it lives), and a streamer with `mlock` on
/// streams across such a registration the same way. Both were refused with
/// `Overlap` ("registered without mlock").
#[test]
fn mlock_coexists_with_a_live_range_made_without_mlock() {
    use wirespeed_pinned::{Strategy, StreamConfig, Streamer};
    let t = start();
    let dir = TempDir::new("pm-range-mlock-share");
    let (f, data) = file(&dir, 13, 64 * PAGE as usize + 123);
    let budget = PinBudget::unlimited();
    let before = vm_lck_kb();
    let mine = PinnedRange::new(&f, 5..32 * PAGE + 5, PinOptions::default(), &budget).unwrap();
    let locked = PinOptions::new().mlock(true);
    let kib = |pages: u64| pages * PAGE / 1024;
    match PinnedRange::new(&f, 4 * PAGE..8 * PAGE, locked, &budget) {
        Ok(inner) => {
            assert_eq!((inner.sharers(), inner.is_mlocked(), mine.is_mlocked()), (2, true, false));
            assert_eq!(vm_lck_kb(), before + kib(4));
            let other = PinnedRange::new(&f, 6 * PAGE + 1..10 * PAGE - 1, locked, &budget).unwrap();
            assert_eq!(vm_lck_kb(), before + kib(6), "pages 4..10");
            assert_eq!(round_trip(&other), &data[6 * PAGE as usize + 1..10 * PAGE as usize - 1]);
            drop(inner);
            assert_eq!(vm_lck_kb(), before + kib(4), "pages 6..10 stay locked for the other range");
            drop(other);
            assert_eq!(vm_lck_kb(), before);
        }
        // Without CAP_IPC_LOCK and a low limit: the typed error, nothing locked.
        Err(Error::MemlockLimit { .. }) => assert_eq!(vm_lck_kb(), before),
        Err(e) => panic!("{e}"),
    }
    let dev = Device::get(0).unwrap();
    for strategy in [
        Strategy::Windows { window: 5 * PAGE as usize, in_flight: 2 },
        Strategy::Hybrid { window: 5 * PAGE as usize, slot: PAGE as usize, threads: 2 },
        Strategy::WholeFile,
        Strategy::Auto,
    ] {
        let cfg = StreamConfig::new(strategy, PinBudget::new(1 << 20)).with_mlock(true);
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, data.len()).unwrap();
        match s.to_device(&f, 0..data.len() as u64, &mut dst) {
            Ok(r) => assert!(dst.to_vec().unwrap() == data, "{strategy}: {r}"),
            Err(Error::MemlockLimit { .. }) => {}
            Err(e) => panic!("{strategy}: {e}"),
        }
        drop(s);
        assert_eq!(vm_lck_kb(), before, "{strategy}: unlocked once done");
    }
    assert_eq!((mine.sharers(), mine.is_mlocked()), (1, false));
    assert_eq!(round_trip(&mine), &data[5..32 * PAGE as usize + 5]);
    drop(mine);
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

/// A range carries the device it was made for: the current one (`new`), the
/// one named (`new_on`), the context's (`new_in`); a range sharing a live
/// registration names its own.
#[test]
fn a_range_carries_its_device() {
    let t = start();
    let dir = TempDir::new("pm-range-device");
    let (f, _) = file(&dir, 14, 16 * PAGE as usize);
    let budget = PinBudget::unlimited();
    let dev = Device::get(0).unwrap();
    let a = PinnedRange::new(&f, 0..4 * PAGE, PinOptions::default(), &budget).unwrap();
    let b = PinnedRange::new_on(&dev, &f, PAGE..2 * PAGE, PinOptions::default(), &budget).unwrap();
    assert_eq!((a.device(), b.device(), b.sharers()), (dev, dev, 2));
    if let Ok(ctx) = wirespeed_cuda::RegistrationContext::new(&dev) {
        let c = PinnedRange::new_in(&Arc::new(ctx), &f, 8 * PAGE..9 * PAGE, PinOptions::default(), &budget).unwrap();
        assert_eq!(c.device(), dev);
    }
    drop((a, b));
    wirespeed_tests::run_child("device_child", &[("CUDA_EMU_DEVICES", "2")]);
    t.assert_clean();
}

#[test]
#[ignore = "runs in a child process started by a_range_carries_its_device"]
fn device_child() {
    if !wirespeed_tests::is_child("device_child") {
        return;
    }
    let _t = wirespeed_tests::start_emulated();
    let dir = TempDir::new("pm-range-device-child");
    let (f, data) = file(&dir, 15, 16 * PAGE as usize);
    let budget = PinBudget::unlimited();
    let (d0, d1) = (Device::get(0).unwrap(), Device::get(1).unwrap());
    d1.make_current().unwrap();
    let current = PinnedRange::new(&f, 0..4 * PAGE, PinOptions::default(), &budget).unwrap();
    assert_eq!(current.device(), d1, "the current device");
    let named = PinnedRange::new_on(&d0, &f, 8 * PAGE..12 * PAGE, PinOptions::default(), &budget).unwrap();
    let shared = PinnedRange::new_on(&d1, &f, 9 * PAGE..10 * PAGE, PinOptions::default(), &budget).unwrap();
    assert_eq!((named.device(), shared.device(), shared.sharers()), (d0, d1, 2));
    // Each copies to its own device.
    for r in [&current, &named] {
        let stream = Stream::new(&r.device()).unwrap();
        let mut d = DeviceBuffer::<u8>::new(&r.device(), r.len() as usize).unwrap();
        stream.copy_to_device(&r.source(), &mut d).unwrap().wait().unwrap();
        assert_eq!(d.to_vec().unwrap(), &data[r.range().start as usize..r.range().end as usize]);
    }
    wirespeed_tests::child_ran("device_child");
}
