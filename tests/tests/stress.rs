//! Many small operations from several threads at once: the emulated runtime
//! must stay live under millions of stream operations (it once hung after
//! about 1.4 million: glibc's condition variable lost a wakeup, see
//! cudart_emu.c, `emu_cv`). A watchdog turns a hang into a failure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use wirespeed_cuda::{Device, DeviceBuffer, Event, EventOptions, PinnedBuffer, Stream};
use wirespeed_tests::{Watchdog, start};

/// Operations the emulator must execute (its counter) before the test stops,
/// unless `SECONDS` run out first.
const TARGET_OPS: u64 = 1_500_000;
/// The test's time budget (CI wants it under a minute, builds aside).
const SECONDS: u64 = 25;
const THREADS: usize = 4;

#[test]
fn millions_of_small_operations_from_several_threads() {
    let t = start();
    let _dog = Watchdog::new(SECONDS + 60);
    let d = Device::get(0).unwrap();
    let before = t.counters().map_or(0, |c| c.ops_executed);
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for k in 0..THREADS {
            let (d, stop, rounds) = (&d, &stop, &rounds);
            scope.spawn(move || {
                let (a, b) = (Stream::new(d).unwrap(), Stream::new(d).unwrap());
                let ev = Event::new(d, EventOptions::default()).unwrap();
                let src = PinnedBuffer::from_slice(&[k as u8 + 1]).unwrap();
                let mut mid = DeviceBuffer::<u8>::new(d, 1).unwrap();
                let mut back = PinnedBuffer::<u8>::new(1).unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // A copy on `a`, read on `b` (a cross-stream wait), an
                    // event on each, waited by the host.
                    a.copy_to_device(&src, &mut mid).unwrap().detach();
                    a.record(&ev).unwrap();
                    b.copy_to_host(&mid, &mut back).unwrap().detach();
                    if i.is_multiple_of(4) {
                        ev.synchronize().unwrap();
                    }
                    if i.is_multiple_of(16) {
                        b.record(&ev).unwrap();
                        ev.synchronize().unwrap();
                        assert_eq!(back.as_slice().unwrap(), &[k as u8 + 1]);
                    }
                    // Allocations and frees (cudaFree drains every stream).
                    if i.is_multiple_of(64) {
                        let mut scratch = DeviceBuffer::<u8>::new(d, 256).unwrap();
                        a.memset(&mut scratch, 7).unwrap().detach();
                        drop(scratch);
                    }
                    if i.is_multiple_of(512) {
                        drop(PinnedBuffer::<u8>::new(64).unwrap());
                    }
                    i += 1;
                }
                rounds.fetch_add(i, Ordering::Relaxed);
            });
        }
        // The controller: stops at the target count or the time budget.
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let done = t.counters().map_or(0, |c| c.ops_executed) - before;
            if done >= TARGET_OPS || started.elapsed() >= Duration::from_secs(SECONDS) {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    });
    // Nothing is printed here: the scoped threads may still hold the test's
    // output capture, and ThreadSanitizer (std uninstrumented) would see its
    // last drop race with the printing.
    let (rounds, secs) = (rounds.load(Ordering::Relaxed), started.elapsed().as_secs_f64());
    let ops = t.counters().map(|c| c.ops_executed - before);
    assert!(rounds > 0, "no round in {secs:.1} s ({ops:?} operations)");
    t.assert_clean();
}
