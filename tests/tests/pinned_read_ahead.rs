//! Reading ahead (`StreamConfig::read_ahead`): a loop of transfers over
//! sequential pieces, each started once the one before has its copies
//! enqueued, runs as one pass, and every piece gets its own bytes; a piece
//! whose `after` is held waits for it on the device even when its first
//! parts were filled before it came; whatever else comes (another range, a
//! blocking call, the streamer dropped, a failed copy) drops what was read
//! ahead at once and leaves nothing behind.
//!
//! The read-ahead here waits up to its longest (60 s), so that every piece
//! of a loop comes while the pass still waits for it: what joins is the
//! same on every run and on both runtimes. Whether a piece's first parts
//! were filled before it came depends on the machine, and is not asserted.
//! The watchdogs (30 s) fail a test where something waited for the
//! read-ahead's time to run out instead.

use std::sync::Arc;
use std::time::Duration;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{Error, MAX_READ_AHEAD, MappedFile, PinBudget, StartOptions, Strategy, StreamConfig, Streamer};
use wirespeed_tests::{TempDir, Watchdog, hold, open_mapped, start, start_emulated, write_pattern_file};

/// Bytes per piece: more than the read-ahead (half the ring: 4 x 128 KiB),
/// and not a multiple of a slot or a page.
const PIECE: usize = (1 << 20) + 4096 + 40;
const PIECES: usize = 8;

/// The ring the tests stream through: 8 slots of 128 KiB, 2 threads.
const RING: Strategy = Strategy::Ring { slots: 8, slot: 128 << 10, threads: 2 };

fn piece(i: usize) -> std::ops::Range<u64> {
    (i * PIECE) as u64..((i + 1) * PIECE) as u64
}

/// A file of `PIECES` pieces and a few bytes more, and its bytes.
fn data_file(dir: &TempDir, seed: u64) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("ahead-{seed}.bin"));
    let data = write_pattern_file(&path, seed, PIECES * PIECE + 999);
    (open_mapped(&path).unwrap(), data)
}

/// A streamer of [`RING`] within 64 MiB, reading ahead as long as it may.
fn streamer(dev: Device) -> Streamer {
    let cfg = StreamConfig::new(RING, PinBudget::new(64 << 20)).with_read_ahead(MAX_READ_AHEAD);
    Streamer::new(&[dev], cfg).unwrap()
}

fn buffers(dev: Device, n: usize) -> Vec<DeviceBuffer<u8>> {
    (0..n).map(|_| DeviceBuffer::new(&dev, PIECE).unwrap()).collect()
}

fn assert_piece(buf: &DeviceBuffer<u8>, data: &[u8], i: usize) {
    let r = piece(i);
    assert!(buf.to_vec().unwrap() == data[r.start as usize..r.end as usize], "piece {i}'s data");
}

#[test]
fn sequential_pieces_one_at_a_time_run_as_one_pass() {
    let t = start();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-loop");
    let (file, data) = data_file(&dir, 51);
    let dev = Device::get(0).unwrap();
    let s = streamer(dev);
    let mine = Stream::new(&dev).unwrap();
    let mut bufs = buffers(dev, PIECES);
    let mut transfers = Vec::new();
    for (i, b) in bufs.iter_mut().enumerate() {
        // As a loop of Python `read_into` calls: after my stream's work so
        // far, and my later work after it.
        let tr = s.start_with(&file, piece(i), b, StartOptions::new().after(&mine)).unwrap();
        tr.then_on(&mine).unwrap();
        transfers.push(tr);
    }
    let reports: Vec<_> = transfers.into_iter().map(|tr| tr.wait().unwrap()).collect();
    for (i, r) in reports.iter().enumerate() {
        assert_eq!((r.bytes, r.chained, r.strategy), (PIECE as u64, i > 0, RING), "piece {i}: {r}");
    }
    for (i, b) in bufs.iter().enumerate() {
        assert_piece(b, &data, i);
    }
    // The pass still holds what follows the last piece: a blocking call (an
    // empty one) ends it. Only the bytes a transfer took count as streamed.
    let mut empty = DeviceBuffer::<u8>::new(&dev, 0).unwrap();
    s.to_device(&file, 0..0, &mut empty).unwrap();
    let totals = s.totals();
    eprintln!("{totals}");
    assert_eq!(totals.ring_bytes, (PIECES * PIECE) as u64, "{totals:?}");
    assert!(totals.read_ahead_bytes <= totals.ring_bytes, "{totals:?}");
    drop((s, bufs, mine, empty));
    t.assert_clean();
}

#[test]
fn a_piece_read_ahead_waits_for_what_it_must_follow() {
    let t = start();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-after");
    let (file, data) = data_file(&dir, 52);
    let dev = Device::get(0).unwrap();
    let s = streamer(dev);
    let (mine, later) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let mut bufs = buffers(dev, 3);
    let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
    let t0 = s.start(&file, piece(0), b0).unwrap();
    t0.then_on(&mine).unwrap();
    let open = hold(&later);
    let t1 = s.start_with(&file, piece(1), b1, StartOptions::new().after(&later)).unwrap();
    let r0 = t0.wait().unwrap();
    assert!(!t1.is_done(), "piece 1 must follow `later`, which is held");
    open.send(()).unwrap();
    let r1 = t1.wait().unwrap();
    assert!(!r0.chained && r1.chained, "{r0}\n{r1}");
    // The pass goes on reading ahead after it.
    let r2 = s.start(&file, piece(2), b2).unwrap().wait().unwrap();
    assert!(r2.chained, "{r2}");
    for (i, b) in bufs.iter().enumerate() {
        assert_piece(b, &data, i);
    }
    drop((s, bufs, mine, later));
    t.assert_clean();
}

#[test]
fn anything_else_drops_what_was_read_ahead_at_once() {
    let t = start();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-dropped");
    let (file, data) = data_file(&dir, 53);
    let (other, other_data) = data_file(&dir, 54);
    let dev = Device::get(0).unwrap();
    let s = streamer(dev);
    let mut bufs = buffers(dev, 6);
    // A range that does not start where the last one ended joins the pass
    // as any queued transfer does.
    s.start(&file, piece(0), &mut bufs[0]).unwrap().wait().unwrap();
    let r = s.start(&file, piece(5), &mut bufs[1]).unwrap().wait().unwrap();
    assert!(r.chained, "{r}");
    // Another file runs in a pass of its own.
    let r = s.start(&other, piece(1), &mut bufs[2]).unwrap().wait().unwrap();
    assert!(!r.chained, "{r}");
    // A blocking call on the streamer takes it at once.
    s.to_device(&file, piece(3), &mut bufs[3]).unwrap();
    // A piece that ends inside what was read ahead is not taken, but read.
    s.start(&file, piece(0), &mut bufs[4]).unwrap().wait().unwrap();
    let short = piece(1).start..piece(1).start + 4096;
    s.start(&file, short.clone(), bufs[5].slice_mut(..4096).unwrap()).unwrap().wait().unwrap();
    assert!(bufs[5].to_vec().unwrap()[..4096] == data[short.start as usize..short.end as usize]);
    // Dropping the streamer ends the pass at once.
    s.start(&file, piece(6), &mut bufs[4]).unwrap().wait().unwrap();
    drop(s);
    for (i, (d, at)) in [(&data, 0), (&data, 5), (&other_data, 1), (&data, 3), (&data, 6)].into_iter().enumerate() {
        assert_piece(&bufs[i], d, at);
    }
    drop(bufs);
    t.assert_clean();
}

#[test]
fn a_failed_copy_while_reading_ahead_leaves_nothing_behind() {
    const UNKNOWN: u32 = 999;
    let t = start_emulated();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-fault");
    let (file, data) = data_file(&dir, 55);
    let dev = Device::get(0).unwrap();
    for nth in [1, 9, 10, 12, 20] {
        let s = streamer(dev);
        let mine = Stream::new(&dev).unwrap();
        let mut bufs = buffers(dev, 4);
        // Nine copies per piece (slots of 128 KiB): the 9th is piece 0's
        // last, the 10th piece 1's first (copies of parts read ahead are
        // enqueued when their piece comes, in no set order).
        assert!(t.emu().inject_fault("cudaMemcpyAsync", nth, UNKNOWN, false));
        let mut results = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            let tr = s.start(&file, piece(i), b).unwrap();
            match tr.then_on(&mine) {
                Ok(()) => results.push(tr.wait()),
                Err(e) => {
                    let _ = tr.wait();
                    results.push(Err(e));
                }
            }
        }
        t.emu().reset();
        // The first copy is the first piece's, which fails. A later fault
        // may hit the first copy of a piece that joined the pass (read
        // ahead or not): nothing of it was written, so it runs again on its
        // own, and nothing fails.
        if nth == 1 {
            assert!(results[0].is_err(), "fault at the first copy: piece 0 did not fail");
        }
        for (i, r) in results.iter().enumerate() {
            match r {
                Ok(_) => assert_piece(&bufs[i], &data, i),
                Err(Error::Cuda(_) | Error::TransferFailed { .. }) => {}
                Err(e) => panic!("fault at copy {nth}: piece {i}: {e}"),
            }
        }
        // The streamer still works.
        let r = s.start(&file, piece(7), &mut bufs[0]).unwrap().wait().unwrap();
        assert_eq!(r.bytes, PIECE as u64);
        assert_piece(&bufs[0], &data, 7);
        drop((s, bufs, mine));
        t.assert_clean();
    }
}

#[test]
fn without_a_read_ahead_a_pass_reads_nothing_ahead() {
    let t = start();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-off");
    let (file, data) = data_file(&dir, 56);
    let dev = Device::get(0).unwrap();
    let s = Streamer::new(&[dev], StreamConfig::new(RING, PinBudget::new(64 << 20))).unwrap();
    assert_eq!(s.config().read_ahead, Duration::ZERO);
    let mut bufs = buffers(dev, 2);
    for (i, b) in bufs.iter_mut().enumerate() {
        s.start(&file, piece(i), b).unwrap().wait().unwrap();
    }
    let totals = s.totals();
    assert_eq!((totals.read_ahead_bytes, totals.read_ahead_dropped_bytes), (0, 0), "{totals:?}");
    for (i, b) in bufs.iter().enumerate() {
        assert_piece(b, &data, i);
    }
    drop((s, bufs));
    t.assert_clean();
}

/// Bytes read ahead and dropped (another range came first) are not read
/// again by the pass for a transfer that comes later and covers them: such
/// a transfer waits for the next pass. It once joined, its parts inside the
/// dropped bytes were dropped too, and it failed ("its pass ended before its
/// copies were").
#[test]
fn a_transfer_over_bytes_read_ahead_and_dropped_gets_them_all() {
    let t = start();
    let _w = Watchdog::new(30);
    let dir = TempDir::new("ahead-dropped-then-asked");
    let (file, data) = data_file(&dir, 57);
    let dev = Device::get(0).unwrap();
    let held = Stream::new(&dev).unwrap();
    for _ in 0..4 {
        let s = streamer(dev);
        let mut bufs = buffers(dev, 3);
        let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
        s.start(&file, piece(0), b0).unwrap().wait().unwrap();
        // Another range, held on the device: what was read ahead after piece
        // 0 is dropped, and the pass waits for `held` to open.
        let open = hold(&held);
        let other = s.start_with(&file, piece(5), b1, StartOptions::new().after(&held)).unwrap();
        // Piece 1, over the bytes read ahead after piece 0.
        let next = s.start(&file, piece(1), b2).unwrap();
        open.send(()).unwrap();
        other.wait().unwrap();
        next.wait().unwrap();
        drop(s);
        assert_piece(&bufs[0], &data, 0);
        assert_piece(&bufs[1], &data, 5);
        assert_piece(&bufs[2], &data, 1);
    }
    drop(held);
    t.assert_clean();
}
