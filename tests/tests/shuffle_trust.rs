//! What a distributed training job trusts the shuffled-batch `Loader` with,
//! on the emulated runtime (CI) and on a GPU (`CUDA_REQUIRED=1`): ranks
//! split one order whatever memory each is given once the order's settings
//! are named (and are refused where a default would let free memory choose
//! it), checkpoints resume exactly or name what differs, and no way waits
//! on the host for work the caller queued on its own stream.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{Error, Loader, LoaderConfig, MappedFile, PinBudget, Records, Way};
use wirespeed_tests::{TempDir, hold, open_mapped, start, write_pattern_file};

const REC: u64 = 2883;

/// `n` records of 2,883 bytes, and an 8-byte label per record (its index).
fn files(dir: &TempDir, n: u64) -> (Arc<MappedFile>, Arc<MappedFile>) {
    write_pattern_file(&dir.join("feats.bin"), 11, (n * REC) as usize);
    let labels: Vec<u8> = (0..n).flat_map(u64::to_le_bytes).collect();
    std::fs::write(dir.join("labels.bin"), &labels).unwrap();
    (open_mapped(dir.join("feats.bin")).unwrap(), open_mapped(dir.join("labels.bin")).unwrap())
}

fn arrays(f: &(Arc<MappedFile>, Arc<MappedFile>)) -> Vec<Records> {
    vec![Records::new(&f.0, 0, REC).unwrap(), Records::new(&f.1, 0, 8).unwrap()]
}

/// Blocks of 16 records; a pin budget that holds the registered arrays.
fn config(way: Way, batch: u64) -> LoaderConfig {
    LoaderConfig::new(batch).seed(21).way(way).block_bytes(16 * REC).pin_budget(PinBudget::new(8 << 20))
}

/// The labels of one epoch's batches, gathered on the device.
fn epoch(loader: &mut Loader, dev: &Device) -> Vec<u64> {
    let b = loader.sharding().batch_size() as usize;
    let mut x = DeviceBuffer::<u8>::new(dev, b * REC as usize).unwrap();
    let mut y = DeviceBuffer::<u8>::new(dev, b * 8).unwrap();
    let mut out = Vec::new();
    while let Some(info) = loader.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap() {
        let ys = y.to_vec().unwrap();
        let k = info.records as usize;
        out.extend(ys[..k * 8].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
    }
    out
}

#[test]
fn more_than_one_rank_without_a_budget_is_refused_where_free_memory_would_choose_the_order() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let dir = TempDir::new("trust-refuse");
    let f = files(&dir, 100);
    for (way, slots) in [(Way::Auto, None), (Way::Pool, None)] {
        let mut c = config(way, 8).rank(1, 2);
        c.pool_slots = slots;
        let e = Loader::new(&dev, &arrays(&f), c).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("device_budget") && e.to_string().contains("rank 1 of 2"), "{e}");
    }
    // The budget named, or a way whose order does not follow it: accepted.
    for c in [
        config(Way::Auto, 8).rank(1, 2).device_budget(1 << 20),
        config(Way::Full, 8).rank(1, 2),
        config(Way::Pool, 8).rank(1, 2).pool_slots(2),
        config(Way::Auto, 8),
    ] {
        Loader::new(&dev, &arrays(&f), c).unwrap();
    }
}

#[test]
fn ranks_given_different_budgets_split_one_order_every_way() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let dir = TempDir::new("trust-ranks");
    let n = 1001;
    let f = files(&dir, n);
    // Each rank its own device budget, all large enough for the way.
    let budgets = [3 << 20, 5 << 20, 8 << 20];
    for way in [Way::Pool, Way::Resident, Way::Registered, Way::Ring] {
        for drop_last in [false, true] {
            let mut seen = Vec::new();
            let mut lens = BTreeSet::new();
            for (rank, budget) in budgets.iter().enumerate() {
                let c = config(way, 24).rank(rank as u64, 3).drop_last(drop_last).device_budget(*budget).pool_slots(3);
                let mut loader = Loader::new(&dev, &arrays(&f), c).unwrap();
                assert_eq!(loader.way(), way);
                let got = epoch(&mut loader, &dev);
                lens.insert(got.len());
                seen.extend(got);
            }
            assert_eq!(lens.len(), 1, "{way:?}: shares of different lengths {lens:?}");
            let distinct: BTreeSet<u64> = seen.iter().copied().collect();
            if drop_last {
                assert_eq!(distinct.len(), seen.len(), "{way:?}: a record twice");
            } else {
                assert_eq!(distinct, (0..n).collect(), "{way:?}: a record never handed out");
                assert_eq!(seen.len() as u64, n.div_ceil(3) * 3, "{way:?}");
            }
        }
    }
}

#[test]
fn a_checkpoint_resumes_exactly_in_any_way_of_its_order_and_names_what_differs() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let dir = TempDir::new("trust-resume");
    let f = files(&dir, 500);
    let budget = 8 << 20;
    let mut first = Loader::new(&dev, &arrays(&f), config(Way::Resident, 32).device_budget(budget)).unwrap();
    let whole = epoch(&mut first, &dev);
    first.set_epoch(0).unwrap();
    let mut x = DeviceBuffer::<u8>::new(&dev, 32 * REC as usize).unwrap();
    let mut y = DeviceBuffer::<u8>::new(&dev, 32 * 8).unwrap();
    for _ in 0..4 {
        first.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap();
    }
    let saved = first.checkpoint();
    assert_eq!((saved.state.epoch, saved.state.batch, saved.pool), (0, 4, None));
    drop(first);
    // A full shuffle is one order whichever way gathers it.
    for way in [Way::Registered, Way::Ring, Way::Full] {
        let mut again = Loader::new(&dev, &arrays(&f), config(way, 32).device_budget(budget)).unwrap();
        again.resume(&saved).unwrap();
        assert_eq!(epoch(&mut again, &dev), whole[4 * 32..], "{way:?}");
    }
    // The pool's order is another: refused, naming both.
    let mut pool = Loader::new(&dev, &arrays(&f), config(Way::Pool, 32).device_budget(budget).pool_slots(4)).unwrap();
    let e = pool.resume(&saved).unwrap_err().to_string();
    assert!(e.contains("order") && e.contains("full shuffle") && e.contains("4 blocks a half"), "{e}");
    // A pool's checkpoint resumes a pool of its shape, not of another.
    epoch(&mut pool, &dev);
    pool.set_epoch(2).unwrap();
    let mut ahead = pool.checkpoint();
    let rest = epoch(&mut pool, &dev);
    ahead.state.batch = 3;
    let mut same = Loader::new(&dev, &arrays(&f), config(Way::Pool, 32).device_budget(budget).pool_slots(4)).unwrap();
    same.resume(&ahead).unwrap();
    assert_eq!(epoch(&mut same, &dev), rest[3 * 32..]);
    let mut other = Loader::new(&dev, &arrays(&f), config(Way::Pool, 32).device_budget(budget).pool_slots(5)).unwrap();
    assert!(other.resume(&ahead).unwrap_err().to_string().contains("5 blocks a half"));
    // Every other setting of the order, by name.
    let base = config(Way::Resident, 32).device_budget(budget);
    for (name, c) in [
        ("seed", base.clone().seed(22)),
        ("batch_size", { LoaderConfig::new(16).seed(21).way(Way::Resident).device_budget(budget) }),
        ("shuffle", base.clone().shuffle(false)),
        ("drop_last", base.clone().drop_last(true)),
        ("world", base.clone().rank(0, 2)),
    ] {
        let mut l = Loader::new(&dev, &arrays(&f), c).unwrap();
        let e = l.resume(&saved).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(name), "{name}: {e}");
    }
}

#[test]
fn pool_slots_larger_than_the_budget_holds_are_refused() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let dir = TempDir::new("trust-slots");
    let f = files(&dir, 200);
    let c = config(Way::Pool, 8).device_budget(200_000).pool_slots(40);
    let e = Loader::new(&dev, &arrays(&f), c).unwrap_err().to_string();
    assert!(e.contains("pool_slots 40") && e.contains("device budget of 200000"), "{e}");
    let c = config(Way::Pool, 8).pool_slots(0);
    assert!(Loader::new(&dev, &arrays(&f), c).is_err());
}

#[test]
fn no_way_waits_on_the_host_for_the_callers_stream() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let dir = TempDir::new("trust-held");
    let f = files(&dir, 700);
    for way in [Way::Pool, Way::Resident, Way::Registered, Way::Ring] {
        let c = config(way, 32).device_budget(if way == Way::Pool { 400_000 } else { 8 << 20 }).pool_slots(3);
        let mut loader = Loader::new(&dev, &arrays(&f), c).unwrap();
        // The caller's stream, its work queued and not done (held), made to
        // wait for each batch as a training step's stream is.
        let mine = Stream::new(&dev).unwrap();
        let open = hold(&mine);
        // Let go once the epochs are handed out, or after a minute at the
        // latest (a loader that waited for the stream would then go on, and
        // fail the assertion below rather than hang).
        let released = Arc::new(AtomicBool::new(false));
        let (done, finished) = channel::<()>();
        let releaser = {
            let released = Arc::clone(&released);
            std::thread::spawn(move || {
                if finished.recv_timeout(std::time::Duration::from_secs(60)).is_err() {
                    released.store(true, Ordering::SeqCst);
                }
                drop(open);
            })
        };
        let mut x = DeviceBuffer::<u8>::new(&dev, 32 * REC as usize).unwrap();
        let mut y = DeviceBuffer::<u8>::new(&dev, 32 * 8).unwrap();
        let mut batches = 0;
        for _ in 0..2 {
            while loader.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap().is_some() {
                loader.ready_on(&mine).unwrap();
                batches += 1;
            }
            let e = loader.state().epoch;
            loader.set_epoch(e + 1).unwrap();
        }
        let _ = done.send(());
        releaser.join().unwrap();
        assert!(!released.load(Ordering::SeqCst), "{way:?}: the loader waited for the caller's stream");
        assert_eq!(batches, 2 * loader.len());
        mine.synchronize().unwrap();
    }
}
