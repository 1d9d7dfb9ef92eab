//! Registration contexts: host memory registered in a second driver context
//! (`RegistrationContext`), copied from by the ordinary streams of the primary
//! context. On the emulator in CI, on the real driver with `CUDA_REQUIRED=1`.
//!
//! In such a context the driver does not wait for copies when it unregisters
//! (measured on an H200), so every unregistration must come after the copies
//! that read the memory. The emulator refuses and counts one that does not
//! (`unregister_violations`); the tests that make one on purpose, or that
//! check what only the emulator can tell (a refused context, its counters),
//! run on the emulator only. No timing assertions.

use std::ffi::c_void;
use std::sync::Arc;

use wirespeed_cuda::sys::driver::{CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_READ_ONLY, CUcontext, CUresult};
use wirespeed_cuda::{
    Device, DeviceBuffer, Error, HostRegistration, RegisterFlags, RegistrationContext, Stream, host_flags, pointer_kind,
};
use wirespeed_pinned::{MappedFile, PinBudget, PinOptions, PinnedRange};
use wirespeed_tests::{Ctx, Pages, TempDir, open_mapped, pattern, start, start_emulated, write_pattern_file};

fn dev() -> Device {
    Device::get(0).expect("device 0")
}

fn drv() -> &'static wirespeed_cuda::sys::DriverApi {
    wirespeed_cuda::sys::driver().expect("the driver API").api()
}

fn rt() -> &'static wirespeed_cuda::sys::Api {
    wirespeed_cuda::sys::runtime().expect("the runtime").api()
}

/// The calling thread's current driver context.
fn current_context() -> CUcontext {
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: `c` is a valid place for the handle.
    let r = unsafe { (drv().cuCtxGetCurrent)(&mut c) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    c
}

/// The emulator's count of refused unregistrations, or 0 on a GPU.
fn violations(t: &Ctx) -> u64 {
    t.counters().map_or(0, |c| c.unregister_violations)
}

fn file(dir: &TempDir, seed: u64, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("f{seed}.bin"));
    let data = write_pattern_file(&path, seed, len);
    (open_mapped(&path).unwrap(), data)
}

type Registered = HostRegistration<Pages>;

fn send_sync<T: Send + Sync>() {}
fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}

#[test]
fn the_context_is_send_sync_and_unwind_safe() {
    send_sync::<RegistrationContext>();
    send_sync::<Arc<RegistrationContext>>();
    unwind_safe::<Arc<RegistrationContext>>();
    unwind_safe::<HostRegistration<Box<[u8]>>>();
}

// ------------------------------------------------------------------ the driver API

#[test]
fn the_driver_functions_come_through_the_runtime() {
    let t = start();
    let d = wirespeed_cuda::sys::driver().expect("the driver API");
    assert!(d.source().starts_with("cudaGetDriverEntryPointByVersion of "), "{}", d.source());
    assert_eq!(d.error_name(CUresult::CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(d.error_name(CUresult(123_456)), "CUresult(123456)");
    assert!(!d.error_string(CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE).is_empty());
    assert_eq!(wirespeed_cuda::sys::DRIVER_SYMBOLS.len(), 12);

    // The same functions by their versioned names, from the driver library itself.
    let lib = if t.emulated() {
        wirespeed_cuda::sys::emulator::library_path().unwrap()
    } else {
        wirespeed_cuda::sys::DRIVER_LIBRARY.to_string()
    };
    // SAFETY: the NVIDIA driver library, or the emulator, which exports the same
    // versioned driver symbols.
    let by_name = unsafe { wirespeed_cuda::sys::Driver::load_library(&lib) }.expect("the driver library");
    assert_eq!(by_name.source(), lib);
    let mut n = 0;
    // SAFETY: flags 0; `n` is a valid place for the device handle.
    assert_eq!(unsafe { (by_name.api().cuInit)(0) }, CUresult::CUDA_SUCCESS);
    // SAFETY: as above.
    assert_eq!(unsafe { (by_name.api().cuDeviceGet)(&mut n, 0) }, CUresult::CUDA_SUCCESS);
    assert_eq!(n, 0);

    // A library that is not there is a typed error.
    // SAFETY: it does not exist.
    let e = unsafe { wirespeed_cuda::sys::Driver::load_library("/nonexistent/libcuda.so.1") }.unwrap_err();
    assert!(matches!(e, wirespeed_cuda::sys::LoadError::NotFound { .. }), "{e}");
    t.assert_clean();
}

/// The real runtimes of the PyPI wheels (`CUDA_WHEEL_LIBS`, as in loader.rs):
/// each hands out the driver functions, or says why not (no driver), typed.
#[test]
fn wheel_runtimes_hand_out_the_driver_functions_or_say_why() {
    let Some(dir) = std::env::var_os("CUDA_WHEEL_LIBS").filter(|d| !d.is_empty()) else {
        eprintln!("note: CUDA_WHEEL_LIBS is not set: the real runtimes of the PyPI wheels are not checked");
        return;
    };
    for file in ["libcudart.so.13", "libcudart.so.12"] {
        let path = std::path::Path::new(&dir).join(file);
        // SAFETY: the CUDA runtime of the wheel.
        let rt = unsafe { wirespeed_cuda::sys::Runtime::load(path.to_str().unwrap()) }.unwrap();
        match wirespeed_cuda::sys::Driver::from_runtime(rt) {
            Ok(d) => {
                // SAFETY: flags 0.
                let r = unsafe { (d.api().cuInit)(0) };
                eprintln!("{file}: driver functions from {}; cuInit: {}", d.source(), d.error_name(r));
            }
            Err(e @ wirespeed_cuda::sys::LoadError::NoDriver { .. }) => {
                eprintln!("{file}: {e}");
                assert!(e.to_string().contains("install or update the NVIDIA driver"), "{e}");
            }
            Err(e) => panic!("{file}: {e}"),
        }
    }
}

/// The runtime `driver_child` loads.
const DRIVER_LIB: &str = "REGCTX_DRIVER_LIB";

/// The process-wide `driver()` with the real CUDA 13 runtime of the wheel
/// (`CUDA_WHEEL_LIBS`), in a child process (the runtime is chosen once per
/// process): the driver functions through it with a driver, else a typed
/// error that lists both ways tried.
#[test]
fn the_process_wide_driver_with_a_real_runtime() {
    let Some(dir) = std::env::var_os("CUDA_WHEEL_LIBS").filter(|d| !d.is_empty()) else {
        eprintln!("note: CUDA_WHEEL_LIBS is not set: the process-wide driver() on a real runtime is not checked");
        return;
    };
    let lib = std::path::Path::new(&dir).join("libcudart.so.13");
    let r = wirespeed_tests::run_child("driver_child", &[(DRIVER_LIB, lib.to_str().unwrap())]);
    let said = r.stdout.lines().find_map(|l| l.split_once("driver: ").map(|(_, t)| t.to_string()));
    eprintln!("driver(): {}", said.unwrap_or_default());
}

/// Runs only in the child process started above.
#[test]
#[ignore = "runs in a child process started by the_process_wide_driver_with_a_real_runtime"]
fn driver_child() {
    if !wirespeed_tests::is_child("driver_child") {
        return;
    }
    let lib = std::env::var_os(DRIVER_LIB).expect("the runtime to load");
    // SAFETY: the CUDA runtime of the wheel, before anything loaded one.
    unsafe { wirespeed_cuda::sys::set_runtime_path(lib.to_str().unwrap()) }.unwrap();
    match wirespeed_cuda::sys::driver() {
        Ok(d) => {
            assert!(d.source().contains("cudaGetDriverEntryPointByVersion"), "{}", d.source());
            println!("driver: {}", d.source());
        }
        Err(e @ wirespeed_cuda::sys::LoadError::NoDriver { .. }) => {
            let s = e.to_string();
            assert!(s.contains("cudaGetDriverEntryPointByVersion of") && s.contains("libcuda.so.1"), "{s}");
            println!("driver: {s}");
        }
        Err(e) => panic!("{e}"),
    }
    wirespeed_tests::child_ran("driver_child");
}

#[test]
fn the_entry_point_lookup_picks_the_abi_by_version() {
    let t = start();
    let get = {
        let rt = wirespeed_cuda::sys::runtime().unwrap();
        let h = {
            let c = std::ffi::CString::new(rt.path()).unwrap();
            // SAFETY: a valid C string; RTLD_NOLOAD only looks the loaded library up.
            unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
        };
        assert!(!h.is_null());
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c"cudaGetDriverEntryPointByVersion".as_ptr()) };
        assert!(!p.is_null(), "the runtime exports cudaGetDriverEntryPointByVersion");
        // SAFETY: the runtime's function, with the signature of its header.
        unsafe { std::mem::transmute::<*mut c_void, wirespeed_cuda::sys::PFN_cudaGetDriverEntryPointByVersion>(p) }
    };
    let lookup = |name: &std::ffi::CStr, version: u32| {
        let mut f = std::ptr::null_mut();
        let mut status = wirespeed_cuda::sys::cudaDriverEntryPointQueryResult(99);
        // SAFETY: a NUL-terminated name, valid places for the results.
        let code = unsafe { get(name.as_ptr(), &mut f, version, 0, &mut status) };
        assert_eq!(code.0, 0, "{name:?} at {version}");
        (f, status.0)
    };
    // cuCtxCreate at 3.2: the ABI of cuCtxCreate_v2, which the table binds.
    let (f, status) = lookup(c"cuCtxCreate", 3020);
    assert!(!f.is_null());
    assert_eq!(status, 0);
    // Older than the function: not found at that version.
    let (f, status) = lookup(c"cuMemHostRegister", 3000);
    assert!(f.is_null());
    assert_ne!(status, 0);
    // A name the driver does not have.
    let (f, status) = lookup(c"cuNoSuchFunction", 13000);
    assert!(f.is_null());
    assert_eq!(status, 1, "cudaDriverEntryPointSymbolNotFound");
    if t.emulated() {
        // At 12.5 cuCtxCreate is cuCtxCreate_v4: an ABI the emulator does not
        // have, so it says so rather than hand out the v2 function.
        let (f, _) = lookup(c"cuCtxCreate", 12050);
        assert!(f.is_null());
    }
    t.assert_clean();
}

// ------------------------------------------------------------------ contexts

#[test]
fn a_context_is_made_on_the_device_and_left_off_the_thread() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap(); // the runtime has set this thread up
    let before = current_context();
    let ctx = RegistrationContext::new(&d).unwrap();
    assert_eq!(current_context(), before, "the new context was popped again");
    assert!(!ctx.as_raw().is_null());
    assert_ne!(ctx.as_raw(), before);
    assert_eq!(ctx.device(), d);
    let other = RegistrationContext::new(&d).unwrap();
    assert_ne!(other.id(), ctx.id());
    assert_ne!(other.as_raw(), ctx.as_raw());
    assert!(format!("{ctx:?}").contains("RegistrationContext"));
    if let Some(c) = t.counters() {
        assert_eq!(c.contexts, 2);
    }
    // The runtime still works on this thread, in the primary context.
    let mut g = DeviceBuffer::<u8>::zeroed(&d, 4096).unwrap();
    let src = wirespeed_cuda::PinnedBuffer::from_slice(&[9u8; 4096]).unwrap();
    s.copy_to_device(&src, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), vec![9u8; 4096]);
    drop((ctx, other));
    if let Some(c) = t.counters() {
        assert_eq!(c.contexts, 0, "destroyed with the last owner");
    }
    drop((s, g, src));
    t.assert_clean();
}

#[test]
fn a_file_mapping_and_a_heap_buffer_registered_in_the_context_copy_in_the_primary_one() {
    let t = start();
    let d = dev();
    if !d.supports_read_only_register().unwrap() {
        eprintln!("note: the device does not support read-only registration; skipped");
        return;
    }
    let v0 = violations(&t);
    let ctx = Arc::new(RegistrationContext::new(&d).unwrap());
    let dir = TempDir::new("regctx");
    let (f, data) = file(&dir, 1, (4 << 20) + 555);
    let budget = PinBudget::new(64 << 20);
    let s = Stream::new(&d).unwrap();
    let here = current_context();

    // A read-only file window.
    let range = 1000..(2 << 20) + 333;
    let r = PinnedRange::new_in(&ctx, &f, range.clone(), PinOptions::default(), &budget).unwrap();
    assert!(r.is_portable(), "always portable in a registration context");
    assert!(Arc::ptr_eq(r.context().unwrap(), &ctx));
    assert_eq!(current_context(), here, "pushed for the register call only");
    let mut g = DeviceBuffer::<u8>::new(&d, r.len() as usize).unwrap();
    s.copy_to_device(&r.source(), &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), &data[range.start as usize..range.end as usize]);
    if let Some(c) = t.counters() {
        assert_eq!(c.registrations, 1);
    }
    // A range inside shares it, whatever context it asks for: the copies run
    // in the primary context, which sees a portable registration of any
    // context (the streamer's windows and a caller's own pins coexist so).
    let inner = PinnedRange::new_in(&ctx, &f, 5000..9000, PinOptions::default(), &budget).unwrap();
    assert_eq!(inner.sharers(), 2);
    let in_primary = PinnedRange::new(&f, 5000..9000, PinOptions::default(), &budget).unwrap();
    assert_eq!(in_primary.sharers(), 3);
    assert!(Arc::ptr_eq(in_primary.context().unwrap(), &ctx), "the owner's context unregisters it");
    let other_ctx = Arc::new(RegistrationContext::new(&d).unwrap());
    let in_other = PinnedRange::new_in(&other_ctx, &f, 5000..9000, PinOptions::default(), &budget).unwrap();
    assert_eq!(in_other.sharers(), 4);
    let mut g3 = DeviceBuffer::<u8>::new(&d, 4000).unwrap();
    s.copy_to_device(&in_primary.source(), &mut g3).unwrap().wait().unwrap();
    assert_eq!(g3.to_vec().unwrap(), &data[5000..9000]);
    drop((in_primary, in_other, g3));
    // Pages elsewhere in the file, in the primary context, still work alongside.
    let primary = PinnedRange::new(&f, (3 << 20)..(4 << 20), PinOptions::default(), &budget).unwrap();
    assert!(primary.context().is_none());
    let mut g2 = DeviceBuffer::<u8>::new(&d, 1 << 20).unwrap();
    s.copy_to_device(&primary.source(), &mut g2).unwrap().wait().unwrap();
    assert_eq!(g2.to_vec().unwrap(), &data[3 << 20..4 << 20]);
    drop((inner, primary, other_ctx));
    r.release().unwrap();
    assert_eq!(budget.used(), 0);

    // A heap buffer.
    let heap = pattern(2, (1 << 20) + 17);
    let reg = HostRegistration::new_in(&ctx, heap.clone().into_boxed_slice(), RegisterFlags::default()).unwrap();
    assert!(reg.flags().portable && !reg.flags().read_only);
    assert!(Arc::ptr_eq(reg.context().unwrap(), &ctx));
    assert!(format!("{reg:?}").contains("context"));
    if t.emulated() {
        // The runtime sees it as registered (portable) host memory.
        let p = reg.as_bytes().as_ptr().cast::<c_void>();
        assert!(pointer_kind(p).unwrap().is_pinned_host());
        assert_ne!(host_flags(p).unwrap() & wirespeed_cuda::sys::cudaHostRegisterPortable, 0);
    }
    let mut h = DeviceBuffer::<u8>::new(&d, heap.len()).unwrap();
    let s2 = Stream::new(&d).unwrap();
    s.copy_to_device(&reg.slice(..1 << 19).unwrap(), &mut h.slice_mut(..1 << 19).unwrap()).unwrap().detach();
    s2.copy_to_device(&reg.slice(1 << 19..).unwrap(), &mut h.slice_mut(1 << 19..).unwrap()).unwrap().detach();
    let back = reg.into_inner().unwrap(); // waits for both copies, then unregisters in the context
    assert_eq!(&*back, &heap[..]);
    assert_eq!(h.to_vec().unwrap(), heap);

    // An empty range is refused before the driver is asked.
    let e = HostRegistration::new_in(&ctx, Box::<[u8]>::default(), RegisterFlags::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(violations(&t), v0);
    drop((s, s2, g, g2, h, ctx));
    t.assert_clean();
}

#[test]
fn many_cycles_with_copies_in_flight_on_several_streams() {
    let t = start();
    let d = dev();
    t.set_delay_us(300);
    let v0 = violations(&t);
    let ctx = Arc::new(RegistrationContext::new(&d).unwrap());
    let dir = TempDir::new("regctx-cycles");
    let (f, fdata) = file(&dir, 3, 4 << 20);
    let budget = PinBudget::new(8 << 20);
    const CYCLES: usize = 40;
    const CHUNK: usize = 64 << 10;

    std::thread::scope(|scope| {
        // Three threads register heap buffers, each copied by two streams,
        // and unregister the previous one while the next one's copies run.
        for th in 0..3u64 {
            let ctx = &ctx;
            scope.spawn(move || {
                let d = dev();
                let (sa, sb) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
                let mut dst =
                    [DeviceBuffer::<u8>::new(&d, CHUNK).unwrap(), DeviceBuffer::<u8>::new(&d, CHUNK).unwrap()];
                let mut prev: Option<(Registered, Vec<u8>)> = None;
                for i in 0..CYCLES {
                    let data = pattern(100 * th + i as u64, CHUNK);
                    let reg = HostRegistration::new_in(ctx, Pages::new(&data), RegisterFlags::default()).unwrap();
                    let slot = &mut dst[i % 2];
                    sa.copy_to_device(&reg.slice(..CHUNK / 2).unwrap(), &mut slot.slice_mut(..CHUNK / 2).unwrap())
                        .unwrap()
                        .detach();
                    sb.copy_to_device(&reg.slice(CHUNK / 2..).unwrap(), &mut slot.slice_mut(CHUNK / 2..).unwrap())
                        .unwrap()
                        .detach();
                    if let Some((old, want)) = prev.take() {
                        // Alternately by Drop and by into_inner: both wait for its copies.
                        if i % 2 == 0 {
                            drop(old);
                        } else {
                            let pages = old.into_inner().unwrap();
                            assert_eq!(pages.bytes(), &want[..]);
                        }
                        assert_eq!(dst[(i + 1) % 2].to_vec().unwrap(), want, "thread {th} cycle {}", i - 1);
                    }
                    prev = Some((reg, data));
                }
                let (last, want) = prev.take().unwrap();
                drop(last);
                assert_eq!(dst[(CYCLES - 1) % 2].to_vec().unwrap(), want);
            });
        }
        // A fourth slides read-only windows over a file, registered ahead of the copies.
        let (ctx, f, fdata, budget) = (&ctx, &f, &fdata, &budget);
        scope.spawn(move || {
            let d = dev();
            let streams = [Stream::new(&d).unwrap(), Stream::new(&d).unwrap()];
            const WIN: u64 = 256 << 10;
            let mut out = DeviceBuffer::<u8>::new(&d, fdata.len()).unwrap();
            let mut live = std::collections::VecDeque::new();
            for (k, start) in (0..f.len()).step_by(WIN as usize).enumerate() {
                let w = PinnedRange::new_in(ctx, f, start..start + WIN, PinOptions::default(), budget).unwrap();
                let half = (WIN / 2) as usize;
                for (j, s) in streams.iter().enumerate() {
                    let at = start as usize + j * half;
                    s.copy_to_device(
                        &w.slice(j * half..(j + 1) * half).unwrap(),
                        &mut out.slice_mut(at..at + half).unwrap(),
                    )
                    .unwrap()
                    .detach();
                }
                live.push_back(w);
                if live.len() > 2 || k % 5 == 4 {
                    live.pop_front().unwrap().release().unwrap(); // waits for its two copies only
                }
            }
            drop(live);
            assert_eq!(out.to_vec().unwrap(), *fdata);
        });
    });
    assert_eq!(violations(&t), v0, "no unregistration came before a copy that read the memory");
    assert_eq!(budget.used(), 0);
    drop(ctx);
    t.assert_clean();
}

// ------------------------------------------------------------------ the rule, on the emulator

#[test]
fn unregistering_under_a_copy_is_caught_on_the_emulator() {
    let t = start();
    if !t.emulated() {
        eprintln!("note: the check belongs to the emulator; skipped on a GPU");
        return;
    }
    let v0 = violations(&t);
    drop(t); // the child has its own emulator; this one's books are untouched
    let r = wirespeed_tests::run_child("violation_child", &[]);
    assert!(r.stderr.contains("cuMemHostUnregister"), "the emulator says so on stderr:\n{}", r.stderr);
    assert!(r.stderr.contains("still uses this registered memory"), "{}", r.stderr);
    assert!(r.stderr.contains("cudaGetDeviceCount called while a context made with cuCtxCreate"), "{}", r.stderr);
    let t = start();
    assert_eq!(violations(&t), v0);
}

/// Runs only in the child process started above: a deliberate violation
/// through raw calls (the safe API cannot make one).
#[test]
#[ignore = "runs in a child process started by unregistering_under_a_copy_is_caught_on_the_emulator"]
fn violation_child() {
    if !wirespeed_tests::is_child("violation_child") {
        return;
    }
    let t = start_emulated();
    let d = dev();
    let ctx = RegistrationContext::new(&d).unwrap();
    let (drv, rt) = (drv(), rt());
    let data = pattern(7, 1 << 16);
    let p = data.as_ptr().cast_mut().cast::<c_void>();
    let push = || {
        // SAFETY: a live context, popped again below.
        assert_eq!(unsafe { (drv.cuCtxPushCurrent_v2)(ctx.as_raw()) }, CUresult::CUDA_SUCCESS);
    };
    let pop = || {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid place for the handle.
        assert_eq!(unsafe { (drv.cuCtxPopCurrent_v2)(&mut c) }, CUresult::CUDA_SUCCESS);
        assert_eq!(c, ctx.as_raw());
    };

    // While the context is current, the emulated runtime refuses to run calls
    // in it (the real one would run them there, not in the primary context).
    push();
    let mut n = 0;
    // SAFETY: `n` is a valid place.
    assert_eq!(unsafe { (rt.cudaGetDeviceCount)(&mut n) }.0, 49, "cudaErrorIncompatibleDriverContext");
    pop();
    // SAFETY: as above.
    assert_eq!(unsafe { (rt.cudaGetDeviceCount)(&mut n) }.0, 0);
    // SAFETY: no arguments (clears the refused call's last error).
    unsafe { (rt.cudaGetLastError)() };

    // Register in the context, start a slow copy from it, unregister at once.
    push();
    // SAFETY: `data` outlives the registration (it is unregistered below, and
    // the copy waited for, before `data` drops).
    let r = unsafe {
        (drv.cuMemHostRegister_v2)(p, data.len(), CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_PORTABLE)
    };
    pop();
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    t.set_delay_us(200_000);
    let s = Stream::new(&d).unwrap();
    let g = DeviceBuffer::<u8>::new(&d, data.len()).unwrap();
    // SAFETY: `g` is device memory of `data.len()` bytes; `data` stays alive
    // and registered until the stream is synchronized below.
    let r = unsafe {
        (rt.cudaMemcpyAsync)(
            g.as_raw_ptr().cast(),
            p,
            data.len(),
            wirespeed_cuda::sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
            s.as_raw(),
        )
    };
    assert_eq!(r.0, 0);
    let before = violations(&t);
    push();
    // SAFETY: deliberately wrong: the copy above still reads `p`. The emulator
    // refuses (the memory stays registered); a real driver would not.
    let r = unsafe { (drv.cuMemHostUnregister)(p) };
    pop();
    assert_eq!(r, CUresult::CUDA_ERROR_ILLEGAL_STATE, "refused");
    assert_eq!(violations(&t), before + 1, "counted");
    assert_eq!(t.counters().unwrap().registrations, 1, "still registered");

    // Done right: wait for the copy, then unregister.
    s.synchronize().unwrap();
    push();
    // SAFETY: the copy has completed.
    let r = unsafe { (drv.cuMemHostUnregister)(p) };
    pop();
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    assert_eq!(violations(&t), before + 1);
    assert_eq!(g.to_vec().unwrap(), data);
    t.set_delay_us(0);
    drop((s, g, ctx));
    t.assert_clean();
    wirespeed_tests::child_ran("violation_child");
}

// ------------------------------------------------------------------ failures and the fallback

#[test]
fn a_refused_context_is_a_typed_error_and_the_primary_context_still_works() {
    let t = start();
    if !t.emulated() {
        eprintln!("note: refusing a context is the emulator's control; skipped on a GPU");
        return;
    }
    let d = dev();
    t.emu().fail_context_creation(Some(46));
    let e = RegistrationContext::new(&d).unwrap_err();
    let Error::Driver { call, code, name, .. } = &e else { panic!("{e:?}") };
    assert_eq!((*call, *code, name.as_str()), ("cuCtxCreate", 46, "CUDA_ERROR_DEVICE_UNAVAILABLE"));
    assert_eq!(e.code(), Some(46));
    assert!(!e.is_sticky());
    assert!(e.hint().unwrap().contains("fall back to registering in the primary context"), "{e}");
    assert!(e.to_string().contains("exclusive-process"), "{e}");
    assert_eq!(t.counters().unwrap().contexts, 0, "nothing was made");

    // The fallback: the primary context, as before.
    let data = pattern(4, 1 << 16);
    let reg = HostRegistration::new(data.clone().into_boxed_slice(), RegisterFlags::default()).unwrap();
    assert!(reg.context().is_none());
    let s = Stream::new(&d).unwrap();
    let mut g = DeviceBuffer::<u8>::new(&d, data.len()).unwrap();
    s.copy_to_device(&reg, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), data);
    drop(reg);

    t.emu().fail_context_creation(None);
    let ctx = Arc::new(RegistrationContext::new(&d).unwrap());

    // A failed register hands the memory back and leaves nothing registered.
    assert!(t.emu().inject_fault("cuMemHostRegister_v2", 1, 2, false));
    let (e, back) =
        HostRegistration::try_new_in(&ctx, data.clone().into_boxed_slice(), RegisterFlags::default()).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cuMemHostRegister", Some(2)), "{e}");
    assert_eq!(&*back, &data[..]);
    // So does a context that cannot be pushed.
    assert!(t.emu().inject_fault("cuCtxPushCurrent_v2", 1, 201, false));
    let (e, back) = HostRegistration::try_new_in(&ctx, back, RegisterFlags::default()).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cuCtxPushCurrent", Some(201)), "{e}");
    assert_eq!(t.counters().unwrap().registrations, 0);

    // An unregister that fails once: into_inner reports it, Drop tries again
    // (after waiting for the copies again) and frees the memory.
    let reg = HostRegistration::new_in(&ctx, back, RegisterFlags::default()).unwrap();
    s.copy_to_device(&reg, &mut g).unwrap().detach();
    let unregisters = t.emu().call_count("cuMemHostUnregister").unwrap();
    assert!(t.emu().inject_fault("cuMemHostUnregister", 1, 999, false));
    let e = reg.into_inner().unwrap_err();
    assert_eq!((e.call(), e.code()), ("cuMemHostUnregister", Some(999)), "{e}");
    assert_eq!(t.emu().call_count("cuMemHostUnregister").unwrap(), unregisters + 2);
    assert_eq!(t.counters().unwrap().registrations, 0);
    assert_eq!(g.to_vec().unwrap(), data);

    // A registration context's register with the wrong flags for the memory.
    let dir = TempDir::new("regctx-ro");
    let (f, _) = file(&dir, 5, 3 * 4096);
    let window = PinnedRange::new_in(&ctx, &f, 0..4096, PinOptions::default(), &PinBudget::unlimited()).unwrap();
    drop(window);
    let e = unwritable_without_read_only(&ctx);
    assert_eq!((e.call(), e.code()), ("cuMemHostRegister", Some(1)), "{e}");
    assert!(e.to_string().contains("ReadOnly"), "{e}");
    assert_eq!(violations(&t), 0);
    drop((s, g, ctx));
    t.assert_clean();
}

/// Registers a read-only private mapping without the read-only flag.
fn unwritable_without_read_only(ctx: &Arc<RegistrationContext>) -> Error {
    HostRegistration::new_in(ctx, Pages::with(&[5u8; 4096], true), RegisterFlags::default()).unwrap_err()
}

// ------------------------------------------------------------------ leaks

#[test]
fn a_forgotten_registration_in_a_context_is_never_unregistered() {
    let t = start();
    drop(t); // the child leaks on purpose, in its own process
    wirespeed_tests::run_child("forget_child", &[]);
    start().assert_clean();
}

/// Runs only in the child process started above. (A `Pending` has no `Drop`:
/// forgetting it is the same as dropping it. It is forgotten anyway, the case
/// the safety model names.)
#[test]
#[ignore = "runs in a child process started by a_forgotten_registration_in_a_context_is_never_unregistered"]
#[allow(clippy::forget_non_drop)]
fn forget_child() {
    if !wirespeed_tests::is_child("forget_child") {
        return;
    }
    let t = start();
    t.set_delay_us(20_000);
    let d = dev();
    let ctx = Arc::new(RegistrationContext::new(&d).unwrap());
    let raw = ctx.as_raw();
    let s = Stream::new(&d).unwrap();
    let data = pattern(6, 1 << 16);
    let reg = HostRegistration::new_in(&ctx, Pages::new(&data), RegisterFlags::default()).unwrap();
    let mut g = DeviceBuffer::<u8>::new(&d, data.len()).unwrap();
    std::mem::forget(s.copy_to_device(&reg, &mut g).unwrap());
    let calls =
        t.env.emu.map(|e| (e.call_count("cuMemHostUnregister").unwrap(), e.call_count("cuCtxDestroy_v2").unwrap()));
    std::mem::forget(reg);
    assert_eq!(Arc::strong_count(&ctx), 2, "the forgotten registration holds the context");
    drop(ctx);
    // The context lives on: it can still be made current.
    // SAFETY: the context is alive (leaked with the registration); popped at once.
    assert_eq!(unsafe { (drv().cuCtxPushCurrent_v2)(raw) }, CUresult::CUDA_SUCCESS);
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid place for the handle.
    assert_eq!(unsafe { (drv().cuCtxPopCurrent_v2)(&mut c) }, CUresult::CUDA_SUCCESS);
    assert_eq!(c, raw);
    s.synchronize().unwrap();
    assert_eq!(g.to_vec().unwrap(), data, "the copy read the leaked, still registered memory");
    if let (Some(e), Some(calls)) = (&t.env.emu, calls) {
        assert_eq!((e.call_count("cuMemHostUnregister").unwrap(), e.call_count("cuCtxDestroy_v2").unwrap()), calls);
        let c = e.counters();
        assert_eq!((c.registrations, c.contexts), (1, 1), "leaked, not unregistered");

        // An unregister that fails twice leaks too (memory and context).
        let ctx = Arc::new(RegistrationContext::new(&d).unwrap());
        let reg = HostRegistration::new_in(&ctx, Pages::new(&data), RegisterFlags::default()).unwrap();
        assert!(e.inject_fault("cuMemHostUnregister", 1, 999, false));
        assert!(e.inject_fault("cuMemHostUnregister", 2, 999, false));
        assert!(reg.into_inner().is_err());
        assert_eq!(Arc::strong_count(&ctx), 2, "leaked with the memory");
        drop(ctx);
        let c = e.counters();
        assert_eq!((c.registrations, c.contexts), (2, 2));
        assert_eq!(c.unregister_violations, 0);
    }
    wirespeed_tests::child_ran("forget_child");
}

/// Popping the registration context failing after a registration: the pop is
/// tried again, so the context does not stay current on the thread (where
/// every later runtime call failed with cudaErrorIncompatibleDriverContext);
/// and where undoing the registration fails too, the registration is kept
/// and returned rather than its memory handed back still registered (memory
/// mapped there later read as registered: a copy into it failed with
/// cudaErrorInvalidValue, the randomized test's "live buffer read back
/// cudaErrorInvalidValue").
#[test]
fn a_failed_pop_leaves_the_thread_usable_and_no_memory_registered_behind() {
    let t = start();
    if !t.emulated() {
        eprintln!("note: failing a pop is the emulator's control; skipped on a GPU");
        return;
    }
    let d = dev();
    let ctx = Arc::new(RegistrationContext::new(&d).unwrap());
    let data = pattern(8, 1 << 16);
    // One failed pop: tried again, registered, and the thread still works.
    assert!(t.emu().inject_fault("cuCtxPopCurrent_v2", 1, 999, false));
    let reg = HostRegistration::try_new_in(&ctx, Pages::new(&data), RegisterFlags::default()).unwrap();
    assert_ne!(current_context(), ctx.as_raw(), "the context is off the thread");
    let mut g = DeviceBuffer::<u8>::new(&d, data.len()).unwrap();
    let s = Stream::new(&d).unwrap();
    s.copy_to_device(&reg, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), data);
    drop(reg);
    assert_eq!(t.counters().unwrap().registrations, 0);
    // Both pops fail, and so does undoing the registration: kept, returned.
    for nth in [1, 2, 3] {
        assert!(t.emu().inject_fault("cuCtxPopCurrent_v2", nth, 999, false));
    }
    assert!(t.emu().inject_fault("cuMemHostUnregister", 1, 999, false));
    let kept = HostRegistration::try_new_in(&ctx, Pages::new(&data), RegisterFlags::default());
    t.emu().reset();
    let kept = kept.unwrap_or_else(|(e, _)| panic!("handed back still registered: {e}"));
    // The context stayed current (every pop failed): take it off by hand.
    while current_context() == ctx.as_raw() {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid place for the handle; the context is ours.
        assert_eq!(unsafe { (drv().cuCtxPopCurrent_v2)(&mut c) }, CUresult::CUDA_SUCCESS);
    }
    s.copy_to_device(&kept, &mut g).unwrap().wait().unwrap();
    assert_eq!(g.to_vec().unwrap(), data);
    drop(kept);
    drop((s, g, ctx));
    t.assert_clean();
}
