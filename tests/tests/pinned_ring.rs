//! pinned-mem: the pinned ring and its slot state machine.

use std::sync::Mutex;
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{Error, PinBudget, PinnedRing};
use wirespeed_tests::{TempDir, open_mapped, pattern, start, write_pattern_file};

fn host_allocs(t: &wirespeed_tests::Ctx) -> Option<u64> {
    t.emulated().then(|| t.emu().call_count("cudaHostAlloc").unwrap())
}

#[test]
fn many_cycles_reuse_the_slots_without_allocating() {
    let t = start();
    {
        t.set_delay_us(200); // copies finish well after they are enqueued
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let (slot, cycles) = (64 << 10, 40);
        let data = pattern(11, slot * cycles - 777);
        let budget = PinBudget::new(1 << 20);
        let allocs0 = host_allocs(&t);
        let ring = PinnedRing::new(3, slot, &budget).unwrap();
        let allocs1 = host_allocs(&t);
        // Each slot is page-aligned: where cudaHostAlloc does not align a block
        // this small (a real GPU, the emulator), each has a page of slack,
        // drawn from the budget too (and the first, unaligned, block was given back).
        let padded = ring.pinned_bytes() > 3 * slot as u64;
        assert_eq!(budget.used(), ring.pinned_bytes());
        let mut dst = DeviceBuffer::<u8>::new(&dev, data.len()).unwrap();
        for (i, part) in data.chunks(slot).enumerate() {
            let full = ring.acquire().unwrap().copy_from(part).unwrap();
            let mut d = dst.slice_mut(i * slot..i * slot + part.len()).unwrap();
            drop(full.copy_to_device(&stream, &mut d).unwrap());
            assert!(ring.free_slots() + ring.in_flight_slots() <= 3);
        }
        let done = ring.drain().unwrap();
        assert!(done > 0 && done <= 3 * slot as u64, "the last copies, reported once: {done}");
        assert_eq!(ring.in_flight_slots(), 0);
        assert_eq!(ring.free_slots(), 3);
        assert_eq!(dst.to_vec().unwrap(), data);
        assert_eq!(ring.allocations(), 3);
        if let (Some(a0), Some(a1)) = (allocs0, allocs1) {
            assert_eq!(a1 - a0, 3 + u64::from(padded), "one cudaHostAlloc per slot at start-up");
            assert_eq!(host_allocs(&t), Some(a1), "no allocation after start-up");
        }
        drop(ring);
        assert_eq!(budget.used(), 0);
    }
    t.assert_clean();
}

#[test]
fn a_slot_is_free_again_only_after_its_copy_completed() {
    let t = start();
    {
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let ring = PinnedRing::new(1, 1 << 20, &PinBudget::unlimited()).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, 1 << 20).unwrap();
        if t.emulated() {
            t.set_delay_us(50_000); // 50 ms per operation
        }
        let copied0 = t.counters().map(|c| c.bytes_copied);
        let first = pattern(12, 1 << 20);
        let in_flight = ring.acquire().unwrap().copy_from(&first).unwrap().copy_to_device(&stream, &mut dst).unwrap();
        if t.emulated() {
            assert!(!in_flight.is_complete().unwrap(), "50 ms later at the earliest");
        }
        assert!(ring.try_acquire().unwrap().is_none(), "the only slot is in flight, not returned");
        drop(in_flight); // back to the ring's in-flight queue
        let mut again = ring.acquire().unwrap(); // waits for the copy's event
        if let Some(c0) = copied0 {
            assert!(t.counters().unwrap().bytes_copied >= c0 + (1 << 20), "the copy had completed");
        }
        assert_eq!(again.completed_bytes(), 1 << 20);
        again.as_mut_slice().unwrap().fill(0xAB); // overwriting it cannot change what was copied
        drop(again);
        assert_eq!(dst.to_vec().unwrap(), first);
        drop(ring);
    }
    t.assert_clean();
}

#[test]
fn wait_try_and_timeout() {
    let t = start();
    {
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let ring = PinnedRing::new(2, 4096, &PinBudget::unlimited()).unwrap();
        let a = ring.acquire().unwrap();
        let b = ring.try_acquire().unwrap().expect("a second slot");
        assert_ne!(a.index(), b.index());
        assert!(ring.try_acquire().unwrap().is_none());
        assert!(ring.acquire_timeout(Duration::from_millis(5)).unwrap().is_none());
        drop(a);
        assert!(ring.acquire_timeout(Duration::from_secs(5)).unwrap().is_some());
        let mut dst = DeviceBuffer::<u8>::new(&dev, 5).unwrap();
        let full = b.copy_from(b"hello").unwrap();
        assert_eq!(full.data().unwrap(), b"hello");
        let free = full.copy_to_device(&stream, &mut dst).unwrap().wait().unwrap();
        assert_eq!(free.completed_bytes(), 5);
        assert_eq!(dst.to_vec().unwrap(), b"hello");
        drop(free);
        assert_eq!(ring.free_slots(), 2);
        drop(ring);
    }
    t.assert_clean();
}

#[test]
fn producer_threads_fill_from_a_file_mapping_and_closure() {
    let t = start();
    {
        t.set_delay_us(100);
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let dir = TempDir::new("pm-ring");
        let path = dir.join("data.bin");
        let data = write_pattern_file(&path, 13, (1 << 20) + 4321);
        let file = open_mapped(&path).unwrap();
        let slot = 32 << 10;
        let ring = PinnedRing::new(4, slot, &PinBudget::new(1 << 20)).unwrap();
        let dst = Mutex::new(DeviceBuffer::<u8>::new(&dev, data.len()).unwrap());
        let next = Mutex::new(0usize);
        std::thread::scope(|s| {
            for k in 0..3 {
                let (ring, file, dst, next, stream, data) = (&ring, &file, &dst, &next, &stream, &data);
                s.spawn(move || {
                    loop {
                        let off = {
                            let mut n = next.lock().unwrap();
                            let o = *n;
                            *n += slot;
                            o
                        };
                        if off >= data.len() {
                            break;
                        }
                        let len = slot.min(data.len() - off);
                        let free = ring.acquire().unwrap();
                        let full = match k {
                            0 => free.read_from(file, off as u64, len).unwrap(),
                            1 => free.copy_from(&file.as_bytes()[off..off + len]).unwrap(),
                            _ => free
                                .fill_with(|b| {
                                    b[..len].copy_from_slice(&data[off..off + len]);
                                    Ok(len)
                                })
                                .unwrap(),
                        };
                        let mut dst = dst.lock().unwrap();
                        let mut d = dst.slice_mut(off..off + len).unwrap();
                        drop(full.copy_to_device(stream, &mut d).unwrap());
                    }
                });
            }
        });
        ring.drain().unwrap();
        assert_eq!(dst.lock().unwrap().to_vec().unwrap(), data);
        assert_eq!(ring.allocations(), 4);
        drop(ring);
    }
    t.assert_clean();
}

#[test]
fn submit_to_two_destinations() {
    let t = start();
    {
        let dev = Device::get(0).unwrap();
        let (s1, s2) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
        let ring = PinnedRing::new(1, 8192, &PinBudget::unlimited()).unwrap();
        let (mut a, mut b) =
            (DeviceBuffer::<u8>::new(&dev, 8000).unwrap(), DeviceBuffer::<u8>::new(&dev, 3000).unwrap());
        let data = pattern(14, 8000);
        let full = ring.acquire().unwrap().copy_from(&data).unwrap();
        let in_flight = full
            .submit(&[&s1, &s2], |src| {
                s1.copy_to_device(&src.all()?, &mut a)?.detach();
                s2.copy_to_device(&src.slice(5000..8000)?, &mut b)?.detach();
                Ok(())
            })
            .unwrap();
        in_flight.wait().unwrap();
        assert_eq!(a.to_vec().unwrap(), data);
        assert_eq!(b.to_vec().unwrap(), &data[5000..]);
        drop(ring);
    }
    t.assert_clean();
}

#[test]
fn errors_return_the_slot_to_the_ring() {
    let t = start();
    {
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let dir = TempDir::new("pm-ring");
        let path = dir.join("small.bin");
        write_pattern_file(&path, 15, 1000);
        let file = open_mapped(&path).unwrap();
        let ring = PinnedRing::new(2, 4096, &PinBudget::unlimited()).unwrap();
        assert!(matches!(ring.acquire().unwrap().read_from(&file, 500, 1000), Err(Error::FileChanged { .. })));
        assert!(matches!(ring.acquire().unwrap().copy_from(&[0; 5000]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(ring.acquire().unwrap().fill(10..4097), Err(Error::InvalidArgument { .. })));
        let mut short = DeviceBuffer::<u8>::new(&dev, 10).unwrap();
        let e = ring.acquire().unwrap().copy_from(&[1; 20]).unwrap().copy_to_device(&stream, &mut short).unwrap_err();
        assert!(matches!(e, Error::Cuda(wirespeed_cuda::Error::InvalidArgument { .. })), "{e}");
        // A panic inside `submit`'s closure: the slot comes back too (in flight).
        let full = ring.acquire().unwrap().copy_from(&[2; 10]).unwrap();
        wirespeed_tests::quiet_expected_panics();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            full.submit(&[&stream], |src| {
                stream.copy_to_device(&src.all()?, &mut short)?.detach();
                panic!("submit closure panics (expected in this test)");
            })
        }));
        assert!(caught.is_err());
        ring.drain().unwrap();
        assert_eq!(ring.free_slots(), 2, "every slot came back");
        assert_eq!(short.to_vec().unwrap(), [2; 10], "the copy enqueued before the panic ran");
        drop(ring);
    }
    t.assert_clean();
}

#[test]
fn sizes_and_budget_are_checked() {
    let t = start();
    {
        assert!(matches!(PinnedRing::new(0, 4096, &PinBudget::unlimited()), Err(Error::InvalidArgument { .. })));
        assert!(matches!(PinnedRing::new(4, 0, &PinBudget::unlimited()), Err(Error::InvalidArgument { .. })));
        // Room for 4 slots and their alignment slack (a page each at most).
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        let limit = (1 << 20) + 4 * page;
        let budget = PinBudget::new(limit);
        let allocs = host_allocs(&t);
        match PinnedRing::new(5, 256 << 10, &budget) {
            Err(Error::BudgetExceeded { requested, available, limit: l }) => {
                assert_eq!((requested, available, l), (5 * (256 << 10), limit, limit));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(host_allocs(&t), allocs, "refused before allocating");
        assert_eq!(budget.used(), 0);
        let ring = PinnedRing::new(4, 256 << 10, &budget).unwrap();
        let pinned = ring.pinned_bytes();
        assert!((1 << 20..=limit).contains(&pinned), "{pinned}");
        assert_eq!(budget.available(), limit - pinned);
        let clone = ring.clone();
        drop(ring);
        assert_eq!(budget.used(), pinned, "the clone keeps it");
        drop(clone);
        assert_eq!(budget.used(), 0);
    }
    t.assert_clean();
}

/// A forgotten in-flight slot keeps the ring and the stream its event was
/// recorded on alive, and nothing is freed under its copy. It leaks by design,
/// so this runs in a child process whose leaks do not matter.
#[test]
fn forgotten_in_flight_slot_keeps_the_ring_and_its_stream() {
    let t = start();
    wirespeed_tests::run_child("forgotten_in_flight_child", &[]);
    t.assert_clean();
}

/// Runs only in the child process started above.
#[test]
#[ignore = "runs in a child process started by forgotten_in_flight_slot_keeps_the_ring_and_its_stream"]
fn forgotten_in_flight_child() {
    if !wirespeed_tests::is_child("forgotten_in_flight_child") {
        return;
    }
    let t = start();
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(1 << 20);
    let data = pattern(23, 64 << 10);
    let mut dst = DeviceBuffer::<u8>::new(&dev, data.len()).unwrap();
    let ring = PinnedRing::new(2, 64 << 10, &budget).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let pinned = ring.pinned_bytes();
    let counts =
        |t: &wirespeed_tests::Ctx| t.counters().map(|c| (c.pinned_allocs, c.streams, c.events, c.bytes_copied));
    let before = counts(&t);
    t.set_delay_us(100_000); // the copy stays in flight while the handles go
    let full = ring.acquire().unwrap().copy_from(&data).unwrap();
    std::mem::forget(full.copy_to_device(&stream, &mut dst).unwrap());
    drop(ring);
    drop(stream);
    if let (Some((allocs0, streams0, _, copied0)), Some((allocs, streams, events, copied))) = (before, counts(&t)) {
        assert_eq!(copied, copied0, "the copy is still in flight");
        assert_eq!(allocs, allocs0, "no slot was freed under the copy");
        assert_eq!(streams, streams0, "the stream stays alive (its handles are gone)");
        assert!(events >= 1, "the slot's event stays alive");
    }
    assert_eq!(budget.used(), pinned, "the ring's reservation stays drawn");
    // The copy completes from the leaked (still allocated) slot.
    assert_eq!(dst.to_vec().unwrap(), data);
    t.set_delay_us(0);
    drop(dst);
    if let (Some((allocs0, streams0, ..)), Some((allocs, streams, events, _))) = (before, counts(&t)) {
        assert_eq!((allocs, streams), (allocs0, streams0), "the ring and its stream stay for the process");
        assert!(events >= 1);
    }
    assert_eq!(budget.used(), pinned);
    wirespeed_tests::child_ran("forgotten_in_flight_child");
}

#[test]
fn acquire_if_ready_never_waits_for_a_copy() {
    let t = start();
    if !t.emulated() {
        return; // holds the emulated streams
    }
    {
        let dev = Device::get(0).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let ring = PinnedRing::new(2, 4096, &PinBudget::unlimited()).unwrap();
        let mut dst = DeviceBuffer::<u8>::new(&dev, 4).unwrap();
        t.emu().hold(true);
        let first = ring.acquire_if_ready().unwrap().expect("a free slot");
        drop(first.copy_from(b"ab").unwrap().copy_to_device(&stream, &mut dst.slice_mut(0..2).unwrap()).unwrap());
        let second = ring.acquire_if_ready().unwrap().expect("the other free slot");
        drop(second.copy_from(b"cd").unwrap().copy_to_device(&stream, &mut dst.slice_mut(2..4).unwrap()).unwrap());
        // Both slots in flight, their copies held: none is ready, and asking
        // keeps them in flight (in order).
        assert!(ring.acquire_if_ready().unwrap().is_none());
        assert_eq!((ring.free_slots(), ring.in_flight_slots()), (0, 2));
        t.emu().hold(false);
        stream.synchronize().unwrap();
        let a = ring.acquire_if_ready().unwrap().expect("the oldest, its copy completed");
        let b = ring.acquire_if_ready().unwrap().expect("the other");
        assert_eq!((a.completed_bytes(), b.completed_bytes()), (2, 2));
        assert_eq!(dst.to_vec().unwrap(), b"abcd");
        drop((a, b, ring));
    }
    t.assert_clean();
}
