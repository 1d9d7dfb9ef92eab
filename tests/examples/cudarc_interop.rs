//! A runtime built on cudarc streams a file into its own `CudaSlice`, and its
//! own stream runs work after the transfer with no host wait in between.
//!
//!   cargo run -p wirespeed-tests --example cudarc_interop [FILE]
//!
//! Without FILE it writes a 256 MiB test file to the temporary folder. Needs a
//! GPU and its driver (cudarc loads `libcuda` at run time); without one it says
//! so and exits.
//!
//! The steps that matter:
//!
//! 1. cudarc owns the memory (`CudaSlice`) and a stream; the streamer gets the
//!    slice's device address through the `unsafe`
//!    `DeviceSliceMut::from_raw_parts`, and cudarc's stream through the
//!    `unsafe` `Stream::from_raw` (not owned: cudarc destroys it).
//! 2. `StartOptions::after(&theirs)`: the copies wait (on the device) for what
//!    cudarc's stream did so far: here, allocating and clearing the slice.
//! 3. `Transfer::then_on(&theirs)`: what cudarc enqueues afterwards (a kernel;
//!    here a device-to-device copy) waits (on the device) for the copies.
//! 4. Until the transfer is observed complete (`wait`, or work ordered after
//!    `then_on`), nothing else touches the slice, and it is not freed.

use std::time::Instant;

use cudarc::driver::{CudaContext, DevicePtrMut};
use wirespeed_cuda::{Device, DeviceSliceMut, Stream};
use wirespeed_pinned::{MappedFile, PinBudget, StartOptions, Strategy, StreamConfig, Streamer};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res {
    let dev = match Device::get(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no GPU here ({e}): this example needs one and its driver");
            return Ok(());
        }
    };
    let (path, made) = match std::env::args_os().nth(1) {
        Some(p) => (std::path::PathBuf::from(p), false),
        None => {
            let p = std::env::temp_dir().join(format!("cudarc-interop-{}.bin", std::process::id()));
            let data: Vec<u8> = (0..256u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            std::fs::write(&p, data)?;
            (p, true)
        }
    };
    let res = run(dev, &path);
    if made {
        let _ = std::fs::remove_file(&path);
    }
    res
}

fn run(dev: Device, path: &std::path::Path) -> Res {
    // SAFETY: nobody writes or truncates the file while it is mapped (the
    // example's own file, or one you name and leave alone meanwhile).
    let file = unsafe { MappedFile::open(path) }?;
    let len = usize::try_from(file.len())?;
    let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(4 << 30)))?;

    // The runtime's side: cudarc's context, stream and memory.
    let ctx = CudaContext::new(dev.ordinal())?;
    let theirs = ctx.new_stream()?;
    let mut weights = theirs.alloc_zeros::<u8>(len)?;
    let mut staged = theirs.alloc_zeros::<u8>(len)?;
    let address = {
        let (p, _record) = weights.device_ptr_mut(&theirs);
        p
    };

    // 1. Hand the slice and the stream to the streamer.
    // SAFETY: cudarc's stream is a live stream of the device's primary
    // context, which the CUDA runtime uses too, and outlives `mine`.
    let mine = unsafe { Stream::from_raw(theirs.cu_stream().cast(), dev, false) }?;
    // SAFETY: `weights` is `len` bytes of device memory of `dev`, alive until
    // the end of this function; nothing touches it but the transfer, then
    // work ordered after `then_on`, and `wait` returns before it is freed.
    let dst = unsafe { DeviceSliceMut::<u8>::from_raw_parts(address as usize as *mut u8, len, dev) }?;

    // 2. and 3.
    let t0 = Instant::now();
    let transfer = streamer.start_with(&file, 0..len as u64, dst, StartOptions::new().after(&mine))?;
    transfer.then_on(&mine)?;
    let enqueued = t0.elapsed();
    theirs.memcpy_dtod(&weights, &mut staged)?; // stands for a kernel reading `weights`

    // 4. Observe the end, then check.
    let report = transfer.wait()?;
    let back = theirs.clone_dtoh(&staged)?;
    let ok = back.as_slice() == file.as_bytes();
    println!("{report}");
    println!(
        "then_on returned after {:.1} ms; the copy on cudarc's stream saw {} bytes",
        enqueued.as_secs_f64() * 1e3,
        if ok { "the file's" } else { "OTHER" }
    );
    drop(mine);
    ctx.check_err()?;
    if !ok {
        return Err("the bytes on the device differ from the file".into());
    }
    Ok(())
}
