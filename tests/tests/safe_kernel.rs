//! Run-time loaded kernels (`Library`, `Kernel`, `KernelArgs`,
//! `Stream::launch`) on this binary's runtime: the emulator in CI (which runs
//! its own copy of `wirespeed_gather` on the host, checking every address),
//! the real GPU with `CUDA_REQUIRED=1` (the PTX of pinned-mem/kernels). Checks
//! that need the emulator's counters, delays or holds run only when
//! `t.emulated()`; a device fault, which poisons the runtime, runs in a child
//! process. The fault injections at the new CUDA calls are in safe_faults.rs,
//! with every other call site's.

use wirespeed_cuda::{
    Device, DeviceBuffer, DeviceSink, Error, HostRegistration, Kernel, KernelArgs, LaunchConfig, Library, PinnedBuffer,
    RegisterFlags, RegistrationContext, Stream,
};
use wirespeed_cuda_sys::{LoadError, cudaError};
use wirespeed_tests::{Ctx, Pages, Watchdog, child_ran, is_child, pattern, run_child, start, start_emulated};

/// The gather kernel: `wirespeed_gather(dst, src, offsets, n, rec)` makes
/// record k of `dst` (`rec` bytes at `dst + k * rec`) a copy of the `rec`
/// bytes at `src + offsets[k]`.
const GATHER_PTX: &str = include_str!("../../pinned-mem/kernels/gather.ptx");

/// The record size of the dataset the kernel is for: (3, 31, 31) bytes.
const REC: usize = 2883;

fn dev() -> Device {
    Device::get(0).expect("device 0")
}

/// Clears the thread's last error that a refused call left (as CUDA does).
fn clear_last_error() {
    let api = wirespeed_cuda_sys::runtime().expect("runtime").api();
    // SAFETY: no arguments.
    unsafe { (api.cudaGetLastError)() };
}

fn gather_kernel() -> Kernel {
    Library::load_ptx(GATHER_PTX).expect("load the PTX").kernel("wirespeed_gather").expect("the gather kernel")
}

/// `n` offsets of `rec`-byte records within `len` bytes: unaligned, in a
/// scrambled order, with repeats.
fn offsets(n: usize, rec: usize, len: usize, seed: u64) -> Vec<u64> {
    let room = (len - rec + 1) as u64;
    (0..n as u64).map(|k| (k ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % room).collect()
}

/// What the gather makes of `src`: its records at `offsets`, one after another.
fn gathered(src: &[u8], offsets: &[u64], rec: usize) -> Vec<u8> {
    offsets.iter().flat_map(|&o| &src[o as usize..o as usize + rec]).copied().collect()
}

/// Asserts a batch is what was gathered, naming the first byte that differs.
#[track_caller]
fn assert_batch(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "batch length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("byte {i} of the batch is {}, not {}", got[i], want[i]);
    }
}

fn device_copy<T: wirespeed_cuda::Pod>(d: &Device, values: &[T]) -> DeviceBuffer<T> {
    let mut b = DeviceBuffer::new(d, values.len()).expect("device buffer");
    b.copy_from_slice(values).expect("copy in");
    b
}

/// A grid for `n` records: a warp each, 8 warps to a block of 256 threads
/// (the kernel's bound).
fn config(n: usize) -> LaunchConfig {
    LaunchConfig::linear(n.div_ceil(8).clamp(1, 1024) as u32, 256)
}

/// `wirespeed_gather`'s parameters: the batch, the records (`src` adds
/// them), the offsets, their number and `rec`.
fn gather_args<'a>(
    batch: &'a mut (impl DeviceSink<u8> + ?Sized),
    src: impl FnOnce(KernelArgs<'a>) -> KernelArgs<'a>,
    offsets: &'a DeviceBuffer<u64>,
    rec: usize,
) -> KernelArgs<'a> {
    src(KernelArgs::new().write(batch)).read(offsets).value(offsets.len() as u64).value(rec as u64)
}

// ------------------------------------------------------------------ gathering

#[test]
fn kernel_types_are_send_sync_and_clone() {
    fn send_sync_clone<T: Send + Sync + Clone>() {}
    send_sync_clone::<Library>();
    send_sync_clone::<Kernel>();
    send_sync_clone::<LaunchConfig>();
}

#[test]
fn gathers_odd_sized_records_from_device_memory() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let data = pattern(1, 64 * REC + 17);
    let pool = device_copy(&d, &data);
    for (i, rec) in [REC, 1, 15, 16, 17, 100, 4099, 3 * REC].into_iter().enumerate() {
        let n = if rec == REC { 500 } else { 37 };
        let offs = offsets(n, rec, data.len(), i as u64);
        let offsets_dev = device_copy(&d, &offs);
        let mut batch = DeviceBuffer::<u8>::zeroed(&d, n * rec).unwrap();
        let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, rec);
        // SAFETY: wirespeed_gather's parameters; every offset leaves a whole
        // record within `pool`, and `batch` holds `n` records.
        unsafe { s.launch(&gather, config(n), args) }.unwrap().wait().unwrap();
        assert_batch(&batch.to_vec().unwrap(), &gathered(&data, &offs, rec));
    }
    drop((s, gather, pool));
    t.assert_clean();
}

/// Host memory the device reads in place: pinned, registered (mapped) in the
/// primary context, and registered in a registration context (the launch
/// runs in the primary one), each from the start and from a part of it.
#[test]
fn gathers_odd_sized_records_from_pinned_and_registered_host_memory() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let data = pattern(2, 40 * REC + 1000);
    let n = 120;
    let offs = offsets(n, REC, data.len() - 1000, 3);
    let offsets_dev = device_copy(&d, &offs);
    let mut batch = DeviceBuffer::<u8>::zeroed(&d, n * REC).unwrap();
    // Gathers from the host memory `$src` (whose first byte is byte `$skip`
    // of `data`) and checks the batch.
    macro_rules! check {
        ($src:expr, $skip:expr) => {{
            let src = $src;
            let args = gather_args(&mut batch, |a| a.read_host(&src), &offsets_dev, REC);
            // SAFETY: wirespeed_gather's parameters; every offset leaves a
            // whole record within the host memory given (`data.len() - 1000`
            // bytes or more), and `batch` holds `n` records.
            unsafe { s.launch(&gather, config(n), args) }.unwrap().wait().unwrap();
            assert_batch(&batch.to_vec().unwrap(), &gathered(&data[$skip..], &offs, REC));
        }};
    }

    let pinned = PinnedBuffer::from_slice(&data).unwrap();
    check!(pinned.slice(..).unwrap(), 0);
    check!(pinned.slice(1000..).unwrap(), 1000);

    let mapped = RegisterFlags::new().mapped(true);
    let reg = HostRegistration::new(Pages::new(&data), mapped).unwrap();
    check!(reg.slice(..).unwrap(), 0);
    check!(reg.slice(1000..).unwrap(), 1000);
    drop(reg);

    let ctx = std::sync::Arc::new(RegistrationContext::new(&d).unwrap());
    let reg = HostRegistration::new_in(&ctx, Pages::new(&data), mapped).unwrap();
    check!(reg.slice(..).unwrap(), 0);
    drop((reg, ctx, pinned, s, gather, offsets_dev, batch));
    t.assert_clean();
}

/// Many launches with their `Pending`s forgotten, their kernel and library
/// dropped while they are queued, and their buffers dropped right after, in
/// a scrambled order: every launch runs before the library goes (dropping
/// the last kernel waits for them), every buffer's `Drop` waits for the
/// launches that use it, and nothing is left behind.
#[test]
#[allow(clippy::forget_non_drop)] // forgetting the `Pending` is the point
fn forgotten_launches_keep_their_library_and_buffers_until_they_complete() {
    let t = start();
    t.set_delay_us(300); // the launches lag behind the host (emulator)
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let before = t.counters().map(|c| c.kernel_launches);
    let n = 16;
    let mut sets: Vec<_> = (0..24u64)
        .map(|i| {
            let data = pattern(10 + i, 24 * REC);
            let offs = offsets(n, REC, data.len(), i);
            let want = gathered(&data, &offs, REC);
            let src = PinnedBuffer::from_slice(&data).unwrap();
            (src, device_copy(&d, &offs), DeviceBuffer::<u8>::zeroed(&d, n * REC).unwrap(), want)
        })
        .collect();
    for (i, (src, offsets_dev, batch, _)) in sets.iter_mut().enumerate() {
        let pool = (i % 2 == 0).then(|| device_copy(&d, &pattern(10 + i as u64, 24 * REC)));
        let args = match &pool {
            Some(pool) => gather_args(batch, |a| a.read(pool), offsets_dev, REC),
            None => gather_args(batch, |a| a.read_host(&*src), offsets_dev, REC),
        };
        // SAFETY: wirespeed_gather's parameters; every offset leaves a whole
        // record within the source (24 records long), `batch` holds `n`.
        std::mem::forget(unsafe { s.launch(&gather, config(n), args) }.unwrap());
        drop(pool); // waits for the launch that reads it
    }
    drop(gather); // the last handle: waits for every launch, then unloads
    if let (Some(c), Some(before)) = (t.counters(), before) {
        assert_eq!(c.libraries, 0);
        assert_eq!(c.kernel_launches, before + 24, "every launch ran before the library was unloaded");
    }
    // Sources first (their Drop waits), then every other batch unread.
    let mut kept = Vec::new();
    for (i, (src, offsets_dev, batch, want)) in sets.into_iter().enumerate() {
        drop((src, offsets_dev));
        if i % 3 == 0 {
            kept.push((batch, want));
        }
    }
    for (batch, want) in kept {
        assert_batch(&batch.to_vec().unwrap(), &want);
    }
    drop(s);
    t.assert_clean();
}

/// Dropping the last handle of a library blocks while a launch of its
/// kernels is queued (the emulator holds the stream back), then unloads.
#[test]
#[allow(clippy::forget_non_drop)] // forgetting the `Pending` is the point
fn the_last_handle_of_a_library_waits_for_queued_launches() {
    let t = start();
    if !t.emulated() {
        return; // holding a stream back needs the emulator
    }
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let library = gather.library();
    let data = pattern(20, 8 * REC);
    let pool = device_copy(&d, &data);
    let offs = offsets(8, REC, data.len(), 1);
    let offsets_dev = device_copy(&d, &offs);
    let mut batch = DeviceBuffer::<u8>::zeroed(&d, 8 * REC).unwrap();
    t.emu().hold(true);
    let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, REC);
    // SAFETY: wirespeed_gather's parameters; the offsets leave whole records within `pool`.
    std::mem::forget(unsafe { s.launch(&gather, config(8), args) }.unwrap());
    drop(library);
    let dropper = std::thread::spawn(move || drop(gather));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (waited, loaded) = (!dropper.is_finished(), t.counters().unwrap().libraries);
    t.emu().hold(false);
    dropper.join().unwrap();
    assert!(waited, "the library's last handle must wait for the queued launch");
    assert_eq!(loaded, 1);
    assert_eq!(t.counters().unwrap().libraries, 0);
    assert_batch(&batch.to_vec().unwrap(), &gathered(&data, &offs, REC));
    drop((s, pool, offsets_dev, batch));
    t.assert_clean();
}

// ------------------------------------------------------------------ ordering

/// A launch reading a buffer that another stream writes runs after the
/// write; a launch writing a buffer runs after another stream's read of it,
/// and before another stream's later read.
#[test]
fn launches_are_ordered_with_other_streams_uses_of_their_buffers() {
    let t = start();
    let d = dev();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let gather = gather_kernel();
    let n = 32;
    let data = pattern(30, 40 * REC);
    let offs = offsets(n, REC, data.len(), 5);
    let offsets_dev = device_copy(&d, &offs);
    let src = PinnedBuffer::from_slice(&data).unwrap();
    let mut pool = DeviceBuffer::<u8>::zeroed(&d, data.len()).unwrap();
    let mut batch = DeviceBuffer::<u8>::zeroed(&d, n * REC).unwrap();
    t.set_delay_us(20_000);

    // Read after another stream's write: the launch on `b` waits for the copy on `a`.
    a.copy_to_device(&src, &mut pool).unwrap().detach();
    let args = gather_args(&mut batch, |x| x.read(&pool), &offsets_dev, REC);
    // SAFETY: wirespeed_gather's parameters; the offsets leave whole records within `pool`.
    unsafe { b.launch(&gather, config(n), args) }.unwrap().detach();
    // Read of the launch's write on another stream: the copy on `a` waits
    // for it (and then takes longer than anything else here).
    let mut first = PinnedBuffer::<u8>::new(n * REC).unwrap();
    let offs2 = offsets(n, REC, data.len(), 6);
    let offsets2_dev = device_copy(&d, &offs2);
    t.set_delay_us(60_000);
    a.copy_to_host(&batch, &mut first).unwrap().detach();
    // Write after another stream's read: this launch (other records, no
    // delay, right behind the first launch on `b`) waits for the copy above
    // to have read the first batch. (Its records were copied in
    // synchronously: no other use orders it after `a`.)
    t.set_delay_us(0);
    let pool2 = device_copy(&d, &data);
    let args = gather_args(&mut batch, |x| x.read(&pool2), &offsets2_dev, REC);
    // SAFETY: as above.
    unsafe { b.launch(&gather, config(n), args) }.unwrap().detach();
    assert_batch(first.as_slice().unwrap(), &gathered(&data, &offs, REC));
    assert_batch(&batch.to_vec().unwrap(), &gathered(&data, &offs2, REC));
    drop((a, b, gather, offsets_dev, offsets2_dev, src, pool, pool2, batch, first));
    t.assert_clean();
}

/// The records and the batch as two parts of one buffer (one fence, read and
/// written by one launch); then two threads launching between parts of two
/// buffers in opposite directions, whose launches lock both buffers' fences
/// (in one order: they cannot deadlock).
#[test]
fn parts_of_one_buffer_and_launches_in_opposite_directions() {
    let t = start();
    let _watchdog = Watchdog::new(120);
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let n = 10;
    let data = pattern(40, 20 * REC);
    let offs = offsets(n, REC, data.len(), 9);
    let offsets_dev = device_copy(&d, &offs);
    let mut buf = DeviceBuffer::<u8>::zeroed(&d, data.len() + n * REC).unwrap();
    {
        let (mut records, mut batch) = buf.split_at_mut(data.len()).unwrap();
        let src = PinnedBuffer::from_slice(&data).unwrap();
        s.copy_to_device(&src, &mut records).unwrap().detach();
        let args = gather_args(&mut batch, |a| a.read(&records), &offsets_dev, REC);
        // SAFETY: wirespeed_gather's parameters; the offsets leave whole
        // records within `records`, and `batch` holds `n` records.
        unsafe { s.launch(&gather, config(n), args) }.unwrap().detach();
    }
    let all = buf.to_vec().unwrap(); // waits for both parts
    assert_batch(&all[data.len()..], &gathered(&data, &offs, REC));

    let records_then_room = [&data[..], &vec![0u8; n * REC][..]].concat();
    let (mut x, mut y) = (device_copy(&d, &records_then_room), device_copy(&d, &records_then_room));
    {
        let (x_records, mut x_batch) = x.split_at_mut(data.len()).unwrap();
        let (y_records, mut y_batch) = y.split_at_mut(data.len()).unwrap();
        std::thread::scope(|scope| {
            for (records, batch) in [(&x_records, &mut y_batch), (&y_records, &mut x_batch)] {
                let (gather, offsets_dev) = (&gather, &offsets_dev);
                scope.spawn(move || {
                    let s = Stream::new(&dev()).unwrap();
                    for _ in 0..100 {
                        let args = gather_args(&mut *batch, |a| a.read(records), offsets_dev, REC);
                        // SAFETY: as above.
                        unsafe { s.launch(gather, config(n), args) }.unwrap().detach();
                    }
                });
            }
        });
    }
    assert_batch(&x.to_vec().unwrap()[data.len()..], &gathered(&data, &offs, REC));
    assert_batch(&y.to_vec().unwrap()[data.len()..], &gathered(&data, &offs, REC));
    drop((s, gather, offsets_dev, buf, x, y));
    t.assert_clean();
}

// ------------------------------------------------------------------ errors

#[track_caller]
fn assert_invalid(e: &Error, call: &str) {
    assert!(matches!(e, Error::InvalidArgument { .. }), "expected InvalidArgument from {call}, got {e:?}");
    assert_eq!(e.call(), call, "{e}");
}

#[test]
fn names_and_text_the_library_does_not_have() {
    let t = start();
    let library = Library::load_ptx(GATHER_PTX).unwrap();
    let e = library.kernel("wirespeed_scatter").unwrap_err();
    assert!(matches!(e, Error::Cuda { .. }), "{e:?}");
    assert_eq!(e.call(), "cudaLibraryGetKernel");
    if t.emulated() {
        assert_eq!(e.code(), Some(cudaError::cudaErrorSymbolNotFound.0), "{e}");
        assert!(e.to_string().contains("cudaErrorSymbolNotFound"), "{e}");
    }
    assert_invalid(&library.kernel("wirespeed\0gather").unwrap_err(), "Library::kernel");
    let e = Library::load_ptx("not\0ptx").unwrap_err();
    assert_invalid(&e, "Library::load_ptx");
    assert!(e.to_string().contains("NUL byte at 3"), "{e}");
    if t.emulated() {
        // The emulator checks the text is PTX at load (a real runtime may defer it).
        let e = Library::load_ptx("not ptx").unwrap_err();
        assert_eq!((e.call(), e.code()), ("cudaLibraryLoadData", Some(cudaError::cudaErrorInvalidPtx.0)));
    }
    drop(library);
    clear_last_error();
    t.assert_clean();
}

/// A zero dimension and a value wider than a slot are refused before CUDA
/// is called; a block larger than any device allows is CUDA's error. None
/// enqueues anything: the buffers are idle at once.
#[test]
fn bad_configs_and_arguments_are_typed_errors_and_enqueue_nothing() {
    let t = start();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let pool = DeviceBuffer::<u8>::zeroed(&d, 4 * REC).unwrap();
    let offsets_dev = device_copy(&d, &[0u64, REC as u64]);
    let mut batch = DeviceBuffer::<u8>::zeroed(&d, 2 * REC).unwrap();
    let launches = t.emulated().then(|| t.emu().call_count("cudaLaunchKernel").unwrap());
    for bad in [
        LaunchConfig::linear(0, 256),
        LaunchConfig::linear(1, 0),
        LaunchConfig::linear(1, 256).grid([1, 0, 1]),
        LaunchConfig::linear(1, 256).block([32, 1, 0]),
    ] {
        let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, REC);
        // SAFETY: wirespeed_gather's parameters; the offsets leave whole records within `pool`.
        let e = unsafe { s.launch(&gather, bad, args) }.unwrap_err();
        assert_invalid(&e, "Stream::launch");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
    let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, REC).value(0u128);
    // SAFETY: never enqueued (the u128 is refused); otherwise as above.
    let e = unsafe { s.launch(&gather, config(2), args) }.unwrap_err();
    assert_invalid(&e, "KernelArgs::value");
    assert!(e.to_string().contains("parameter 5") && e.to_string().contains("16 bytes"), "{e}");
    if let Some(before) = launches {
        assert_eq!(t.emu().call_count("cudaLaunchKernel").unwrap(), before, "refused before CUDA");
    }
    if t.emulated() {
        // Host memory the device cannot address (the lookup made to fail).
        let host = PinnedBuffer::<u8>::new(4 * REC).unwrap();
        let invalid = cudaError::cudaErrorInvalidValue.0;
        assert!(t.emu().inject_fault("cudaHostGetDevicePointer", 1, invalid, false));
        let args = gather_args(&mut batch, |a| a.read_host(&host), &offsets_dev, REC);
        // SAFETY: as above, with `host` as the records.
        let e = unsafe { s.launch(&gather, config(2), args) }.unwrap_err();
        assert_eq!((e.call(), e.code()), ("cudaHostGetDevicePointer", Some(invalid)), "{e}");
        assert!(e.hint().unwrap().contains("RegisterFlags::mapped"), "{e}");
        assert_eq!(t.emu().call_count("cudaLaunchKernel").unwrap(), launches.unwrap_or(0), "refused before the launch");
    }
    let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, REC);
    // SAFETY: as above.
    let e = unsafe { s.launch(&gather, LaunchConfig::linear(1, 2048), args) }.unwrap_err();
    // What the runtime answers a block of too many threads: CUDA 13's
    // cudaErrorInvalidValue, CUDA 12.9's cudaErrorInvalidConfiguration.
    let refused = [cudaError::cudaErrorInvalidValue.0, cudaError::cudaErrorInvalidConfiguration.0];
    assert!(e.call() == "cudaLaunchKernel" && e.code().is_some_and(|c| refused.contains(&c)), "{e}");
    clear_last_error();
    assert!(batch.to_vec().unwrap().iter().all(|&b| b == 0), "nothing ran");
    drop((s, gather, pool, offsets_dev, batch));
    t.assert_clean();
}

#[test]
fn a_runtime_without_the_library_functions_is_a_typed_error_saying_what_to_use() {
    let e = Error::Load(LoadError::RuntimeTooOld {
        library: "libcudart.so.12".into(),
        version: 12040,
        symbol: "cudaLibraryLoadData".into(),
        needed_for: "loading kernels at run time",
    });
    let text = e.to_string();
    assert!(text.contains("cudaLibraryLoadData") && text.contains("12.4"), "{text}");
    assert!(e.hint().unwrap().contains("12.5"), "{text}");
}

// ------------------------------------------------------------------ child processes

#[test]
fn memory_of_another_device_is_refused() {
    run_child("child_two_devices", &[("CUDA_EMU_DEVICES", "2")]);
}

#[test]
#[ignore = "runs in a child process started by memory_of_another_device_is_refused"]
fn child_two_devices() {
    if !is_child("child_two_devices") {
        return;
    }
    let t = start_emulated();
    let (d0, d1) = (Device::get(0).unwrap(), Device::get(1).unwrap());
    let gather = gather_kernel(); // one library for both devices
    let data = pattern(50, 4 * REC);
    let offs = [REC as u64, 0];
    let run = |s: &Stream, pool: &DeviceBuffer<u8>, offsets_dev: &DeviceBuffer<u64>, batch: &mut DeviceBuffer<u8>| {
        let args = gather_args(batch, |a| a.read(pool), offsets_dev, REC);
        // SAFETY: wirespeed_gather's parameters; the offsets leave whole records within `pool`.
        unsafe { s.launch(&gather, config(2), args) }.map(|p| p.wait())
    };
    let s1 = Stream::new(&d1).unwrap();
    let (pool0, offsets0) = (device_copy(&d0, &data), device_copy(&d0, &offs));
    let mut batch0 = DeviceBuffer::<u8>::zeroed(&d0, 2 * REC).unwrap();
    let e = run(&s1, &pool0, &offsets0, &mut batch0).unwrap_err();
    assert_invalid(&e, "Stream::launch");
    assert!(e.to_string().contains("device 0") && e.to_string().contains("device 1"), "{e}");
    let (pool1, offsets1) = (device_copy(&d1, &data), device_copy(&d1, &offs));
    let mut batch1 = DeviceBuffer::<u8>::zeroed(&d1, 2 * REC).unwrap();
    run(&s1, &pool1, &offsets1, &mut batch1).unwrap().unwrap();
    assert_batch(&batch1.to_vec().unwrap(), &gathered(&data, &offs, REC));
    let s0 = Stream::new(&d0).unwrap();
    run(&s0, &pool0, &offsets0, &mut batch0).unwrap().unwrap();
    assert_batch(&batch0.to_vec().unwrap(), &gathered(&data, &offs, REC));
    drop((s0, s1, gather, pool0, offsets0, batch0, pool1, offsets1, batch1));
    t.assert_clean();
    child_ran("child_two_devices");
}

#[test]
fn a_device_fault_is_a_sticky_error() {
    run_child("child_device_fault", &[]);
}

/// An offset past the records: the emulated device faults (sticky
/// `cudaErrorIllegalAddress`), the wait reports it, and the library and the
/// buffers, whose launch cannot be proven complete, are leaked, not freed.
#[test]
#[ignore = "runs in a child process started by a_device_fault_is_a_sticky_error"]
fn child_device_fault() {
    if !is_child("child_device_fault") {
        return;
    }
    let t: Ctx = start_emulated();
    let d = dev();
    let s = Stream::new(&d).unwrap();
    let gather = gather_kernel();
    let pool = DeviceBuffer::<u8>::zeroed(&d, 4 * REC).unwrap();
    let offsets_dev = device_copy(&d, &[0u64, 4 * REC as u64]);
    let mut batch = DeviceBuffer::<u8>::zeroed(&d, 2 * REC).unwrap();
    let args = gather_args(&mut batch, |a| a.read(&pool), &offsets_dev, REC);
    // SAFETY: deliberately not: the second offset is past `pool`. The
    // emulator checks every address and faults instead of touching it.
    let e = unsafe { s.launch(&gather, config(2), args) }.unwrap().wait().unwrap_err();
    assert!(e.is_sticky(), "{e}");
    assert_eq!(e.code(), Some(cudaError::cudaErrorIllegalAddress.0), "{e}");
    assert!(e.hint().unwrap().contains("restart the process"), "{e}");
    drop((gather, batch, pool, offsets_dev, s));
    let c = t.counters().unwrap();
    assert_eq!((c.libraries, c.device_allocs), (1, 3), "leaked, not freed under a launch that may run");
    child_ran("child_device_fault");
}
