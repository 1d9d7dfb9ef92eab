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
//! | `StreamConfig::reserve_threads`, `reserve_room`, `read_ahead` | `stream_config_knobs_at_every_bound`, `reserve_threads_are_bounded` |
//! | `Streamer::resolve`, `prepare` (file lengths)       | `resolve_and_prepare_of_any_length_are_overflow_free` |
//! | transfer ranges, `for_each_chunk`'s chunk, scratch sizes, `Transfer` timeouts | `streamer_calls_at_every_bound` |
//! | `PinnedRange` ranges and slices, `PinOptions`, `MappedFile` ranges (`bytes`, `populate`, `resident_bytes`) and `device_buffer` sizes | `ranges_and_mappings_at_every_bound` |
//! | `Permutation`, `Sharding`, `Records`                | `shuffle_at_every_bound` |
//! | agent threads the system refuses                    | `agent_threads_the_system_refuses_are_a_typed_error` |
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

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{
    Error, MAX_READ_AHEAD, MappedFile, Permutation, PinBudget, PinOptions, PinnedRange, PinnedRing, Records, Sharding,
    Strategy, StreamConfig, Streamer,
};
use wirespeed_tests::{Ctx, TempDir, Watchdog, open_mapped, start, write_pattern_file};

/// 2^40.
const TIB: u64 = 1 << 40;
/// The sizes every `u64` parameter is tried at.
const U64S: [u64; 5] = [0, 1, TIB, TIB + 1, u64::MAX];
/// The sizes every `usize` parameter is tried at.
const USIZES: [usize; 5] = [0, 1, 1 << 40, (1 << 40) + 1, usize::MAX];
/// A budget that grants no size of 2^40.
const SMALL: u64 = 64 << 20;
/// The test file: a few pages and an unaligned tail.
const LEN: usize = 3 * 4096 + 123;

fn dev() -> Device {
    Device::get(0).unwrap()
}

fn file(dir: &TempDir, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("bounds-{len}.bin"));
    let data = write_pattern_file(&path, len as u64, len);
    (open_mapped(&path).unwrap(), data)
}

fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { .. })
}

fn over_budget(e: &Error) -> bool {
    matches!(e, Error::BudgetExceeded { .. })
}

fn bad_range(e: &Error) -> bool {
    matches!(e, Error::BadRange { .. })
}

/// `r` is an error that `is` accepts.
#[track_caller]
fn refused<T>(what: &str, r: wirespeed_pinned::Result<T>, is: fn(&Error) -> bool) {
    match r {
        Err(e) => assert!(is(&e), "{what}: unexpected error {e:?} ({e})"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

/// Streams all of `file` with `cfg` and checks the bytes that arrived.
fn stream_all(cfg: StreamConfig, file: &Arc<MappedFile>, data: &[u8]) -> wirespeed_pinned::Result<()> {
    let s = Streamer::new(&[dev()], cfg)?;
    let mut dst = DeviceBuffer::<u8>::new(&dev(), data.len()).unwrap();
    s.to_device(file, 0..data.len() as u64, &mut dst)?;
    assert!(dst.to_vec().unwrap() == data, "the bytes that arrived differ");
    Ok(())
}

fn clean(t: &Ctx, budget: &PinBudget) {
    budget.release_parked(); // what dropped streamers kept warm for the next one
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

// ------------------------------------------------------------------ every parameter

#[test]
fn budgets_at_every_bound() {
    let t = start();
    for limit in U64S {
        let b = PinBudget::new(limit);
        assert_eq!((b.limit(), b.used(), b.available()), (limit, 0, limit));
        for bytes in U64S {
            match b.reserve(bytes) {
                Ok(r) => {
                    assert!(bytes <= limit);
                    assert_eq!((r.bytes(), b.used(), b.peak() >= bytes), (bytes, bytes, true));
                    drop(r);
                }
                Err(Error::BudgetExceeded { requested, available, limit: l }) => {
                    assert_eq!((requested, available, l), (bytes, limit, limit));
                    assert!(bytes > limit);
                }
                Err(e) => panic!("{limit}: {bytes}: {e}"),
            }
            assert_eq!(b.used(), 0);
        }
        // Whatever is reserved, one byte more than the limit is refused.
        let all = b.reserve(limit).unwrap();
        refused("one byte more", b.reserve(1), over_budget);
        drop(all);
        // A streamer on a budget of this limit: planned or refused, typed.
        let dir = TempDir::new("bounds-budget");
        let (f, data) = file(&dir, LEN);
        match stream_all(StreamConfig::new(Strategy::Auto, b.clone()), &f, &data) {
            Ok(()) => assert!(limit >= 4096, "{limit}"),
            Err(e) => assert!(over_budget(&e), "{limit}: {e}"),
        }
        clean(&t, &b);
    }
}

#[test]
fn rings_at_every_bound() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = TempDir::new("bounds-ring");
    let (f, data) = file(&dir, LEN);
    let budget = PinBudget::new(SMALL);
    for slots in USIZES {
        for slot in USIZES {
            let what = format!("PinnedRing::new({slots}, {slot})");
            match PinnedRing::new(slots, slot, &budget) {
                Ok(ring) => {
                    assert!(slots == 1 && slot == 1, "{what}: accepted");
                    drop(ring);
                }
                Err(e) if slots == 0 || slot == 0 || slots > 1 << 16 || slot > 1 << 40 => {
                    assert!(invalid(&e), "{what}: {e}");
                }
                Err(e) => assert!(over_budget(&e), "{what}: {e}"),
            }
            assert_eq!(budget.used(), 0, "{what}");
        }
    }
    // The calls on a ring's slots.
    let stream = Stream::new(&dev()).unwrap();
    let ring = PinnedRing::new(2, 4096, &budget).unwrap();
    for n in USIZES {
        let what = format!("fill(0..{n})");
        match ring.acquire().unwrap().fill(0..n) {
            Ok(full) => assert!(n <= 4096 && full.len() == n, "{what}"),
            Err(e) => assert!(invalid(&e) && n > 4096, "{what}: {e}"),
        }
        match ring.acquire().unwrap().read_from(&f, 0, n) {
            Ok(full) => assert!(n <= 4096 && full.data().unwrap() == &data[..n], "read_from(0, {n})"),
            Err(e) => assert!(invalid(&e) && n > 4096, "read_from(0, {n}): {e}"),
        }
        let mut dst = DeviceBuffer::<u8>::new(&dev(), 16).unwrap();
        let full = ring.acquire().unwrap().copy_from(&data[..16]).unwrap();
        let slice = full.submit(&[&stream], |src| {
            let r = src.slice(0..n).map(|s| s.len());
            stream.copy_to_device(&src.all()?, &mut dst)?.detach();
            r.map(drop)
        });
        match slice {
            Ok(done) => assert!(n <= 16 && done.wait().is_ok(), "slice(0..{n})"),
            Err(e) => assert!(invalid(&e) && n > 16, "slice(0..{n}): {e}"),
        }
        ring.drain().unwrap();
        assert_eq!(dst.to_vec().unwrap(), &data[..16]);
    }
    for offset in U64S {
        match ring.acquire().unwrap().read_from(&f, offset, 1) {
            Ok(full) => assert!(offset < LEN as u64 && full.data().unwrap()[0] == data[offset as usize]),
            // Past the end: the file ends before (or, past what `pread` takes, an I/O error).
            Err(e @ (Error::FileChanged { .. } | Error::Io { .. })) => {
                assert!(offset >= LEN as u64, "at {offset}: {e}")
            }
            Err(e) => panic!("at {offset}: {e}"),
        }
    }
    // Timeouts of every length, on a ring with a free slot and on one without.
    for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::from_secs(1 << 40), Duration::MAX] {
        let a = ring.acquire_timeout(timeout).unwrap().expect("a free slot");
        let b = ring.try_acquire().unwrap().expect("a second free slot");
        if timeout < Duration::from_secs(1) {
            assert!(ring.acquire_timeout(timeout).unwrap().is_none(), "{timeout:?}: no slot is free");
        }
        drop((a, b));
    }
    drop((ring, stream));
    clean(&t, &budget);
}

#[test]
fn strategies_at_every_bound() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("bounds-strategy");
    let (f, data) = file(&dir, LEN);
    let budget = PinBudget::new(SMALL);
    // Each parameter at each size, the others small.
    let mut every = Vec::new();
    for n in USIZES {
        every.extend([
            Strategy::Windows { window: n, in_flight: 2 },
            Strategy::Windows { window: 8192, in_flight: n },
            Strategy::Ring { slots: n, slot: 4096, threads: 2 },
            Strategy::Ring { slots: 4, slot: n, threads: 2 },
            Strategy::Ring { slots: 4, slot: 4096, threads: n },
            Strategy::Hybrid { window: n, slot: 4096, threads: 1 },
            Strategy::Hybrid { window: 8192, slot: n, threads: 1 },
            Strategy::Hybrid { window: 8192, slot: 4096, threads: n },
            Strategy::Direct { slots: n, slot: 4096, threads: 2 },
            Strategy::Direct { slots: 4, slot: n, threads: 2 },
            Strategy::Direct { slots: 4, slot: 4096, threads: n },
        ]);
    }
    for strategy in every {
        let _ = strategy.pinned_bytes(u64::MAX);
        let _ = strategy.to_string();
        let r = stream_all(StreamConfig::new(strategy, budget.clone()), &f, &data);
        let (sizes, counts, threads) = match strategy {
            Strategy::Windows { window, in_flight } => (window, in_flight, 1),
            Strategy::Ring { slots, slot, threads } | Strategy::Direct { slots, slot, threads } => {
                (slot, slots, threads)
            }
            Strategy::Hybrid { window, slot, threads } => (window.max(slot), 1, threads),
            _ => unreachable!(),
        };
        let zero = matches!(
            strategy,
            Strategy::Windows { window: 0, .. }
                | Strategy::Windows { in_flight: 0, .. }
                | Strategy::Ring { slots: 0, .. }
                | Strategy::Ring { slot: 0, .. }
                | Strategy::Ring { threads: 0, .. }
                | Strategy::Hybrid { window: 0, .. }
                | Strategy::Hybrid { slot: 0, .. }
                | Strategy::Hybrid { threads: 0, .. }
                | Strategy::Direct { slots: 0, .. }
                | Strategy::Direct { slot: 0, .. }
                | Strategy::Direct { threads: 0, .. }
        );
        match r {
            Ok(()) => assert!(!zero && sizes <= 1 << 40 && counts <= 1 << 16 && threads <= 1024, "{strategy:?}"),
            Err(e) if zero || sizes > 1 << 40 || counts > 1 << 16 || threads > 1024 => {
                assert!(invalid(&e), "{strategy:?}: {e}");
            }
            Err(Error::DirectUnsupported { .. }) if matches!(strategy, Strategy::Direct { .. }) => {}
            Err(e) => assert!(over_budget(&e), "{strategy:?}: {e}"),
        }
        clean(&t, &budget);
    }
}

#[test]
fn stream_config_knobs_at_every_bound() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = TempDir::new("bounds-config");
    let (f, data) = file(&dir, LEN);
    let budget = PinBudget::new(SMALL);
    for threads in USIZES {
        let cfg = StreamConfig::new(Strategy::Auto, budget.clone()).with_reserve_threads(threads);
        match stream_all(cfg, &f, &data) {
            Ok(()) => assert!(threads <= 1024, "{threads} reserve threads"),
            Err(e) => assert!(invalid(&e) && threads > 1024, "{threads} reserve threads: {e}"),
        }
    }
    for room in [0.0, 1.0, TIB as f64, f64::MAX, f64::INFINITY, -1.0, f64::NAN] {
        let cfg = StreamConfig::new(Strategy::Auto, budget.clone()).with_reserve_room(room);
        match stream_all(cfg, &f, &data) {
            Ok(()) => assert!(!room.is_nan()),
            Err(e) => assert!(invalid(&e) && room.is_nan(), "reserve_room {room}: {e}"),
        }
    }
    let secs = [0, 1, 60, 61, TIB, u64::MAX];
    let waits = secs.map(Duration::from_secs).into_iter().chain([Duration::from_nanos(1), Duration::MAX]);
    for wait in waits {
        let ring = Strategy::Ring { slots: 4, slot: 64 << 10, threads: 2 };
        let cfg = StreamConfig::new(ring, budget.clone()).with_read_ahead(wait);
        match stream_all(cfg, &f, &data) {
            Ok(()) => assert!(wait <= MAX_READ_AHEAD, "a read-ahead of {wait:?}"),
            Err(e) => assert!(invalid(&e) && wait > MAX_READ_AHEAD, "a read-ahead of {wait:?}: {e}"),
        }
    }
    clean(&t, &budget);
}

#[test]
fn streamer_calls_at_every_bound() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("bounds-streamer");
    let (f, data) = file(&dir, LEN);
    let len = LEN as u64;
    let budget = PinBudget::new(SMALL);
    #[allow(clippy::reversed_empty_ranges)] // a reversed range, on purpose
    let ranges: Vec<Range<u64>> = vec![
        0..0,
        len..len,
        0..1,
        len - 1..len,
        0..len,
        Range { start: 5, end: 4 }, // reversed
        0..TIB,
        TIB..TIB + 1,
        u64::MAX - 1..u64::MAX,
        u64::MAX..u64::MAX,
        len..u64::MAX,
    ];
    for strategy in [
        Strategy::Auto,
        Strategy::WholeFile,
        Strategy::Windows { window: 8192, in_flight: 2 },
        Strategy::Ring { slots: 2, slot: 4096, threads: 2 },
        Strategy::Hybrid { window: 8192, slot: 4096, threads: 1 },
    ] {
        let s = Streamer::new(&[dev()], StreamConfig::new(strategy, budget.clone())).unwrap();
        for r in &ranges {
            let what = format!("{strategy}: {r:?}");
            let fits = r.start <= r.end && r.end <= len;
            let n = if fits { (r.end - r.start) as usize } else { 1 };
            let mut dst = DeviceBuffer::<u8>::new(&dev(), n).unwrap();
            let want = fits.then(|| &data[r.start as usize..r.end as usize]);
            match s.to_device(&f, r.clone(), &mut dst) {
                Ok(rep) => assert!(fits && rep.bytes == n as u64 && dst.to_vec().unwrap() == want.unwrap(), "{what}"),
                Err(e) => assert!(!fits && bad_range(&e), "{what}: {e}"),
            }
            match s.start(&f, r.clone(), &mut dst).map(|t| t.wait()) {
                Ok(Ok(rep)) => assert!(fits && rep.bytes == n as u64, "start {what}"),
                Ok(Err(e)) => panic!("start {what}: {e}"),
                Err(e) => assert!(!fits && bad_range(&e), "start {what}: {e}"),
            }
            if fits {
                assert!(dst.to_vec().unwrap() == want.unwrap(), "start {what}");
            }
            let mut scratch = DeviceBuffer::<u8>::new(&dev(), 4096).unwrap();
            match s.to_scratch(&f, r.clone(), &mut scratch) {
                Ok(rep) => assert!(fits && rep.bytes == n as u64, "scratch {what}"),
                Err(e) => assert!(!fits && bad_range(&e), "scratch {what}: {e}"),
            }
        }
        // A scratch buffer of one byte.
        let mut one = DeviceBuffer::<u8>::new(&dev(), 1).unwrap();
        assert_eq!(s.to_scratch(&f, 7..17, &mut one).unwrap().bytes, 10, "{strategy}");
        assert_eq!(one.to_vec().unwrap(), [data[16]], "{strategy}");
        drop(one);
        // Chunks of every size.
        for chunk in USIZES {
            let mut seen = 0u64;
            match s.for_each_chunk(&f, 0..len, chunk, |_, _, _, n| {
                seen += n as u64;
                Ok(())
            }) {
                Ok(_) => assert!(chunk > 0 && seen == len, "{strategy}: chunk {chunk}"),
                Err(e) => assert!(invalid(&e) && chunk == 0, "{strategy}: chunk {chunk}: {e}"),
            }
        }
        transfer_timeouts(&s, &f);
        drop(s);
        clean(&t, &budget);
    }
}

/// A transfer's timeouts of every length: `Duration::MAX` waits as long as
/// the call without one.
fn transfer_timeouts(s: &Streamer, f: &Arc<MappedFile>) {
    let mine = Stream::new(&dev()).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
    for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::from_secs(1 << 40), Duration::MAX] {
        let tr = s.start(f, 0..LEN as u64, &mut dst).unwrap();
        let _ = tr.wait_timeout(timeout);
        if timeout > Duration::from_secs(1) {
            assert!(tr.then_on_timeout(&mine, timeout).unwrap(), "{timeout:?}");
        }
        tr.wait().unwrap();
    }
}

#[test]
fn ranges_and_mappings_at_every_bound() {
    let t = start();
    let dir = TempDir::new("bounds-ranges");
    let (f, data) = file(&dir, LEN);
    let len = LEN as u64;
    let budget = PinBudget::new(SMALL);
    for start_at in U64S {
        for end in U64S.into_iter().chain([len - 1, len, len + 1]) {
            let r = start_at..end;
            let fits = start_at <= end && end <= len;
            for opts in [PinOptions::default(), PinOptions::new().portable(true), PinOptions::new().mlock(true)] {
                match PinnedRange::new(&f, r.clone(), opts, &budget) {
                    Ok(p) => assert!(fits && start_at < end && p.as_bytes() == &data[start_at as usize..end as usize]),
                    Err(Error::MemlockLimit { .. }) if opts.mlock => {}
                    Err(e) => assert!(bad_range(&e) && !(fits && start_at < end), "{r:?} {opts:?}: {e}"),
                }
            }
            match f.bytes(r.clone()) {
                Ok(b) => assert!(fits && b == &data[start_at as usize..end as usize], "bytes({r:?})"),
                Err(e) => assert!(bad_range(&e) && !fits, "bytes({r:?}): {e}"),
            }
            match f.populate(r.clone()) {
                Ok(_) => assert!(fits, "populate({r:?})"),
                Err(e) => assert!(bad_range(&e) && !fits, "populate({r:?}): {e}"),
            }
            match f.resident_bytes(r.clone()) {
                Ok(b) => assert!(fits && b <= end - start_at, "resident_bytes({r:?})"),
                Err(e) => assert!(bad_range(&e) && !fits, "resident_bytes({r:?}): {e}"),
            }
            match f.device_buffer::<u32>(&dev(), r.clone()) {
                Ok(b) => assert!(fits && b.len() as u64 * 4 == end - start_at, "device_buffer({r:?})"),
                Err(e) if !fits => assert!(bad_range(&e), "device_buffer({r:?}): {e}"),
                Err(e) => assert!(invalid(&e) && (end - start_at) % 4 != 0, "device_buffer({r:?}): {e}"),
            }
        }
    }
    let p = PinnedRange::new(&f, 1..len, PinOptions::default(), &budget).unwrap();
    for a in USIZES {
        for b in USIZES {
            match p.slice(a..b) {
                Ok(s) => assert!(a <= b && b as u64 <= p.len() && s.len() == b - a, "slice({a}..{b})"),
                Err(e) => assert!(invalid(&e) && (a > b || b as u64 > p.len()), "slice({a}..{b}): {e}"),
            }
        }
    }
    drop(p);
    clean(&t, &budget);
}

#[test]
fn shuffle_at_every_bound() {
    let t = start();
    let dir = TempDir::new("bounds-shuffle");
    let (f, _) = file(&dir, LEN);
    for n in U64S {
        for key in [0, 1, u64::MAX] {
            let p = Permutation::new(n, key);
            for i in U64S {
                let at = p.at(i);
                assert!(if i < n { at < n } else { at == i }, "{n} {key}: at({i}) = {at}");
            }
            assert_eq!(Permutation::identity(n).at(n.saturating_sub(1)), n.saturating_sub(1));
        }
    }
    for records in U64S {
        for batch in U64S {
            for world in U64S {
                for rank in [0, 1, world.saturating_sub(1), world, u64::MAX] {
                    for drop_last in [false, true] {
                        let what = format!("Sharding::new({records}, {batch}, {rank}, {world}, {drop_last})");
                        let s = match Sharding::new(records, batch, rank, world, drop_last) {
                            Ok(s) => s,
                            Err(e) => {
                                assert!(invalid(&e) && (records == 0 || batch == 0 || rank >= world), "{what}: {e}");
                                continue;
                            }
                        };
                        let (per_rank, total, positions) = (s.per_rank(), s.total(), s.positions());
                        assert!(positions.start <= positions.end && per_rank <= records, "{what}");
                        assert!(total >= per_rank.min(records), "{what}");
                        let batches = s.batches();
                        for b in [0, 1, batches.saturating_sub(1), batches, u64::MAX] {
                            let r = s.batch(b);
                            assert!(r.start <= r.end && r.end - r.start <= batch, "{what}: batch({b}) = {r:?}");
                            if b < batches {
                                assert!(positions.start <= r.start && r.end <= positions.end, "{what}: batch {b}");
                            }
                        }
                        for p in U64S {
                            assert!(s.unpad(p) < records, "{what}: unpad({p})");
                        }
                    }
                }
            }
        }
    }
    for header in U64S.into_iter().chain([LEN as u64 - 1, LEN as u64]) {
        for bytes in U64S {
            for tail in [false, true] {
                let what = format!("Records({header}, {bytes}, ignoring_tail: {tail})");
                let r = if tail { Records::ignoring_tail(&f, header, bytes) } else { Records::new(&f, header, bytes) };
                let r = match r {
                    Ok(r) => r,
                    Err(e) => {
                        assert!(invalid(&e), "{what}: {e}");
                        continue;
                    }
                };
                assert!(r.count() >= 1 && header + r.count() * bytes <= LEN as u64, "{what}");
                for i in U64S {
                    let (one, span) = (r.range(i), r.span(i..i.saturating_add(1)));
                    assert!(one.start <= one.end && span.start <= span.end, "{what}: record {i}");
                    if i < r.count() {
                        assert!(one.end <= LEN as u64 && one == span, "{what}: record {i}");
                    }
                }
            }
        }
    }
    drop(f);
    t.assert_clean();
}

/// A thread count the system refuses (here every new thread, in a child
/// process as nobody with `RLIMIT_NPROC` at 0) fails the transfer with a
/// typed error: starting the agents' threads once panicked. With the limit
/// back, the same streamer moves the file again.
#[test]
fn agent_threads_the_system_refuses_are_a_typed_error() {
    let t = start();
    let r = wirespeed_tests::spawn_child("refused_threads_child", &[]);
    assert!(r.output.status.success(), "child failed:\n{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("REFUSED-THREADS:"), "the child did not say what it did:\n{}\n{}", r.stdout, r.stderr);
    eprintln!("{}", r.stdout.lines().find(|l| l.contains("REFUSED-THREADS:")).unwrap_or_default());
    t.assert_clean();
}

#[test]
#[ignore = "runs in a child process started by agent_threads_the_system_refuses_are_a_typed_error"]
fn refused_threads_child() {
    if !wirespeed_tests::is_child("refused_threads_child") {
        return;
    }
    let t = start();
    let dir = TempDir::new("bounds-threads");
    let (f, data) = file(&dir, LEN);
    let budget = PinBudget::new(SMALL);
    let strategy = Strategy::Ring { slots: 4, slot: 4096, threads: 3 };
    let s = Streamer::new(&[dev()], StreamConfig::new(strategy, budget.clone())).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
    s.to_device(&f, 0..LEN as u64, &mut dst).unwrap(); // the ring and the streams exist now
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on this process's own limits and credentials
    // (glibc applies setresuid to every thread).
    let refused = unsafe {
        libc::getrlimit(libc::RLIMIT_NPROC, &mut old) == 0
            && libc::setrlimit(libc::RLIMIT_NPROC, &libc::rlimit { rlim_cur: 0, rlim_max: old.rlim_max }) == 0
            && (libc::geteuid() != 0 || libc::setresuid(65534, 65534, 0) == 0)
            && std::thread::Builder::new().spawn(|| {}).is_err()
    };
    if refused {
        match s.to_device(&f, 0..LEN as u64, &mut dst) {
            Err(e @ Error::Io { .. }) => println!("REFUSED-THREADS: {e}"),
            other => panic!("expected a typed error, got {other:?}"),
        }
    } else {
        println!("REFUSED-THREADS: skipped: this process can still start threads");
    }
    // SAFETY: as above: the soft limit back up to the hard one, root again.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NPROC, &old);
        libc::setresuid(0, 0, 0);
    }
    s.to_device(&f, 0..LEN as u64, &mut dst).unwrap();
    assert!(dst.to_vec().unwrap() == data);
    drop((s, dst));
    clean(&t, &budget);
    wirespeed_tests::child_ran("refused_threads_child");
}
