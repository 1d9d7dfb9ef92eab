//! pinned-mem: streaming files to the GPU with every strategy.
//!
//! Files are a few MiB with unaligned lengths; strategies use small windows
//! and slots so every transfer has many of them. The same tests run on the
//! emulator and on a real GPU: no timing is asserted.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use wirespeed_cuda::{Device, DeviceBuffer};
use wirespeed_pinned::{
    CopyStreams, Error, MappedFile, PinBudget, Report, Strategy, StreamConfig, Streamer, WindowContext,
};
use wirespeed_tests::{Ctx, Watchdog, open_mapped, pattern, start};

const LEN: usize = (3 << 20) + 12345;

/// A temporary folder on a file system that takes `O_DIRECT` when there is one
/// (the target folder usually is on disk; /tmp may be tmpfs).
struct DiskDir(PathBuf);

impl DiskDir {
    fn new(tag: &str) -> DiskDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("pm-{tag}-{}-{n}", std::process::id());
        let mut candidates = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR"))];
        if let Ok(cwd) = std::env::current_dir() {
            candidates.push(cwd.join("target").join("tmp"));
        }
        candidates.push(std::env::temp_dir());
        for base in &candidates {
            let p = base.join(&name);
            if std::fs::create_dir_all(&p).is_ok() && direct_works(&p) {
                return DiskDir(p);
            }
            let _ = std::fs::remove_dir_all(&p);
        }
        let p = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&p).unwrap();
        DiskDir(p)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn direct_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join("probe");
    let ok = std::fs::write(&p, [0u8; 4096]).is_ok()
        && std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&p).is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}

fn data_file(dir: &DiskDir, seed: u64, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("data-{seed}.bin"));
    let data = pattern(seed, len);
    std::fs::write(&path, &data).unwrap();
    (open_mapped(&path).unwrap(), data)
}

/// Every strategy, with windows and slots small enough to make many of them.
fn strategies() -> Vec<Strategy> {
    vec![
        Strategy::WholeFile,
        Strategy::Windows { window: 256 << 10, in_flight: 3 },
        Strategy::Windows { window: 300_000, in_flight: 1 },
        Strategy::Ring { slots: 4, slot: (128 << 10) + 13, threads: 3 },
        Strategy::Ring { slots: 1, slot: 1 << 20, threads: 2 },
        Strategy::Hybrid { window: 512 << 10, slot: 64 << 10, threads: 2 },
        Strategy::Direct { slots: 4, slot: 256 << 10, threads: 2 },
    ]
}

fn streamer(strategy: Strategy, budget: &PinBudget) -> Streamer {
    let dev = Device::get(0).unwrap();
    Streamer::new(&[dev], StreamConfig::new(strategy, budget.clone())).unwrap()
}

/// Runs `f`, treating a file system without O_DIRECT as a pass for Direct.
fn direct_ok<T>(strategy: Strategy, r: wirespeed_pinned::Result<T>) -> Option<T> {
    match r {
        Err(Error::DirectUnsupported { .. }) if matches!(strategy, Strategy::Direct { .. }) => {
            eprintln!("O_DIRECT is not supported here: {strategy} skipped");
            None
        }
        r => Some(r.unwrap_or_else(|e| panic!("{strategy}: {e}"))),
    }
}

fn check_report(r: &Report, strategy: Strategy, bytes: u64, budget: &PinBudget) {
    assert_eq!(r.bytes, bytes);
    if strategy != Strategy::Auto {
        assert_eq!(r.strategy.to_string().split(' ').next(), strategy.to_string().split(' ').next());
    }
    assert!(r.seconds >= 0.0 && r.cpu_seconds >= 0.0 && r.gbps() >= 0.0);
    assert!(r.peak_pinned <= budget.limit(), "{r}");
    assert!(r.to_string().starts_with(&r.strategy.to_string()));
    // Every byte is counted once, in place or through the ring, and the steps
    // of the strategy that ran were timed.
    let b = &r.breakdown;
    assert_eq!(b.in_place_bytes + b.ring_bytes, bytes, "{r}: {b}");
    match r.strategy {
        Strategy::Ring { .. } | Strategy::Direct { .. } => {
            assert_eq!(b.in_place_bytes, 0, "{b}");
            assert!(b.fill_seconds > 0.0 && b.register_seconds == 0.0, "{b}");
        }
        Strategy::Windows { .. } | Strategy::WholeFile => assert_eq!(b.ring_bytes, 0, "{b}"),
        _ => {}
    }
    if r.registrations > 0 {
        assert!(b.register_seconds > 0.0, "{r}: {b}");
    }
    // Only auto's hybrid keeps ring threads in reserve.
    if strategy != Strategy::Auto || !matches!(r.strategy, Strategy::Hybrid { .. }) {
        assert_eq!(b.reserve_threads, 0, "{r}: {b}");
    }
}

#[test]
fn auto_hybrid_reserve_joins_when_the_copy_engine_has_room() {
    let t = start();
    let _w = Watchdog::new(300);
    let dir = DiskDir::new("reserve");
    let len = (232 << 20) + 4321;
    let (file, data) = data_file(&dir, 7, len);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(192 << 20);
    for (reserve, streams) in [(1usize, CopyStreams::One), (1, CopyStreams::PerThread), (0, CopyStreams::One)] {
        // The emulated copy engine is slow, so the ring waits for slots there
        // and a reserve would stay asleep: `reserve_room` 1 lets it join at
        // once, however fast the pass (it once joined only at its first look,
        // 20 ms in, and a busy machine could end the pass before). On a GPU
        // the default threshold decides (and this pass is short).
        let mut cfg = StreamConfig::new(Strategy::Auto, budget.clone())
            .with_reserve_threads(reserve)
            .with_copy_streams(streams)
            .with_progress(|_, _| std::thread::sleep(std::time::Duration::from_millis(1)));
        if t.emulated() {
            cfg.reserve_room = 1.0;
        }
        let s = Streamer::new(&[dev], cfg).unwrap();
        let resolved = s.resolve(len as u64);
        assert!(matches!(resolved, Strategy::Hybrid { .. }), "{resolved}");
        let mut dst = DeviceBuffer::<u8>::new(&dev, len).unwrap();
        let r = s.to_device(&file, 0..len as u64, &mut dst).unwrap();
        check_report(&r, Strategy::Auto, len as u64, &budget);
        assert!(dst.to_vec().unwrap() == data, "reserve {reserve}: data differs");
        let joined = r.breakdown.reserve_threads;
        assert!(joined <= reserve as u64, "{r}");
        if t.emulated() {
            assert_eq!(joined, reserve as u64, "{r}: {}", r.breakdown);
        }
        assert_eq!(r.breakdown.to_string().contains("a reserve thread joined"), joined == 1, "{r}");
        drop((s, dst));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn every_strategy_moves_a_file_exactly() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("stream");
    let (file, data) = data_file(&dir, 1, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for (i, strategy) in strategies().into_iter().enumerate() {
        t.set_delay_us(if i % 2 == 0 { 0 } else { 100 });
        let s = streamer(strategy, &budget);
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let Some(r) = direct_ok(strategy, s.to_device(&file, 0..LEN as u64, &mut dst)) else { continue };
        check_report(&r, strategy, LEN as u64, &budget);
        assert!(dst.to_vec().unwrap() == data, "{strategy}: data differs");
        // A streamer's first pass allocates its ring or makes its registration context.
        if !matches!(strategy, Strategy::WholeFile | Strategy::Direct { .. }) {
            assert!(r.breakdown.setup_seconds > 0.0, "{strategy}: {}", r.breakdown);
        }
        match strategy {
            Strategy::WholeFile => assert_eq!(r.registrations, 1),
            Strategy::Windows { .. } => assert!(r.registrations >= 10, "{r}"),
            Strategy::Ring { .. } | Strategy::Direct { .. } => assert_eq!(r.registrations, 0),
            _ => {}
        }
        // An unaligned part of the file into a smaller buffer.
        let part = 4097u64..(LEN as u64 - 5555);
        let mut small = DeviceBuffer::<u8>::new(&dev, (part.end - part.start) as usize).unwrap();
        let r = s.to_device(&file, part.clone(), &mut small).unwrap();
        check_report(&r, strategy, part.end - part.start, &budget);
        assert!(small.to_vec().unwrap() == data[part.start as usize..part.end as usize], "{strategy}: part differs");
        drop((s, dst, small));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0, "{strategy}: everything given back");
        t.assert_clean();
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn prepare_makes_the_ring_and_the_context_before_the_first_transfer() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("prepare");
    // As in the reserve's test: a hybrid on the emulator's 2 cores and the
    // GPU machine's 16 (its windows must be at least 32 MiB).
    let len = (232 << 20) + 777;
    let (file, data) = data_file(&dir, 13, len);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(192 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, budget.clone())).unwrap();
    let plan = s.prepare(len as u64).unwrap();
    assert_eq!(plan, s.resolve(len as u64));
    let (ring, windows) = match plan {
        Strategy::Hybrid { .. } => (true, true),
        Strategy::Ring { .. } => (true, false),
        Strategy::Windows { .. } => (false, true),
        other => panic!("a 232 MiB file within 192 MiB: {other}"),
    };
    assert!(ring && windows, "{plan}: a hybrid, so that both are made ahead");
    assert_eq!(budget.used() > 0, ring, "{plan}");
    if let Some(c) = t.counters() {
        assert_eq!(c.contexts, u64::from(windows), "{plan}");
    }
    let mut dst = DeviceBuffer::<u8>::new(&dev, len).unwrap();
    let r = s.to_device(&file, 0..len as u64, &mut dst).unwrap();
    check_report(&r, Strategy::Auto, len as u64, &budget);
    assert!(dst.to_vec().unwrap() == data, "{plan}: data differs");
    // Preparing again (or for a plan it holds) makes nothing new.
    let used = budget.used();
    s.prepare(len as u64).unwrap();
    assert_eq!(budget.used(), used);
    drop((s, dst));
    budget.release_parked(); // what the dropped streamer parked with it
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn auto_picks_from_the_budget() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("auto");
    let len = (12 << 20) + 777;
    let (file, data) = data_file(&dir, 2, len);
    let dev = Device::get(0).unwrap();
    type Expect = fn(&Strategy) -> bool;
    let cases: [(u64, Expect); 3] = [
        (64 << 20, |s| *s == Strategy::WholeFile),
        (9 << 20, |s| matches!(s, Strategy::Ring { .. })), // windows this small would be slower
        (1 << 20, |s| matches!(s, Strategy::Ring { .. })),
    ];
    for (limit, expect) in cases {
        let budget = PinBudget::new(limit);
        let s = streamer(Strategy::Auto, &budget);
        let resolved = s.resolve(len as u64);
        assert!(expect(&resolved), "budget {limit}: {resolved}");
        let mut dst = DeviceBuffer::<u8>::new(&dev, len).unwrap();
        let r = s.to_device(&file, 0..len as u64, &mut dst).unwrap();
        assert_eq!(r.strategy, resolved, "a page-cached file gets what resolve() says");
        check_report(&r, Strategy::Auto, len as u64, &budget);
        assert!(r.peak_pinned <= limit);
        assert!(dst.to_vec().unwrap() == data, "{resolved}: data differs");
        drop((s, dst));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    // Nothing fits: a clear error, nothing left.
    let budget = PinBudget::new(10 << 10);
    let s = streamer(Strategy::Auto, &budget);
    let mut dst = DeviceBuffer::<u8>::new(&dev, len).unwrap();
    assert!(matches!(s.to_device(&file, 0..len as u64, &mut dst), Err(Error::BudgetExceeded { .. })));
    drop((s, dst));
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn to_devices_with_one_device() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("devs");
    let (file, data) = data_file(&dir, 3, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for strategy in strategies() {
        let s = streamer(strategy, &budget);
        let mut dsts = vec![DeviceBuffer::<u8>::new(&dev, LEN).unwrap()];
        let Some(r) = direct_ok(strategy, s.to_devices(&file, 0..LEN as u64, &mut dsts)) else { continue };
        assert_eq!(r.bytes, LEN as u64);
        assert!(dsts[0].to_vec().unwrap() == data, "{strategy}");
        drop((s, dsts));
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

fn two_devices(t: &Ctx) {
    let _w = Watchdog::new(120);
    let devices = Device::all().unwrap();
    assert!(devices.len() >= 2, "{} devices", devices.len());
    let devices = &devices[..2];
    let dir = DiskDir::new("two");
    let (file, data) = data_file(&dir, 4, LEN);
    let budget = PinBudget::new(16 << 20);
    for strategy in strategies() {
        let cfg = StreamConfig::new(strategy, budget.clone());
        let s = Streamer::new(devices, cfg).unwrap();
        let mut dsts: Vec<_> = devices.iter().map(|d| DeviceBuffer::<u8>::new(d, LEN).unwrap()).collect();
        let Some(r) = direct_ok(strategy, s.to_devices(&file, 0..LEN as u64, &mut dsts)) else { continue };
        assert_eq!(r.bytes, 2 * LEN as u64);
        for (d, dst) in dsts.iter().enumerate() {
            assert_eq!(dst.device(), devices[d]);
            assert!(dst.to_vec().unwrap() == data, "{strategy}: device {d} differs");
        }
        // One buffer on the second device only.
        let mut one = DeviceBuffer::<u8>::new(&devices[1], 1000).unwrap();
        s.to_device(&file, 5..1005, &mut one).unwrap();
        assert_eq!(one.to_vec().unwrap(), &data[5..1005]);
        // Chunks alternate between the devices.
        let seen = Mutex::new(Vec::new());
        s.for_each_chunk(&file, 0..LEN as u64, 300_000, |stream, chunk, off, len| {
            let k = off / 300_000;
            assert_eq!(stream.device(), devices[(k % 2) as usize]);
            assert_eq!(chunk.device(), stream.device());
            let v = chunk.to_vec()?;
            assert!(v[..len] == data[off as usize..off as usize + len]);
            seen.lock().unwrap().push(off);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.lock().unwrap().len(), LEN.div_ceil(300_000));
        drop((s, dsts, one));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
        t.assert_clean();
    }
}

#[test]
fn to_devices_with_two_devices() {
    let t = start();
    if !t.emulated() {
        if Device::count().unwrap() >= 2 {
            two_devices(&t);
        } else {
            eprintln!("one GPU: the two-device case runs on the emulator in CI");
        }
        t.assert_clean();
        return;
    }
    wirespeed_tests::run_child("two_devices_child", &[("CUDA_EMU_DEVICES", "2")]);
    t.assert_clean();
}

/// Runs only in the child started above (emulator with two devices).
#[test]
#[ignore = "runs in a child process started by to_devices_with_two_devices"]
fn two_devices_child() {
    if !wirespeed_tests::is_child("two_devices_child") {
        return;
    }
    let t = start();
    two_devices(&t);
    t.assert_clean();
    wirespeed_tests::child_ran("two_devices_child");
}

/// What `scratch` holds after bytes `range` of `data` were written around it in order.
fn wrapped(data: &[u8], range: Range<usize>, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    for (i, b) in data[range].iter().enumerate() {
        v[i % size] = *b;
    }
    v
}

#[test]
fn to_scratch_writes_around() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("scratch");
    let (file, data) = data_file(&dir, 5, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    let size = (1 << 20) + 1;
    for strategy in strategies() {
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        // Ring strategies enqueue from several threads, so the final contents
        // are not determined: check each part as it is written instead.
        let in_order = matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. });
        cfg.verify = !in_order;
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut scratch = DeviceBuffer::<u8>::zeroed(&dev, size).unwrap();
        let range = 3usize..LEN - 7;
        let Some(r) = direct_ok(strategy, s.to_scratch(&file, range.start as u64..range.end as u64, &mut scratch))
        else {
            continue;
        };
        assert_eq!(r.bytes, range.len() as u64);
        if in_order {
            assert_eq!(r.verified, None);
            assert!(scratch.to_vec().unwrap() == wrapped(&data, range, size), "{strategy}");
        } else {
            assert_eq!(r.verified, Some(true), "{strategy}");
        }
        // A range smaller than the scratch buffer lands at its start.
        let r = s.to_scratch(&file, 100..200, &mut scratch).unwrap();
        assert_eq!(r.bytes, 100);
        assert_eq!(&scratch.to_vec().unwrap()[..100], &data[100..200]);
        drop((s, scratch));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn for_each_chunk_hands_every_chunk_once() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("chunks");
    let (file, data) = data_file(&dir, 6, LEN);
    let budget = PinBudget::new(16 << 20);
    for strategy in strategies() {
        let s = streamer(strategy, &budget);
        let range = 1000u64..LEN as u64 - 1;
        let chunk = 100_003usize;
        let mut seen: Vec<(u64, usize)> = Vec::new();
        let res = s.for_each_chunk(&file, range.clone(), chunk, |stream, buf, off, len| {
            assert_eq!(stream.device(), s.devices()[0]);
            assert_eq!(buf.len(), chunk.min((range.end - range.start) as usize));
            let v = buf.to_vec()?;
            assert!(v[..len] == data[off as usize..off as usize + len], "{strategy}: chunk at {off} differs");
            seen.push((off, len));
            Ok(())
        });
        let Some(r) = direct_ok(strategy, res) else { continue };
        assert_eq!(r.bytes, range.end - range.start);
        if matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. }) {
            assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "{strategy}: in file order");
        }
        seen.sort();
        let mut at = range.start;
        for (off, len) in &seen {
            assert_eq!(*off, at, "{strategy}: every chunk once, in place");
            assert!(*len == chunk || *off + *len as u64 == range.end);
            at += *len as u64;
        }
        assert_eq!(at, range.end);
        drop(s);
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn a_callback_error_stops_the_transfer() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("cberr");
    let (file, _) = data_file(&dir, 7, LEN);
    let budget = PinBudget::new(16 << 20);
    for strategy in strategies() {
        let s = streamer(strategy, &budget);
        let mut calls = 0;
        let res = s.for_each_chunk(&file, 0..LEN as u64, 65536, |_, _, _, _| {
            calls += 1;
            if calls == 3 { Err(Error::InvalidArgument { what: "test", message: "stop".into() }) } else { Ok(()) }
        });
        match res {
            Err(Error::InvalidArgument { what: "test", .. }) => assert_eq!(calls, 3),
            Err(Error::DirectUnsupported { .. }) => {}
            other => panic!("{strategy}: {other:?}"),
        }
        drop(s);
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn reentrant_calls_are_refused() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("reent");
    let (file, _) = data_file(&dir, 8, 1 << 20);
    let budget = PinBudget::new(16 << 20);
    let s = streamer(Strategy::WholeFile, &budget);
    let dev = Device::get(0).unwrap();
    let mut inner = None;
    s.for_each_chunk(&file, 0..1 << 20, 1 << 19, |_, _, _, _| {
        let mut dst = DeviceBuffer::<u8>::new(&dev, 10)?;
        inner = Some(s.to_device(&file, 0..10, &mut dst).map(|_| ()));
        Ok(())
    })
    .unwrap();
    assert!(matches!(inner, Some(Err(Error::InvalidArgument { .. }))), "{inner:?}");
    drop(s);

    // From a progress callback, which runs on an agent thread for windows and
    // the ring, on the calling thread for the whole file: refused, not a hang.
    for strategy in [
        Strategy::Windows { window: 256 << 10, in_flight: 2 },
        Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 },
        Strategy::WholeFile,
    ] {
        let me = Arc::new(std::sync::OnceLock::<std::sync::Weak<Streamer>>::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (m, sn) = (me.clone(), seen.clone());
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        cfg.progress = Some(Arc::new(move |_, _| {
            if let Some(s) = m.get().and_then(std::sync::Weak::upgrade) {
                sn.lock().unwrap().push(s.release_pins().map_err(|e| e.to_string()));
            }
        }));
        let s = Arc::new(Streamer::new(&[dev], cfg).unwrap());
        me.set(Arc::downgrade(&s)).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, 1 << 20).unwrap();
        s.to_device(&file, 0..1 << 20, &mut dst).unwrap();
        let seen = seen.lock().unwrap();
        assert!(!seen.is_empty(), "{strategy}");
        assert!(
            seen.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("inside a callback"))),
            "{strategy}: {seen:?}"
        );
        drop((s, dst));
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// A's progress callback (on A's agent thread) runs B, whose inline pass calls
/// B's progress callback on that same thread, which calls back into A: refused
/// (InvalidArgument), not a deadlock on A's state.
#[test]
fn nested_streamers_refuse_calls_back_into_an_outer_one() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("nested");
    let (file, _) = data_file(&dir, 16, 1 << 20);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(16 << 20);
    let a_cell = Arc::new(std::sync::OnceLock::<std::sync::Weak<Streamer>>::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (ac, sn) = (a_cell.clone(), seen.clone());
    let mut b_cfg = StreamConfig::new(Strategy::WholeFile, budget.clone());
    b_cfg.progress = Some(Arc::new(move |_, _| {
        if let Some(a) = ac.get().and_then(std::sync::Weak::upgrade) {
            sn.lock().unwrap().push(a.release_pins().map_err(|e| e.to_string()));
        }
    }));
    let b = Arc::new(Streamer::new(&[dev], b_cfg).unwrap());
    let (bb, f2) = (b.clone(), file.clone());
    let mut a_cfg = StreamConfig::new(Strategy::Windows { window: 256 << 10, in_flight: 2 }, budget.clone());
    let ran = Arc::new(AtomicBool::new(false));
    let r2 = ran.clone();
    a_cfg.progress = Some(Arc::new(move |_, _| {
        if !r2.swap(true, Ordering::AcqRel) {
            let mut dst = DeviceBuffer::<u8>::new(&Device::get(0).unwrap(), 4096).unwrap();
            bb.to_device(&f2, 0..4096, &mut dst).unwrap();
        }
    }));
    let a = Arc::new(Streamer::new(&[dev], a_cfg).unwrap());
    a_cell.set(Arc::downgrade(&a)).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, 1 << 20).unwrap();
    a.to_device(&file, 0..1 << 20, &mut dst).unwrap();
    assert!(ran.load(Ordering::Acquire));
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("inside a callback"))), "{seen:?}");
    drop((a, b, dst));
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn verify_mode_confirms_and_detects_changes() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("verify");
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for strategy in strategies() {
        let (file, _) = data_file(&dir, 9, LEN);
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        cfg.verify = true;
        let s = Streamer::new(&[dev], cfg.clone()).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let Some(r) = direct_ok(strategy, s.to_device(&file, 0..LEN as u64, &mut dst)) else { continue };
        assert_eq!(r.verified, Some(true), "{strategy}");
        let r = s.for_each_chunk(&file, 0..LEN as u64, 1 << 20, |_, _, _, _| Ok(())).unwrap();
        assert_eq!(r.verified, Some(true), "{strategy}");
        drop(s);

        // The file changes after its first bytes reached the device: the copy
        // back differs from the file, and verification says so. (This breaks
        // `MappedFile::open`'s contract on purpose: verification is how a
        // caller would notice.)
        let writer = std::fs::OpenOptions::new().write(true).open(file.path()).unwrap();
        let changed = Arc::new(AtomicBool::new(false));
        let c = changed.clone();
        cfg.progress = Some(Arc::new(move |_, _| {
            if !c.swap(true, Ordering::AcqRel) {
                use std::os::unix::fs::FileExt;
                writer.write_all_at(&[0x55; 16], 0).unwrap();
                writer.write_all_at(&[0xAA; 16], 16).unwrap();
            }
        }));
        // Windows and pieces are claimed in order, so byte 0 is copied first.
        if matches!(strategy, Strategy::WholeFile | Strategy::Windows { .. }) {
            let s = Streamer::new(&[dev], cfg).unwrap();
            let r = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
            assert!(changed.load(Ordering::Acquire));
            assert_eq!(r.verified, Some(false), "{strategy}: a change after the copy is detected");
            drop(s);
        }
        drop(dst);
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn progress_reports_every_byte() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("progress");
    let (file, _) = data_file(&dir, 10, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for strategy in strategies() {
        let calls = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
        let c = calls.clone();
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        cfg.progress = Some(Arc::new(move |done, total| c.lock().unwrap().push((done, total))));
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        if direct_ok(strategy, s.to_device(&file, 0..LEN as u64, &mut dst)).is_none() {
            continue;
        }
        let calls = calls.lock().unwrap();
        assert!(!calls.is_empty(), "{strategy}: {calls:?}");
        assert!(calls.iter().all(|&(_, total)| total == LEN as u64));
        let mut sorted: Vec<u64> = calls.iter().map(|c| c.0).collect();
        sorted.sort();
        assert_eq!(sorted.last(), Some(&(LEN as u64)), "{strategy}: all bytes reported");
        sorted.dedup();
        assert_eq!(sorted.len(), calls.len(), "{strategy}: done only grows");
        drop((s, dst));
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn a_panicking_progress_callback_is_an_error() {
    let t = start();
    wirespeed_tests::quiet_expected_panics();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("panic");
    let (file, data) = data_file(&dir, 14, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    // Whole-file passes run their one agent on the calling thread, windows and
    // the ring on agent threads, and the ring's last bytes are counted on the
    // calling thread: a panic in the callback (on the first call, or on the
    // last) is the same error everywhere, and the streamer works on after it.
    let strategies = [
        Strategy::WholeFile,
        Strategy::Windows { window: 256 << 10, in_flight: 3 },
        Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 },
    ];
    for (strategy, on_last) in strategies.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let armed = Arc::new(AtomicBool::new(true));
        let a = armed.clone();
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        cfg.progress = Some(Arc::new(move |done, total| {
            if (!on_last || done == total) && a.swap(false, Ordering::AcqRel) {
                panic!("progress callback panics (expected in this test)");
            }
        }));
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        for pass in 0..2 {
            armed.store(true, Ordering::Release);
            let e = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap_err();
            match e {
                Error::WorkerPanicked { message } => assert!(message.contains("expected in this test"), "{message}"),
                e => panic!("{strategy} pass {pass}: {e}"),
            }
        }
        let r = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
        assert_eq!(r.bytes, LEN as u64);
        assert!(dst.to_vec().unwrap() == data, "{strategy}");
        drop((s, dst));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0, "{strategy}");
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn a_second_pass_reuses_the_registration() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("reuse");
    let (file, data) = data_file(&dir, 11, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    // Whole-range registrations go to the second context (the driver's call).
    let registers = || t.emulated().then(|| t.emu().call_count("cuMemHostRegister_v2").unwrap());
    for strategy in [Strategy::WholeFile, Strategy::Auto] {
        let s = streamer(strategy, &budget);
        let before = registers();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let r1 = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
        assert_eq!((r1.strategy, r1.registrations), (Strategy::WholeFile, 1));
        let r2 = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
        assert_eq!((r2.strategy, r2.registrations), (Strategy::WholeFile, 0), "the second pass registers nothing");
        // A part of the file is served by the same registration.
        let mut part = DeviceBuffer::<u8>::new(&dev, 1000).unwrap();
        let r3 = s.to_device(&file, 777..1777, &mut part).unwrap();
        assert_eq!(r3.registrations, 0);
        assert_eq!(part.to_vec().unwrap(), &data[777..1777]);
        if let (Some(b), Some(a)) = (before, registers()) {
            assert_eq!(a - b, 1, "one registration for three passes");
        }
        assert!(s.kept_pinned_bytes() >= LEN as u64);
        assert_eq!(budget.used(), s.kept_pinned_bytes());
        assert!(dst.to_vec().unwrap() == data);
        s.release_pins().unwrap();
        assert_eq!((budget.used(), s.kept_pinned_bytes()), (0, 0));
        drop((s, dst, part));
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// A file truncated after a pass: the next pass, served by the kept
/// registration, refuses it as a fresh registration would (FileChanged),
/// instead of copying from pages the file lost.
#[test]
fn a_kept_registration_checks_the_file_again() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("trunc");
    let (file, _) = data_file(&dir, 15, LEN);
    let budget = PinBudget::new(16 << 20);
    let s = streamer(Strategy::WholeFile, &budget);
    let dev = Device::get(0).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
    // Breaks `MappedFile::open`'s contract on purpose: is it detected?
    std::fs::OpenOptions::new().write(true).open(file.path()).unwrap().set_len((LEN / 2) as u64).unwrap();
    let e = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap_err();
    assert!(matches!(e, Error::FileChanged { .. }), "{e}");
    drop((s, dst));
    budget.release_parked(); // what the dropped streamer parked with it
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// When the whole file does not fit the budget, a whole-file pass keeps a
/// registration of just its range. A later pass over a range that shares pages
/// with it (the next unaligned piece, say) must not fail with `Overlap`: the
/// streamer gives its own cached registration back first.
#[test]
fn consecutive_pieces_do_not_overlap_the_kept_registration() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("pieces");
    let len = 3 << 20;
    let (file, data) = data_file(&dir, 17, len);
    let dev = Device::get(0).unwrap();
    for strategy in [Strategy::WholeFile, Strategy::Auto] {
        let budget = PinBudget::new(2 << 20); // less than the file: ranges, not the whole file, are kept
        let s = streamer(strategy, &budget);
        let mut first = DeviceBuffer::<u8>::new(&dev, 1_000_000).unwrap();
        s.to_device(&file, 0..1_000_000, &mut first).unwrap();
        let mut second = DeviceBuffer::<u8>::new(&dev, 1_000_000).unwrap();
        s.to_device(&file, 1_000_000..2_000_000, &mut second).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        assert!(first.to_vec().unwrap() == data[..1_000_000], "{strategy}");
        assert!(second.to_vec().unwrap() == data[1_000_000..2_000_000], "{strategy}");
        drop((s, first, second));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    t.assert_clean();
}

#[test]
fn cached_pins_make_room_for_other_work() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("room");
    let (a, da) = data_file(&dir, 12, 5 << 20);
    let (b, db) = data_file(&dir, 13, 5 << 20);
    let budget = PinBudget::new(8 << 20);
    let dev = Device::get(0).unwrap();
    let s = streamer(Strategy::WholeFile, &budget);
    let mut dst = DeviceBuffer::<u8>::new(&dev, 5 << 20).unwrap();
    s.to_device(&a, 0..5 << 20, &mut dst).unwrap();
    assert!(dst.to_vec().unwrap() == da);
    // `a`'s cached registration is given back to make room for `b`.
    let r = s.to_device(&b, 0..5 << 20, &mut dst).unwrap();
    assert_eq!(r.registrations, 1);
    assert!(dst.to_vec().unwrap() == db);
    assert!(budget.used() <= 8 << 20);
    drop((s, dst));
    budget.release_parked(); // what the dropped streamer parked with it
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn budget_errors_are_clean() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("budget");
    let (file, _) = data_file(&dir, 14, LEN);
    let budget = PinBudget::new(2 << 20);
    let dev = Device::get(0).unwrap();
    for strategy in [
        Strategy::WholeFile,
        Strategy::Windows { window: 1 << 20, in_flight: 3 },
        Strategy::Ring { slots: 3, slot: 1 << 20, threads: 1 },
        Strategy::Hybrid { window: 1 << 20, slot: 1 << 20, threads: 1 },
        Strategy::Direct { slots: 4, slot: 1 << 20, threads: 1 },
    ] {
        let s = streamer(strategy, &budget);
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        match s.to_device(&file, 0..LEN as u64, &mut dst) {
            Err(Error::BudgetExceeded { limit, .. }) => assert_eq!(limit, 2 << 20),
            Err(Error::DirectUnsupported { .. }) if matches!(strategy, Strategy::Direct { .. }) => {}
            other => panic!("{strategy}: {other:?}"),
        }
        assert_eq!(budget.used(), 0, "{strategy}");
        drop((s, dst));
        budget.release_parked(); // what the dropped streamer parked with it
        t.assert_clean();
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn argument_errors() {
    let t = start();
    let dir = DiskDir::new("args");
    let (file, _) = data_file(&dir, 15, 10_000);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    let cfg = || StreamConfig::new(Strategy::Auto, budget.clone());
    assert!(matches!(Streamer::new(&[], cfg()), Err(Error::InvalidArgument { .. })));
    assert!(matches!(Streamer::new(&[dev, dev], cfg()), Err(Error::InvalidArgument { .. })));
    let bad = StreamConfig::new(Strategy::Ring { slots: 0, slot: 1, threads: 1 }, budget.clone());
    assert!(matches!(Streamer::new(&[dev], bad), Err(Error::InvalidArgument { .. })));
    let s = Streamer::new(&[dev], cfg()).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, 100).unwrap();
    assert!(matches!(s.to_device(&file, 9_950..10_050, &mut dst), Err(Error::BadRange { .. })));
    assert!(matches!(s.to_device(&file, 0..99, &mut dst), Err(Error::InvalidArgument { .. })));
    assert!(matches!(s.to_devices(&file, 0..100, &mut []), Err(Error::InvalidArgument { .. })));
    assert!(matches!(s.for_each_chunk(&file, 0..100, 0, |_, _, _, _| Ok(())), Err(Error::InvalidArgument { .. })));
    let mut empty = DeviceBuffer::<u8>::new(&dev, 0).unwrap();
    assert!(matches!(s.to_scratch(&file, 0..100, &mut empty), Err(Error::InvalidArgument { .. })));
    let r = s.to_device(&file, 500..500, &mut empty).unwrap();
    assert_eq!((r.bytes, r.registrations), (0, 0));
    drop((s, dst, empty));
    budget.release_parked(); // what the dropped streamer parked with it
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn mlock_while_streaming() {
    let t = start();
    let _w = Watchdog::new(60);
    let dir = DiskDir::new("mlock");
    let (file, data) = data_file(&dir, 16, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for strategy in [Strategy::WholeFile, Strategy::Windows { window: 512 << 10, in_flight: 2 }] {
        let mut cfg = StreamConfig::new(strategy, budget.clone());
        cfg.mlock = true;
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        match s.to_device(&file, 0..LEN as u64, &mut dst) {
            Ok(_) => assert!(dst.to_vec().unwrap() == data),
            Err(Error::MemlockLimit { .. }) => {}
            Err(e) => panic!("{strategy}: {e}"),
        }
        drop((s, dst));
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn direct_is_refused_clearly_without_o_direct() {
    let t = start();
    // tmpfs refuses O_DIRECT; /dev/shm is tmpfs on most Linux machines.
    let shm = Path::new("/dev/shm");
    let dir = shm.join(format!("pm-direct-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() || direct_works(&dir) {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("no file system without O_DIRECT here: skipped");
        t.assert_clean();
        return;
    }
    let path = dir.join("data.bin");
    std::fs::write(&path, pattern(17, 100_000)).unwrap();
    let file = open_mapped(&path).unwrap();
    let budget = PinBudget::new(16 << 20);
    let s = streamer(Strategy::Direct { slots: 2, slot: 64 << 10, threads: 1 }, &budget);
    let dev = Device::get(0).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, 100_000).unwrap();
    match s.to_device(&file, 0..100_000, &mut dst) {
        Err(e @ Error::DirectUnsupported { .. }) => assert!(e.to_string().contains("O_DIRECT"), "{e}"),
        other => panic!("{other:?}"),
    }
    drop((s, dst, file));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

#[test]
fn absurd_strategy_sizes_are_typed_errors_not_aborts() {
    let t = start();
    let dir = DiskDir::new("absurd");
    let (file, _) = data_file(&dir, 31, LEN);
    let dev = Device::get(0).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    // Before these were bounded, the first aborted the process (the window
    // agent sized its state by `in_flight`) and the others panicked in a worker.
    for strategy in [
        Strategy::Windows { window: 4096, in_flight: 1 << 40 },
        Strategy::Windows { window: usize::MAX, in_flight: 2 },
        Strategy::Ring { slots: 4, slot: usize::MAX, threads: 1 },
        Strategy::Hybrid { window: 1 << 20, slot: usize::MAX, threads: 2 },
    ] {
        let moved = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::unlimited()))
            .and_then(|s| s.to_device(&file, 0..LEN as u64, &mut dst));
        match moved {
            Err(Error::Cuda(wirespeed_cuda::Error::InvalidArgument { .. })) | Err(Error::InvalidArgument { .. }) => {}
            other => panic!("{strategy:?}: {other:?}"),
        }
    }
    drop(dst);
    t.assert_clean();
}

/// Sliding windows are registered in a second context when one can be made,
/// unregistered only after their copies (the emulator counts any unregister
/// under a copy as a violation), and fall back to the primary context, saying
/// why, when the configuration turns it off or the context cannot be made.
#[test]
fn windows_use_a_second_context_and_fall_back_to_the_primary_one() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("winctx");
    let (file, data) = data_file(&dir, 32, LEN);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(4 << 20);
    let run = |cfg: StreamConfig| {
        let s = Streamer::new(&[dev], cfg).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let report = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
        assert_eq!(dst.to_vec().unwrap(), data, "{report}");
        report
    };
    for strategy in [
        Strategy::Windows { window: 256 << 10, in_flight: 3 },
        Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 2 },
    ] {
        let report = run(StreamConfig::new(strategy, budget.clone()));
        assert_eq!(report.windows, WindowContext::SecondContext, "{report}");
        assert!(report.to_string().contains("windows in a second context"), "{report}");
        let mut off = StreamConfig::new(strategy, budget.clone());
        off.second_context = false;
        let report = run(off);
        assert!(
            matches!(&report.windows, WindowContext::PrimaryContext { reason } if reason.contains("second_context is off")),
            "{report}"
        );
    }
    if let Some(c) = t.counters() {
        assert_eq!(c.unregister_violations, 0);
    }
    // Whole-file passes and the ring register no windows.
    let report = run(StreamConfig::new(Strategy::Ring { slots: 4, slot: 64 << 10, threads: 2 }, budget.clone()));
    assert_eq!(report.windows, WindowContext::None);
    // What the streamers above parked with the budget (their ring, their
    // context): let it go, so that the next streamer has to make a context.
    budget.release_parked();
    if t.emulated() {
        t.emu().fail_context_creation(Some(46));
        let report = run(StreamConfig::new(Strategy::Windows { window: 256 << 10, in_flight: 2 }, budget.clone()));
        t.emu().fail_context_creation(None);
        assert!(
            matches!(&report.windows, WindowContext::PrimaryContext { reason } if reason.contains("cuCtxCreate")),
            "{report}"
        );
    }
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// While the caller holds a `PinnedRange` of part of a file, streaming the
/// whole file works with every strategy: windows are cut at the edges of the
/// caller's registration and share it inside (no `Overlap` for a window range
/// the caller never asked for), and a whole-file pass that cannot register
/// the range runs as windows, saying so in its report.
#[test]
fn a_live_user_pin_coexists_with_every_strategy() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("userpin");
    let (file, data) = data_file(&dir, 33, LEN);
    let dev = Device::get(0).unwrap();
    let mine = PinBudget::unlimited();
    let held =
        wirespeed_pinned::PinnedRange::new(&file, 300_001..900_003, wirespeed_pinned::PinOptions::default(), &mine)
            .unwrap();
    let budget = PinBudget::new(4 << 20);
    for strategy in [
        Strategy::WholeFile,
        Strategy::Windows { window: 256 << 10, in_flight: 2 },
        Strategy::Windows { window: 1 << 20, in_flight: 2 },
        Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 2 },
        Strategy::Ring { slots: 4, slot: 64 << 10, threads: 2 },
        Strategy::Auto,
    ] {
        let big = if strategy == Strategy::WholeFile { PinBudget::unlimited() } else { budget.clone() };
        let s = Streamer::new(&[dev], StreamConfig::new(strategy, big)).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let report = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        let got = dst.to_vec().unwrap();
        // (The first byte that differs, not two dumps of 3 MiB.)
        let first_bad = got.iter().zip(&data).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "{strategy}: {report}");
        if strategy == Strategy::WholeFile {
            assert!(matches!(report.strategy, Strategy::Windows { .. }), "ran as windows: {report}");
        }
        drop(s);
    }
    // The caller's registration is untouched and still copies.
    assert_eq!(held.sharers(), 1);
    let stream = wirespeed_cuda::Stream::new(&dev).unwrap();
    let mut back = DeviceBuffer::<u8>::new(&dev, 600_002).unwrap();
    stream.copy_to_device(&held.source(), &mut back).unwrap().wait().unwrap();
    assert_eq!(back.to_vec().unwrap(), &data[300_001..900_003]);
    drop((held, back, stream));
    budget.release_parked(); // what the dropped streamers parked with it
    assert_eq!((budget.used(), mine.used()), (0, 0));
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// `verify` takes its bounce buffer from the budget before the plan is made;
/// `resolve` accounts for it, so the plan it reports is the one that runs.
#[test]
fn verify_runs_the_plan_resolve_reported() {
    let t = start();
    let dir = DiskDir::new("verifyplan");
    let (file, _) = data_file(&dir, 34, LEN);
    let dev = Device::get(0).unwrap();
    let page = 4096u64;
    let pages = (LEN as u64).div_ceil(page) * page;
    // Room for the whole file, but not for the whole file and a 1 MiB bounce buffer.
    let budget = PinBudget::new(pages + page + (512 << 10));
    let mut cfg = StreamConfig::new(Strategy::Auto, budget.clone());
    cfg.verify = true;
    let s = Streamer::new(&[dev], cfg).unwrap();
    let planned = s.resolve(LEN as u64);
    let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    let report = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
    assert_eq!(report.strategy, planned, "{report}");
    assert_ne!(planned, Strategy::WholeFile);
    assert_eq!(report.verified, Some(true));
    drop((s, dst));
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// `O_DIRECT` with small slots: `cudaHostAlloc` does not page-align small
/// blocks on a real GPU (64 KiB slots failed with "the slot is not aligned or
/// too small for O_DIRECT" on the H200), and the emulator is as loose. The ring
/// hands out page-aligned slots anyway, and counts the slack in the budget.
#[test]
fn direct_with_small_slots_moves_a_file_exactly() {
    let t = start();
    let _w = Watchdog::new(120);
    if t.emulated() {
        // The emulator's small pinned blocks are not page-aligned, as on a GPU.
        let small = wirespeed_cuda::PinnedBuffer::<u8>::new(64 << 10).unwrap();
        assert_ne!(small.as_ptr() as usize % 4096, 0, "the emulator hands out unaligned small blocks");
    }
    let dir = DiskDir::new("direct-small");
    let (file, data) = data_file(&dir, 41, LEN);
    let budget = PinBudget::new(16 << 20);
    let dev = Device::get(0).unwrap();
    for (slots, slot, threads) in [(4, 64 << 10, 2), (2, 4096, 1), (3, (64 << 10) + 4096, 2)] {
        let strategy = Strategy::Direct { slots, slot, threads };
        let s = streamer(strategy, &budget);
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let Some(r) = direct_ok(strategy, s.to_device(&file, 0..LEN as u64, &mut dst)) else { continue };
        check_report(&r, strategy, LEN as u64, &budget);
        assert!(dst.to_vec().unwrap() == data, "{strategy}: data differs");
        // An unaligned part of the file too.
        let mut part = DeviceBuffer::<u8>::new(&dev, 200_001).unwrap();
        direct_ok(strategy, s.to_device(&file, 12_345..212_346, &mut part)).unwrap();
        assert!(part.to_vec().unwrap() == data[12_345..212_346], "{strategy}: part differs");
        drop((s, dst, part));
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(file);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// The ring's slots are page-aligned whatever `cudaHostAlloc` returns, and the
/// budget holds what the ring really pinned.
#[test]
fn ring_slots_are_page_aligned_and_budgeted() {
    let t = start();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let budget = PinBudget::new(16 << 20);
    for slot in [1, 100, 4096, 64 << 10, (64 << 10) + 1, 1 << 20] {
        let ring = wirespeed_pinned::PinnedRing::new(3, slot, &budget).unwrap();
        assert_eq!(budget.used(), ring.pinned_bytes());
        assert!(ring.pinned_bytes() >= 3 * slot as u64 && ring.pinned_bytes() < 3 * (slot + page) as u64);
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = ring.acquire().unwrap();
            let buf = s.as_mut_slice().unwrap();
            assert_eq!(buf.len(), slot);
            assert_eq!(buf.as_ptr() as usize % page, 0, "slot of {slot} bytes is page-aligned");
            buf.fill(7);
            held.push(s);
        }
        drop(held);
        drop(ring);
        budget.release_parked(); // what the dropped streamer parked with it
        assert_eq!(budget.used(), 0);
    }
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}

/// Ring agents copy on the streamer's stream, on a stream of their own, or
/// on one stream each: every way lands every byte, under a delay that shows a missing order, and a
/// caller's copy after the transfer sees them all.
#[test]
fn ring_agents_copy_on_one_stream_their_own_or_one_each() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = DiskDir::new("agentstreams");
    let (file, data) = data_file(&dir, 33, LEN);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(4 << 20);
    t.set_delay_us(200);
    for strategy in [
        Strategy::Ring { slots: 6, slot: 64 << 10, threads: 3 },
        Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 3 },
        Strategy::Direct { slots: 6, slot: 64 << 10, threads: 3 },
    ] {
        for (streams, made) in [(CopyStreams::PerThread, 4), (CopyStreams::RingApart, 2), (CopyStreams::One, 1)] {
            let created = t.emulated().then(|| t.emu().call_count("cudaStreamCreateWithPriority").unwrap_or(0));
            let s =
                Streamer::new(&[dev], StreamConfig::new(strategy, budget.clone()).with_copy_streams(streams)).unwrap();
            let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
            for pass in 0..2 {
                let report = s.to_device(&file, 0..LEN as u64, &mut dst).unwrap();
                assert_eq!(dst.to_vec().unwrap(), data, "{strategy} {streams:?}, pass {pass}: {report}");
            }
            if let Some(before) = created {
                // The streamer's own stream, plus the ring's (made once, kept).
                let now = t.emu().call_count("cudaStreamCreateWithPriority").unwrap_or(0);
                assert_eq!(now - before, made, "{strategy} {streams:?}");
            }
        }
    }
    t.set_delay_us(0);
    budget.release_parked(); // what the dropped streamers parked with it
    assert_eq!(budget.used(), 0);
    drop(budget); // its last handle: nothing stays parked with it
    t.assert_clean();
}
