//! Interop with a runtime built on cudarc (the Rust CUDA crate most users
//! have): the streamer fills a `CudaSlice<u8>` that cudarc allocated, ordered
//! after cudarc's stream (which allocated and cleared it) with
//! `StartOptions::after`, and cudarc's stream copies the landed bytes to a
//! second `CudaSlice` after `Transfer::then_on`, with no host synchronization
//! in between; then the bytes are checked.
//!
//! cudarc talks to the driver (`libcuda`), which the emulator does not
//! provide: on the emulated runtime this test says so and returns. On a GPU
//! machine (and whenever `CUDA_REQUIRED=1`, where the harness refuses the
//! emulator) it runs.

use std::sync::Arc;

use cudarc::driver::{CudaContext, DevicePtrMut};
use wirespeed_cuda::{Device, DeviceSliceMut, Stream};
use wirespeed_pinned::{PinBudget, StartOptions, Strategy, StreamConfig, Streamer};
use wirespeed_tests::{TempDir, Watchdog, open_mapped, start, write_pattern_file};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// One pass: `len` bytes of `file` into a fresh `CudaSlice`, then a copy on
/// cudarc's stream to another, checked against `data`.
fn pass(strategy: Strategy, path: &std::path::Path, data: &[u8]) -> Res {
    let len = data.len();
    let dev = Device::get(0)?;
    let file = open_mapped(path)?;
    let streamer = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(256 << 20)))?;

    // The caller's runtime: a cudarc context (the device's primary context,
    // as the CUDA runtime's), a stream of its own, and its own memory.
    let ctx = CudaContext::new(0)?;
    let theirs = ctx.new_stream()?;
    let mut landing = theirs.alloc_zeros::<u8>(len)?; // allocated and cleared on `theirs`, asynchronously
    let mut copy = theirs.alloc_zeros::<u8>(len)?;
    let landing_ptr = {
        let (p, _record) = landing.device_ptr_mut(&theirs);
        p
    };
    // SAFETY: cudarc's stream handle is a live CUstream of device 0's primary
    // context (the runtime's), alive until `theirs` drops, after `mine`.
    let mine = unsafe { Stream::from_raw(theirs.cu_stream().cast(), dev, false) }?;
    // SAFETY: `landing` is `len` bytes of device memory of device 0, alive
    // until the end of this function; nothing but the transfer touches it
    // until the copy ordered after `then_on` below, and `wait` returns before
    // it is freed.
    let dst = unsafe { DeviceSliceMut::<u8>::from_raw_parts(landing_ptr as usize as *mut u8, len, dev) }?;

    // After the allocation and clearing on `theirs`; then `theirs` waits for
    // the copies, on the device.
    let transfer = streamer.start_with(&file, 0..len as u64, dst, StartOptions::new().after(&mine))?;
    transfer.then_on(&mine)?;
    theirs.memcpy_dtod(&landing, &mut copy)?; // runs after the transfer's last copy
    let copied = theirs.clone_dtoh(&copy)?; // the first host wait: cudarc synchronizes its stream
    let landed = theirs.clone_dtoh(&landing)?;
    let report = transfer.wait()?;
    assert_eq!(report.bytes, len as u64);
    assert!(copied == data, "{strategy}: the copy on cudarc's stream did not see the transfer's bytes");
    assert!(landed == data, "{strategy}: the CudaSlice does not hold the file's bytes");
    drop((mine, streamer));
    ctx.check_err()?;
    Ok(())
}

#[test]
fn a_cudarc_runtime_streams_into_its_own_memory_and_orders_its_stream_after() {
    let t = start();
    if t.emulated() {
        eprintln!("note: the emulated runtime has no driver for cudarc: cudarc interop skipped (it runs on a GPU)");
        return;
    }
    let _w = Watchdog::new(300);
    let dir = TempDir::new("cudarc");
    let len = (64 << 20) + 12345;
    let path = dir.join("data.bin");
    let data = Arc::new(write_pattern_file(&path, 77, len));
    for strategy in [
        Strategy::WholeFile,
        Strategy::Windows { window: 8 << 20, in_flight: 2 },
        Strategy::Ring { slots: 8, slot: 4 << 20, threads: 4 },
    ] {
        pass(strategy, &path, &data).unwrap_or_else(|e| panic!("{strategy}: {e}"));
    }
}
