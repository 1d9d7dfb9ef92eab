//! Every public method of `cuda-safe`, on this binary's runtime: the emulator in
//! CI, the real GPU with `CUDA_REQUIRED=1`. Checks that need the emulator's
//! counters or delays run only when `t.emulated()`; there are no timing
//! assertions. Each test ends with `t.assert_clean()`.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use wirespeed_cuda::{
    Device, DeviceBuffer, Error, Event, EventOptions, Fence, HostMemory, HostRegistration, PinnedBuffer, PinnedFlags,
    Pod, PointerKind, RegisterFlags, STICKY_CODES, Stream, StreamOptions, host_device_pointer, host_flags,
    pointer_kind, runtime_info,
};
use wirespeed_cuda_sys::cudaMemoryType;
use wirespeed_tests::{Ctx, pattern, start};

fn dev() -> Device {
    Device::get(0).expect("device 0")
}

fn api() -> &'static wirespeed_cuda_sys::Api {
    wirespeed_cuda_sys::runtime().expect("runtime").api()
}

/// The error of a result whose value has no `Debug` (the slice types).
#[track_caller]
fn err<T>(r: Result<T, Error>) -> Error {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_invalid(e: &Error, call: &str) {
    assert!(matches!(e, Error::InvalidArgument { .. }), "expected InvalidArgument from {call}, got {e:?}");
    assert_eq!(e.call(), call, "{e}");
    assert_eq!(e.code(), None);
    assert_eq!(e.hint(), None);
}

/// A slow-down for the emulator (no-op on a GPU) so that missing ordering shows.
fn slow(t: &Ctx) {
    t.set_delay_us(5_000);
}

fn iota(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed)).collect()
}

// ------------------------------------------------------------------ static properties

fn send_sync<T: Send + Sync>() {}

#[test]
fn types_are_send_and_sync() {
    send_sync::<Device>();
    send_sync::<Stream>();
    send_sync::<Event>();
    send_sync::<Error>();
    send_sync::<Fence>();
    send_sync::<DeviceBuffer<u8>>();
    send_sync::<PinnedBuffer<f64>>();
    send_sync::<HostRegistration<Box<[u8]>>>();
    send_sync::<wirespeed_cuda::Pending<'static>>();
    send_sync::<wirespeed_cuda::DeviceSlice<'static, u32>>();
    send_sync::<wirespeed_cuda::DeviceSliceMut<'static, u32>>();
    // Buffers may be used across catch_unwind, as with std's Mutex inside.
    fn unwind_safe<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe>() {}
    unwind_safe::<Fence>();
    unwind_safe::<DeviceBuffer<u8>>();
    unwind_safe::<PinnedBuffer<f64>>();
    unwind_safe::<HostRegistration<Box<[u8]>>>();
}

/// An event waited for on one thread while another thread records it on a
/// second stream: the waiter must not take the new record's stream as done
/// (CUDA waited for the record it saw, on the first stream). If it did, the
/// host would read a pinned buffer that the second stream has still to fill.
/// The streams are held back by host functions; the sleeps only order the
/// threads (no timing is asserted, and a slow machine cannot make it fail).
#[test]
fn event_waited_while_rerecorded_elsewhere() {
    let t = start();
    let d = dev();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let ev = Event::new(&d, EventOptions::default()).unwrap();
    let n = 1 << 16;
    let mut src = DeviceBuffer::<u32>::new(&d, n).unwrap();
    src.copy_from_slice(&iota(n, 9)).unwrap();
    let mut p = PinnedBuffer::<u32>::new(n).unwrap();
    let (tx1, rx1) = std::sync::mpsc::channel::<()>();
    let (tx2, rx2) = std::sync::mpsc::channel::<()>();
    s1.launch_host_fn(move || {
        let _ = rx1.recv();
    })
    .unwrap();
    s2.launch_host_fn(move || {
        let _ = rx2.recv();
    })
    .unwrap();
    s2.copy_to_host(&src, &mut p).unwrap().detach(); // held back by gate 2
    s1.record(&ev).unwrap(); // held back by gate 1
    let pause = || std::thread::sleep(std::time::Duration::from_millis(50));
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| ev.synchronize());
        pause(); // the waiter is in cudaEventSynchronize, on s1's record
        s2.record(&ev).unwrap(); // behind the copy into `p`
        tx1.send(()).unwrap(); // s1's record completes: the waiter returns
        pause();
        let opener = scope.spawn(move || {
            pause();
            tx2.send(()).unwrap(); // only now may the copy into `p` run
        });
        assert_eq!(p.as_slice().unwrap(), &iota(n, 9)[..], "host read waited for s2's copy");
        waiter.join().unwrap().unwrap();
        opener.join().unwrap();
    });
    drop((s1, s2, ev, src, p));
    t.assert_clean();
}

#[test]
fn options_and_flags() {
    // The defaults, field by field, and `new()` is the default.
    let so = StreamOptions::default();
    assert_eq!((so.non_blocking, so.priority), (false, 0));
    assert_eq!(StreamOptions::new(), so);
    let eo = EventOptions::default();
    assert_eq!((eo.timing, eo.blocking_sync), (false, false));
    assert_eq!(EventOptions::new(), eo);
    let pf = PinnedFlags::default();
    assert_eq!((pf.portable, pf.mapped, pf.write_combined), (false, false, false));
    assert_eq!(PinnedFlags::new(), pf);
    let rf = RegisterFlags::default();
    assert_eq!((rf.portable, rf.mapped, rf.read_only), (false, false, false));
    assert_eq!(RegisterFlags::new(), rf);
    // Each builder method sets its own field and only it.
    let so = StreamOptions::new().non_blocking(true).priority(-2);
    assert_eq!((so.non_blocking, so.priority), (true, -2));
    assert!(!StreamOptions::new().priority(-2).non_blocking);
    let eo = EventOptions::new().timing(true);
    assert_eq!((eo.timing, eo.blocking_sync), (true, false));
    let eo = EventOptions::new().blocking_sync(true);
    assert_eq!((eo.timing, eo.blocking_sync), (false, true));
    let pf = PinnedFlags::new().write_combined(true);
    assert_eq!((pf.portable, pf.mapped, pf.write_combined), (false, false, true));
    let pf = PinnedFlags::new().portable(true).mapped(true).write_combined(true).mapped(false);
    assert_eq!((pf.portable, pf.mapped, pf.write_combined), (true, false, true));
    let lc = wirespeed_cuda::LaunchConfig::new([2, 3, 4], [32, 2, 1]).shared_bytes(512);
    assert_eq!((lc.grid, lc.block, lc.shared_bytes), ([2, 3, 4], [32, 2, 1], 512));
    assert_eq!(wirespeed_cuda::LaunchConfig::linear(7, 64), wirespeed_cuda::LaunchConfig::new([7, 1, 1], [64, 1, 1]));
    assert_eq!(RegisterFlags::default().bits(), wirespeed_cuda_sys::cudaHostRegisterDefault);
    assert_eq!(RegisterFlags::new().portable(true).bits(), wirespeed_cuda_sys::cudaHostRegisterPortable);
    assert_eq!(RegisterFlags::new().mapped(true).bits(), wirespeed_cuda_sys::cudaHostRegisterMapped);
    assert_eq!(RegisterFlags::new().read_only(true).bits(), wirespeed_cuda_sys::cudaHostRegisterReadOnly);
    assert_eq!(RegisterFlags::new().portable(true).mapped(true).read_only(true).bits(), 1 | 2 | 8);
    let f = Fence::default();
    assert!(f.is_idle());
    assert!(format!("{f:?}").contains("Fence"));
}

#[test]
fn error_methods() {
    let cuda = |call, code: u32| Error::Cuda { call, code, name: format!("name{code}"), message: "msg".into() };
    let e = cuda("cudaMalloc", 2);
    assert_eq!(e.code(), Some(2));
    assert_eq!(e.call(), "cudaMalloc");
    assert!(!e.is_sticky());
    assert!(e.hint().unwrap().contains("out of memory"));
    let s = e.to_string();
    assert!(s.contains("cudaMalloc failed: name2 (2): msg") && s.contains("hint: out of memory"), "{s}");
    assert!(std::error::Error::source(&e).is_none());

    for &c in STICKY_CODES {
        let e = cuda("cudaStreamSynchronize", c);
        assert!(e.is_sticky());
        assert!(e.hint().unwrap().contains("restart"), "{c}");
    }
    assert_eq!(STICKY_CODES, &[700, 702, 714, 715, 716, 717, 718, 719]);
    assert!(cuda("cudaGetDeviceCount", 35).hint().unwrap().contains("driver"));
    assert!(cuda("cudaGetDeviceCount", 100).hint().unwrap().contains("CUDA_VISIBLE_DEVICES"));
    assert!(cuda("cudaSetDevice", 101).hint().unwrap().contains("Device::count"));
    assert!(cuda("cudaHostRegister", 1).hint().unwrap().contains("ReadOnly"));
    assert_eq!(cuda("cudaMemcpy", 1).hint(), None, "code 1 has a hint only for cudaHostRegister");
    assert!(cuda("cudaHostRegister", 712).hint().unwrap().contains("already registered"));
    assert!(cuda("cudaHostUnregister", 713).hint().is_some());
    assert!(cuda("cudaStreamQuery", 600).hint().is_some());
    assert_eq!(cuda("cudaMemcpy", 999).hint(), None);
    assert_eq!(cuda("cudaMemcpy", 999).to_string(), "cudaMemcpy failed: name999 (999): msg");

    let e = Error::InvalidArgument { call: "Device::get", message: "nope".into() };
    assert_eq!(e.to_string(), "Device::get: nope");
    assert_invalid(&e, "Device::get");

    let load = wirespeed_cuda_sys::LoadError::BadPath("a\0b".into());
    let e = Error::from(load.clone());
    assert_eq!(e, Error::Load(load));
    assert_eq!(e.call(), "loading the CUDA runtime");
    assert_eq!(e.code(), None);
    assert!(!e.is_sticky());
    assert!(e.hint().unwrap().contains("CUDA_SYS_RUNTIME"));
    assert!(std::error::Error::source(&e).is_some());
    assert!(e.to_string().contains("NUL byte"));
}

// ------------------------------------------------------------------ devices and the runtime

#[test]
fn devices() {
    let t = start();
    let n = Device::count().unwrap();
    assert!(n >= 1);
    let all = Device::all().unwrap();
    assert_eq!(all.len(), n);
    for (i, d) in all.iter().enumerate() {
        assert_eq!(d.ordinal(), i);
        assert_eq!(Device::get(i).unwrap(), *d);
    }
    for bad in [n, n + 1, usize::MAX] {
        let e = Device::get(bad).unwrap_err();
        assert_invalid(&e, "Device::get");
        assert!(e.to_string().contains(&format!("{n} device(s) visible")), "{e}");
    }
    let d = dev();
    d.make_current().unwrap();
    let name = d.name().unwrap();
    assert!(!name.is_empty());
    if t.emulated() {
        assert_eq!(name, "Emulated CUDA Device");
    } else {
        assert!(name.starts_with("NVIDIA"), "{name}");
    }
    let (free, total) = d.mem_info().unwrap();
    assert!(total > 0 && free <= total, "{free} of {total}");
    assert!(d.supports_host_register().unwrap());
    let _ = d.supports_read_only_register().unwrap();
    assert!(d.async_engine_count().unwrap() >= 1);
    assert!(d.unified_addressing().unwrap());
    assert!(d.attribute(wirespeed_cuda_sys::cudaDeviceAttr::cudaDevAttrMultiProcessorCount).unwrap() >= 1);
    let (least, greatest) = d.stream_priority_range().unwrap();
    assert!(greatest <= least, "greatest {greatest} least {least}");
    d.synchronize().unwrap();
    assert!(format!("{d:?}").contains("ordinal"));
    t.assert_clean();
}

#[test]
fn runtime_info_matches_the_loaded_runtime() {
    let t = start();
    let info = runtime_info().unwrap();
    let rt = wirespeed_cuda_sys::runtime().unwrap();
    assert_eq!(info.runtime_version, rt.version());
    assert_eq!(info.path, rt.path());
    assert_eq!(info.path, t.env.path);
    assert!(info.runtime_version >= 12000, "{info:?}");
    assert!(info.driver_version >= 12000, "{info:?}");
    if t.emulated() {
        assert_eq!(info.runtime_version, 13000);
    }
    t.assert_clean();
}

// ------------------------------------------------------------------ streams

#[test]
fn streams_and_options() {
    let t = start();
    let d = dev();
    let (least, greatest) = d.stream_priority_range().unwrap();
    let s = Stream::new(&d).unwrap();
    assert_eq!(s.device(), d);
    assert!(!s.as_raw().is_null());
    assert!(format!("{s:?}").contains("Stream"));
    for options in [
        StreamOptions::default(),
        StreamOptions::new().non_blocking(true),
        StreamOptions::new().priority(greatest),
        StreamOptions::new().non_blocking(true).priority(least),
        StreamOptions::new().non_blocking(true).priority(greatest - 100), // clamped by CUDA
    ] {
        let s = Stream::with_options(&d, options).unwrap();
        let mut buf = DeviceBuffer::<u16>::new(&d, 100).unwrap();
        s.memset(&mut buf, 0x5A).unwrap().wait().unwrap();
        assert!(buf.to_vec().unwrap().iter().all(|&v| v == 0x5A5A), "{options:?}");
        s.synchronize().unwrap();
        assert!(s.query().unwrap());
    }
    s.synchronize().unwrap();
    assert!(s.query().unwrap(), "an idle stream");
    drop(s);
    t.assert_clean();
}

#[test]
fn stream_query_and_pending_is_complete() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let host = PinnedBuffer::from_slice(&iota(1 << 16, 1)).unwrap();
    let mut buf = DeviceBuffer::<u32>::new(&d, 1 << 16).unwrap();
    t.set_delay_us(100_000);
    let p = s.copy_to_device(&host, &mut buf).unwrap();
    assert!(format!("{p:?}").contains("seq"));
    if t.emulated() {
        // The copy waits 100 ms in the emulator before it runs.
        assert!(!p.is_complete().unwrap());
        assert!(!s.query().unwrap());
    }
    p.wait().unwrap();
    s.memset(&mut buf.slice_mut(0..0).unwrap(), 1).unwrap().wait().unwrap();
    s.synchronize().unwrap();
    assert!(s.query().unwrap());
    let p = s.copy_to_device(&host, &mut buf).unwrap();
    s.synchronize().unwrap();
    assert!(p.is_complete().unwrap());
    p.wait().unwrap();
    assert_eq!(buf.to_vec().unwrap(), iota(1 << 16, 1));
    drop((s, host, buf));
    t.assert_clean();
}

#[test]
fn stream_from_raw() {
    let t = start();
    let d = dev();
    d.make_current().unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: `raw` is a valid place for the handle.
    let code = unsafe { (api().cudaStreamCreateWithFlags)(&mut raw, wirespeed_cuda_sys::cudaStreamNonBlocking) };
    assert_eq!(code.0, 0);
    // SAFETY: a live stream of `d`, owned by the wrapper from now on.
    let s = unsafe { Stream::from_raw(raw, d, true) }.unwrap();
    assert_eq!(s.as_raw(), raw);
    let src = PinnedBuffer::from_slice(&[1u8, 2, 3, 4]).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&d, 4).unwrap();
    s.copy_to_device(&src, &mut dst).unwrap().wait().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [1, 2, 3, 4]);
    drop(s); // destroys the owned stream

    // The legacy default stream (null), not owned.
    // SAFETY: null is the legacy stream, live for the whole process.
    let legacy = unsafe { Stream::from_raw(std::ptr::null_mut(), d, false) }.unwrap();
    legacy.memset(&mut dst, 9).unwrap().wait().unwrap();
    let mut back = PinnedBuffer::<u8>::new(4).unwrap();
    legacy.copy_to_host(&dst, &mut back).unwrap().wait().unwrap();
    assert_eq!(back.as_slice().unwrap(), [9; 4]);
    drop(legacy);
    drop((src, dst, back));
    t.assert_clean();
}

#[test]
fn stream_shared_between_threads() {
    let t = start();
    slow(&t);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let src = PinnedBuffer::from_slice(&iota(4096, 7)).unwrap();
    let mut on_gpu = DeviceBuffer::<u32>::new(&d, 4096).unwrap();
    s.copy_to_device(&src, &mut on_gpu).unwrap().detach();
    let shared = &on_gpu;
    std::thread::scope(|scope| {
        for k in 0..4 {
            let s2 = s.clone();
            scope.spawn(move || {
                // A clone used from another thread, reading a buffer shared by reference.
                let mut back = PinnedBuffer::<u32>::new(4096).unwrap();
                s2.copy_to_host(shared, &mut back).unwrap().wait().unwrap();
                assert_eq!(back.as_slice().unwrap(), iota(4096, 7), "thread {k}");
                let other = Stream::new(&d).unwrap(); // another stream, made on this thread
                let mut back2 = PinnedBuffer::<u32>::new(4096).unwrap();
                other.copy_to_host(shared, &mut back2).unwrap().wait().unwrap();
                assert_eq!(back2.as_slice().unwrap(), iota(4096, 7), "thread {k}");
            });
        }
    });
    // A stream, a buffer and a pending copy moved to another thread.
    let moved = std::thread::spawn(move || {
        let mut back = PinnedBuffer::<u32>::new(4096).unwrap();
        s.copy_to_host(&on_gpu, &mut back).unwrap().wait().unwrap();
        (back.as_slice().unwrap().to_vec(), s, on_gpu)
    })
    .join()
    .unwrap();
    assert_eq!(moved.0, iota(4096, 7));
    drop(moved);
    drop(src);
    t.assert_clean();
}

#[test]
fn launch_host_fn_runs_in_stream_order() {
    let t = start();
    slow(&t);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = PinnedBuffer::from_slice(&iota(1024, 3)).unwrap();
    let mut on_gpu = DeviceBuffer::<u32>::new(&d, 1024).unwrap();
    for i in 0..10 {
        let l = log.clone();
        s.launch_host_fn(move || l.lock().unwrap().push(i)).unwrap();
        if i == 4 {
            s.copy_to_device(&src, &mut on_gpu).unwrap().detach();
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    s.launch_host_fn(move || {
        let _ = tx.send("done");
    })
    .unwrap();
    assert_eq!(rx.recv().unwrap(), "done");
    assert_eq!(*log.lock().unwrap(), (0..10).collect::<Vec<_>>());
    // A panicking host function is contained; the stream goes on.
    wirespeed_tests::quiet_expected_panics();
    s.launch_host_fn(|| panic!("host function panics (expected in this test)")).unwrap();
    let l = log.clone();
    s.launch_host_fn(move || l.lock().unwrap().push(10)).unwrap();
    s.synchronize().unwrap();
    assert_eq!(log.lock().unwrap().len(), 11);
    assert_eq!(Arc::strong_count(&log), 1, "every closure was dropped after running");
    // From a clone on another thread.
    let s2 = s.clone();
    let l = log.clone();
    std::thread::spawn(move || s2.launch_host_fn(move || l.lock().unwrap().push(11)).unwrap()).join().unwrap();
    s.synchronize().unwrap();
    assert_eq!(log.lock().unwrap().last(), Some(&11));
    assert_eq!(on_gpu.to_vec().unwrap(), iota(1024, 3));
    drop((s, src, on_gpu));
    t.assert_clean();
}

// ------------------------------------------------------------------ events

#[test]
fn events() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let timed = EventOptions::new().timing(true);
    let (a, b) = (Event::new(&d, timed).unwrap(), Event::new(&d, timed).unwrap());
    assert!(!a.as_raw().is_null());
    assert!(format!("{a:?}").contains("Event"));
    assert!(a.query().unwrap(), "a never-recorded event is complete");
    s.record(&a).unwrap();
    let src = PinnedBuffer::from_slice(&iota(1 << 16, 9)).unwrap();
    let mut on_gpu = DeviceBuffer::<u32>::new(&d, 1 << 16).unwrap();
    s.copy_to_device(&src, &mut on_gpu).unwrap().detach();
    s.record(&b).unwrap();
    b.synchronize().unwrap();
    assert!(b.query().unwrap());
    assert!(a.query().unwrap());
    let ms = b.elapsed_ms(&a).unwrap();
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
    a.synchronize().unwrap();

    // Timing off: elapsed time is refused with cudaErrorInvalidResourceHandle.
    let untimed = Event::new(&d, EventOptions::default()).unwrap();
    let blocking = Event::new(&d, EventOptions::new().blocking_sync(true)).unwrap();
    s.record(&untimed).unwrap();
    s.record(&blocking).unwrap();
    blocking.synchronize().unwrap();
    untimed.synchronize().unwrap();
    let e = untimed.elapsed_ms(&a).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cudaEventElapsedTime", Some(400)), "{e}");
    let e = a.elapsed_ms(&untimed).unwrap_err();
    assert_eq!(e.code(), Some(400), "{e}");

    // wait_event orders another stream after the record.
    let s2 = Stream::new(&d).unwrap();
    s2.wait_event(&b).unwrap();
    s2.wait_event(&untimed).unwrap();
    s2.synchronize().unwrap();

    // Event::synchronize tells the stream how far it got: reading the buffer
    // then needs no further wait (emulator: no cudaStreamSynchronize call).
    slow(&t);
    let mut back = PinnedBuffer::<u32>::new(1 << 16).unwrap();
    s.copy_to_host(&on_gpu, &mut back).unwrap().detach();
    s.record(&b).unwrap();
    b.synchronize().unwrap();
    let syncs = t.emulated().then(|| t.emu().call_count("cudaStreamSynchronize").unwrap());
    assert_eq!(back.as_slice().unwrap(), iota(1 << 16, 9));
    if let Some(n) = syncs {
        assert_eq!(t.emu().call_count("cudaStreamSynchronize").unwrap(), n);
    }
    drop((a, b, untimed, blocking, s, s2, src, on_gpu, back));
    t.assert_clean();
}

// ------------------------------------------------------------------ device buffers

#[test]
fn device_buffer_basics() {
    let t = start();
    let d = dev();
    let mut b = DeviceBuffer::<u32>::new(&d, 1000).unwrap();
    assert_eq!(b.len(), 1000);
    assert!(!b.is_empty());
    assert_eq!(b.device(), d);
    assert!(!b.as_raw_ptr().is_null());
    assert!(format!("{b:?}").contains("DeviceBuffer"));
    let data = iota(1000, 5);
    b.copy_from_slice(&data).unwrap();
    assert_eq!(b.to_vec().unwrap(), data);
    let mut out = vec![0u32; 1000];
    b.copy_to_slice(&mut out).unwrap();
    assert_eq!(out, data);

    let e = b.copy_from_slice(&data[1..]).unwrap_err();
    assert_invalid(&e, "DeviceBuffer::copy_from_slice");
    let e = b.copy_to_slice(&mut out[..999]).unwrap_err();
    assert_invalid(&e, "DeviceBuffer::copy_to_slice");
    let mut longer = vec![0u32; 1001];
    assert_invalid(&b.copy_to_slice(&mut longer).unwrap_err(), "DeviceBuffer::copy_to_slice");

    let z = DeviceBuffer::<f64>::zeroed(&d, 777).unwrap();
    assert_eq!(z.to_vec().unwrap(), vec![0.0; 777]);

    // Empty buffers: no allocation, every operation works.
    let mut empty = DeviceBuffer::<u64>::zeroed(&d, 0).unwrap();
    assert!(empty.is_empty());
    assert!(empty.as_raw_ptr().is_null());
    empty.copy_from_slice(&[]).unwrap();
    assert_eq!(empty.to_vec().unwrap(), Vec::<u64>::new());
    let s = Stream::new(&d).unwrap();
    let mut p0 = PinnedBuffer::<u64>::new(0).unwrap();
    s.copy_to_device(&p0, &mut empty).unwrap().wait().unwrap();
    s.copy_to_host(&empty, &mut p0).unwrap().wait().unwrap();
    s.memset(&mut empty, 1).unwrap().wait().unwrap();

    // Arrays of Pod are Pod.
    let mut arr = DeviceBuffer::<[u16; 3]>::new(&d, 4).unwrap();
    arr.copy_from_slice(&[[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]).unwrap();
    assert_eq!(arr.to_vec().unwrap()[3], [10, 11, 12]);

    // Sizes: overflow is refused before CUDA; too much memory is CUDA's out-of-memory.
    let e = DeviceBuffer::<u64>::new(&d, usize::MAX).unwrap_err();
    assert_invalid(&e, "DeviceBuffer::new");
    let e = DeviceBuffer::<u8>::new(&d, 1 << 50).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cudaMalloc", Some(2)), "{e}");
    drop((b, z, empty, arr, s, p0));
    t.assert_clean();
}

#[test]
fn device_slices_and_ranges() {
    use std::ops::Bound;
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let data = iota(100, 11);
    let mut b = DeviceBuffer::<u32>::new(&d, 100).unwrap();
    b.copy_from_slice(&data).unwrap();
    let read = |b: &DeviceBuffer<u32>, r: std::ops::Range<usize>| {
        let sl = b.slice(r.clone()).unwrap();
        let mut out = PinnedBuffer::<u32>::new(r.len()).unwrap();
        s.copy_to_host(&sl, &mut out).unwrap().wait().unwrap();
        out.as_slice().unwrap().to_vec()
    };
    assert_eq!(read(&b, 10..20), &data[10..20]);
    assert_eq!(read(&b, 0..100), data);
    assert_eq!(read(&b, 100..100), Vec::<u32>::new());
    // Every RangeBounds form.
    let len = |r: Result<wirespeed_cuda::DeviceSlice<'_, u32>, Error>| {
        let sl = r.unwrap();
        let mut out = PinnedBuffer::<u32>::new(0).unwrap();
        // A length mismatch names the operation.
        match s.copy_to_host(&sl, &mut out) {
            Ok(p) => {
                p.wait().unwrap();
                0
            }
            Err(e) => {
                assert_invalid(&e, "Stream::copy_to_host");
                assert!(e.to_string().contains("destination 0"), "{e}");
                1
            }
        }
    };
    assert_eq!(len(b.slice(..)), 1);
    assert_eq!(len(b.slice(5..)), 1);
    assert_eq!(len(b.slice(..=0)), 1);
    assert_eq!(len(b.slice(3..3)), 0);
    assert_eq!(len(b.slice((Bound::Excluded(4), Bound::Included(4)))), 0);
    for e in [
        err(b.slice(std::ops::Range { start: 5, end: 3 })), // reversed
        err(b.slice(0..101)),
        err(b.slice(..=100)),
        err(b.slice(101..)),
        err(b.slice((Bound::Excluded(usize::MAX), Bound::Unbounded))),
    ] {
        assert_invalid(&e, "DeviceBuffer::slice");
        assert!(e.to_string().contains("out of bounds for length 100"), "{e}");
    }
    assert_invalid(&err(b.slice_mut(50..200)), "DeviceBuffer::slice_mut");

    // Writes through a mutable slice touch only that range.
    s.memset(&mut b.slice_mut(10..20).unwrap(), 0).unwrap().wait().unwrap();
    let src = PinnedBuffer::from_slice(&[7u32; 5]).unwrap();
    s.copy_to_device(&src, &mut b.slice_mut(95..).unwrap()).unwrap().wait().unwrap();
    let part = src.slice(1..3).unwrap();
    assert_eq!(part.len(), 2);
    assert!(!part.is_empty());
    assert!(src.slice(2..2).unwrap().is_empty());
    s.copy_to_device(&part, &mut b.slice_mut(0..2).unwrap()).unwrap().wait().unwrap();
    let mut want = data.clone();
    want[10..20].fill(0);
    want[95..].fill(7);
    want[0..2].fill(7);
    assert_eq!(b.to_vec().unwrap(), want);

    // A mutable slice is also a source (device to device, device to host).
    let mut other = DeviceBuffer::<u32>::zeroed(&d, 10).unwrap();
    {
        let ms = b.slice_mut(10..20).unwrap();
        s.copy_device_to_device(&ms, &mut other).unwrap().wait().unwrap();
        let mut host = PinnedBuffer::<u32>::new(10).unwrap();
        let mut hs = host.slice_mut(..).unwrap();
        s.copy_to_host(&ms, &mut hs).unwrap().wait().unwrap();
        assert_eq!(host.as_slice().unwrap(), [0; 10]);
    }
    assert_eq!(other.to_vec().unwrap(), [0; 10]);
    // Mismatched lengths between slices.
    let e = s.copy_device_to_device(&b.slice(0..5).unwrap(), &mut other).unwrap_err();
    assert_invalid(&e, "Stream::copy_device_to_device");
    let e = s.copy_to_device(&src, &mut other).unwrap_err();
    assert_invalid(&e, "Stream::copy_to_device");
    assert!(e.to_string().contains("source has 5 values, destination 10"), "{e}");
    drop((b, other, src, s));
    t.assert_clean();
}

// ------------------------------------------------------------------ copies

#[test]
fn copies_h2d_d2d_d2h_memset() {
    let t = start();
    slow(&t);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 16;
    let bytes = pattern(42, n);
    let src = PinnedBuffer::from_slice(&bytes).unwrap();
    let mut a = DeviceBuffer::<u8>::new(&d, n).unwrap();
    let mut b = DeviceBuffer::<u8>::new(&d, n).unwrap();
    let mut back = PinnedBuffer::<u8>::new(n).unwrap();
    s.copy_to_device(&src, &mut a).unwrap().detach();
    s.copy_device_to_device(&a, &mut b).unwrap().detach();
    s.memset(&mut a.slice_mut(0..n / 2).unwrap(), 0xEE).unwrap().detach();
    s.copy_to_host(&b, &mut back).unwrap().wait().unwrap();
    assert_eq!(back.as_slice().unwrap(), bytes);
    let got = a.to_vec().unwrap();
    assert!(got[..n / 2].iter().all(|&x| x == 0xEE));
    assert_eq!(&got[n / 2..], &bytes[n / 2..]);
    // Typed copies: f32 through u32-sized elements.
    let fl: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let fsrc = PinnedBuffer::from_slice(&fl).unwrap();
    let mut fdev = DeviceBuffer::<f32>::new(&d, 1000).unwrap();
    let mut fback = PinnedBuffer::<f32>::new(1000).unwrap();
    s.copy_to_device(&fsrc, &mut fdev).unwrap().detach();
    s.copy_to_host(&fdev, &mut fback).unwrap().wait().unwrap();
    assert_eq!(fback.as_slice().unwrap(), fl);
    // memset of a multi-byte type sets bytes.
    s.memset(&mut fdev, 0).unwrap().wait().unwrap();
    assert_eq!(fdev.to_vec().unwrap(), vec![0.0f32; 1000]);
    drop((s, src, a, b, back, fsrc, fdev, fback));
    t.assert_clean();
}

/// The pipeline of the crate docs, checked: allocate, fill, copy H2D async,
/// more work on the stream, copy D2H, read, reuse two slots in a loop, with no
/// `unsafe` (the module forbids it).
#[forbid(unsafe_code)]
mod pipeline {
    use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Result, Stream};

    pub fn upload(dev: &Device, chunk: usize, chunks: usize) -> Result<Vec<u32>> {
        let stream = Stream::new(dev)?;
        let mut slots = [PinnedBuffer::<u32>::new(chunk)?, PinnedBuffer::<u32>::new(chunk)?];
        let mut on_gpu = DeviceBuffer::<u32>::zeroed(dev, chunks * chunk)?;
        for i in 0..chunks {
            let slot = &mut slots[i % 2];
            // Waits only if this slot's previous copy still runs.
            for (j, v) in slot.as_mut_slice()?.iter_mut().enumerate() {
                *v = (i * chunk + j) as u32;
            }
            let mut dst = on_gpu.slice_mut(i * chunk..(i + 1) * chunk)?;
            stream.copy_to_device(slot, &mut dst)?.detach();
        }
        // More work on the stream: a device copy, then a memset of its first chunk.
        let mut work = DeviceBuffer::<u32>::new(dev, chunks * chunk)?;
        stream.copy_device_to_device(&on_gpu, &mut work)?.detach();
        stream.memset(&mut work.slice_mut(0..chunk)?, 0xFF)?.detach();
        let mut back = PinnedBuffer::<u32>::new(chunks * chunk)?;
        stream.copy_to_host(&work, &mut back)?.wait()?;
        Ok(back.as_slice()?.to_vec())
    }

    /// Double-buffered download on two streams: slot k receives chunk i while
    /// the host reads chunk i - 1 from the other slot.
    pub fn download(dev: &Device, data: &[u32], chunk: usize) -> Result<Vec<u32>> {
        let streams = [Stream::new(dev)?, Stream::new(dev)?];
        let mut on_gpu = DeviceBuffer::<u32>::new(dev, data.len())?;
        on_gpu.copy_from_slice(data)?;
        let mut slots = [PinnedBuffer::<u32>::new(chunk)?, PinnedBuffer::<u32>::new(chunk)?];
        let mut out = Vec::with_capacity(data.len());
        let chunks = data.len() / chunk;
        for i in 0..=chunks {
            if i < chunks {
                let k = i % 2;
                let src = on_gpu.slice(i * chunk..(i + 1) * chunk)?;
                streams[k].copy_to_host(&src, &mut slots[k])?.detach();
            }
            if i > 0 {
                // as_slice waits for the copy into that slot only.
                out.extend_from_slice(slots[(i - 1) % 2].as_slice()?);
            }
        }
        Ok(out)
    }
}

#[test]
fn double_buffering_loop_without_unsafe() {
    let t = start();
    slow(&t);
    let d = dev();
    let (chunk, chunks) = (4096, 8);
    let got = pipeline::upload(&d, chunk, chunks).unwrap();
    let mut want: Vec<u32> = (0..(chunk * chunks) as u32).collect();
    want[..chunk].fill(u32::MAX);
    assert_eq!(got, want);
    let data = iota(chunk * chunks, 77);
    assert_eq!(pipeline::download(&d, &data, chunk).unwrap(), data);
    t.assert_clean();
}

// ------------------------------------------------------------------ fences across streams

#[test]
fn cross_stream_ordering_without_manual_sync() {
    let t = start();
    slow(&t);
    let d = dev();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let n = 1 << 16;
    let src = PinnedBuffer::from_slice(&iota(n, 21)).unwrap();
    let mut buf = DeviceBuffer::<u32>::zeroed(&d, n).unwrap();
    let mut back = PinnedBuffer::<u32>::new(n).unwrap();

    // Read after write: A writes, B reads.
    a.copy_to_device(&src, &mut buf).unwrap().detach();
    b.copy_to_host(&buf, &mut back).unwrap().wait().unwrap();
    assert_eq!(back.as_slice().unwrap(), iota(n, 21));

    // Write after read: A reads (slowly), B overwrites: A must see the old data.
    let mut back2 = PinnedBuffer::<u32>::new(n).unwrap();
    a.copy_to_host(&buf, &mut back2).unwrap().detach();
    b.memset(&mut buf, 0).unwrap().detach();
    assert_eq!(back2.as_slice().unwrap(), iota(n, 21));
    assert_eq!(buf.to_vec().unwrap(), vec![0; n]);

    // Write after write: A writes, B writes: B's bytes are the final ones.
    a.copy_to_device(&src, &mut buf).unwrap().detach();
    b.memset(&mut buf, 0xAB).unwrap().detach();
    assert!(buf.to_vec().unwrap().iter().all(|&v| v == 0xABAB_ABAB));

    // Pinned source reused on another stream while a read of it is in flight.
    a.copy_to_device(&src, &mut buf).unwrap().detach();
    let mut buf2 = DeviceBuffer::<u32>::new(&d, n).unwrap();
    b.copy_to_device(&src, &mut buf2).unwrap().detach();
    // Three streams: C reads what A and B wrote.
    let c = Stream::new(&d).unwrap();
    let mut joined = DeviceBuffer::<u32>::new(&d, 2 * n).unwrap();
    c.copy_device_to_device(&buf, &mut joined.slice_mut(0..n).unwrap()).unwrap().detach();
    c.copy_device_to_device(&buf2, &mut joined.slice_mut(n..).unwrap()).unwrap().detach();
    let v = joined.to_vec().unwrap();
    assert_eq!(&v[..n], iota(n, 21));
    assert_eq!(&v[n..], iota(n, 21));
    drop((a, b, c, src, buf, buf2, back, back2, joined));
    t.assert_clean();
}

// `Pending` has no `Drop` (by design: nothing may depend on one running), so
// forgetting it is the same as dropping it. The test forgets anyway: it is the
// caller's move that the safety model must survive, whatever `Pending` becomes.
#[allow(clippy::forget_non_drop)]
#[test]
fn forgotten_pending_still_fenced() {
    let t = start();
    t.set_delay_us(50_000);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 16;
    let src = PinnedBuffer::from_slice(&iota(n, 33)).unwrap();
    let mut buf = DeviceBuffer::<u32>::zeroed(&d, n).unwrap();

    // Forget the guard of a write into the device buffer, then read it.
    std::mem::forget(s.copy_to_device(&src, &mut buf).unwrap());
    assert_eq!(buf.to_vec().unwrap(), iota(n, 33));

    // Forget the guard of a write into pinned memory, then read it.
    let mut back = PinnedBuffer::<u32>::new(n).unwrap();
    std::mem::forget(s.copy_to_host(&buf, &mut back).unwrap());
    assert_eq!(back.as_slice().unwrap(), iota(n, 33));

    // Forget, then mutate the pinned source: the mutation waits for the copy.
    let mut src2 = PinnedBuffer::from_slice(&iota(n, 34)).unwrap();
    std::mem::forget(s.copy_to_device(&src2, &mut buf).unwrap());
    src2.as_mut_slice().unwrap().fill(0);
    assert_eq!(buf.to_vec().unwrap(), iota(n, 34));

    // Forget, then drop both ends of copies still in flight: Drop waits.
    let mut doomed = DeviceBuffer::<u32>::new(&d, n).unwrap();
    std::mem::forget(s.copy_to_device(&src, &mut doomed).unwrap());
    drop(doomed);
    let mut doomed_host = PinnedBuffer::<u32>::new(n).unwrap();
    std::mem::forget(s.copy_to_host(&buf, &mut doomed_host).unwrap());
    drop(doomed_host);
    let doomed_src = PinnedBuffer::from_slice(&iota(n, 35)).unwrap();
    std::mem::forget(s.copy_to_device(&doomed_src, &mut buf).unwrap());
    drop(doomed_src);
    assert_eq!(buf.to_vec().unwrap(), iota(n, 35));

    // A registration whose copy guard was forgotten: into_inner waits, then unregisters.
    let reg = HostRegistration::new(pattern(5, 4 * n).into_boxed_slice(), RegisterFlags::default()).unwrap();
    let mut bytes = DeviceBuffer::<u8>::new(&d, 4 * n).unwrap();
    std::mem::forget(s.copy_to_device(&reg, &mut bytes).unwrap());
    let mem = reg.into_inner().unwrap();
    assert_eq!(bytes.to_vec().unwrap(), &*mem);

    // A forgotten Pending only borrowed the stream: forgetting it leaks
    // nothing, and the stream goes with its last handle.
    drop((s, src, src2, buf, back, bytes, mem));
    t.assert_clean();
}

#[test]
fn freeing_waits_for_stream_use() {
    let t = start();
    t.set_delay_us(50_000);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 18;
    let src = PinnedBuffer::from_slice(&pattern(8, n)).unwrap();
    for _ in 0..3 {
        // Drop a device buffer while a detached copy still writes it, and a
        // pinned buffer while a detached copy still reads it.
        let mut dst = DeviceBuffer::<u8>::new(&d, n).unwrap();
        let before = t.counters().map(|c| c.bytes_copied);
        s.copy_to_device(&src, &mut dst).unwrap().detach();
        drop(dst);
        if let (Some(b), Some(c)) = (before, t.counters()) {
            assert!(c.bytes_copied >= b + n as u64, "the copy ran before the free returned");
        }
        let tmp = PinnedBuffer::from_slice(&pattern(9, n)).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&d, n).unwrap();
        s.copy_to_device(&tmp, &mut dst).unwrap().detach();
        drop(tmp);
        assert_eq!(dst.to_vec().unwrap(), pattern(9, n));
    }
    drop((s, src));
    t.assert_clean();
}

// ------------------------------------------------------------------ pinned memory

#[test]
fn pinned_buffers_and_flags() {
    let t = start();
    let d = dev();
    let mut p = PinnedBuffer::<u32>::new(100).unwrap();
    assert_eq!(p.len(), 100);
    assert!(!p.is_empty());
    assert_eq!(p.flags(), PinnedFlags::default());
    assert!(format!("{p:?}").contains("PinnedBuffer"));
    assert_eq!(p.as_slice().unwrap(), [0; 100], "zero-initialized");
    p.as_mut_slice().unwrap().copy_from_slice(&iota(100, 1));
    assert_eq!(p.as_slice().unwrap(), iota(100, 1));
    let q = PinnedBuffer::from_slice(&[1.5f64, 2.5]).unwrap();
    assert_eq!(q.as_slice().unwrap(), [1.5, 2.5]);
    let e = PinnedBuffer::<u8>::new(0).unwrap();
    assert!(e.is_empty());
    assert_eq!(e.as_slice().unwrap(), &[] as &[u8]);
    let e2 = PinnedBuffer::<u64>::new(usize::MAX).unwrap_err();
    assert_invalid(&e2, "PinnedBuffer::new");

    // Slices and their ranges.
    assert_eq!(p.slice(10..20).unwrap().len(), 10);
    assert_invalid(&err(p.slice(10..200)), "PinnedBuffer::slice");
    assert_invalid(&err(p.slice_mut(101..)), "PinnedBuffer::slice_mut");
    let s = Stream::new(&d).unwrap();
    let mut on_gpu = DeviceBuffer::<u32>::zeroed(&d, 100).unwrap();
    {
        let part = p.slice(50..60).unwrap();
        s.copy_to_device(&part, &mut on_gpu.slice_mut(0..10).unwrap()).unwrap().wait().unwrap();
    }
    {
        let mut part = p.slice_mut(0..10).unwrap();
        s.copy_to_host(&on_gpu.slice(90..100).unwrap(), &mut part).unwrap().wait().unwrap();
    }
    let mut want = iota(100, 1);
    want[0..10].fill(0);
    assert_eq!(p.as_slice().unwrap(), want);
    assert_eq!(&on_gpu.to_vec().unwrap()[0..10], &iota(100, 1)[50..60]);

    // Flags, as the runtime reports them (a GPU may add implied flags).
    for flags in [
        PinnedFlags::new().portable(true),
        PinnedFlags::new().mapped(true),
        PinnedFlags::new().write_combined(true),
        PinnedFlags::new().portable(true).mapped(true),
    ] {
        let b = PinnedBuffer::<u8>::with_flags(8192, flags).unwrap();
        assert_eq!(b.flags(), flags);
        let mut bits = 0;
        if flags.portable {
            bits |= wirespeed_cuda_sys::cudaHostAllocPortable;
        }
        if flags.mapped {
            bits |= wirespeed_cuda_sys::cudaHostAllocMapped;
        }
        if flags.write_combined {
            bits |= wirespeed_cuda_sys::cudaHostAllocWriteCombined;
        }
        // The emulator reports the flags asked for; the H200's driver reports
        // only cudaHostAllocMapped (0x2), implied under unified addressing.
        let got = host_flags(b.as_ptr().cast()).unwrap();
        if t.emulated() {
            assert_eq!(got, bits, "{flags:?}");
        } else {
            assert_ne!(got & wirespeed_cuda_sys::cudaHostAllocMapped, 0, "{flags:?}: {got:#x}");
        }
        assert!(pointer_kind(b.as_ptr().cast()).unwrap().is_pinned_host());
        if flags.mapped {
            let dp = host_device_pointer(b.as_ptr().cast()).unwrap();
            assert!(!dp.is_null());
        }
        // Write-combined memory still works for copies (and host writes).
        let mut b = b;
        b.as_mut_slice().unwrap().fill(3);
        let mut g = DeviceBuffer::<u8>::new(&d, 8192).unwrap();
        s.copy_to_device(&b, &mut g).unwrap().wait().unwrap();
        assert!(g.to_vec().unwrap().iter().all(|&x| x == 3));
    }
    drop((p, q, e, s, on_gpu));
    t.assert_clean();
}

#[test]
fn pointer_queries() {
    let t = start();
    let d = dev();
    let g = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
    assert_eq!(
        pointer_kind(g.as_raw_ptr().cast()).unwrap(),
        PointerKind { memory: cudaMemoryType::cudaMemoryTypeDevice, device: Some(0) }
    );
    assert!(pointer_kind(g.as_raw_ptr().wrapping_add(100).cast()).unwrap().is_device());
    let p = PinnedBuffer::<u8>::new(4096).unwrap();
    assert!(pointer_kind(p.as_ptr().cast()).unwrap().is_pinned_host());
    assert!(host_flags(p.as_ptr().cast()).is_ok());
    let pageable = vec![0u8; 4096];
    let pp: *const c_void = pageable.as_ptr().cast();
    if t.emulated() {
        assert_eq!(pointer_kind(pp).unwrap().memory, cudaMemoryType::cudaMemoryTypeUnregistered);
    } else {
        let _ = pointer_kind(pp); // unregistered (or managed, under HMM): not asserted on a GPU
    }
    let e = host_flags(pp).unwrap_err();
    assert_eq!(e.call(), "cudaHostGetFlags");
    let e = host_device_pointer(pp).unwrap_err();
    assert_eq!(e.call(), "cudaHostGetDevicePointer");
    if t.emulated() {
        assert_eq!(host_flags(pp).unwrap_err().code(), Some(1));
        assert_eq!(host_device_pointer(pp).unwrap_err().code(), Some(1));
    }
    // Registered memory is host memory too.
    let reg = HostRegistration::new(vec![1u8; 1 << 16].into_boxed_slice(), RegisterFlags::new().mapped(true)).unwrap();
    let rp: *const c_void = reg.as_bytes().as_ptr().cast();
    assert!(pointer_kind(rp).unwrap().is_pinned_host());
    assert_eq!(
        host_flags(rp).unwrap() & wirespeed_cuda_sys::cudaHostRegisterMapped,
        wirespeed_cuda_sys::cudaHostRegisterMapped
    );
    assert!(!host_device_pointer(rp).unwrap().is_null());
    drop((g, p, reg));
    // CUDA keeps an error of a failed call as the thread's last error; clear it.
    // SAFETY: no arguments.
    unsafe { (api().cudaGetLastError)() };
    t.assert_clean();
}

// ------------------------------------------------------------------ registered memory

/// A view of bytes that the test keeps alive (and unwritten) until every
/// registration of them is gone: the same bytes can be offered twice.
struct Borrowed {
    ptr: *const u8,
    len: usize,
}
// SAFETY: only a pointer to bytes nobody writes while the view lives.
unsafe impl Send for Borrowed {}
// SAFETY: as above.
unsafe impl Sync for Borrowed {}
impl Borrowed {
    fn of(bytes: &[u8]) -> Borrowed {
        Borrowed { ptr: bytes.as_ptr(), len: bytes.len() }
    }
}
// SAFETY: each test using it keeps the viewed bytes alive, in place and
// unwritten until every registration of them was dropped.
unsafe impl HostMemory for Borrowed {
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[test]
fn host_registration() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 20;
    let data = pattern(77, n);
    let reg = HostRegistration::new(data.clone().into_boxed_slice(), RegisterFlags::default()).unwrap();
    assert_eq!(reg.len(), n);
    assert!(!reg.is_empty());
    assert_eq!(reg.flags(), RegisterFlags::default());
    assert_eq!(reg.as_bytes(), &data[..]);
    assert_eq!(&**reg.memory(), &data[..]);
    assert!(format!("{reg:?}").contains("HostRegistration"));
    let mut on_gpu = DeviceBuffer::<u8>::zeroed(&d, n).unwrap();
    s.copy_to_device(&reg, &mut on_gpu).unwrap().wait().unwrap();
    assert_eq!(on_gpu.to_vec().unwrap(), data);
    // A slice of the registration.
    let part = reg.slice(1000..2000).unwrap();
    assert_eq!(part.len(), 1000);
    s.copy_to_device(&part, &mut on_gpu.slice_mut(0..1000).unwrap()).unwrap().wait().unwrap();
    assert_eq!(&on_gpu.to_vec().unwrap()[..1000], &data[1000..2000]);
    assert_invalid(&err(reg.slice(0..n + 1)), "HostRegistration::slice");
    // Copies detached, then into_inner waits for them.
    slow(&t);
    s.copy_to_device(&reg, &mut on_gpu).unwrap().detach();
    let back = reg.into_inner().unwrap();
    assert_eq!(&*back, &data[..]);
    // Memory taken back can be registered again, with other flags.
    for flags in
        [RegisterFlags::new().portable(true), RegisterFlags::new().mapped(true), RegisterFlags::new().read_only(true)]
    {
        let reg = HostRegistration::new(back.clone(), flags).unwrap();
        assert_eq!(reg.flags(), flags);
        let got = host_flags(reg.as_bytes().as_ptr().cast()).unwrap();
        if t.emulated() {
            assert_eq!(got, flags.bits(), "{flags:?}");
        } else {
            // As for pinned memory: the H200's driver reports cudaHostRegisterMapped (0x2) only.
            assert_ne!(got & wirespeed_cuda_sys::cudaHostRegisterMapped, 0, "{flags:?}: {got:#x}");
        }
        s.copy_to_device(&reg, &mut on_gpu).unwrap().wait().unwrap();
        drop(reg);
    }
    // Empty memory is refused before CUDA, and handed back by try_new.
    let e = HostRegistration::new(Box::<[u8]>::default(), RegisterFlags::default()).unwrap_err();
    assert_invalid(&e, "HostRegistration::new");
    let (e, mem) = HostRegistration::try_new(Box::<[u8]>::default(), RegisterFlags::default()).unwrap_err();
    assert_invalid(&e, "HostRegistration::new");
    assert!(mem.is_empty());
    drop((s, on_gpu, back));
    t.assert_clean();
}

#[test]
fn registering_the_same_pages_twice_is_refused() {
    let t = start();
    let d = dev();
    // `mem` outlives every registration below (declared first, dropped last).
    let mem = pattern(3, 1 << 16);
    let first = HostRegistration::new(Borrowed::of(&mem), RegisterFlags::default()).unwrap();
    for again in [Borrowed::of(&mem), Borrowed::of(&mem[100..200]), Borrowed::of(&mem[(1 << 16) - 1..])] {
        // Refused before CUDA (which would answer 712), naming the pages.
        let (e, back) = HostRegistration::try_new(again, RegisterFlags::default()).unwrap_err();
        assert_invalid(&e, "HostRegistration::new");
        assert!(e.to_string().contains("share the page"), "{e}");
        assert!(std::ptr::eq(back.ptr, back.as_ptr()), "try_new hands the memory back");
    }
    let e = HostRegistration::new(Borrowed::of(&mem), RegisterFlags::default()).unwrap_err();
    assert_invalid(&e, "HostRegistration::new");
    // The first registration still works, and unregisters cleanly.
    let s = Stream::new(&d).unwrap();
    let mut g = DeviceBuffer::<u8>::new(&d, mem.len()).unwrap();
    s.copy_to_device(&first, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), mem);
    let m = first.into_inner().unwrap();
    // Once unregistered, the pages can be registered again.
    let again = HostRegistration::new(m, RegisterFlags::default()).unwrap();
    drop((again, s, g));
    drop(mem);
    t.assert_clean();
}

/// Two heap buffers that share a page (as small allocations do): CUDA
/// registers whole pages, so the second registration would fail with 712. It
/// is refused with a typed error naming the shared page and the remedy; the
/// first keeps working, and page-aligned buffers register side by side.
#[test]
fn heap_buffers_sharing_a_page() {
    let t = start();
    let d = dev();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let heap = vec![0u8; 4 * page];
    let base = heap.as_ptr().align_offset(page); // the first page boundary in `heap`
    let (a, b) = (&heap[base..base + page + 100], &heap[base + page + 100..base + 2 * page]);
    let first = HostRegistration::new(Borrowed::of(a), RegisterFlags::default()).unwrap();
    let (e, _) = HostRegistration::try_new(Borrowed::of(b), RegisterFlags::default()).unwrap_err();
    assert_invalid(&e, "HostRegistration::new");
    let msg = e.to_string();
    let shared = format!("{:#x}", (b.as_ptr() as usize) & !(page - 1));
    assert!(msg.contains(&shared), "the shared page {shared} is named: {msg}");
    assert!(msg.contains("page-align") && msg.contains("covers both"), "the remedy is given: {msg}");
    // In a registration context too (CUDA refuses pages registered in any context).
    if let Ok(ctx) = wirespeed_cuda::RegistrationContext::new(&d) {
        let ctx = Arc::new(ctx);
        let e = HostRegistration::new_in(&ctx, Borrowed::of(b), RegisterFlags::default()).unwrap_err();
        assert_invalid(&e, "HostRegistration::new_in");
    }
    // The first registration still copies.
    let s = Stream::new(&d).unwrap();
    let mut g = DeviceBuffer::<u8>::new(&d, a.len()).unwrap();
    s.copy_to_device(&first, &mut g).unwrap().wait().unwrap();
    drop(first);
    // Once it is gone, the other buffer registers.
    drop(HostRegistration::new(Borrowed::of(b), RegisterFlags::default()).unwrap());
    // Page-aligned neighbours register side by side.
    let (x, y) = (&heap[base..base + page], &heap[base + page..base + 2 * page]);
    let rx = HostRegistration::new(Borrowed::of(x), RegisterFlags::default()).unwrap();
    let ry = HostRegistration::new(Borrowed::of(y), RegisterFlags::default()).unwrap();
    drop((rx, ry, s, g));
    drop(heap);
    t.assert_clean();
}

/// Read-only pages (`PROT_READ`) need the `read_only` flag, as on the H200.
struct ReadOnlyPages {
    ptr: *mut c_void,
    len: usize,
}
// SAFETY: the mapping is owned by the value and only read.
unsafe impl Send for ReadOnlyPages {}
// SAFETY: as above.
unsafe impl Sync for ReadOnlyPages {}
impl ReadOnlyPages {
    fn new(data: &[u8]) -> ReadOnlyPages {
        let len = data.len();
        // SAFETY: a fresh private anonymous mapping; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` writable bytes, disjoint from `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.cast::<u8>(), len) };
        // SAFETY: our own mapping.
        assert_eq!(unsafe { libc::mprotect(ptr, len, libc::PROT_READ) }, 0);
        ReadOnlyPages { ptr, len }
    }
}
// SAFETY: the mapping stays mapped at the same address until Drop, and is read-only.
unsafe impl HostMemory for ReadOnlyPages {
    fn as_ptr(&self) -> *const u8 {
        self.ptr.cast()
    }
    fn len(&self) -> usize {
        self.len
    }
}
impl Drop for ReadOnlyPages {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

#[test]
fn read_only_pages_need_the_read_only_flag() {
    let t = start();
    let d = dev();
    if !d.supports_read_only_register().unwrap() {
        eprintln!("note: the device does not support read-only registration; skipped");
        return;
    }
    let data = pattern(12, 1 << 16);
    let (e, pages) = HostRegistration::try_new(ReadOnlyPages::new(&data), RegisterFlags::default()).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cudaHostRegister", Some(1)), "{e}");
    assert!(e.to_string().contains("ReadOnly"), "{e}");
    let reg = HostRegistration::new(pages, RegisterFlags::new().read_only(true)).unwrap();
    let s = Stream::new(&d).unwrap();
    let mut g = DeviceBuffer::<u8>::new(&d, data.len()).unwrap();
    s.copy_to_device(&reg, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), data);
    drop((reg, s, g));
    // SAFETY: no arguments (clears the failed registration's last error).
    unsafe { (api().cudaGetLastError)() };
    t.assert_clean();
}

// ------------------------------------------------------------------ Pod

#[test]
fn pod_types() {
    fn is_pod<T: Pod>() {}
    is_pod::<u8>();
    is_pod::<i128>();
    is_pod::<f32>();
    is_pod::<usize>();
    is_pod::<[u64; 4]>();
    is_pod::<[[u8; 2]; 3]>();
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Rgba {
        r: u8,
        g: u8,
        b: u8,
        a: u8,
    }
    // SAFETY: four bytes, no padding, every bit pattern valid.
    unsafe impl Pod for Rgba {}
    let t = start();
    let d = dev();
    let mut b = DeviceBuffer::<Rgba>::new(&d, 3).unwrap();
    b.copy_from_slice(&[Rgba { r: 1, g: 2, b: 3, a: 4 }; 3]).unwrap();
    let v = b.to_vec().unwrap();
    assert_eq!((v[2].r, v[2].g, v[2].b, v[2].a), (1, 2, 3, 4));
    drop(b);
    t.assert_clean();
}

/// On a GPU `cudaMemset` returns before the device has finished (measured on
/// the H200: 5 µs for 1 GiB), on the legacy stream, which non-blocking streams
/// do not wait for; a pageable `cudaMemcpy` may return once its bytes are
/// staged. `zeroed` and `copy_from_slice` must be complete for work on any
/// stream when they return: a late memset would overwrite what a stream copied
/// in after it. (The emulator completes both before returning.)
#[test]
fn synchronous_calls_are_complete_for_other_streams() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let n: usize = if t.emulated() { 16 << 20 } else { 1 << 30 };
    let k = 1 << 16;
    let ab = PinnedBuffer::from_slice(&vec![0xABu8; k]).unwrap();
    let mut tail = PinnedBuffer::<u8>::new(k).unwrap();
    for round in 0..4 {
        let mut z = DeviceBuffer::<u8>::zeroed(&d, n).unwrap();
        s.copy_to_device(&ab, &mut z.slice_mut(n - k..).unwrap()).unwrap().wait().unwrap();
        // Let every stream of the device finish (a late memset included), then look.
        d.synchronize().unwrap();
        s.copy_to_host(&z.slice(n - k..).unwrap(), &mut tail).unwrap().wait().unwrap();
        let bad = tail.as_slice().unwrap().iter().filter(|&&b| b != 0xAB).count();
        assert_eq!(bad, 0, "round {round}: the memset of zeroed() ran after a later copy");
        s.copy_to_host(&z.slice(0..k).unwrap(), &mut tail).unwrap().wait().unwrap();
        assert!(tail.as_slice().unwrap().iter().all(|&b| b == 0), "round {round}");
    }
    for len in [4096, 65536, 64 << 20] {
        let data = pattern(len as u64, len);
        for round in 0..4 {
            let mut b = DeviceBuffer::<u8>::new(&d, len).unwrap();
            s.memset(&mut b, 0).unwrap().wait().unwrap();
            b.copy_from_slice(&data).unwrap();
            let m = len.min(k);
            let mut back = PinnedBuffer::<u8>::new(m).unwrap();
            s.copy_to_host(&b.slice(len - m..).unwrap(), &mut back).unwrap().wait().unwrap();
            assert_eq!(
                back.as_slice().unwrap(),
                &data[len - m..],
                "{len} bytes, round {round}: copy_from_slice was not complete"
            );
        }
    }
    drop((s, ab, tail));
    t.assert_clean();
}
