//! A runtime author's use of `wirespeed-pinned` and `wirespeed-cuda`, written
//! from their documentation alone, outside the repository's workspace: a
//! program that owns device memory and a stream of its own, and plugs the
//! file streamer into them. Every step checks the bytes it got against the
//! file.
//!
//! ```text
//! cargo run --manifest-path downstream/Cargo.toml --features emulator -- --emulated   # no GPU
//! cargo run --manifest-path downstream/Cargo.toml --release                          # a GPU
//! ```
//!
//! `.ci/run` runs it on the emulated runtime; `scripts/gpu-bundle.sh` packs
//! its binary, which `.gpu/run.sh` runs on the GPU with the real runtime.
//!
//! The steps:
//!
//! 1. a file range into a sub-slice of a larger buffer, and two ranges at once
//!    into the two halves of `split_at_mut`;
//! 2. a range into a typed (`f32`) buffer sized from the range;
//! 3. a non-blocking `start`, polled with `is_done`, then `wait`;
//! 4. a transfer awaited as a `Future`, by a hand-written `block_on`;
//! 5. memory the runtime allocated itself (`DeviceSliceMut::from_raw_parts`):
//!    cleared on the runtime's stream, streamed into after that
//!    (`StartOptions::after`), then read by an operation on the same stream
//!    after `then_on`, with no host wait in between;
//! 6. the whole file streamed while the program holds a `PinnedRange` of part
//!    of it, by a streamer built with `StreamConfig`'s builders (verification,
//!    progress), its `Report` read field by field.
//!
//! `unsafe` is denied in the crate (`Cargo.toml`); two functions allow it:
//! [`open`], because mapping a file is `unsafe` (nobody may change it while
//! mapped), and [`runtime_memory`], the one place memory allocated outside
//! the crates enters them.

use std::future::Future;
use std::ops::Range;
use std::pin::pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
use wirespeed_pinned::{
    MappedFile, PinBudget, PinOptions, PinnedRange, Report, StartOptions, Strategy, StreamConfig, Streamer,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// `f32` values in the test file: value `i` is `i as f32` (exact below 2^24).
const FLOATS: u64 = 3 << 20;
/// Bytes after the floats, so that the file ends inside a page.
const TAIL: u64 = 1000;
/// A MiB, as a file offset and as a buffer index.
const MIB: u64 = 1 << 20;
const MIB_AT: usize = 1 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("downstream: every check passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("downstream: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Res<()> {
    if std::env::args().skip(1).any(|a| a == "--emulated") {
        if std::env::var("CUDA_REQUIRED").is_ok_and(|v| v == "1") {
            return Err("--emulated with CUDA_REQUIRED=1: the real runtime is required".into());
        }
        emulated()?;
    }
    let info = wirespeed_cuda::runtime_info()?;
    let dev = Device::get(0)?;
    println!("runtime: {} (CUDA {}.{})", info.path, info.runtime_version / 1000, info.runtime_version % 1000 / 10);
    println!("device 0: {}", dev.name()?);
    let test_file = TestFile::write()?;
    let file = open(&test_file.path)?;
    println!("file: {} bytes", file.len());

    // One streamer for the runtime's transfers: Auto within a 64 MiB pin budget.
    let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(64 * MIB)))?;
    println!("plan for the whole file: {}", streamer.resolve(file.len()));

    into_sub_slices(&streamer, &file, dev)?;
    into_typed(&streamer, &file, dev)?;
    start_poll_wait(&streamer, &file, dev)?;
    awaited(&streamer, &file, dev)?;
    runtime_memory(&streamer, &file, dev)?;
    // Its kept registrations overlap the range held next: give them back.
    streamer.release_pins()?;
    whole_file_while_a_range_is_held(&file, dev)?;
    drop(streamer);
    Ok(())
}

/// Selects the emulated runtime (before any CUDA call), as the docs show.
#[cfg(feature = "emulator")]
fn emulated() -> Res<()> {
    wirespeed_cuda::sys::emulator::install()?;
    Ok(())
}

#[cfg(not(feature = "emulator"))]
fn emulated() -> Res<()> {
    Err("--emulated: this build lacks the emulated runtime; build with --features emulator".into())
}

/// Maps the test file.
#[allow(unsafe_code)] // MappedFile::open: the file must not change while mapped
fn open(path: &std::path::Path) -> Res<Arc<MappedFile>> {
    // SAFETY: the file is this program's own, written before and never
    // written or truncated again; it is removed (unlinked, which leaves a
    // mapping intact) only once the program is done with it.
    Ok(unsafe { MappedFile::open(path) }?)
}

/// 1. A range into a sub-slice of a larger buffer (blocking), then two ranges
///    at once, non-blocking, into the two halves of `split_at_mut`.
fn into_sub_slices(streamer: &Streamer, file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let mut arena = DeviceBuffer::<u8>::zeroed(&dev, 4 * MIB_AT)?;
    let range = MIB + 123..2 * MIB + 123; // not page aligned
    let at = 512 << 10;
    let report = streamer.to_device(file, range.clone(), arena.slice_mut(at..at + MIB_AT)?)?;
    let got = arena.to_vec()?;
    check("sub-slice: the range", &got[at..at + MIB_AT], file.bytes(range.clone())?)?;
    check_zero("sub-slice: the bytes around it", &got[..at])?;
    check_zero("sub-slice: the bytes around it", &got[at + MIB_AT..])?;
    println!("1. {} into bytes {at}.. of a 4 MiB buffer: {report}", describe(&range));

    let (low, high) = arena.split_at_mut(MIB_AT)?;
    let (r1, r2) = (0..MIB, 5 * MIB..8 * MIB);
    let t1 = streamer.start(file, r1.clone(), low)?;
    let t2 = streamer.start(file, r2.clone(), high)?;
    let (a, b) = (t1.wait()?, t2.wait()?);
    let got = arena.to_vec()?;
    check("split_at_mut: low half", &got[..MIB_AT], file.bytes(r1)?)?;
    check("split_at_mut: high half", &got[MIB_AT..], file.bytes(r2)?)?;
    println!("   two ranges at once into the halves of split_at_mut: {} and {} bytes", a.bytes, b.bytes);
    Ok(())
}

/// 2. A range into a typed buffer, sized from the range (no casts).
fn into_typed(streamer: &Streamer, file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let first = 1000u64;
    let range = 4 * first..4 * (first + (1 << 18));
    let mut weights = file.device_buffer::<f32>(&dev, range.clone())?;
    let report = streamer.to_device(file, range, &mut weights)?;
    let v = weights.to_vec()?;
    if let Some((i, x)) = v.iter().enumerate().find(|&(i, &x)| x != (first + i as u64) as f32) {
        return Err(format!("typed: value {i} is {x}, not {}", first + i as u64).into());
    }
    println!("2. {} f32 values into a DeviceBuffer<f32>: {report}", v.len());
    Ok(())
}

/// 3. `start` returns at once; poll with `is_done` (here, yielding), then `wait`.
fn start_poll_wait(streamer: &Streamer, file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let range = 0..8 * MIB;
    let mut dst = file.device_buffer::<u8>(&dev, range.clone())?;
    let t = streamer.start(file, range.clone(), &mut dst)?;
    let mut polls = 0u64;
    while !t.is_done() {
        polls += 1;
        if !t.wait_timeout(Duration::from_millis(1)) {
            std::thread::yield_now(); // ... the runtime's other work
        }
    }
    let report = t.wait()?; // returns at once: it is done
    check("start/poll/wait", &dst.to_vec()?, file.bytes(range)?)?;
    println!("3. started, polled {polls} time(s), waited: {report}");
    Ok(())
}

/// Wakes the thread that `block_on` parks.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to its end on this thread: polls it, parks until woken.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park(); // (spurious wake-ups only cost another poll)
    }
}

/// 4. A transfer awaited as a `Future`, with no async runtime.
fn awaited(streamer: &Streamer, file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let range = 2 * MIB..6 * MIB;
    let mut dst = file.device_buffer::<u8>(&dev, range.clone())?;
    let report = block_on(async { streamer.start(file, range.clone(), &mut dst)?.await })?;
    check("awaited", &dst.to_vec()?, file.bytes(range)?)?;
    println!("4. awaited by a hand-written block_on: {report}");
    Ok(())
}

/// 5. Memory the runtime allocated itself, and its own stream: it clears the
///    memory on its stream, streams a range into it after that
///    (`StartOptions::after`), and reads the landed bytes with an operation
///    on the same stream enqueued after `then_on`: no host wait between the
///    three. The host waits only to check the result.
#[allow(unsafe_code)] // DeviceSliceMut::from_raw_parts: memory this crate allocated elsewhere
fn runtime_memory(streamer: &Streamer, file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let len = 3 * MIB_AT;
    let range = 7 * MIB + 4..10 * MIB + 4;
    let mine = Stream::new(&dev)?; // the runtime's stream
    // The runtime's allocation: its allocator hands out an address; here a
    // buffer stands in, of which only the address is used.
    let backing = DeviceBuffer::<u8>::new(&dev, len)?;
    let ptr = backing.as_raw_ptr();
    let mut landed = DeviceBuffer::<u8>::zeroed(&dev, len)?; // where the runtime's op writes

    // The three steps; every exit below waits for what was enqueued.
    let mut steps = || -> Res<Report> {
        // SAFETY: `ptr .. ptr + len` is device memory of `dev` (`backing`),
        // which outlives every operation here: the transfer is waited for
        // and `mine` synchronized before `backing` can go (it is leaked if
        // that fails). The memset is its first user; the transfer's copies
        // are ordered after it (`after`), and the copy below after them
        // (`then_on`): nothing touches the memory out of that order.
        let mut clear = unsafe { DeviceSliceMut::from_raw_parts(ptr, len, dev) }?;
        mine.memset(&mut clear, 0xEE)?.detach();
        // SAFETY: as above; this view's user is the transfer, ordered after
        // the memset on `mine` by `after`, before the copy by `then_on`.
        let dst = unsafe { DeviceSliceMut::from_raw_parts(ptr, len, dev) }?;
        let transfer = streamer.start_with(file, range.clone(), dst, StartOptions::new().after(&mine))?;
        let mut read = || -> Res<()> {
            transfer.then_on(&mine)?;
            // SAFETY: as above; read by a copy on `mine`, enqueued after
            // `then_on` made `mine` wait for the transfer's copies.
            let src = unsafe { DeviceSliceMut::from_raw_parts(ptr, len, dev) }?;
            mine.copy_device_to_device(&src, &mut landed)?.detach();
            Ok(())
        };
        let enqueued = read();
        let report = transfer.wait(); // observed complete, whatever `read` did
        enqueued?;
        Ok(report?)
    };
    let result = steps();
    if let Err(e) = mine.synchronize() {
        std::mem::forget(backing); // a copy may still use it: leak, never free under it
        return Err(format!("runtime memory: the runtime's stream failed ({e}); its memory is leaked").into());
    }
    let report = result?;
    check("runtime memory after then_on", &landed.to_vec()?, file.bytes(range.clone())?)?;
    println!("5. into the runtime's own memory after its memset (after), read on its stream (then_on): {report}");
    drop(backing);
    Ok(())
}

/// 6. The whole file, while the program holds a pinned range of part of it,
///    by a streamer built with the builders; its report read field by field.
fn whole_file_while_a_range_is_held(file: &Arc<MappedFile>, dev: Device) -> Res<()> {
    let held_budget = PinBudget::new(4 * MIB);
    let held = PinnedRange::new_on(&dev, file, 5 * MIB + 77..6 * MIB + 1, PinOptions::default(), &held_budget)?;

    let seen = Arc::new(AtomicU64::new(0));
    let progress = seen.clone();
    let config = StreamConfig::new(Strategy::Auto, PinBudget::new(64 * MIB))
        .with_verify(true)
        .with_mlock(false)
        .with_second_context(true)
        .with_progress(move |done, _total| {
            progress.fetch_max(done, Ordering::Relaxed);
        });
    let streamer = Streamer::new(&[dev], config)?;
    let all = 0..file.len();
    let mut dst = file.device_buffer::<u8>(&dev, all.clone())?;
    let report = streamer.to_device(file, all.clone(), &mut dst)?;
    check("whole file", &dst.to_vec()?, file.bytes(all)?)?;

    // The report, field by field (it is non-exhaustive: `..`).
    let Report { strategy, bytes, seconds, cpu_seconds, peak_pinned, registrations, verified, windows, .. } = &report;
    if *bytes != file.len() || *verified != Some(true) {
        return Err(format!("whole file: report says {bytes} bytes, verified {verified:?}").into());
    }
    if seen.load(Ordering::Relaxed) != file.len() {
        return Err(format!("whole file: progress reached {} of {}", seen.load(Ordering::Relaxed), file.len()).into());
    }
    println!(
        "6. the whole file while bytes {:?} are held pinned: {strategy}, {bytes} bytes in {seconds:.4} s \
         ({:.2} GB/s, {cpu_seconds:.4} CPU s, {:.3} CPU s/GB), peak pinned {peak_pinned}, {registrations} \
         registration(s), verified {verified:?}, windows: {windows:?}",
        held.range(),
        report.gbps(),
        report.cpu_per_gb()
    );

    // The held range is still ours, and still a copy source.
    let mut part = file.device_buffer::<u8>(&dev, held.range())?;
    Stream::new(&dev)?.copy_to_device(&held.source(), &mut part)?.wait()?;
    check("the held range", &part.to_vec()?, held.as_bytes())?;
    held.release()?;
    if held_budget.used() != 0 {
        return Err("the held range's budget was not given back".into());
    }
    println!("   the held range still copies, and is released");
    Ok(())
}

/// The test file, removed when dropped.
struct TestFile {
    path: std::path::PathBuf,
}

impl TestFile {
    /// `FLOATS` native-endian `f32` values `0.0, 1.0, ...`, then `TAIL` bytes.
    fn write() -> Res<TestFile> {
        let path = std::env::temp_dir().join(format!("wirespeed-downstream-{}.bin", std::process::id()));
        let mut data = Vec::with_capacity((4 * FLOATS + TAIL) as usize);
        for i in 0..FLOATS {
            data.extend_from_slice(&(i as f32).to_ne_bytes());
        }
        data.extend((0..TAIL).map(|i| (i * 7) as u8));
        std::fs::write(&path, &data)?;
        Ok(TestFile { path })
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Fails unless `got` equals `want`, naming the first difference.
fn check(what: &str, got: &[u8], want: &[u8]) -> Res<()> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes, expected {}", got.len(), want.len()).into());
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: byte {i} is {:#04x}, the file has {:#04x}", got[i], want[i]).into()),
    }
}

fn check_zero(what: &str, got: &[u8]) -> Res<()> {
    match got.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: byte {i} is {:#04x}, expected untouched (0)", got[i]).into()),
    }
}

fn describe(r: &Range<u64>) -> String {
    format!("file bytes {}..{}", r.start, r.end)
}
