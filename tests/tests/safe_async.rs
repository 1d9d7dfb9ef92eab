//! Asynchrony is real on the emulator (always used by this binary, also on a
//! GPU machine): with a delay per stream operation, raw CUDA calls that skip a
//! synchronization observe stale data, which is what makes a test that omits a
//! synchronization fail in CI. The `cuda-safe` equivalents always observe the
//! right data, because host access and `Drop` wait on the buffers' fences and
//! other streams are ordered after them.

use std::ffi::c_void;
use wirespeed_cuda::{Device, DeviceBuffer, EventOptions, PinnedBuffer, Stream};
use wirespeed_cuda_sys::{cudaMemcpyKind, cudaStream_t};
use wirespeed_tests::{pattern, start_emulated};

/// Long enough that the host always gets ahead of the stream.
const DELAY_US: u32 = 100_000;

fn api() -> &'static wirespeed_cuda_sys::Api {
    wirespeed_cuda_sys::runtime().expect("runtime").api()
}

#[track_caller]
fn ok(code: wirespeed_cuda_sys::cudaError_t) {
    assert_eq!(code.0, 0, "{}", wirespeed_cuda_sys::runtime().unwrap().error_name(code));
}

/// Raw allocations, freed (and checked) by hand.
struct Raw {
    pinned: Vec<*mut c_void>,
    device: Vec<*mut c_void>,
    streams: Vec<cudaStream_t>,
}

impl Raw {
    fn new() -> Raw {
        // SAFETY: plain value argument.
        ok(unsafe { (api().cudaSetDevice)(0) });
        Raw { pinned: vec![], device: vec![], streams: vec![] }
    }
    fn pinned(&mut self, n: usize) -> &'static mut [u8] {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid place for the pointer.
        ok(unsafe { (api().cudaHostAlloc)(&mut p, n, 0) });
        self.pinned.push(p);
        // SAFETY: `n` fresh bytes, freed only in `free_all`, after which no slice is used.
        unsafe {
            std::ptr::write_bytes(p.cast::<u8>(), 0, n);
            std::slice::from_raw_parts_mut(p.cast(), n)
        }
    }
    fn device(&mut self, n: usize) -> *mut c_void {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid place for the pointer; then `n` bytes of it are set,
        // and the legacy stream (where cudaMemset runs, asynchronously) is waited
        // for, since the non-blocking streams used next are not ordered after it.
        unsafe {
            ok((api().cudaMalloc)(&mut p, n));
            ok((api().cudaMemset)(p, 0, n));
            ok((api().cudaStreamSynchronize)(std::ptr::null_mut()));
        }
        self.device.push(p);
        p
    }
    fn stream(&mut self) -> cudaStream_t {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a valid place for the handle.
        ok(unsafe { (api().cudaStreamCreateWithFlags)(&mut s, wirespeed_cuda_sys::cudaStreamNonBlocking) });
        self.streams.push(s);
        s
    }
    fn free_all(self) {
        // SAFETY: every handle is ours, idle after the synchronization, and freed once.
        unsafe {
            ok((api().cudaDeviceSynchronize)());
            for s in self.streams {
                ok((api().cudaStreamDestroy)(s));
            }
            for p in self.device {
                ok((api().cudaFree)(p));
            }
            for p in self.pinned {
                ok((api().cudaFreeHost)(p));
            }
        }
    }
}

/// # Safety
/// As `cudaMemcpyAsync`.
unsafe fn copy_async(dst: *mut c_void, src: *const c_void, n: usize, kind: cudaMemcpyKind, s: cudaStream_t) {
    // SAFETY: the caller's contract.
    ok(unsafe { (api().cudaMemcpyAsync)(dst, src, n, kind, s) });
}

/// # Safety
/// As `cudaMemcpy`.
unsafe fn copy_sync(dst: *mut c_void, src: *const c_void, n: usize, kind: cudaMemcpyKind) {
    // SAFETY: the caller's contract.
    ok(unsafe { (api().cudaMemcpy)(dst, src, n, kind) });
}

fn sync(s: cudaStream_t) {
    // SAFETY: a live stream.
    ok(unsafe { (api().cudaStreamSynchronize)(s) });
}

fn h2d() -> cudaMemcpyKind {
    cudaMemcpyKind::cudaMemcpyHostToDevice
}
fn d2h() -> cudaMemcpyKind {
    cudaMemcpyKind::cudaMemcpyDeviceToHost
}

#[test]
fn raw_calls_without_synchronization_see_stale_data() {
    let t = start_emulated();
    let n = 1 << 16;
    let want = pattern(1, n);
    let mut raw = Raw::new();
    let src = raw.pinned(n);
    src.copy_from_slice(&want);
    let dst = raw.pinned(n);
    let dev = raw.device(n);
    let s = raw.stream();

    // H2D from pinned memory (delayed), then read the device at once, with an
    // undelayed synchronous copy (the legacy stream does not wait for a
    // non-blocking stream): still the old zeros.
    t.set_delay_us(DELAY_US);
    // SAFETY: pinned and device ranges of `n` bytes that stay alive until free_all.
    unsafe { copy_async(dev, src.as_ptr().cast(), n, h2d(), s) };
    t.set_delay_us(0);
    let mut seen = vec![0xAAu8; n];
    // SAFETY: as above; `seen` is `n` writable bytes.
    unsafe { copy_sync(seen.as_mut_ptr().cast(), dev, n, d2h()) };
    assert!(seen.iter().all(|&b| b == 0), "a read without synchronization saw the new data");

    // D2H into pinned memory, then read the pinned memory at once: stale.
    t.set_delay_us(DELAY_US);
    // SAFETY: as above.
    unsafe { copy_async(dst.as_mut_ptr().cast(), dev, n, d2h(), s) };
    assert!(dst.iter().all(|&b| b == 0), "pinned memory changed before the stream reached the copy");
    sync(s);
    assert_eq!(&dst[..], &want[..], "after the synchronization the data is there");

    // Mutating the pinned source while its copy is queued changes what is copied.
    // SAFETY: as above.
    unsafe { copy_async(dev, src.as_ptr().cast(), n, h2d(), s) };
    src.fill(0x77);
    sync(s);
    t.set_delay_us(0);
    // SAFETY: as above.
    unsafe { copy_sync(seen.as_mut_ptr().cast(), dev, n, d2h()) };
    assert!(seen.iter().all(|&b| b == 0x77), "the copy read the source after the host wrote it");

    // Two non-blocking streams are not ordered with each other.
    let s2 = raw.stream();
    src.copy_from_slice(&want);
    dst.fill(0);
    t.set_delay_us(DELAY_US);
    // SAFETY: as above.
    unsafe { copy_async(dev, src.as_ptr().cast(), n, h2d(), s) };
    t.set_delay_us(0);
    // SAFETY: as above.
    unsafe { copy_async(dst.as_mut_ptr().cast(), dev, n, d2h(), s2) };
    sync(s2);
    assert!(dst.iter().all(|&b| b == 0x77), "stream 2 read before stream 1 wrote");
    raw.free_all();
    t.assert_clean();
}

#[test]
fn cuda_safe_equivalents_see_the_right_data() {
    let t = start_emulated();
    let n = 1 << 16;
    let want = pattern(1, n);
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let mut src = PinnedBuffer::from_slice(&want).unwrap();
    let mut dst = PinnedBuffer::<u8>::new(n).unwrap();
    let mut dev = DeviceBuffer::<u8>::zeroed(&d, n).unwrap();
    t.set_delay_us(DELAY_US);

    // H2D, then read the device buffer: waits for the copy.
    s.copy_to_device(&src, &mut dev).unwrap().detach();
    assert_eq!(dev.to_vec().unwrap(), want);

    // D2H, then read the pinned buffer: waits for the copy.
    s.copy_to_host(&dev, &mut dst).unwrap().detach();
    assert_eq!(dst.as_slice().unwrap(), want);

    // Mutating the pinned source waits for the copy that reads it.
    s.copy_to_device(&src, &mut dev).unwrap().detach();
    src.as_mut_slice().unwrap().fill(0x77);
    assert_eq!(dev.to_vec().unwrap(), want, "the copy saw the bytes of its time");

    // Two streams: the second is ordered after the first by the fence, with an
    // event on the device, not a host wait.
    let s2 = Stream::new(&d).unwrap();
    let emu = t.emu();
    let (waits, records, syncs) = (
        emu.call_count("cudaStreamWaitEvent").unwrap(),
        emu.call_count("cudaEventRecord").unwrap(),
        emu.call_count("cudaStreamSynchronize").unwrap(),
    );
    s.copy_to_device(&src, &mut dev).unwrap().detach();
    let p = s2.copy_to_host(&dev, &mut dst).unwrap();
    assert_eq!(emu.call_count("cudaStreamWaitEvent").unwrap(), waits + 1);
    assert_eq!(emu.call_count("cudaEventRecord").unwrap(), records + 1);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs, "no host wait to order the streams");
    assert!(!p.is_complete().unwrap());
    p.wait().unwrap();
    assert!(dst.as_slice().unwrap().iter().all(|&b| b == 0x77));

    // Reading a pinned buffer only waits for writes: a pending read of it does not block.
    s.copy_to_device(&src, &mut dev).unwrap().detach();
    let syncs = emu.call_count("cudaStreamSynchronize").unwrap();
    assert!(src.as_slice().unwrap().iter().all(|&b| b == 0x77));
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs, "a host read waits only for writes");
    s.synchronize().unwrap();
    drop((s, s2, src, dst, dev));
    t.assert_clean();
}

#[test]
fn pageable_async_copies_are_staged_synchronously() {
    let t = start_emulated();
    let n = 1 << 16;
    let want = pattern(2, n);
    let mut raw = Raw::new();
    let dev = raw.device(n);
    let s = raw.stream();
    t.set_delay_us(DELAY_US);
    // H2D from pageable memory: staged at the call, so writing the source at
    // once does not change what reaches the device.
    let mut src = want.clone();
    // SAFETY: `src` and `dev` hold `n` bytes; pageable sources are staged.
    unsafe { copy_async(dev, src.as_ptr().cast(), n, h2d(), s) };
    src.fill(0);
    drop(src); // even freeing it is fine
    sync(s);
    let mut seen = vec![0u8; n];
    // SAFETY: as above.
    unsafe { copy_sync(seen.as_mut_ptr().cast(), dev, n, d2h()) };
    assert_eq!(seen, want);
    // D2H into pageable memory: returns once the data is there.
    let mut into = vec![0u8; n];
    // SAFETY: as above.
    unsafe { copy_async(into.as_mut_ptr().cast(), dev, n, d2h(), s) };
    assert_eq!(into, want, "a copy into pageable memory is synchronous");
    raw.free_all();

    // cuda-safe reaches pageable memory only through the synchronous calls.
    let d = Device::get(0).unwrap();
    let mut b = DeviceBuffer::<u8>::new(&d, n).unwrap();
    let mut src = want.clone();
    b.copy_from_slice(&src).unwrap();
    src.fill(0);
    assert_eq!(b.to_vec().unwrap(), want);
    drop(b);
    t.assert_clean();
}

#[test]
fn status_while_work_is_queued() {
    let t = start_emulated();
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let src = PinnedBuffer::from_slice(&pattern(3, 4096)).unwrap();
    let mut dev = DeviceBuffer::<u8>::new(&d, 4096).unwrap();
    let timed = EventOptions::new().timing(true);
    let (a, b) = (wirespeed_cuda::Event::new(&d, timed).unwrap(), wirespeed_cuda::Event::new(&d, timed).unwrap());
    t.set_delay_us(DELAY_US);
    s.record(&a).unwrap();
    let p = s.copy_to_device(&src, &mut dev).unwrap();
    s.record(&b).unwrap();
    assert!(!p.is_complete().unwrap());
    assert!(!s.query().unwrap());
    assert!(!b.query().unwrap());
    // Not ready is a status for queries, an error (600) for elapsed time.
    let e = b.elapsed_ms(&a).unwrap_err();
    assert_eq!((e.call(), e.code()), ("cudaEventElapsedTime", Some(600)), "{e}");
    assert!(e.hint().unwrap().contains("not finished"));
    // Another stream waits for the event on the device.
    let s2 = Stream::new(&d).unwrap();
    s2.wait_event(&b).unwrap();
    let mut dev2 = DeviceBuffer::<u8>::zeroed(&d, 4096).unwrap();
    t.set_delay_us(0);
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = order.clone();
    s2.launch_host_fn(move || o.lock().unwrap().push("s2 after b")).unwrap();
    let o = order.clone();
    s.launch_host_fn(move || o.lock().unwrap().push("s after copy")).unwrap();
    s2.memset(&mut dev2, 1).unwrap().wait().unwrap();
    s.synchronize().unwrap();
    assert!(p.is_complete().unwrap());
    p.wait().unwrap();
    assert!(b.query().unwrap());
    assert!(b.elapsed_ms(&a).unwrap() >= 0.0);
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 2);
    assert!(order.contains(&"s2 after b"));
    drop((s, s2, src, dev, dev2, a, b));
    t.assert_clean();
}

#[test]
fn drop_waits_through_the_fence_before_freeing() {
    let t = start_emulated();
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 16;
    let src = PinnedBuffer::from_slice(&pattern(4, n)).unwrap();
    let emu = t.emu();
    t.set_delay_us(DELAY_US);
    // A device buffer dropped while a copy into it is queued: the fence makes
    // Drop wait for the stream (cudaStreamSynchronize) before cudaFree.
    let mut dev = DeviceBuffer::<u8>::new(&d, n).unwrap();
    s.copy_to_device(&src, &mut dev).unwrap().detach();
    let (syncs, copied) = (emu.call_count("cudaStreamSynchronize").unwrap(), emu.counters().bytes_copied);
    drop(dev);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs + 1);
    assert!(emu.counters().bytes_copied >= copied + n as u64);
    // Likewise a pinned buffer dropped while a copy out of it is queued.
    let mut dev = DeviceBuffer::<u8>::new(&d, n).unwrap();
    let tmp = PinnedBuffer::from_slice(&pattern(5, n)).unwrap();
    s.copy_to_device(&tmp, &mut dev).unwrap().detach();
    let syncs = emu.call_count("cudaStreamSynchronize").unwrap();
    drop(tmp);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs + 1);
    assert_eq!(dev.to_vec().unwrap(), pattern(5, n));
    // A buffer no stream uses is freed without any wait.
    let syncs = emu.call_count("cudaStreamSynchronize").unwrap();
    drop(dev);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs);
    drop((s, src));
    t.assert_clean();
}

/// One source read by three streams at once: its fence keeps every reader (the
/// first inline, the others beside it), host writes wait for all three, and a
/// stream reading again updates its own entry.
#[test]
fn one_source_read_by_several_streams() {
    let t = start_emulated();
    let d = Device::get(0).unwrap();
    let streams = [Stream::new(&d).unwrap(), Stream::new(&d).unwrap(), Stream::new(&d).unwrap()];
    let n = 1 << 16;
    let mut src = PinnedBuffer::from_slice(&pattern(6, n)).unwrap();
    let mut dsts: Vec<DeviceBuffer<u8>> = (0..3).map(|_| DeviceBuffer::new(&d, n).unwrap()).collect();
    let emu = t.emu();
    t.set_delay_us(DELAY_US / 10);
    for (s, dst) in streams.iter().zip(dsts.iter_mut()) {
        s.copy_to_device(&src, dst).unwrap().detach();
    }
    // The first stream reads again, into the second stream's buffer (ordered
    // after that stream's write through the buffer's own fence).
    streams[0].copy_to_device(&src, &mut dsts[1]).unwrap().detach();
    let syncs = emu.call_count("cudaStreamSynchronize").unwrap();
    // Writing the source from the host waits for every stream that reads it.
    src.as_mut_slice().unwrap().fill(0xEE);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs + 3, "one wait per reading stream");
    for dst in &dsts {
        assert_eq!(dst.to_vec().unwrap(), pattern(6, n), "each copy read the bytes before the host wrote");
    }
    // Nothing reads it any more: the next host write waits for nothing.
    let syncs = emu.call_count("cudaStreamSynchronize").unwrap();
    src.as_mut_slice().unwrap().fill(0x11);
    assert_eq!(emu.call_count("cudaStreamSynchronize").unwrap(), syncs);
    drop((streams, src, dsts));
    t.assert_clean();
}

/// The double-buffered upload of the crate docs under a long delay: each slot
/// is refilled only once its previous copy finished.
#[test]
fn double_buffering_under_delay() {
    let t = start_emulated();
    let d = Device::get(0).unwrap();
    let stream = Stream::new(&d).unwrap();
    let chunk = 1 << 12;
    let mut slots = [PinnedBuffer::<u32>::new(chunk).unwrap(), PinnedBuffer::<u32>::new(chunk).unwrap()];
    let mut on_gpu = DeviceBuffer::<u32>::zeroed(&d, 8 * chunk).unwrap();
    t.set_delay_us(20_000);
    for i in 0..8 {
        let slot = &mut slots[i % 2];
        slot.as_mut_slice().unwrap().fill(i as u32);
        let mut dst = on_gpu.slice_mut(i * chunk..(i + 1) * chunk).unwrap();
        stream.copy_to_device(slot, &mut dst).unwrap().detach();
    }
    let mut back = PinnedBuffer::<u32>::new(8 * chunk).unwrap();
    stream.copy_to_host(&on_gpu, &mut back).unwrap().wait().unwrap();
    for (i, c) in back.as_slice().unwrap().chunks(chunk).enumerate() {
        assert!(c.iter().all(|&v| v == i as u32), "chunk {i}");
    }
    drop((stream, slots, on_gpu, back));
    t.assert_clean();
}

#[test]
fn lanes_write_at_once_and_hand_every_copy_back_to_the_owner() {
    let t = start_emulated();
    let n = 1 << 16;
    let d = Device::get(0).unwrap();
    let (a, b) = (pattern(2, n / 2), pattern(3, n / 2));
    let (pa, pb) = (PinnedBuffer::from_slice(&a).unwrap(), PinnedBuffer::from_slice(&b).unwrap());
    let (s1, s2, s3) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mut dev = DeviceBuffer::<u8>::zeroed(&d, n).unwrap();
    let mut back = PinnedBuffer::<u8>::new(n).unwrap();
    t.set_delay_us(DELAY_US);
    let emu = t.emu();
    let waits = emu.call_count("cudaStreamWaitEvent").unwrap();

    // Two lanes, each on its own stream, write their halves: neither is
    // ordered after the other (no event wait between them).
    let lanes = wirespeed_cuda::DeviceSliceMut::from(&mut dev).detach().into_lanes(2);
    s1.copy_to_device(&pa, &mut lanes.lane(0).unwrap().slice_mut(..n / 2).unwrap()).unwrap().detach();
    s2.copy_to_device(&pb, &mut lanes.lane(1).unwrap().slice_mut(n / 2..).unwrap()).unwrap().detach();
    assert_eq!(emu.call_count("cudaStreamWaitEvent").unwrap(), waits, "lanes are not ordered against each other");
    lanes.join().release();

    // A third stream reading the buffer is ordered after both lanes, on the device.
    s3.copy_to_host(&dev, &mut back).unwrap().detach();
    assert_eq!(emu.call_count("cudaStreamWaitEvent").unwrap(), waits + 2, "ordered after each lane's stream");
    let got = back.as_slice().unwrap();
    assert_eq!((&got[..n / 2], &got[n / 2..]), (&a[..], &b[..]), "the reader ran before a lane's copy");

    // Dropping the lanes (no join) hands their records back too: host access waits for them.
    let lanes = wirespeed_cuda::DeviceSliceMut::from(&mut dev).detach().into_lanes(2);
    s2.copy_to_device(&pa, &mut lanes.lane(1).unwrap().slice_mut(n / 2..).unwrap()).unwrap().detach();
    drop(lanes);
    assert_eq!(dev.to_vec().unwrap()[n / 2..], a[..], "to_vec ran before the lane's copy");

    drop((s1, s2, s3, pa, pb, back, dev));
    t.assert_clean();
}
