//! Transfers queued back to back on one streamer run as one pass: the agents
//! go on from one transfer to the next with no drain between them (also
//! over gaps between the ranges), each transfer still gets its own data,
//! event and report, a transfer whose `after` has not completed joins and
//! waits for it on the device, a transfer whose range lies before the
//! others' joins too, and a transfer that cannot join (another file, a
//! range that overlaps one of the pass's) runs in the next pass as it would
//! have. `Auto` plans the pass for the queued total, not piece by piece. A
//! pass that fails fails the transfers it wrote to, and those it had not
//! touched run on their own.
//!
//! Each test first holds the streamer's pass behind a gate (a host function
//! on the caller's stream that the first transfer is ordered after), so that
//! the later transfers are queued while the first one is still being
//! claimed: what joins the pass is then the same on every run and on both
//! runtimes. No timing is asserted.

use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{
    Error, MappedFile, PinBudget, Report, StartOptions, Strategy, StreamConfig, Streamer, Transfer,
};
use wirespeed_tests::{TempDir, Watchdog, open_mapped, start, start_emulated, write_pattern_file};

use std::ops::Range;

/// Bytes per transfer: more than any strategy below keeps in flight, and
/// not a multiple of a window, a slot or a page.
const SPAN: usize = (2 << 20) + 4096 + 40;
const SPANS: usize = 4;

/// The strategies whose passes take queued transfers.
fn strategies() -> [Strategy; 3] {
    [
        Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 2 },
        Strategy::Windows { window: 256 << 10, in_flight: 2 },
        Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 },
    ]
}

fn data_file(dir: &TempDir, seed: u64, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
    let path = dir.join(&format!("chain-{seed}.bin"));
    let data = write_pattern_file(&path, seed, len);
    (open_mapped(&path).unwrap(), data)
}

/// A host function on `stream` that waits until the sender is used or
/// dropped. While it waits, nothing that waits for every stream (freeing
/// memory) may run.
fn gate(stream: &Stream) -> Sender<()> {
    let (tx, rx) = channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = rx.recv();
        })
        .unwrap();
    tx
}

/// A first pass, so that the streamer holds its ring before a gate closes:
/// freeing pinned memory (making the ring) waits for every stream, the
/// gated one too.
fn warm_up(s: &Streamer, file: &Arc<MappedFile>, buf: &mut DeviceBuffer<u8>) {
    s.to_device(file, span(0), buf).unwrap();
}

/// A streamer of `strategy` within 64 MiB and a buffer per span, after a
/// first pass ([`warm_up`]).
fn ready(dev: Device, strategy: Strategy, file: &Arc<MappedFile>) -> (Streamer, Vec<DeviceBuffer<u8>>) {
    let s = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(64 << 20))).unwrap();
    let mut bufs: Vec<DeviceBuffer<u8>> = (0..SPANS).map(|_| DeviceBuffer::new(&dev, SPAN).unwrap()).collect();
    warm_up(&s, file, &mut bufs[0]);
    (s, bufs)
}

/// Starts a transfer of span `i` into buffer `i` for each buffer, the first
/// ordered after `mine` behind a gate on it: the pass begins once the
/// answered sender is used (or dropped).
fn start_gated<'a>(
    s: &'a Streamer,
    file: &Arc<MappedFile>,
    bufs: &'a mut [DeviceBuffer<u8>],
    mine: &Stream,
) -> (Sender<()>, Vec<Transfer<'a>>) {
    let open = gate(mine);
    let transfers = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            let options = if i == 0 { StartOptions::new().after(mine) } else { StartOptions::new() };
            s.start_with(file, span(i), b, options).unwrap()
        })
        .collect();
    (open, transfers)
}

fn span(i: usize) -> std::ops::Range<u64> {
    (i * SPAN) as u64..((i + 1) * SPAN) as u64
}

#[test]
fn queued_transfers_run_as_one_pass_each_with_its_own_report() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-one-pass");
    let (file, data) = data_file(&dir, 31, SPANS * SPAN + 777);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(20);
    for strategy in strategies() {
        let (s, mut bufs) = ready(dev, strategy, &file);
        let mine = Stream::new(&dev).unwrap();
        let (open, transfers) = start_gated(&s, &file, &mut bufs, &mine);
        open.send(()).unwrap();
        let reports: Vec<Report> = transfers.into_iter().map(|tr| tr.wait().unwrap()).collect();
        for (i, r) in reports.iter().enumerate() {
            assert_eq!(r.bytes, SPAN as u64, "{strategy}: transfer {i}");
            assert_eq!(r.strategy, strategy, "{strategy}: transfer {i}");
            // The first began the pass; the others were queued while it was
            // held at the gate, so the pass took each of them.
            assert_eq!(r.chained, i > 0, "{strategy}: transfer {i}: {r}");
            assert!(r.seconds > 0.0, "{strategy}: transfer {i}");
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.to_vec().unwrap() == data[i * SPAN..(i + 1) * SPAN], "{strategy}: transfer {i}'s data");
        }
        drop(s);
    }
    t.assert_clean();
}

/// Ranges queued in no order of the file (a shuffle's blocks) join one
/// pass, each with its own data; one that overlaps a range of the pass
/// begins the next pass, and the ranges after it join that one.
#[test]
fn ranges_in_any_order_join_and_an_overlap_begins_the_next_pass() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-any-order");
    let (file, data) = data_file(&dir, 34, SPANS * SPAN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(20);
    // Span 2, then 0 and 3 (before and after it), then 2 again (an
    // overlap: the next pass), then 1 (joins that one).
    let order = [2usize, 0, 3, 2, 1];
    for strategy in strategies() {
        let (s, mut first) = ready(dev, strategy, &file);
        let mut bufs: Vec<DeviceBuffer<u8>> =
            (0..order.len()).map(|_| DeviceBuffer::new(&dev, SPAN).unwrap()).collect();
        let mine = Stream::new(&dev).unwrap();
        let open = gate(&mine);
        let transfers: Vec<Transfer<'_>> = bufs
            .iter_mut()
            .zip(order)
            .enumerate()
            .map(|(i, (b, k))| {
                let options = if i == 0 { StartOptions::new().after(&mine) } else { StartOptions::new() };
                s.start_with(&file, span(k), b, options).unwrap()
            })
            .collect();
        open.send(()).unwrap();
        let chained: Vec<bool> = transfers.into_iter().map(|tr| tr.wait().unwrap().chained).collect();
        assert_eq!(chained, [false, true, true, false, true], "{strategy}");
        for (i, (b, k)) in bufs.iter().zip(order).enumerate() {
            assert!(b.to_vec().unwrap() == data[k * SPAN..(k + 1) * SPAN], "{strategy}: transfer {i}'s data");
        }
        drop((s, bufs, first.pop()));
    }
}

#[test]
fn a_transfer_that_cannot_join_runs_in_the_next_pass() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-cannot-join");
    let (f1, d1) = data_file(&dir, 32, SPANS * SPAN);
    let (f2, d2) = data_file(&dir, 33, SPAN);
    let dev = Device::get(0).unwrap();
    t.set_delay_us(20);
    let strategy = Strategy::Hybrid { window: 256 << 10, slot: 64 << 10, threads: 2 };
    let s = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(64 << 20))).unwrap();
    let mut bufs: Vec<DeviceBuffer<u8>> = (0..6).map(|_| DeviceBuffer::new(&dev, SPAN).unwrap()).collect();
    warm_up(&s, &f1, &mut bufs[0]);
    let (mine, later) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let open = gate(&mine);
    let open_later = gate(&later);
    let [b0, b1, b2, b3, b4, b5] = &mut bufs[..] else { unreachable!() };
    let t0 = s.start_with(&f1, span(1), b0, StartOptions::new().after(&mine)).unwrap();
    let t1 = s.start(&f1, span(2), b1).unwrap(); // joins
    let t2 = s.start(&f2, span(0), b2).unwrap(); // another file: the next pass
    let t3 = s.start(&f1, span(0), b3).unwrap(); // after another file's: the next pass
    // Not completed: it joins t3's pass and waits for `later` on the device,
    // once t3's copies are all enqueued (so that they do not wait for it).
    let t4 = s.start_with(&f1, span(1), b4, StartOptions::new().after(&later)).unwrap();
    let t5 = s.start(&f1, span(3), b5).unwrap();
    open.send(()).unwrap();
    let (r0, r1, r2, r3) = (t0.wait().unwrap(), t1.wait().unwrap(), t2.wait().unwrap(), t3.wait().unwrap());
    assert!(!r0.chained && r1.chained && !r2.chained && !r3.chained, "{r0}\n{r1}\n{r2}\n{r3}");
    // t3 ended while `later` was held: t4 cannot have.
    assert!(!t4.is_done() && !t5.is_done());
    open_later.send(()).unwrap();
    let (r4, r5) = (t4.wait().unwrap(), t5.wait().unwrap());
    assert!(r4.chained && r5.chained, "{r4}\n{r5}");
    let want =
        [&d1[SPAN..2 * SPAN], &d1[2 * SPAN..3 * SPAN], &d2[..], &d1[..SPAN], &d1[SPAN..2 * SPAN], &d1[3 * SPAN..]];
    for (i, (b, w)) in bufs.iter().zip(want).enumerate() {
        assert!(b.to_vec().unwrap() == w, "transfer {i}'s data");
    }
    drop((s, bufs, mine, later));
    t.assert_clean();
}

#[test]
fn a_failed_pass_fails_what_it_wrote_and_runs_the_rest_on_their_own() {
    const UNKNOWN: u32 = 999;
    let t = start_emulated();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-failure");
    let (file, data) = data_file(&dir, 34, SPANS * SPAN);
    let dev = Device::get(0).unwrap();
    let strategy = Strategy::Ring { slots: 4, slot: 1 << 20, threads: 1 };
    let (s, mut bufs) = ready(dev, strategy, &file);
    let mine = Stream::new(&dev).unwrap();
    let (open, transfers) = start_gated(&s, &file, &mut bufs, &mine);
    // Three copies per transfer (slots of 1 MiB, one thread, in order): the
    // fifth is the second of transfer 1.
    assert!(t.emu().inject_fault("cudaMemcpyAsync", 5, UNKNOWN, false));
    open.send(()).unwrap();
    let results: Vec<_> = transfers.into_iter().map(|tr| tr.wait()).collect();
    t.emu().reset();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(e @ Error::Cuda(_)) => assert_eq!(e.cuda_call(), Some("cudaMemcpyAsync"), "{e}"),
        other => panic!("transfer 1: {other:?}"),
    }
    // Transfer 2 was not touched: it runs after the failed pass, in a pass
    // of its own (which transfer 3 may join).
    let r2 = results[2].as_ref().unwrap_or_else(|e| panic!("transfer 2: {e}"));
    assert!(!r2.chained, "{r2}");
    assert!(results[3].is_ok(), "{:?}", results[3]);
    for i in [0, 2, 3] {
        assert!(bufs[i].to_vec().unwrap() == data[i * SPAN..(i + 1) * SPAN], "transfer {i}'s data");
    }
    drop((s, bufs, mine));
    t.assert_clean();
}

/// Piece `i` of `n` with a gap of `gap` bytes before each one after the first.
fn piece(i: usize, gap: usize) -> Range<u64> {
    let at = (i * (SPAN + gap)) as u64;
    at..at + SPAN as u64
}

#[test]
fn pieces_with_gaps_between_them_run_as_one_pass() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-gaps");
    const GAP: usize = 300_001;
    let (file, data) = data_file(&dir, 35, SPANS * (SPAN + GAP));
    let dev = Device::get(0).unwrap();
    t.set_delay_us(20);
    for strategy in strategies() {
        let (s, mut bufs) = ready(dev, strategy, &file);
        let mine = Stream::new(&dev).unwrap();
        let open = gate(&mine);
        // Each piece ordered after `mine` (the first held at the gate): the
        // later ones' `after` has not completed when they join, either.
        let transfers: Vec<Transfer<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| s.start_with(&file, piece(i, GAP), b, StartOptions::new().after(&mine)).unwrap())
            .collect();
        open.send(()).unwrap();
        for (i, tr) in transfers.into_iter().enumerate() {
            let r = tr.wait().unwrap();
            assert_eq!((r.bytes, r.chained), (SPAN as u64, i > 0), "{strategy}: piece {i}: {r}");
        }
        for (i, b) in bufs.iter().enumerate() {
            let r = piece(i, GAP);
            assert!(b.to_vec().unwrap() == data[r.start as usize..r.end as usize], "{strategy}: piece {i}'s data");
        }
        drop((s, mine));
    }
    t.assert_clean();
}

#[test]
fn an_after_that_has_completed_does_not_end_the_chain() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-after-done");
    let (file, data) = data_file(&dir, 36, SPANS * SPAN);
    let dev = Device::get(0).unwrap();
    let strategy = Strategy::Ring { slots: 4, slot: 128 << 10, threads: 2 };
    let (s, mut bufs) = ready(dev, strategy, &file);
    let (mine, idle) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    idle.synchronize().unwrap();
    let (head, rest) = bufs.split_at_mut(1);
    let (open, mut transfers) = start_gated(&s, &file, head, &mine);
    for (i, b) in rest.iter_mut().enumerate() {
        // Ordered after a stream with nothing on it: its event completes at once.
        transfers.push(s.start_with(&file, span(i + 1), b, StartOptions::new().after(&idle)).unwrap());
    }
    open.send(()).unwrap();
    for (i, tr) in transfers.into_iter().enumerate() {
        let r = tr.wait().unwrap();
        assert_eq!(r.chained, i > 0, "transfer {i}: {r}");
    }
    for (i, b) in bufs.iter().enumerate() {
        assert!(b.to_vec().unwrap() == data[i * SPAN..(i + 1) * SPAN], "transfer {i}'s data");
    }
    drop((s, bufs, mine, idle));
    t.assert_clean();
}

/// With `Auto`, pieces that each fit the budget, queued back to back, run as
/// one pass planned for their total: streamed, not each registered whole.
#[test]
fn auto_plans_a_chain_for_its_queued_total() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-auto");
    const PIECES: usize = 8;
    let (file, data) = data_file(&dir, 37, PIECES * SPAN);
    let (other, other_data) = data_file(&dir, 38, 4096);
    let dev = Device::get(0).unwrap();
    // Each piece fits, their total does not.
    let budget = PinBudget::new(12 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, budget.clone())).unwrap();
    assert_eq!(s.resolve(SPAN as u64), Strategy::WholeFile, "a piece alone would be registered whole");
    let planned = s.resolve((PIECES * SPAN) as u64);
    assert_ne!(planned, Strategy::WholeFile);
    s.prepare((PIECES * SPAN) as u64).unwrap(); // its ring, before the gate holds a stream
    // A transfer of another file holds the worker at a gate while the
    // pieces are queued: the pass that takes them up sees them all.
    let mine = Stream::new(&dev).unwrap();
    let mut first = DeviceBuffer::<u8>::new(&dev, 4096).unwrap();
    let open = gate(&mine);
    let held = s.start_with(&other, 0..4096, &mut first, StartOptions::new().after(&mine)).unwrap();
    let mut bufs: Vec<DeviceBuffer<u8>> = (0..PIECES).map(|_| DeviceBuffer::new(&dev, SPAN).unwrap()).collect();
    let transfers: Vec<Transfer<'_>> =
        bufs.iter_mut().enumerate().map(|(i, b)| s.start(&file, span(i), b).unwrap()).collect();
    open.send(()).unwrap();
    assert_eq!(held.wait().unwrap().strategy, Strategy::WholeFile);
    for (i, tr) in transfers.into_iter().enumerate() {
        let r = tr.wait().unwrap();
        assert_eq!((r.strategy, r.chained), (planned, i > 0), "piece {i}: {r}");
    }
    for (i, b) in bufs.iter().enumerate() {
        assert!(b.to_vec().unwrap() == data[i * SPAN..(i + 1) * SPAN], "piece {i}'s data");
    }
    assert_eq!(first.to_vec().unwrap(), other_data);
    // Nothing of the file is kept registered: the pieces streamed.
    let ring = planned.pinned_bytes(0).unwrap_or(0);
    assert!(s.kept_pinned_bytes() <= ring + (8 << 10), "{} kept", s.kept_pinned_bytes());
    // Every piece of the pass counts as streamed: read again alone, one is
    // registered whole (and kept).
    let mut again = DeviceBuffer::<u8>::new(&dev, SPAN).unwrap();
    assert_eq!(s.start(&file, span(3), &mut again).unwrap().wait().unwrap().strategy, Strategy::WholeFile);
    assert!(again.to_vec().unwrap() == data[3 * SPAN..4 * SPAN], "piece 3 again");
    drop((s, bufs, first, mine, budget, again));
    t.assert_clean();
}

/// A lone piece of a file larger than the budget streams through the ring
/// the first time: read once, it would be registered, copied and given back.
/// Read again while the streamer remembers it, it is registered whole and
/// kept, and a part of it uses that registration.
#[test]
fn a_lone_piece_streams_through_the_ring_until_it_is_read_again() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-lone");
    const PIECES: usize = 8;
    let (file, data) = data_file(&dir, 39, PIECES * SPAN);
    let dev = Device::get(0).unwrap();
    // Each piece fits, the file does not.
    let budget = PinBudget::new(12 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, budget.clone())).unwrap();
    let read = |range: Range<u64>| {
        let mut buf = DeviceBuffer::<u8>::new(&dev, (range.end - range.start) as usize).unwrap();
        let r = s.start(&file, range.clone(), &mut buf).unwrap().wait().unwrap();
        assert!(buf.to_vec().unwrap() == data[range.start as usize..range.end as usize], "{range:?}'s data");
        r.strategy
    };
    // A pass over the whole file does not count as reading each piece.
    let all = read(0..(PIECES * SPAN) as u64);
    assert_ne!(all, Strategy::WholeFile, "the file does not fit");
    let mut ring = 0;
    for i in [0, 1] {
        let first = read(span(i));
        assert!(matches!(first, Strategy::Ring { .. }), "piece {i} first: {first}");
        ring = first.pinned_bytes(0).unwrap();
    }
    // The ring (and its slots' alignment slack) is kept, no registration.
    let kept = s.kept_pinned_bytes();
    assert!(kept <= ring + (64 << 10), "{kept} kept beside a ring of {ring}: no piece registered");
    assert_eq!(read(span(0)), Strategy::WholeFile, "piece 0 again");
    let kept = s.kept_pinned_bytes();
    assert!(kept >= SPAN as u64, "{kept} kept: piece 0 registered");
    let part = span(0).start + 4096..span(0).end - 40;
    assert_eq!(read(part), Strategy::WholeFile, "a part of piece 0: its registration");
    let third = read(span(2));
    assert!(matches!(third, Strategy::Ring { .. }), "piece 2 first: {third}");
    drop((s, budget));
    t.assert_clean();
}

/// An empty range through `start` ends as through `to_device`: with an empty
/// report, whatever the strategy, alone or between transfers queued back to
/// back (which still land). The windows, ring and hybrid strategies once
/// queued it as the first transfer of a chained pass, which moved nothing
/// and so never finished it: `wait` failed with "its pass ended before its
/// copies were".
#[test]
fn an_empty_range_through_start_ends_as_through_to_device() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-empty");
    let (file, data) = data_file(&dir, 35, 2 * SPAN);
    let dev = Device::get(0).unwrap();
    let mut every = strategies().to_vec();
    every.extend([Strategy::Auto, Strategy::WholeFile]);
    for strategy in every {
        let s = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(4 << 20))).unwrap();
        let mut empty = DeviceBuffer::<u8>::new(&dev, 0).unwrap();
        let want = s.to_device(&file, 5..5, &mut empty).unwrap();
        let got = s.start(&file, 5..5, &mut empty).unwrap().wait();
        let got = got.unwrap_or_else(|e| panic!("{strategy}: {e}"));
        assert_eq!((got.bytes, got.registrations, got.strategy), (want.bytes, want.registrations, want.strategy));
        assert_eq!(got.verified, want.verified, "{strategy}");
        // Between transfers queued back to back; `then_on` answers at once.
        let (mut a, mut b) =
            (DeviceBuffer::<u8>::new(&dev, SPAN).unwrap(), DeviceBuffer::<u8>::new(&dev, SPAN).unwrap());
        let mine = Stream::new(&dev).unwrap();
        let ta = s.start(&file, span(0), &mut a).unwrap();
        let te = s.start(&file, span(1).start..span(1).start, &mut empty).unwrap();
        let tb = s.start(&file, span(1), &mut b).unwrap();
        te.then_on(&mine).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        assert_eq!(te.wait().unwrap_or_else(|e| panic!("{strategy}: {e}")).bytes, 0);
        let (ra, rb) = (ta.wait().unwrap(), tb.wait().unwrap());
        assert_eq!((ra.bytes, rb.bytes), (SPAN as u64, SPAN as u64), "{strategy}");
        assert!(a.to_vec().unwrap() == data[..SPAN] && b.to_vec().unwrap() == data[SPAN..], "{strategy}");
        drop((s, a, b, empty, mine));
    }
    // With verification and an empty budget too: an empty range pins nothing
    // (to_device once asked the budget for its bounce buffer, and failed).
    let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(0)).with_verify(true);
    let s = Streamer::new(&[dev], cfg).unwrap();
    let mut empty = DeviceBuffer::<u8>::new(&dev, 0).unwrap();
    let want = s.to_device(&file, 5..5, &mut empty).unwrap();
    let got = s.start(&file, 5..5, &mut empty).unwrap().wait().unwrap();
    assert_eq!((want.bytes, want.verified, got.bytes, got.verified), (0, Some(true), 0, Some(true)));
    let mut scratch = DeviceBuffer::<u8>::new(&dev, 1).unwrap();
    assert_eq!(s.to_scratch(&file, 7..7, &mut scratch).unwrap().bytes, 0);
    assert_eq!(s.for_each_chunk(&file, 7..7, 1, |_, _, _, _| panic!("no chunk")).unwrap().bytes, 0);
    drop((s, empty, scratch));
    t.assert_clean();
}

/// Pieces queued together with `start_many` run as one pass planned for
/// their total, with no gate holding the worker: none is taken up alone.
#[test]
fn pieces_started_together_run_as_one_planned_pass() {
    let t = start();
    let _w = Watchdog::new(120);
    let dir = TempDir::new("chain-many");
    const PIECES: usize = 8;
    let (file, data) = data_file(&dir, 39, PIECES * SPAN * 2);
    let dev = Device::get(0).unwrap();
    let budget = PinBudget::new(12 << 20);
    let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, budget.clone())).unwrap();
    let planned = s.resolve((PIECES * SPAN) as u64);
    assert_ne!(planned, Strategy::WholeFile);
    let mut bufs: Vec<DeviceBuffer<u8>> = (0..PIECES).map(|_| DeviceBuffer::new(&dev, SPAN).unwrap()).collect();
    // Every other piece of the file: ascending, with gaps.
    let pieces = bufs.iter_mut().enumerate().map(|(i, b)| (span(2 * i), b.slice_mut(..).unwrap())).collect();
    for (i, tr) in s.start_many(&file, pieces).unwrap().into_iter().enumerate() {
        let r = tr.wait().unwrap();
        assert_eq!((r.strategy, r.chained), (planned, i > 0), "piece {i}: {r}");
    }
    for (i, b) in bufs.iter().enumerate() {
        let r = span(2 * i);
        assert!(b.to_vec().unwrap() == data[r.start as usize..r.end as usize], "piece {i}'s data");
    }
    drop((s, bufs, budget));
    t.assert_clean();
}
