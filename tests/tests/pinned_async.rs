//! Streaming into memory and streams the caller owns, without blocking:
//! partial, typed, raw-pointer and split destinations; `Streamer::start` and
//! its `Transfer` (poll, wait, await, `then_on`, `StartOptions::after`); and
//! what happens when handles are leaked or the streamer is dropped early.
//!
//! The same tests run on the emulator and on a real GPU. Where a missing
//! synchronization must show, the emulator delays every stream operation (a
//! no-op on a GPU): a copy ordered wrongly then reads or writes at the wrong
//! time and the data check fails. No timing is asserted.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, PinnedBuffer, Stream};
use wirespeed_pinned::{
    Error, MappedFile, PinBudget, Report, StartOptions, Strategy, StreamConfig, Streamer, Transfer,
};
use wirespeed_tests::{TempDir, Watchdog, open_mapped, start, write_pattern_file};

const LEN: usize = (1 << 20) + 4096 + 24; // a multiple of 8: typed destinations fit

fn data_file(dir: &TempDir, seed: u64, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("data-{seed}.bin"));
    let data = write_pattern_file(&path, seed, len);
    (open_mapped(&path).unwrap(), data)
}

/// A strategy of each agent: the inline whole-file pass, the window agent on
/// its thread, ring agents.
fn strategies() -> [Strategy; 3] {
    [
        Strategy::WholeFile,
        Strategy::Windows { window: 256 << 10, in_flight: 2 },
        Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 },
    ]
}

fn streamer(strategy: Strategy) -> Streamer {
    let dev = Device::get(0).unwrap();
    Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(64 << 20))).unwrap()
}

fn as_bytes<T: Copy>(v: &[T], to_bytes: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|x| to_bytes(*x)).collect()
}

/// Runs a future to its end on this thread (a waker that unparks it).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn a_part_of_a_larger_buffer_is_filled_and_nothing_else() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-part");
    let (file, data) = data_file(&dir, 1, LEN);
    let dev = Device::get(0).unwrap();
    for (i, strategy) in strategies().into_iter().enumerate() {
        t.set_delay_us(if i % 2 == 0 { 0 } else { 200 });
        let s = streamer(strategy);
        let (at, n) = (1000, 300_001);
        let mut big = DeviceBuffer::<u8>::zeroed(&dev, LEN + 5000).unwrap();
        // Blocking, into a view.
        let r = s.to_device(&file, 7..7 + n as u64, big.slice_mut(at..at + n).unwrap()).unwrap();
        assert_eq!(r.bytes, n as u64);
        let v = big.to_vec().unwrap();
        assert!(v[..at].iter().all(|&b| b == 0), "{strategy}: bytes before the view written");
        assert_eq!(&v[at..at + n], &data[7..7 + n], "{strategy}");
        assert!(v[at + n..].iter().all(|&b| b == 0), "{strategy}: bytes after the view written");
        // Not blocking, into the tail of the same buffer.
        let tail = LEN + 5000 - 4000;
        let r = s.start(&file, 0..4000, big.slice_mut(tail..).unwrap()).unwrap().wait().unwrap();
        assert_eq!(r.bytes, 4000);
        let v = big.to_vec().unwrap();
        assert_eq!(&v[tail..], &data[..4000], "{strategy}");
        assert_eq!(&v[at..at + n], &data[7..7 + n], "{strategy}");
    }
    t.assert_clean();
}

#[test]
fn typed_destinations_get_the_files_bytes() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-typed");
    let (file, data) = data_file(&dir, 2, LEN);
    let dev = Device::get(0).unwrap();
    for strategy in strategies() {
        let s = streamer(strategy);
        let mut words = DeviceBuffer::<u32>::zeroed(&dev, LEN / 4).unwrap();
        s.to_device(&file, 0..LEN as u64, &mut words).unwrap();
        assert_eq!(as_bytes(&words.to_vec().unwrap(), |x| x.to_ne_bytes().to_vec()), data, "{strategy}");

        let mut doubles = DeviceBuffer::<f64>::zeroed(&dev, LEN / 8 + 10).unwrap();
        let part = doubles.slice_mut(10..).unwrap();
        s.start(&file, 0..LEN as u64, part).unwrap().wait().unwrap();
        let v = doubles.to_vec().unwrap();
        assert!(v[..10].iter().all(|&x| x == 0.0));
        assert_eq!(as_bytes(&v[10..], |x| x.to_ne_bytes().to_vec()), data, "{strategy}");

        // Arrays are Pod too: 16-byte records.
        let mut records = DeviceBuffer::<[u64; 2]>::zeroed(&dev, 100).unwrap();
        s.to_device(&file, 1600..3200, &mut records).unwrap();
        let got = as_bytes(&records.to_vec().unwrap(), |r| [r[0].to_ne_bytes(), r[1].to_ne_bytes()].concat());
        assert_eq!(got, &data[1600..3200], "{strategy}");
    }
    t.assert_clean();
}

#[test]
fn device_memory_from_a_raw_pointer_is_a_destination() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-raw");
    let (file, data) = data_file(&dir, 3, LEN);
    let dev = Device::get(0).unwrap();
    for (i, strategy) in strategies().into_iter().enumerate() {
        t.set_delay_us(if i % 2 == 0 { 100 } else { 0 });
        let s = streamer(strategy);
        // Memory "from elsewhere": only its address goes to the streamer.
        let backing = DeviceBuffer::<u8>::zeroed(&dev, LEN).unwrap();
        // SAFETY: device memory of `dev`, alive until the end of the
        // iteration; nothing else touches it until `wait` returned.
        let dst = unsafe { DeviceSliceMut::from_raw_parts(backing.as_raw_ptr(), LEN, dev) }.unwrap();
        s.start(&file, 0..LEN as u64, dst).unwrap().wait().unwrap();
        assert_eq!(backing.to_vec().unwrap(), data, "{strategy}");
        // Blocking, typed, into the middle of it.
        let words = DeviceBuffer::<u32>::zeroed(&dev, 1000).unwrap();
        // SAFETY: as above, values 100..600 of `words`, untouched until to_device returned.
        let mid = unsafe { DeviceSliceMut::from_raw_parts(words.as_raw_ptr().wrapping_add(100), 500, dev) }.unwrap();
        s.to_device(&file, 4..2004, mid).unwrap();
        let v = words.to_vec().unwrap();
        assert!(v[..100].iter().chain(&v[600..]).all(|&x| x == 0));
        assert_eq!(as_bytes(&v[100..600], |x| x.to_ne_bytes().to_vec()), &data[4..2004]);
    }
    t.assert_clean();
}

#[test]
fn from_raw_parts_refuses_what_is_not_device_memory() {
    let t = start();
    let dev = Device::get(0).unwrap();
    let pinned = PinnedBuffer::<u8>::new(4096).unwrap();
    // SAFETY: refused before anything uses it.
    let r = unsafe { DeviceSliceMut::from_raw_parts(pinned.as_ptr().cast_mut(), 4096, dev) };
    assert!(matches!(r, Err(wirespeed_cuda::Error::InvalidArgument { .. })), "{r:?}");
    let buf = DeviceBuffer::<u8>::new(&dev, 64).unwrap();
    // SAFETY: refused (misaligned for u32) before anything uses it.
    let r = unsafe { DeviceSliceMut::from_raw_parts(buf.as_raw_ptr().wrapping_add(1).cast::<u32>(), 4, dev) };
    assert!(matches!(r, Err(wirespeed_cuda::Error::InvalidArgument { .. })), "{r:?}");
    // SAFETY: refused (bytes overflow) before anything uses it.
    let r = unsafe { DeviceSliceMut::from_raw_parts(buf.as_raw_ptr().cast::<u64>(), usize::MAX / 4, dev) };
    assert!(matches!(r, Err(wirespeed_cuda::Error::InvalidArgument { .. })), "{r:?}");
    // An empty view needs no memory at all.
    // SAFETY: zero values: nothing is ever read or written through it.
    let empty = unsafe { DeviceSliceMut::<u8>::from_raw_parts(std::ptr::NonNull::dangling().as_ptr(), 0, dev) };
    assert!(empty.unwrap().is_empty());
    drop((pinned, buf));
    t.assert_clean();
}

#[test]
fn split_halves_are_filled_by_two_concurrent_transfers() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-split");
    let (file, data) = data_file(&dir, 4, LEN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(300);
    let (a, b) = (streamer(strategies()[1]), streamer(strategies()[2]));
    let mut buf = DeviceBuffer::<u8>::zeroed(&dev, LEN).unwrap();
    let mid = 300_000;
    {
        let (low, high) = buf.split_at_mut(mid).unwrap();
        // Both in flight at once, on two streamers (two streams, two workers).
        let t_high = b.start(&file, mid as u64..LEN as u64, high).unwrap();
        let t_low = a.start(&file, 0..mid as u64, low).unwrap();
        let (r_low, r_high) = (t_low.wait().unwrap(), t_high.wait().unwrap());
        assert_eq!((r_low.bytes, r_high.bytes), (mid as u64, (LEN - mid) as u64));
    }
    assert_eq!(buf.to_vec().unwrap(), data);
    drop(buf);

    // The same through one streamer (queued one after the other), handles
    // dropped at once: the buffer's owner waits for both.
    let mut buf = DeviceBuffer::<u8>::zeroed(&dev, LEN).unwrap();
    {
        let mut all = buf.slice_mut(..).unwrap();
        let (low, high) = all.split_at_mut(mid).unwrap();
        drop(a.start(&file, 0..mid as u64, low).unwrap());
        drop(a.start(&file, mid as u64..LEN as u64, high).unwrap());
    }
    assert_eq!(buf.to_vec().unwrap(), data);
    drop((a, b, buf));
    t.assert_clean();
}

#[test]
fn split_halves_on_two_streams_and_copies_between_them() {
    let t = start();
    let dev = Device::get(0).unwrap();
    t.set_delay_us(500);
    let (s1, s2) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 8192).unwrap();
    let src = PinnedBuffer::from_slice(&[5u8; 4096]).unwrap();
    {
        let (mut low, mut high) = buf.split_at_mut(4096).unwrap();
        s1.copy_to_device(&src, &mut low).unwrap().detach();
        s2.memset(&mut high, 1).unwrap().detach();
        // From one part to the other, on the second stream: it must follow
        // the first stream's copy into `low` (one fence, shared).
        s2.copy_device_to_device(&low, &mut high).unwrap().detach();
        s2.memset(&mut high.slice_mut(2048..).unwrap(), 2).unwrap().detach();
    }
    let v = buf.to_vec().unwrap();
    assert!(v[..4096].iter().all(|&b| b == 5));
    assert!(v[4096..6144].iter().all(|&b| b == 5), "the copy between parts ran before its source was written");
    assert!(v[6144..].iter().all(|&b| b == 2));
    drop((buf, src, s1, s2));
    t.assert_clean();
}

#[test]
fn start_then_poll_then_wait_and_await() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-poll");
    let (file, data) = data_file(&dir, 5, LEN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(200);
    for strategy in strategies() {
        let s = streamer(strategy);
        let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let tr = s.start(&file, 0..LEN as u64, &mut dst).unwrap();
        let mut polls = 0u64;
        while !tr.is_done() {
            polls += 1;
            std::thread::yield_now();
        }
        let report: Report = tr.wait().unwrap();
        assert_eq!(report.bytes, LEN as u64, "{strategy} after {polls} polls");
        assert_eq!(dst.to_vec().unwrap(), data, "{strategy}");

        // As a future, on a bare executor.
        let mut dst = DeviceBuffer::<u8>::new(&dev, 5000).unwrap();
        let report = block_on(s.start(&file, 100..5100, &mut dst).unwrap()).unwrap();
        assert_eq!(report.bytes, 5000);
        assert_eq!(dst.to_vec().unwrap(), &data[100..5100], "{strategy}");

        // Awaited through a `&mut`: the result is taken, `wait` says so.
        let mut head = dst.slice_mut(..10).unwrap();
        let mut tr: Transfer<'_> = s.start(&file, 0..10, &mut head).unwrap();
        assert!(block_on(&mut tr).is_ok());
        assert!(tr.is_done());
        assert!(matches!(tr.wait(), Err(Error::InvalidArgument { .. })));
    }
    t.assert_clean();
}

#[test]
fn transfers_of_one_streamer_run_in_order() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-order");
    let (f1, _) = data_file(&dir, 6, LEN);
    let (f2, d2) = data_file(&dir, 7, LEN);
    let (f3, d3) = data_file(&dir, 8, LEN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(100);
    for strategy in strategies() {
        let s = streamer(strategy);
        let mut buf = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        // Three transfers into the same buffer, handles dropped: the last wins.
        drop(s.start(&f1, 0..LEN as u64, &mut buf).unwrap());
        drop(s.start(&f2, 0..LEN as u64, &mut buf).unwrap());
        drop(s.start(&f3, 0..LEN as u64, &mut buf).unwrap());
        assert_eq!(buf.to_vec().unwrap(), d3, "{strategy}");
        // A blocking call after a queued transfer into the same buffer waits
        // for it (no deadlock on the streamer), then overwrites it.
        drop(s.start(&f3, 0..LEN as u64, &mut buf).unwrap());
        s.to_device(&f2, 0..LEN as u64, &mut buf).unwrap();
        assert_eq!(buf.to_vec().unwrap(), d2, "{strategy}");
        // And a scratch pass, likewise.
        drop(s.start(&f2, 0..LEN as u64, &mut buf).unwrap());
        s.to_scratch(&f3, 0..LEN as u64, &mut buf).unwrap();
        assert_eq!(buf.to_vec().unwrap(), d3, "{strategy}");
    }
    t.assert_clean();
}

#[test]
fn then_on_orders_work_on_the_callers_stream() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-then");
    let (file, data) = data_file(&dir, 9, LEN);
    let dev = Device::get(0).unwrap();
    // Long enough that a copy on `mine` not ordered after the transfer would
    // run before the transfer's copies land.
    t.set_delay_us(3000);
    for strategy in strategies() {
        let s = streamer(strategy);
        let mine = Stream::new(&dev).unwrap();
        let landing = DeviceBuffer::<u8>::zeroed(&dev, LEN).unwrap();
        let mut out = DeviceBuffer::<u8>::zeroed(&dev, LEN).unwrap();
        // SAFETY: `landing` is device memory of `dev`, alive until the end of
        // the iteration; only the transfer and then, after `then_on`, the
        // copy on `mine` touch it, until `wait` below.
        let dst = unsafe { DeviceSliceMut::from_raw_parts(landing.as_raw_ptr(), LEN, dev) }.unwrap();
        let tr = s.start(&file, 0..LEN as u64, dst).unwrap();
        tr.then_on(&mine).unwrap();
        // SAFETY: as above: this view is only read on `mine`, after then_on.
        let src = unsafe { DeviceSliceMut::from_raw_parts(landing.as_raw_ptr(), LEN, dev) }.unwrap();
        mine.copy_device_to_device(&src, &mut out).unwrap().detach();
        // No host wait between then_on and the copy; `out`'s fence waits for `mine`.
        assert_eq!(out.to_vec().unwrap(), data, "{strategy}: the copy on the caller's stream ran early");
        tr.wait().unwrap();
        // then_on after the end: nothing left to wait for.
        // SAFETY: as above, until `wait` below.
        let dst = unsafe { DeviceSliceMut::from_raw_parts(landing.as_raw_ptr(), 10, dev) }.unwrap();
        let tr = s.start(&file, 0..10, dst).unwrap();
        while !tr.is_done() {
            std::thread::yield_now();
        }
        tr.then_on(&mine).unwrap();
        tr.wait().unwrap();
        drop((landing, out, mine));
    }
    t.assert_clean();
}

#[test]
fn after_orders_the_copies_after_the_callers_stream() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-after");
    let (file, data) = data_file(&dir, 10, 1 << 20);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(2000);
    for strategy in strategies() {
        let s = streamer(strategy);
        let mine = Stream::new(&dev).unwrap();
        let mut backing = DeviceBuffer::<u8>::zeroed(&dev, 1 << 20).unwrap();
        let stale = PinnedBuffer::from_slice(&vec![0xAAu8; 1 << 20]).unwrap();
        // Work on `mine` that ends by writing the stale bytes, long after the
        // transfer's copies would land if they did not wait for it.
        for _ in 0..5 {
            mine.memset(&mut backing, 0x55).unwrap().detach();
        }
        mine.copy_to_device(&stale, &mut backing).unwrap().detach();
        // SAFETY: device memory of `dev`, alive until the end of the
        // iteration; its other writer (`mine`) is ordered before the
        // transfer by `after`, and nothing touches it until `wait` returned.
        let dst = unsafe { DeviceSliceMut::from_raw_parts(backing.as_raw_ptr(), 1 << 20, dev) }.unwrap();
        let tr = s.start_with(&file, 0..1 << 20, dst, StartOptions::new().after(&mine)).unwrap();
        tr.wait().unwrap();
        assert_eq!(backing.to_vec().unwrap(), data, "{strategy}: the transfer did not wait for the caller's stream");
        drop((backing, stale, mine));
    }
    t.assert_clean();
}

#[test]
fn forgotten_transfer_then_dropped_destination_waits() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-forget");
    let (file, data) = data_file(&dir, 11, LEN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(2000);
    for strategy in strategies() {
        let landed = Arc::new(AtomicU64::new(0));
        let l = landed.clone();
        let mut cfg = StreamConfig::new(strategy, PinBudget::new(64 << 20));
        cfg.progress = Some(Arc::new(move |done, _| {
            l.fetch_max(done, Ordering::AcqRel);
        }));
        let s = Streamer::new(&[dev], cfg).unwrap();

        // Leaked handle, then the destination read: it waits for the data.
        let mut buf = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        std::mem::forget(s.start(&file, 0..LEN as u64, &mut buf).unwrap());
        assert_eq!(buf.to_vec().unwrap(), data, "{strategy}");
        drop(buf);

        // Leaked handle, then the destination dropped at once: the drop waits
        // for the worker to have enqueued and finished every copy (a copy
        // into freed memory would fail, and the transfer stop short).
        landed.store(0, Ordering::Release);
        let mut buf = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        std::mem::forget(s.start(&file, 0..LEN as u64, &mut buf).unwrap());
        drop(buf);
        assert_eq!(landed.load(Ordering::Acquire), LEN as u64, "{strategy}: the buffer was freed under the transfer");
        if let Some(c) = t.counters() {
            assert_eq!(c.device_allocs, 0, "{strategy}");
        }
        // The streamer is still sound and usable.
        let mut buf = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        s.start(&file, 0..LEN as u64, &mut buf).unwrap().wait().unwrap();
        assert_eq!(buf.to_vec().unwrap(), data, "{strategy}");
    }
    t.assert_clean();
}

#[test]
fn dropping_the_streamer_waits_for_its_transfers() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-drop");
    let (file, data) = data_file(&dir, 12, LEN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(2000);
    for strategy in strategies() {
        let s = streamer(strategy);
        let mut a = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
        let mut b = DeviceBuffer::<u32>::new(&dev, LEN / 4).unwrap();
        drop(s.start(&file, 0..LEN as u64, &mut a).unwrap());
        std::mem::forget(s.start(&file, 0..LEN as u64, &mut b).unwrap());
        drop(s); // joins the worker: both transfers ran to their end
        assert_eq!(a.to_vec().unwrap(), data, "{strategy}");
        assert_eq!(as_bytes(&b.to_vec().unwrap(), |x| x.to_ne_bytes().to_vec()), data, "{strategy}");
    }
    t.assert_clean();
}

#[test]
fn start_and_its_transfer_report_errors() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("async-errors");
    let (file, _) = data_file(&dir, 13, LEN);
    let dev = Device::get(0).unwrap();
    let s = streamer(Strategy::WholeFile);
    let mut buf = DeviceBuffer::<u8>::new(&dev, 100).unwrap();
    // Bad ranges.
    let reversed = std::ops::Range { start: 50u64, end: 10 };
    assert!(matches!(s.start(&file, reversed, &mut buf), Err(Error::BadRange { .. })));
    assert!(matches!(s.start(&file, LEN as u64 - 50..LEN as u64 + 50, &mut buf), Err(Error::BadRange { .. })));
    // A destination of another length.
    assert!(matches!(s.start(&file, 0..99, &mut buf), Err(Error::InvalidArgument { .. })));
    assert!(matches!(s.to_device(&file, 0..101, &mut buf), Err(Error::InvalidArgument { .. })));
    // A range that is not a whole number of values.
    let mut words = DeviceBuffer::<u32>::new(&dev, 25).unwrap();
    for r in [
        s.start(&file, 0..99, &mut words).map(|_| ()),
        s.to_device(&file, 0..99, &mut words).map(|_| ()),
        s.start(&file, 0..102, &mut words).map(|_| ()),
    ] {
        match r {
            Err(Error::InvalidArgument { message, .. }) => assert!(message.contains("whole number"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
    // A transfer that fails on the worker (the budget cannot hold the
    // file's registration): then_on says so, wait tells the error.
    let tiny = Streamer::new(&[dev], StreamConfig::new(Strategy::WholeFile, PinBudget::new(4096))).unwrap();
    let mut big = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    let tr = tiny.start(&file, 0..LEN as u64, &mut big).unwrap();
    let mine = Stream::new(&dev).unwrap();
    assert!(matches!(tr.then_on(&mine), Err(Error::TransferFailed { .. })));
    assert!(matches!(tr.wait(), Err(Error::BudgetExceeded { .. })));
    // The destination is usable after a failed transfer.
    big.copy_from_slice(&vec![1; LEN]).unwrap();
    drop((tiny, big, mine));

    // From inside a progress callback of the same streamer: refused.
    let me = Arc::new(std::sync::OnceLock::<std::sync::Weak<Streamer>>::new());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (m, sn, f) = (me.clone(), seen.clone(), file.clone());
    let mut cfg = StreamConfig::new(Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 }, PinBudget::new(64 << 20));
    cfg.progress = Some(Arc::new(move |_, _| {
        if let Some(s) = m.get().and_then(std::sync::Weak::upgrade) {
            let mut d = DeviceBuffer::<u8>::new(&Device::get(0).unwrap(), 10).unwrap();
            sn.lock().unwrap().push(s.start(&f, 0..10, &mut d).map(|_| ()).map_err(|e| e.to_string()));
        }
    }));
    let s2 = Arc::new(Streamer::new(&[dev], cfg).unwrap());
    me.set(Arc::downgrade(&s2)).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, LEN).unwrap();
    s2.start(&file, 0..LEN as u64, &mut dst).unwrap().wait().unwrap();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("inside a callback"))), "{seen:?}");
    drop(s2);

    // Waiting for a transfer from inside a callback of its streamer (here a
    // chunk callback, which holds the streamer): refused, not a deadlock.
    let mut other = DeviceBuffer::<u8>::new(&dev, 4096).unwrap();
    let mut pending = Some(s.start(&file, 0..4096, &mut other).unwrap());
    let mut inner = None;
    s.for_each_chunk(&file, 0..8192, 4096, |_, _, _, _| {
        if let Some(tr) = pending.take() {
            let mine = Stream::new(&dev)?;
            inner =
                Some((tr.then_on(&mine).map_err(|e| e.to_string()), tr.wait().map(|_| ()).map_err(|e| e.to_string())));
        }
        Ok(())
    })
    .unwrap();
    let (then_on, wait) = inner.unwrap();
    assert!(then_on.is_err_and(|e| e.contains("inside a callback")));
    assert!(wait.is_err_and(|e| e.contains("inside a callback")));
    drop(pending);
    drop((s, buf, words, dst, other));
    t.assert_clean();
}

#[test]
fn a_detached_part_makes_its_owner_wait_for_the_release() {
    let t = start();
    let _w = Watchdog::new(60);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(1000);
    let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 8192).unwrap();
    let mut part = buf.slice_mut(4096..).unwrap().detach();
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        wait_go.recv().unwrap();
        let s = Stream::new(&dev).unwrap();
        let src = PinnedBuffer::from_slice(&[9u8; 4096]).unwrap();
        s.copy_to_device(&src, &mut part.slice_mut(..).unwrap()).unwrap().detach();
        part.release();
        drop((src, s));
    });
    // The reader starts before the writer has enqueued anything: it must
    // block until the release, then wait for the copy.
    let reader = std::thread::spawn(move || buf.to_vec().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20)); // (no assertion on it)
    go.send(()).unwrap();
    let v = reader.join().unwrap();
    writer.join().unwrap();
    assert!(v[..4096].iter().all(|&b| b == 0));
    assert!(v[4096..].iter().all(|&b| b == 9), "the owner read before the detached writer's copy");
    t.assert_clean();
}

#[test]
fn a_transfer_is_send_and_its_options_are_plain() {
    fn is_send<T: Send>(_: &T) {}
    let t = start();
    let dir = TempDir::new("async-send");
    let (file, data) = data_file(&dir, 14, 4096);
    let dev = Device::get(0).unwrap();
    let s = streamer(Strategy::WholeFile);
    let mut dst = DeviceBuffer::<u8>::new(&dev, 4096).unwrap();
    std::thread::scope(|scope| {
        let tr = s.start(&file, 0..4096, &mut dst).unwrap();
        is_send(&tr);
        scope.spawn(move || tr.wait().unwrap());
    });
    assert_eq!(dst.to_vec().unwrap(), data);
    assert!(format!("{:?}", StartOptions::new()).contains("StartOptions"));
    drop((s, dst));
    t.assert_clean();
}
