//! The shuffled-batch `Loader`, on the emulated runtime (CI) and on a GPU
//! (`CUDA_REQUIRED=1`): every way hands out every record once per epoch with
//! the file's bytes, the order is fixed by (seed, epoch), resumption, ranks,
//! several arrays, bad input, faults, and nothing left behind.

use std::sync::Arc;

use wirespeed_cuda::{Device, DeviceBuffer};
use wirespeed_pinned::{Loader, LoaderConfig, LoaderState, MappedFile, PinBudget, Records, Way};
use wirespeed_tests::{
    TempDir, child_ran, is_child, open_mapped, run_child, start, start_emulated, write_pattern_file,
};

const REC: u64 = 2883;

struct Data {
    _dir: TempDir,
    feats: Arc<MappedFile>,
    labels: Arc<MappedFile>,
    bytes: Vec<u8>,
    n: u64,
}

/// `n` records of 2,883 bytes (a pattern) and an 8-byte label per record (its index).
fn data(n: u64) -> Data {
    let dir = TempDir::new("shuffle");
    let bytes = write_pattern_file(&dir.join("feats.bin"), 7, (n * REC) as usize);
    let labels: Vec<u8> = (0..n).flat_map(u64::to_le_bytes).collect();
    std::fs::write(dir.join("labels.bin"), &labels).unwrap();
    let feats = open_mapped(dir.join("feats.bin")).unwrap();
    let labels = open_mapped(dir.join("labels.bin")).unwrap();
    Data { _dir: dir, feats, labels, bytes, n }
}

fn arrays(d: &Data) -> Vec<Records> {
    vec![Records::new(&d.feats, 0, REC).unwrap(), Records::new(&d.labels, 0, 8).unwrap()]
}

/// One epoch: each batch's labels, its feature bytes checked against the file.
fn epoch(loader: &mut Loader, d: &Data, dev: &Device) -> Vec<Vec<u64>> {
    let b = loader.sharding().batch_size();
    let mut x = DeviceBuffer::<u8>::new(dev, (b * REC) as usize).unwrap();
    let mut y = DeviceBuffer::<u8>::new(dev, (b * 8) as usize).unwrap();
    let mut out = Vec::new();
    while let Some(info) = loader.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap() {
        let k = info.records as usize;
        let ys = y.to_vec().unwrap();
        let xs = x.to_vec().unwrap();
        let labels: Vec<u64> = ys[..k * 8].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        // The records the kernel gathered (its permutation computed on the
        // device, or its offsets uploaded) are those the order names.
        assert_eq!(labels, loader.batch_records(info.index), "batch {}", info.index);
        for (j, &r) in labels.iter().enumerate() {
            let at = (r * REC) as usize;
            assert_eq!(&xs[j * REC as usize..(j + 1) * REC as usize], &d.bytes[at..at + REC as usize], "record {r}");
        }
        out.push(labels);
    }
    out
}

fn config(way: Way) -> LoaderConfig {
    // Pool: blocks of 16 records, two halves of 4 slots within 400 KB.
    LoaderConfig::new(20)
        .seed(3)
        .way(way)
        .block_bytes(16 * REC)
        .device_budget(400_000)
        .pin_budget(PinBudget::new(8 << 20))
}

#[test]
fn every_way_hands_out_every_record_once_with_the_files_bytes() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let d = data(333);
    for way in [Way::Pool, Way::Resident, Way::Registered, Way::Ring] {
        let c = if way == Way::Resident { config(way).device_budget(4 << 20) } else { config(way) };
        let mut loader = Loader::new(&dev, &arrays(&d), c).unwrap();
        assert_eq!(loader.way(), way);
        assert_eq!(loader.len(), 17);
        for e in 0..2 {
            loader.set_epoch(e).unwrap();
            let batches = epoch(&mut loader, &d, &dev);
            let mut all: Vec<u64> = batches.concat();
            all.sort_unstable();
            assert_eq!(all, (0..d.n).collect::<Vec<_>>(), "{way:?} epoch {e}");
            assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [vec![20; 16], vec![13]].concat());
        }
    }
}

#[test]
fn auto_picks_what_fits() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let d = data(100);
    let a = arrays(&d);
    let pick = |c: LoaderConfig| Loader::new(&dev, &a, c).unwrap().way();
    assert_eq!(pick(LoaderConfig::new(10).device_budget(1 << 20)), Way::Resident);
    assert_eq!(pick(LoaderConfig::new(10).device_budget(1000).pin_budget(PinBudget::new(1 << 20))), Way::Registered);
    let small = LoaderConfig::new(10).device_budget(200_000).pin_budget(PinBudget::new(1000)).block_bytes(10 * REC);
    assert_eq!(pick(small.clone()), Way::Pool);
    assert_eq!(pick(small.pin_budget(PinBudget::new(200_000)).way(Way::Full)), Way::Ring);
}

#[test]
fn the_order_is_fixed_by_seed_and_epoch_and_resumes_exactly() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let d = data(200);
    for way in [Way::Pool, Way::Resident] {
        let mut a =
            Loader::new(&dev, &arrays(&d), config(way).device_budget(if way == Way::Pool { 400_000 } else { 4 << 20 }))
                .unwrap();
        let e0 = epoch(&mut a, &d, &dev);
        a.set_epoch(1).unwrap();
        let e1 = epoch(&mut a, &d, &dev);
        assert_ne!(e0, e1, "{way:?}");
        a.set_epoch(0).unwrap();
        assert_eq!(epoch(&mut a, &d, &dev), e0, "{way:?}: the same epoch again");
        // Resume mid-epoch 1 in a new loader.
        let mut b =
            Loader::new(&dev, &arrays(&d), config(way).device_budget(if way == Way::Pool { 400_000 } else { 4 << 20 }))
                .unwrap();
        b.load_state(LoaderState { epoch: 1, batch: 4 }).unwrap();
        assert_eq!(epoch(&mut b, &d, &dev), e1[4..].to_vec(), "{way:?}: resumed");
        assert!(b.load_state(LoaderState { epoch: 1, batch: 11 }).is_err());
    }
}

#[test]
fn file_order_without_shuffle() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let d = data(100);
    for way in [Way::Pool, Way::Resident] {
        let c = config(way).shuffle(false).device_budget(if way == Way::Pool { 400_000 } else { 4 << 20 });
        let mut l = Loader::new(&dev, &arrays(&d), c).unwrap();
        assert_eq!(epoch(&mut l, &d, &dev).concat(), (0..100).collect::<Vec<_>>(), "{way:?}");
    }
}

#[test]
fn ranks_get_disjoint_shares_that_cover_the_epoch() {
    let _t = start();
    let dev = Device::get(0).unwrap();
    let d = data(301);
    for way in [Way::Pool, Way::Resident] {
        let mut all = Vec::new();
        for rank in 0..3 {
            let c = config(way).rank(rank, 3).device_budget(if way == Way::Pool { 400_000 } else { 4 << 20 });
            let mut l = Loader::new(&dev, &arrays(&d), c).unwrap();
            let mine = epoch(&mut l, &d, &dev).concat();
            assert_eq!(mine.len(), 101, "{way:?} rank {rank}");
            all.extend(mine);
        }
        let mut u = all.clone();
        u.sort_unstable();
        u.dedup();
        assert_eq!(u, (0..301).collect::<Vec<_>>(), "{way:?}");
        assert_eq!(all.len() - u.len(), 2, "{way:?}: 301 padded to 303");
    }
}

#[test]
fn bad_input_is_a_typed_error_and_leaves_nothing() {
    let t = start();
    let dev = Device::get(0).unwrap();
    let d = data(100);
    let short = Records::new(&d.labels, 8, 8).unwrap(); // 99 records
    let feats = Records::new(&d.feats, 0, REC).unwrap();
    let bad: Vec<(Vec<Records>, LoaderConfig, &str)> = vec![
        (vec![feats.clone(), short], LoaderConfig::new(10), "different lengths"),
        (vec![feats.clone()], LoaderConfig::new(0), "batch size"),
        (vec![feats.clone()], LoaderConfig::new(10).rank(2, 2), "rank"),
        (vec![feats.clone()], LoaderConfig::new(10).way(Way::Pool).device_budget(1000), "device budget"),
        (
            vec![feats.clone()],
            LoaderConfig::new(50).way(Way::Pool).block_bytes(4 * REC).device_budget(40 * REC),
            "fewer than a batch",
        ),
        (vec![feats.clone()], LoaderConfig::new(10).way(Way::Resident).device_budget(1000), "device budget"),
        (vec![feats.clone()], LoaderConfig::new(10).way(Way::Registered).pin_budget(PinBudget::new(4096)), "budget"),
        (vec![], LoaderConfig::new(10), "no arrays"),
    ];
    for (a, c, words) in bad {
        let e = Loader::new(&dev, &a, c).unwrap_err();
        assert!(e.to_string().contains(words), "{e} (wanted {words:?})");
    }
    assert!(Records::new(&d.feats, 0, 0).is_err());
    assert!(Records::new(&d.feats, 0, 7).is_err()); // 288,300 bytes are not whole 7-byte records
    assert!(Records::new(&d.feats, 1 << 30, REC).is_err());
    let mut l = Loader::new(&dev, &[feats], LoaderConfig::new(10).device_budget(1 << 20)).unwrap();
    let mut small = DeviceBuffer::<u8>::new(&dev, 100).unwrap();
    assert!(l.next_into(&mut [small.slice_mut(..).unwrap()]).is_err());
    assert!(l.next_into(&mut []).is_err());
    drop((l, small, d));
    if t.emulated() {
        let c = t.counters().unwrap();
        assert_eq!((c.device_allocs, c.pinned_allocs, c.registrations, c.streams), (0, 0, 0, 0), "{c:?}");
    }
}

#[test]
fn a_loader_dropped_or_forgotten_mid_epoch_is_sound() {
    let t = start();
    let dev = Device::get(0).unwrap();
    let d = data(200);
    for way in [Way::Pool, Way::Resident, Way::Registered, Way::Ring] {
        let c = config(way).device_budget(if way == Way::Resident { 4 << 20 } else { 400_000 });
        let mut l = Loader::new(&dev, &arrays(&d), c).unwrap();
        let mut x = DeviceBuffer::<u8>::new(&dev, (20 * REC) as usize).unwrap();
        let mut y = DeviceBuffer::<u8>::new(&dev, 160).unwrap();
        for _ in 0..3 {
            l.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap();
        }
        drop(l); // with gathers and transfers in flight
        let ys = y.to_vec().unwrap(); // waits for the last gather into it
        assert!(ys.chunks(8).all(|c| u64::from_le_bytes(c.try_into().unwrap()) < 200));
    }
    if t.emulated() {
        let c = t.counters().unwrap();
        assert_eq!((c.device_allocs, c.pinned_allocs, c.registrations, c.streams), (0, 0, 0, 0), "{c:?}");
    }
}

#[test]
fn faults_at_load_and_launch_are_typed_errors_and_leave_nothing() {
    if is_child("child_faults") {
        child_faults();
        return;
    }
    let t = start();
    if t.emulated() {
        run_child("child_faults", &[]);
    }
}

#[test]
#[ignore = "runs in a child process started by faults_at_load_and_launch_are_typed_errors_and_leave_nothing"]
fn child_faults() {
    if !is_child("child_faults") {
        return;
    }
    let t = start_emulated();
    let dev = Device::get(0).unwrap();
    let d = data(100);
    // The kernel is loaded on first use, process-wide: a failed load is tried again.
    assert!(t.emu().inject_fault("cudaLibraryLoadData", 1, 218, false));
    let e = Loader::new(&dev, &arrays(&d), LoaderConfig::new(10).device_budget(4 << 20)).unwrap_err();
    assert!(e.to_string().contains("cudaLibraryLoadData"), "{e}");
    let mut l = Loader::new(&dev, &arrays(&d), LoaderConfig::new(10).device_budget(4 << 20)).unwrap();
    let mut x = DeviceBuffer::<u8>::new(&dev, (10 * REC) as usize).unwrap();
    let mut y = DeviceBuffer::<u8>::new(&dev, 80).unwrap();
    assert!(t.emu().inject_fault("cudaLaunchKernel", 1, 719, false));
    let e = l.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap_err();
    assert!(e.to_string().contains("cudaLaunchKernel"), "{e}");
    assert_eq!(l.state().batch, 0, "the batch that failed is handed out again");
    assert!(l.next_into(&mut [x.slice_mut(..).unwrap(), y.slice_mut(..).unwrap()]).unwrap().is_some());
    // A registration that fails leaves nothing registered (after the loader
    // above, whose streamer keeps the file registered, is gone).
    drop((l, x, y));
    assert!(t.emu().inject_fault("cudaHostRegister", 1, 2, false));
    assert!(t.emu().inject_fault("cuMemHostRegister_v2", 1, 2, false));
    let c = LoaderConfig::new(10).way(Way::Registered).pin_budget(PinBudget::new(8 << 20));
    let r = Loader::new(&dev, &arrays(&d), c);
    assert!(r.is_err(), "{:?}", r.map(|l| l.way()));
    t.emu().reset();
    let c = t.counters().unwrap();
    assert_eq!((c.device_allocs, c.pinned_allocs, c.registrations), (0, 0, 0), "{c:?}");
    child_ran("child_faults");
}
