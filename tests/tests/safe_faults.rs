//! Every CUDA call site of `cuda-safe` under an injected fault (emulator only,
//! also on a GPU machine): the method returns `Err` naming the function and the
//! injected code, nothing panics, and nothing is left behind. Sticky errors (a
//! lost context) are tested too, and the other error paths the emulator can
//! reach (no device, a second device).
//!
//! [`COVERED`] lists the functions with a fault test (one `#[test]` each, named
//! after the function); `call_sites_match_raw_rs` compares it with the
//! `check("cudaXxx"` call sites of `cuda-safe/src/raw.rs`, compiled in, so a new
//! call site without a fault test fails CI.

use std::sync::Arc;
use wirespeed_cuda::{
    Device, DeviceBuffer, Error, Event, EventOptions, HostRegistration, KernelArgs, LaunchConfig, Library,
    PinnedBuffer, PinnedFlags, RegisterFlags, Stream, StreamOptions, host_device_pointer, host_flags, pointer_kind,
    runtime_info,
};
use wirespeed_cuda_sys::{cudaError, cudaError_t, cudaMemoryType};
use wirespeed_tests::{Ctx, Pages, child_ran, is_child, pattern, run_child, start_emulated};

fn dev() -> Device {
    Device::get(0).expect("device 0")
}

fn api() -> &'static wirespeed_cuda_sys::Api {
    wirespeed_cuda_sys::runtime().expect("runtime").api()
}

/// Makes the next call of `function` fail with `code`.
#[track_caller]
fn inject(t: &Ctx, function: &str, code: u32) {
    assert!(t.emu().inject_fault(function, 1, code, false), "the emulator knows {function}");
}

/// Checks an injected fault surfaced as `Err(Error::Cuda)` of `call` with `code`.
#[track_caller]
fn expect_fault<T>(r: Result<T, Error>, call: &str, code: u32) -> Error {
    let e = match r {
        Ok(_) => panic!("expected {call} to fail with {code}"),
        Err(e) => e,
    };
    assert!(matches!(e, Error::Cuda { .. }), "{e:?}");
    assert_eq!(e.call(), call, "{e}");
    assert_eq!(e.code(), Some(code), "{e}");
    let name = wirespeed_cuda_sys::runtime().unwrap().error_name(cudaError_t(code));
    assert!(e.to_string().contains(&name), "{e}");
    e
}

/// Clears the thread's last error that the failed calls left (as CUDA does).
fn clear_last_error() {
    // SAFETY: no arguments.
    unsafe { (api().cudaGetLastError)() };
}

macro_rules! fault_tests {
    ($($name:ident => $body:expr;)*) => {
        /// The CUDA functions called by cuda-safe that have a fault test below.
        const COVERED: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            #[allow(non_snake_case)]
            fn $name() {
                let t = start_emulated();
                let body: fn(&Ctx) = $body;
                body(&t);
                clear_last_error();
                t.assert_clean();
            }
        )*
    };
}

fault_tests! {
    cudaGetDeviceCount => |t| {
        inject(t, "cudaGetDeviceCount", 35);
        let e = expect_fault(Device::count(), "cudaGetDeviceCount", 35);
        assert!(e.hint().unwrap().contains("driver"));
        inject(t, "cudaGetDeviceCount", 100);
        expect_fault(Device::all(), "cudaGetDeviceCount", 100);
        inject(t, "cudaGetDeviceCount", 999);
        expect_fault(Device::get(0), "cudaGetDeviceCount", 999);
        assert_eq!(Device::count().unwrap(), 1);
    };
    cudaDriverGetVersion => |t| {
        inject(t, "cudaDriverGetVersion", 999);
        expect_fault(runtime_info(), "cudaDriverGetVersion", 999);
        assert!(runtime_info().is_ok());
    };
    cudaSetDevice => |t| {
        let d = dev();
        inject(t, "cudaSetDevice", 101);
        expect_fault(d.make_current(), "cudaSetDevice", 101);
        inject(t, "cudaSetDevice", 101);
        expect_fault(d.mem_info(), "cudaSetDevice", 101);
        // Objects make their device current before they call CUDA only
        // where the runtime has another one current (here it has theirs):
        // they work on any thread without a cudaSetDevice.
        let s = Stream::new(&d).unwrap();
        let src = PinnedBuffer::<u8>::new(16).unwrap();
        let b = std::sync::Mutex::new(DeviceBuffer::<u8>::new(&d, 16).unwrap());
        std::thread::scope(|sc| {
            sc.spawn(|| {
                Event::new(&d, EventOptions::default()).unwrap();
                b.lock().unwrap().copy_from_slice(&[0; 16]).unwrap();
                s.synchronize().unwrap();
            });
        });
        let mut b = b.into_inner().unwrap();
        // Nothing was enqueued: the buffers are idle and usable.
        s.copy_to_device(&src, &mut b).unwrap().wait().unwrap();
        assert_eq!(b.to_vec().unwrap(), [0; 16]);
    };
    cudaDeviceGetAttribute => |t| {
        let d = dev();
        inject(t, "cudaDeviceGetAttribute", 1);
        expect_fault(d.attribute(wirespeed_cuda_sys::cudaDeviceAttr::cudaDevAttrMultiProcessorCount), "cudaDeviceGetAttribute", 1);
        inject(t, "cudaDeviceGetAttribute", 1);
        expect_fault(d.supports_host_register(), "cudaDeviceGetAttribute", 1);
        inject(t, "cudaDeviceGetAttribute", 1);
        expect_fault(d.supports_read_only_register(), "cudaDeviceGetAttribute", 1);
        inject(t, "cudaDeviceGetAttribute", 1);
        expect_fault(d.async_engine_count(), "cudaDeviceGetAttribute", 1);
        inject(t, "cudaDeviceGetAttribute", 1);
        expect_fault(d.unified_addressing(), "cudaDeviceGetAttribute", 1);
        assert!(d.unified_addressing().unwrap());
    };
    cudaGetDeviceProperties => |t| {
        inject(t, "cudaGetDeviceProperties", 101);
        expect_fault(dev().name(), "cudaGetDeviceProperties", 101);
        assert_eq!(dev().name().unwrap(), "Emulated CUDA Device");
    };
    cudaMemGetInfo => |t| {
        inject(t, "cudaMemGetInfo", 999);
        expect_fault(dev().mem_info(), "cudaMemGetInfo", 999);
    };
    cudaDeviceSynchronize => |t| {
        inject(t, "cudaDeviceSynchronize", 999);
        expect_fault(dev().synchronize(), "cudaDeviceSynchronize", 999);
        dev().synchronize().unwrap();
    };
    cudaDeviceGetStreamPriorityRange => |t| {
        inject(t, "cudaDeviceGetStreamPriorityRange", 999);
        expect_fault(dev().stream_priority_range(), "cudaDeviceGetStreamPriorityRange", 999);
    };
    cudaMalloc => |t| {
        let d = dev();
        inject(t, "cudaMalloc", 2);
        let e = expect_fault(DeviceBuffer::<u32>::new(&d, 1024), "cudaMalloc", 2);
        assert!(e.hint().unwrap().contains("out of memory"));
        inject(t, "cudaMalloc", 2);
        expect_fault(DeviceBuffer::<u32>::zeroed(&d, 1024), "cudaMalloc", 2);
        // An empty buffer does not call cudaMalloc.
        inject(t, "cudaMalloc", 2);
        drop(DeviceBuffer::<u32>::new(&d, 0).unwrap());
        t.emu().reset();
    };
    cudaFree => |t| {
        // Drop cannot report the error: the memory is leaked (still allocated).
        let b = DeviceBuffer::<u8>::new(&dev(), 4096).unwrap();
        let p = b.as_raw_ptr();
        let calls = t.emu().call_count("cudaFree").unwrap();
        inject(t, "cudaFree", 999);
        drop(b);
        assert_eq!(t.emu().call_count("cudaFree").unwrap(), calls + 1);
        assert_eq!(t.counters().unwrap().device_allocs, 1, "the failed free left the allocation");
        // SAFETY: the leaked allocation; nothing refers to it any more.
        assert_eq!(unsafe { (api().cudaFree)(p.cast()) }.0, 0);
    };
    cudaHostAlloc => |t| {
        inject(t, "cudaHostAlloc", 2);
        expect_fault(PinnedBuffer::<u8>::new(4096), "cudaHostAlloc", 2);
        inject(t, "cudaHostAlloc", 2);
        expect_fault(PinnedBuffer::<u8>::with_flags(4096, PinnedFlags::new().mapped(true)), "cudaHostAlloc", 2);
        inject(t, "cudaHostAlloc", 2);
        expect_fault(PinnedBuffer::from_slice(&[1u8, 2, 3]), "cudaHostAlloc", 2);
    };
    cudaFreeHost => |t| {
        let b = PinnedBuffer::<u8>::new(4096).unwrap();
        let p = b.as_ptr();
        inject(t, "cudaFreeHost", 999);
        drop(b);
        assert_eq!(t.counters().unwrap().pinned_allocs, 1, "the failed free left the allocation");
        // SAFETY: the leaked allocation; nothing refers to it any more.
        assert_eq!(unsafe { (api().cudaFreeHost)(p.cast_mut().cast()) }.0, 0);
    };
    cudaHostRegister => |t| {
        let data = pattern(1, 1 << 16);
        inject(t, "cudaHostRegister", 1);
        let (e, back) = HostRegistration::try_new(data.clone().into_boxed_slice(), RegisterFlags::default()).unwrap_err();
        assert_eq!((e.call(), e.code()), ("cudaHostRegister", Some(1)));
        assert_eq!(&*back, &data[..], "the memory is handed back");
        inject(t, "cudaHostRegister", 712);
        let e = expect_fault(HostRegistration::new(back, RegisterFlags::default()), "cudaHostRegister", 712);
        assert!(e.hint().is_some());
        // try_new clears the last error it caused.
        // SAFETY: no arguments.
        assert_eq!(unsafe { (api().cudaPeekAtLastError)() }.0, 0);
    };
    cudaGetDevice => |t| {
        // A registration without `portable` notes the current device first.
        let data = pattern(3, 1 << 16);
        inject(t, "cudaGetDevice", 101);
        let (e, back) = HostRegistration::try_new(data.clone().into_boxed_slice(), RegisterFlags::default()).unwrap_err();
        assert_eq!((e.call(), e.code()), ("cudaGetDevice", Some(101)));
        assert_eq!(&*back, &data[..], "the memory is handed back");
        assert_eq!(t.counters().unwrap().registrations, 0, "nothing was registered");
        clear_last_error();
        // A portable one does not ask.
        inject(t, "cudaGetDevice", 101);
        let portable = RegisterFlags::new().portable(true);
        drop(HostRegistration::new(back, portable).unwrap());
        t.emu().reset();
    };
    cudaHostUnregister => |t| {
        let data = pattern(2, 1 << 16);
        let reg = HostRegistration::new(Pages::new(&data), RegisterFlags::default()).unwrap();
        inject(t, "cudaHostUnregister", 713);
        // into_inner reports it; the registration is then dropped, and its Drop
        // unregisters (the fault was for one call) and frees the memory.
        expect_fault(reg.into_inner(), "cudaHostUnregister", 713);
        assert_eq!(t.counters().unwrap().registrations, 0);
        // Drop failing once tries again, and unregisters.
        let reg = HostRegistration::new(Pages::new(&data), RegisterFlags::default()).unwrap();
        inject(t, "cudaHostUnregister", 713);
        drop(reg);
        assert_eq!(t.counters().unwrap().registrations, 0);
        // Drop failing twice: the registration and its memory are leaked.
        let reg = HostRegistration::new(Pages::new(&data), RegisterFlags::default()).unwrap();
        let p = reg.as_bytes().as_ptr();
        inject(t, "cudaHostUnregister", 713);
        assert!(t.emu().inject_fault("cudaHostUnregister", 2, 713, false));
        drop(reg);
        assert_eq!(t.counters().unwrap().registrations, 1);
        // SAFETY: the leaked registration's start; its pages stay leaked, mapped.
        assert_eq!(unsafe { (api().cudaHostUnregister)(p.cast_mut().cast()) }.0, 0);
        // SAFETY: the leaked mapping (64 KiB); nothing refers to it any more.
        unsafe { libc::munmap(p.cast_mut().cast(), 1 << 16) };
    };
    cudaHostGetFlags => |t| {
        let b = PinnedBuffer::<u8>::new(64).unwrap();
        inject(t, "cudaHostGetFlags", 1);
        expect_fault(host_flags(b.as_ptr().cast()), "cudaHostGetFlags", 1);
        assert_eq!(host_flags(b.as_ptr().cast()).unwrap(), 0);
    };
    cudaHostGetDevicePointer => |t| {
        let b = PinnedBuffer::<u8>::with_flags(64, PinnedFlags::new().mapped(true)).unwrap();
        inject(t, "cudaHostGetDevicePointer", 1);
        expect_fault(host_device_pointer(b.as_ptr().cast()), "cudaHostGetDevicePointer", 1);
        assert!(host_device_pointer(b.as_ptr().cast()).is_ok());
    };
    cudaPointerGetAttributes => |t| {
        let b = DeviceBuffer::<u8>::new(&dev(), 64).unwrap();
        inject(t, "cudaPointerGetAttributes", 1);
        expect_fault(pointer_kind(b.as_raw_ptr().cast()), "cudaPointerGetAttributes", 1);
        assert_eq!(pointer_kind(b.as_raw_ptr().cast()).unwrap().memory, cudaMemoryType::cudaMemoryTypeDevice);
    };
    cudaMemcpy => |t| {
        let mut b = DeviceBuffer::<u32>::zeroed(&dev(), 256).unwrap();
        inject(t, "cudaMemcpy", 1);
        expect_fault(b.copy_from_slice(&[5; 256]), "cudaMemcpy", 1);
        inject(t, "cudaMemcpy", 1);
        let mut out = vec![0u32; 256];
        expect_fault(b.copy_to_slice(&mut out), "cudaMemcpy", 1);
        inject(t, "cudaMemcpy", 1);
        expect_fault(b.to_vec(), "cudaMemcpy", 1);
        assert_eq!(b.to_vec().unwrap(), [0; 256]);
    };
    cudaMemcpyAsync => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let mut host = PinnedBuffer::from_slice(&[7u32; 256]).unwrap();
        let mut a = DeviceBuffer::<u32>::zeroed(&d, 256).unwrap();
        let mut b = DeviceBuffer::<u32>::zeroed(&d, 256).unwrap();
        inject(t, "cudaMemcpyAsync", 1);
        expect_fault(s.copy_to_device(&host, &mut a), "cudaMemcpyAsync", 1);
        inject(t, "cudaMemcpyAsync", 1);
        expect_fault(s.copy_to_host(&a, &mut host), "cudaMemcpyAsync", 1);
        inject(t, "cudaMemcpyAsync", 1);
        expect_fault(s.copy_device_to_device(&a, &mut b), "cudaMemcpyAsync", 1);
        inject(t, "cudaMemcpyAsync", 1);
        expect_fault(s.copy_to_device(&host.slice(0..10).unwrap(), &mut a.slice_mut(0..10).unwrap()), "cudaMemcpyAsync", 1);
        // A refused operation is not fenced: host access does not wait for it.
        let syncs = t.emu().call_count("cudaStreamSynchronize").unwrap();
        host.as_mut_slice().unwrap()[0] = 8;
        assert_eq!(a.to_vec().unwrap(), [0; 256]);
        assert_eq!(t.emu().call_count("cudaStreamSynchronize").unwrap(), syncs);
        s.copy_to_device(&host, &mut a).unwrap().wait().unwrap();
        assert_eq!(a.to_vec().unwrap()[..2], [8, 7]);
        drop((s, host, a, b));
    };
    cudaMemset => |t| {
        inject(t, "cudaMemset", 1);
        expect_fault(DeviceBuffer::<u64>::zeroed(&dev(), 100), "cudaMemset", 1);
        assert_eq!(t.counters().unwrap().device_allocs, 0, "the half-made buffer was freed");
    };
    cudaMemsetAsync => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let mut b = DeviceBuffer::<u16>::zeroed(&d, 100).unwrap();
        inject(t, "cudaMemsetAsync", 1);
        expect_fault(s.memset(&mut b, 1), "cudaMemsetAsync", 1);
        inject(t, "cudaMemsetAsync", 1);
        expect_fault(s.memset(&mut b.slice_mut(10..20).unwrap(), 1), "cudaMemsetAsync", 1);
        assert_eq!(b.to_vec().unwrap(), [0; 100]);
        drop((s, b));
    };
    cudaStreamCreateWithPriority => |t| {
        let d = dev();
        inject(t, "cudaStreamCreateWithPriority", 2);
        expect_fault(Stream::new(&d), "cudaStreamCreateWithPriority", 2);
        inject(t, "cudaStreamCreateWithPriority", 1);
        expect_fault(Stream::with_options(&d, StreamOptions::new().priority(-1)), "cudaStreamCreateWithPriority", 1);
    };
    cudaStreamDestroy => |t| {
        let s = Stream::new(&dev()).unwrap();
        let raw = s.as_raw();
        let s2 = s.clone();
        drop(s);
        assert_eq!(t.counters().unwrap().streams, 1, "a clone keeps the stream");
        inject(t, "cudaStreamDestroy", 400);
        drop(s2);
        assert_eq!(t.counters().unwrap().streams, 1, "the failed destroy left the stream");
        // SAFETY: the leaked stream; nothing refers to it any more.
        assert_eq!(unsafe { (api().cudaStreamDestroy)(raw) }.0, 0);
    };
    cudaStreamSynchronize => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let src = PinnedBuffer::from_slice(&pattern(3, 4096)).unwrap();
        let mut b = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
        inject(t, "cudaStreamSynchronize", 999);
        expect_fault(s.synchronize(), "cudaStreamSynchronize", 999);
        // zeroed() waits for its memset on the legacy stream; the half-made buffer is freed.
        inject(t, "cudaStreamSynchronize", 999);
        expect_fault(DeviceBuffer::<u32>::zeroed(&d, 64), "cudaStreamSynchronize", 999);
        assert_eq!(t.counters().unwrap().device_allocs, 1);
        let p = s.copy_to_device(&src, &mut b).unwrap();
        inject(t, "cudaStreamSynchronize", 999);
        expect_fault(p.wait(), "cudaStreamSynchronize", 999);
        // Host access waits on the fence: the failed wait is reported, and a retry works.
        s.copy_to_device(&src, &mut b).unwrap().detach();
        inject(t, "cudaStreamSynchronize", 999);
        expect_fault(b.to_vec(), "cudaStreamSynchronize", 999);
        assert_eq!(b.to_vec().unwrap(), pattern(3, 4096));
        // Drop whose wait fails leaks the memory rather than free what the
        // copy may still use (by design, even for a passing fault).
        let mut doomed = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
        let p = doomed.as_raw_ptr();
        s.copy_to_device(&src, &mut doomed).unwrap().detach();
        inject(t, "cudaStreamSynchronize", 999);
        drop(doomed);
        assert_eq!(t.counters().unwrap().device_allocs, 2);
        s.synchronize().unwrap();
        // SAFETY: the leaked allocation, idle now; nothing refers to it any more.
        assert_eq!(unsafe { (api().cudaFree)(p.cast()) }.0, 0);
        drop((s, src, b));
    };
    cudaStreamQuery => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        inject(t, "cudaStreamQuery", 999);
        expect_fault(s.query(), "cudaStreamQuery", 999);
        // cudaErrorNotReady is a status, not an error.
        inject(t, "cudaStreamQuery", 600);
        assert!(!s.query().unwrap());
        let src = PinnedBuffer::<u8>::new(64).unwrap();
        let mut b = DeviceBuffer::<u8>::new(&d, 64).unwrap();
        let p = s.copy_to_device(&src, &mut b).unwrap();
        inject(t, "cudaStreamQuery", 999);
        expect_fault(p.is_complete(), "cudaStreamQuery", 999);
        inject(t, "cudaStreamQuery", 600);
        assert!(!p.is_complete().unwrap());
        p.wait().unwrap();
        assert!(s.query().unwrap());
        drop((s, src, b));
    };
    cudaStreamWaitEvent => |t| {
        let d = dev();
        let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
        let ev = Event::new(&d, EventOptions::default()).unwrap();
        a.record(&ev).unwrap();
        inject(t, "cudaStreamWaitEvent", 400);
        expect_fault(b.wait_event(&ev), "cudaStreamWaitEvent", 400);
        // The same call orders one stream after another for a shared buffer.
        let src = PinnedBuffer::from_slice(&pattern(4, 4096)).unwrap();
        let mut buf = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
        let mut back = PinnedBuffer::<u8>::new(4096).unwrap();
        a.copy_to_device(&src, &mut buf).unwrap().detach();
        inject(t, "cudaStreamWaitEvent", 400);
        expect_fault(b.copy_to_host(&buf, &mut back), "cudaStreamWaitEvent", 400);
        b.copy_to_host(&buf, &mut back).unwrap().wait().unwrap();
        assert_eq!(back.as_slice().unwrap(), pattern(4, 4096));
        drop((a, b, ev, src, buf, back));
    };
    cudaLaunchHostFunc => |t| {
        let s = Stream::new(&dev()).unwrap();
        let token = Arc::new(());
        let held = token.clone();
        inject(t, "cudaLaunchHostFunc", 999);
        expect_fault(s.launch_host_fn(move || drop(held)), "cudaLaunchHostFunc", 999);
        assert_eq!(Arc::strong_count(&token), 1, "the refused closure was dropped, not leaked");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        inject(t, "cudaLaunchHostFunc", 999);
        assert!(s.launch_host_fn(move || tx.send(()).unwrap()).is_err());
        assert!(rx.recv().is_err(), "the refused closure never runs");
        drop(s);
    };
    cudaEventCreateWithFlags => |t| {
        let d = dev();
        inject(t, "cudaEventCreateWithFlags", 2);
        expect_fault(Event::new(&d, EventOptions::new().timing(true).blocking_sync(true)), "cudaEventCreateWithFlags", 2);
        // Ordering one stream after another creates an event the first time.
        let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
        let src = PinnedBuffer::from_slice(&pattern(5, 4096)).unwrap();
        let mut buf = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
        let mut back = PinnedBuffer::<u8>::new(4096).unwrap();
        a.copy_to_device(&src, &mut buf).unwrap().detach();
        inject(t, "cudaEventCreateWithFlags", 2);
        expect_fault(b.copy_to_host(&buf, &mut back), "cudaEventCreateWithFlags", 2);
        b.copy_to_host(&buf, &mut back).unwrap().wait().unwrap();
        assert_eq!(back.as_slice().unwrap(), pattern(5, 4096));
        drop((a, b, src, buf, back));
    };
    cudaEventDestroy => |t| {
        let ev = Event::new(&dev(), EventOptions::default()).unwrap();
        let raw = ev.as_raw();
        inject(t, "cudaEventDestroy", 400);
        drop(ev);
        assert_eq!(t.counters().unwrap().events, 1, "the failed destroy left the event");
        // SAFETY: the leaked event; nothing refers to it any more.
        assert_eq!(unsafe { (api().cudaEventDestroy)(raw) }.0, 0);
    };
    cudaEventRecord => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let ev = Event::new(&d, EventOptions::default()).unwrap();
        inject(t, "cudaEventRecord", 400);
        expect_fault(s.record(&ev), "cudaEventRecord", 400);
        // The cross-stream ordering records an event too.
        let s2 = Stream::new(&d).unwrap();
        let src = PinnedBuffer::from_slice(&pattern(6, 4096)).unwrap();
        let mut buf = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
        s.copy_to_device(&src, &mut buf).unwrap().detach();
        inject(t, "cudaEventRecord", 400);
        expect_fault(s2.memset(&mut buf, 0), "cudaEventRecord", 400);
        s2.memset(&mut buf, 0).unwrap().wait().unwrap();
        assert_eq!(buf.to_vec().unwrap(), [0; 4096]);
        s.record(&ev).unwrap();
        ev.synchronize().unwrap();
        drop((s, s2, ev, src, buf));
    };
    cudaEventQuery => |t| {
        let ev = Event::new(&dev(), EventOptions::default()).unwrap();
        inject(t, "cudaEventQuery", 400);
        expect_fault(ev.query(), "cudaEventQuery", 400);
        inject(t, "cudaEventQuery", 600);
        assert!(!ev.query().unwrap(), "not ready is a status");
        assert!(ev.query().unwrap());
        drop(ev);
    };
    cudaEventSynchronize => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let ev = Event::new(&d, EventOptions::default()).unwrap();
        s.record(&ev).unwrap();
        inject(t, "cudaEventSynchronize", 999);
        expect_fault(ev.synchronize(), "cudaEventSynchronize", 999);
        ev.synchronize().unwrap();
        drop((s, ev));
    };
    cudaEventElapsedTime => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let timed = EventOptions::new().timing(true);
        let (a, b) = (Event::new(&d, timed).unwrap(), Event::new(&d, timed).unwrap());
        s.record(&a).unwrap();
        s.record(&b).unwrap();
        b.synchronize().unwrap();
        inject(t, "cudaEventElapsedTime", 400);
        expect_fault(b.elapsed_ms(&a), "cudaEventElapsedTime", 400);
        assert!(b.elapsed_ms(&a).unwrap() >= 0.0);
        drop((s, a, b));
    };
    cudaLibraryLoadData => |t| {
        inject(t, "cudaLibraryLoadData", cudaError::cudaErrorInvalidPtx.0);
        expect_fault(Library::load_ptx(GATHER_PTX), "cudaLibraryLoadData", cudaError::cudaErrorInvalidPtx.0);
        assert_eq!(t.counters().unwrap().libraries, 0, "nothing loaded");
        inject(t, "cudaLibraryLoadData", cudaError::cudaErrorMemoryAllocation.0);
        let e = expect_fault(Library::load_ptx(GATHER_PTX), "cudaLibraryLoadData", cudaError::cudaErrorMemoryAllocation.0);
        assert!(e.hint().unwrap().contains("out of memory"));
        assert!(Library::load_ptx(GATHER_PTX).unwrap().kernel("wirespeed_gather").is_ok());
    };
    cudaLibraryGetKernel => |t| {
        let lib = Library::load_ptx(GATHER_PTX).unwrap();
        inject(t, "cudaLibraryGetKernel", cudaError::cudaErrorSymbolNotFound.0);
        expect_fault(lib.kernel("wirespeed_gather"), "cudaLibraryGetKernel", cudaError::cudaErrorSymbolNotFound.0);
        let k = lib.kernel("wirespeed_gather").unwrap();
        drop(lib);
        assert_eq!(t.counters().unwrap().libraries, 1, "the kernel keeps its library");
        drop(k);
    };
    cudaLibraryUnload => |t| {
        // Drop cannot report the error: the library is leaked (still loaded).
        let lib = Library::load_ptx(GATHER_PTX).unwrap();
        let raw = lib.as_raw();
        inject(t, "cudaLibraryUnload", 999);
        drop(lib);
        assert_eq!(t.counters().unwrap().libraries, 1, "the failed unload left the library");
        let fns = wirespeed_cuda_sys::runtime().unwrap().library_api().unwrap();
        // SAFETY: the leaked library; nothing refers to it any more.
        assert_eq!(unsafe { (fns.cudaLibraryUnload)(raw) }.0, 0);
    };
    cudaLaunchKernel => |t| {
        let d = dev();
        let s = Stream::new(&d).unwrap();
        let gather = Library::load_ptx(GATHER_PTX).unwrap().kernel("wirespeed_gather").unwrap();
        let src = DeviceBuffer::<u8>::zeroed(&d, 64).unwrap();
        let offsets = DeviceBuffer::<u64>::zeroed(&d, 4).unwrap();
        let mut batch = DeviceBuffer::<u8>::zeroed(&d, 4 * 16).unwrap();
        let launches = t.counters().unwrap().kernel_launches;
        inject(t, "cudaLaunchKernel", cudaError::cudaErrorInvalidDeviceFunction.0);
        let args = KernelArgs::new().write(&mut batch).read(&src).read(&offsets).value(4u64).value(16u64);
        // SAFETY: wirespeed_gather's parameters; it reads 4 records of 16
        // bytes at offset 0 of `src`, and `offsets`, and writes `batch`.
        let r = unsafe { s.launch(&gather, LaunchConfig::linear(1, 256), args) };
        expect_fault(r, "cudaLaunchKernel", cudaError::cudaErrorInvalidDeviceFunction.0);
        // Nothing was enqueued or recorded: the buffers are idle and usable.
        assert!(batch.to_vec().unwrap().iter().all(|&b| b == 0));
        assert_eq!(t.counters().unwrap().kernel_launches, launches);
        let args = KernelArgs::new().write(&mut batch).read(&src).read(&offsets).value(4u64).value(16u64);
        // SAFETY: as above.
        unsafe { s.launch(&gather, LaunchConfig::linear(1, 256), args) }.unwrap().wait().unwrap();
        assert_eq!(t.counters().unwrap().kernel_launches, launches + 1);
        drop((s, gather, src, offsets, batch));
    };
}

/// The gather kernel's PTX (the emulator runs its own copy of the kernel).
const GATHER_PTX: &str = include_str!("../../pinned-mem/kernels/gather.ptx");

// ------------------------------------------------------------------ the list of call sites

/// The functions cuda-safe checks, read from its source (compiled in, so this
/// works where the source is absent).
fn call_sites() -> Vec<&'static str> {
    const RAW: &str = include_str!("../../cuda-safe/src/raw.rs");
    let mut v: Vec<&str> = RAW
        .match_indices("check(\"")
        .map(|(i, m)| {
            let rest = &RAW[i + m.len()..];
            &rest[..rest.find('"').expect("closing quote")]
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn call_sites_match_raw_rs() {
    let sites = call_sites();
    assert!(sites.len() >= 30, "{sites:?}");
    let mut covered = COVERED.to_vec();
    covered.sort_unstable();
    let missing: Vec<_> = sites.iter().filter(|s| !covered.contains(s)).collect();
    let stale: Vec<_> = covered.iter().filter(|s| !sites.contains(s)).collect();
    assert!(missing.is_empty(), "call sites of cuda-safe/src/raw.rs without a fault test here: {missing:?}");
    assert!(stale.is_empty(), "fault tests for functions cuda-safe no longer calls: {stale:?}");
    // The other modules reach CUDA only through raw.rs.
    for (file, text) in [
        ("lib.rs", include_str!("../../cuda-safe/src/lib.rs")),
        ("device.rs", include_str!("../../cuda-safe/src/device.rs")),
        ("error.rs", include_str!("../../cuda-safe/src/error.rs")),
        ("memory/mod.rs", include_str!("../../cuda-safe/src/memory/mod.rs")),
        ("memory/accessors.rs", include_str!("../../cuda-safe/src/memory/accessors.rs")),
        ("memory/checks.rs", include_str!("../../cuda-safe/src/memory/checks.rs")),
        ("memory/copies.rs", include_str!("../../cuda-safe/src/memory/copies.rs")),
        ("memory/detached.rs", include_str!("../../cuda-safe/src/memory/detached.rs")),
        ("memory/device.rs", include_str!("../../cuda-safe/src/memory/device.rs")),
        ("memory/lanes.rs", include_str!("../../cuda-safe/src/memory/lanes.rs")),
        ("memory/pinned.rs", include_str!("../../cuda-safe/src/memory/pinned.rs")),
        ("memory/registered.rs", include_str!("../../cuda-safe/src/memory/registered.rs")),
        ("memory/traits.rs", include_str!("../../cuda-safe/src/memory/traits.rs")),
        ("memory/args.rs", include_str!("../../cuda-safe/src/memory/args.rs")),
        ("fence.rs", include_str!("../../cuda-safe/src/fence.rs")),
        ("fence/many.rs", include_str!("../../cuda-safe/src/fence/many.rs")),
        ("kernel/mod.rs", include_str!("../../cuda-safe/src/kernel/mod.rs")),
        ("kernel/library.rs", include_str!("../../cuda-safe/src/kernel/library.rs")),
        ("kernel/launch.rs", include_str!("../../cuda-safe/src/kernel/launch.rs")),
        ("stream.rs", include_str!("../../cuda-safe/src/stream.rs")),
    ] {
        assert!(!text.contains("check(\"") && !text.contains(".api()"), "{file} calls CUDA outside raw.rs");
    }
    // Every name is one the emulator can fail.
    let t = start_emulated();
    for name in COVERED {
        assert!(t.emu().call_count(name).is_some(), "the emulator does not know {name}");
    }
}

// ------------------------------------------------------------------ sticky errors

#[test]
fn sticky_error_fails_every_later_call_and_idle_objects_still_release() {
    let t = start_emulated();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let ev = Event::new(&d, EventOptions::default()).unwrap();
    let src = PinnedBuffer::from_slice(&pattern(7, 4096)).unwrap();
    let mut buf = DeviceBuffer::<u8>::zeroed(&d, 4096).unwrap();
    let reg = HostRegistration::new(Pages::new(&pattern(8, 1 << 16)), RegisterFlags::default()).unwrap();
    assert!(t.emu().inject_fault("cudaMemcpyAsync", 1, 700, true));
    let e = expect_fault(s.copy_to_device(&src, &mut buf), "cudaMemcpyAsync", 700);
    assert!(e.is_sticky());
    assert!(e.hint().unwrap().contains("restart"));
    // Every later call fails with the same code.
    for e in [
        Device::count().map(drop).unwrap_err(),
        d.name().map(drop).unwrap_err(),
        s.synchronize().unwrap_err(),
        s.query().map(drop).unwrap_err(),
        ev.query().map(drop).unwrap_err(),
        s.record(&ev).unwrap_err(),
        Stream::new(&d).map(drop).unwrap_err(),
        DeviceBuffer::<u8>::new(&d, 1).map(drop).unwrap_err(),
        PinnedBuffer::<u8>::new(1).map(drop).unwrap_err(),
        buf.to_vec().map(drop).unwrap_err(),
        s.copy_to_device(&src, &mut buf).map(drop).unwrap_err(),
        s.launch_host_fn(|| ()).unwrap_err(),
    ] {
        assert_eq!(e.code(), Some(700), "{e}");
        assert!(e.is_sticky());
    }
    // Version queries still answer after a lost context.
    assert!(runtime_info().is_ok());
    // Objects no stream uses release everything on drop, even now: the
    // emulator, like the driver tearing a context down, frees them.
    // (into_inner's error drops the registration, whose Drop fails too: its
    // pages are leaked by design, a mapping; the emulator released the range.)
    let reg_ptr = reg.as_bytes().as_ptr();
    let e = reg.into_inner().unwrap_err();
    assert_eq!((e.call(), e.code()), ("cudaHostUnregister", Some(700)));
    // SAFETY: the leaked mapping (64 KiB); nothing refers to it any more.
    unsafe { libc::munmap(reg_ptr.cast_mut().cast(), 1 << 16) };
    drop((s, ev, src, buf));
    let c = t.counters().unwrap();
    assert!(c.is_clean(), "{c:?}");
    t.emu().reset();
    t.assert_clean();
}

#[test]
fn sticky_error_with_work_in_flight_leaks_by_design() {
    let t = start_emulated();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let src = PinnedBuffer::from_slice(&pattern(9, 1 << 16)).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&d, 1 << 16).unwrap();
    let mut back = PinnedBuffer::<u8>::new(1 << 16).unwrap();
    let idle = DeviceBuffer::<u8>::new(&d, 64).unwrap();
    t.set_delay_us(50_000);
    s.copy_to_device(&src, &mut dst).unwrap().detach();
    s.copy_to_host(&dst, &mut back).unwrap().detach();
    let token = Arc::new(());
    let held = token.clone();
    s.launch_host_fn(move || drop(held)).unwrap();
    let (p_src, p_dst, p_back) = (src.as_ptr(), dst.as_raw_ptr(), back.as_ptr());
    // The context is lost at the next wait.
    assert!(t.emu().inject_fault("cudaStreamSynchronize", 1, 700, true));
    // Dropping a buffer whose copies may still run: the wait fails, so the
    // memory is leaked rather than freed under a copy. No panic.
    drop(dst);
    drop(src);
    drop(back);
    drop(idle); // idle: released
    drop(s);
    let c = t.counters().unwrap();
    assert_eq!((c.device_allocs, c.pinned_allocs, c.streams), (1, 2, 0), "{c:?}");
    // The process would restart now. Here: clear the fault and free the leaks by hand.
    t.emu().reset();
    // SAFETY: the leaked allocations; nothing refers to them any more. cudaFree
    // and cudaFreeHost wait for the (destroyed) stream's queued work.
    unsafe {
        assert_eq!((api().cudaFree)(p_dst.cast()).0, 0);
        assert_eq!((api().cudaFreeHost)(p_src.cast_mut().cast()).0, 0);
        assert_eq!((api().cudaFreeHost)(p_back.cast_mut().cast()).0, 0);
    }
    // The host function ran once the stream's work did (the emulator runs
    // queued work even after the fault: only new calls fail).
    assert_eq!(Arc::strong_count(&token), 1);
    t.assert_clean();
}

#[test]
fn sticky_error_surfaces_from_pending_wait() {
    let t = start_emulated();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let src = PinnedBuffer::<u32>::new(256).unwrap();
    let mut dst = DeviceBuffer::<u32>::new(&d, 256).unwrap();
    let p = s.copy_to_device(&src, &mut dst).unwrap();
    assert!(t.emu().inject_fault("cudaStreamSynchronize", 1, 719, true));
    let e = expect_fault(p.wait(), "cudaStreamSynchronize", 719);
    assert!(e.is_sticky());
    let (p_src, p_dst) = (src.as_ptr(), dst.as_raw_ptr());
    drop((s, src, dst)); // their fences still name the failed wait's copy: leaked
    t.emu().reset();
    // SAFETY: the leaked allocations; nothing refers to them any more.
    unsafe {
        let _ = (api().cudaFree)(p_dst.cast());
        let _ = (api().cudaFreeHost)(p_src.cast_mut().cast());
    }
    t.assert_clean();
}

// ------------------------------------------------------------------ other error paths, in child processes

#[test]
fn no_device() {
    run_child("child_no_device", &[("CUDA_EMU_DEVICES", "0")]);
}

#[test]
#[ignore = "runs in a child process started by no_device"]
fn child_no_device() {
    if !is_child("child_no_device") {
        return;
    }
    let t = start_emulated();
    let e = expect_fault(Device::count(), "cudaGetDeviceCount", 100);
    assert!(e.hint().unwrap().contains("no CUDA device"));
    expect_fault(Device::all(), "cudaGetDeviceCount", 100);
    expect_fault(Device::get(0), "cudaGetDeviceCount", 100);
    assert!(runtime_info().is_ok());
    clear_last_error();
    t.assert_clean();
    child_ran("child_no_device");
}

#[test]
fn two_devices() {
    run_child("child_two_devices", &[("CUDA_EMU_DEVICES", "2")]);
}

#[test]
#[ignore = "runs in a child process started by two_devices"]
fn child_two_devices() {
    if !is_child("child_two_devices") {
        return;
    }
    let t = start_emulated();
    assert_eq!(Device::count().unwrap(), 2);
    let (d0, d1) = (Device::get(0).unwrap(), Device::get(1).unwrap());
    let e = Device::get(2).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("2 device(s)"), "{e}");
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    // Objects remember their device, whatever is current on the thread.
    d0.make_current().unwrap();
    let mut b1 = DeviceBuffer::<u8>::zeroed(&d1, 4096).unwrap();
    assert_eq!(pointer_kind(b1.as_raw_ptr().cast()).unwrap().device_memory(), Some(1));
    let mut b0 = DeviceBuffer::<u8>::zeroed(&d0, 4096).unwrap();
    assert_eq!(pointer_kind(b0.as_raw_ptr().cast()).unwrap().device_memory(), Some(0));
    let src = PinnedBuffer::from_slice(&pattern(10, 4096)).unwrap();
    let mut back = PinnedBuffer::<u8>::new(4096).unwrap();
    // A buffer of another device than the stream's is refused before CUDA.
    let mismatch = |e: Error, call: &str| {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert_eq!(e.call(), call);
        assert!(e.to_string().contains("device 1 but the stream on device 0"), "{e}");
    };
    mismatch(s0.copy_to_device(&src, &mut b1).unwrap_err(), "Stream::copy_to_device");
    mismatch(s0.copy_to_host(&b1, &mut back).unwrap_err(), "Stream::copy_to_host");
    mismatch(s0.copy_device_to_device(&b1, &mut b0).unwrap_err(), "Stream::copy_device_to_device");
    mismatch(s0.copy_device_to_device(&b0, &mut b1).unwrap_err(), "Stream::copy_device_to_device");
    mismatch(s0.memset(&mut b1, 0).unwrap_err(), "Stream::memset");
    let ev1 = Event::new(&d1, EventOptions::default()).unwrap();
    let e = s0.record(&ev1).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.call() == "Stream::record", "{e}");
    // Each on its own device: data flows through the host, across devices.
    t.set_delay_us(20_000);
    s1.copy_to_device(&src, &mut b1).unwrap().detach();
    s1.copy_to_host(&b1, &mut back).unwrap().detach();
    s0.copy_to_device(&back, &mut b0).unwrap().detach(); // ordered after s1 by the fence
    assert_eq!(b0.to_vec().unwrap(), pattern(10, 4096));
    s1.record(&ev1).unwrap();
    s0.wait_event(&ev1).unwrap(); // waiting on another device's event is allowed
    // Buffers of device 1 dropped on a thread whose current device is 0.
    std::thread::spawn(move || {
        d0.make_current().unwrap();
        drop((b1, s1, ev1));
    })
    .join()
    .unwrap();
    drop((s0, b0, src, back));
    t.assert_clean();

    // A registration without `portable` is undone on the device it was made
    // on, from a thread where the other device is current; and even when that
    // device cannot be made current (a sticky error), the unregister is tried.
    d1.make_current().unwrap();
    let reg = HostRegistration::new(pattern(11, 1 << 20).into_boxed_slice(), RegisterFlags::default()).unwrap();
    let reg2 = HostRegistration::new(pattern(12, 1 << 20).into_boxed_slice(), RegisterFlags::default()).unwrap();
    d0.make_current().unwrap();
    let sets = t.emu().call_count("cudaSetDevice").unwrap();
    drop(reg.into_inner().unwrap());
    assert_eq!(t.emu().call_count("cudaSetDevice").unwrap(), sets + 1, "device 1 made current to unregister");
    d0.make_current().unwrap();
    assert!(t.emu().inject_fault("cudaSetDevice", 1, 700, true));
    drop(reg2);
    assert_eq!(t.counters().unwrap().registrations, 0, "unregistered despite the failed switch");
    t.emu().reset();
    child_ran("child_two_devices");
}
