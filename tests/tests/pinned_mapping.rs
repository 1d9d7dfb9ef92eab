//! pinned-mem: read-only shared mappings of files.

use wirespeed_pinned::{Error, PinBudget, PinOptions, PinnedRange};
use wirespeed_tests::{TempDir, open_mapped, start, write_pattern_file};

#[test]
fn maps_a_file_with_its_exact_bytes() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let path = dir.join("data.bin");
    let data = write_pattern_file(&path, 1, (3 << 20) + 12345);
    let f = open_mapped(&path).unwrap();
    assert_eq!(f.len(), data.len() as u64);
    assert_eq!(f.path(), path.as_path());
    assert_eq!(f.as_bytes(), &data[..]);
    assert!(f.resident_bytes(0..f.len()).unwrap() <= f.len());
    #[allow(clippy::reversed_empty_ranges)] // on purpose
    let reversed = 10..5;
    assert!(f.resident_bytes(reversed).is_err());
    assert!(matches!(f.resident_bytes(0..f.len() + 1), Err(Error::BadRange { .. })));
    f.drop_page_cache().unwrap();
    assert_eq!(f.as_bytes(), &data[..], "the data is fetched back after dropping the page cache");
    t.assert_clean();
}

#[test]
fn one_byte_file() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let path = dir.join("one.bin");
    std::fs::write(&path, [42u8]).unwrap();
    let f = open_mapped(&path).unwrap();
    assert_eq!((f.len(), f.as_bytes()), (1, &[42u8][..]));
    t.assert_clean();
}

#[test]
fn refuses_empty_files_directories_devices_and_missing_files() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let empty = dir.join("empty.bin");
    std::fs::write(&empty, []).unwrap();
    match open_mapped(&empty) {
        Err(e @ Error::EmptyFile { .. }) => assert!(e.to_string().contains("empty"), "{e}"),
        other => panic!("{other:?}"),
    }
    match open_mapped(dir.path()) {
        Err(e @ Error::NotAFile { kind: "directory", .. }) => assert!(e.to_string().contains("directory"), "{e}"),
        other => panic!("{other:?}"),
    }
    if std::path::Path::new("/dev/null").exists() {
        assert!(matches!(open_mapped("/dev/null"), Err(Error::NotAFile { kind: "character device", .. })));
    }
    match open_mapped(dir.join("missing.bin")) {
        Err(Error::Io { op: "open", path, source }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            assert!(path.ends_with("missing.bin"));
        }
        other => panic!("{other:?}"),
    }
    t.assert_clean();
}

#[test]
fn a_registration_keeps_the_mapping_alive() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let path = dir.join("data.bin");
    let data = write_pattern_file(&path, 2, 100_000);
    let f = open_mapped(&path).unwrap();
    let budget = PinBudget::unlimited();
    let r = PinnedRange::new(&f, 10..90_000, PinOptions::default(), &budget).unwrap();
    drop(f); // the range holds the mapping
    assert_eq!(r.as_bytes(), &data[10..90_000]);
    assert_eq!(r.file().as_bytes(), &data[..]);
    drop(r);
    assert_eq!(budget.used(), 0);
    t.assert_clean();
}

#[test]
fn the_mapping_is_shared_and_read_only() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let path = dir.join("data.bin");
    write_pattern_file(&path, 3, 8192);
    let f = open_mapped(&path).unwrap();
    let addr = f.as_bytes().as_ptr() as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| {
            let mut it = l.split(['-', ' ']);
            let a = usize::from_str_radix(it.next().unwrap_or(""), 16).unwrap_or(0);
            a == addr
        })
        .expect("the mapping is in /proc/self/maps");
    let perms = line.split_whitespace().nth(1).unwrap();
    assert_eq!(perms, "r--s", "PROT_READ + MAP_SHARED, never private or writable: {line}");
    t.assert_clean();
}

#[test]
fn bytes_and_device_buffers_of_ranges_take_file_offsets() {
    let t = start();
    let dir = TempDir::new("pm-map");
    let path = dir.join("ranges.bin");
    let data = write_pattern_file(&path, 7, (1 << 20) + 10);
    let f = open_mapped(&path).unwrap();
    let len = f.len();
    assert_eq!(f.bytes(0..len).unwrap(), &data[..]);
    assert_eq!(f.bytes(100..164).unwrap(), &data[100..164]);
    assert!(f.bytes(len..len).unwrap().is_empty());
    #[allow(clippy::reversed_empty_ranges)] // on purpose
    let reversed = 10..5;
    assert!(matches!(f.bytes(reversed.clone()), Err(Error::BadRange { .. })));
    assert!(matches!(f.bytes(0..len + 1), Err(Error::BadRange { .. })));

    let dev = wirespeed_cuda::Device::get(0).unwrap();
    let whole = f.device_buffer::<u8>(&dev, 0..len).unwrap();
    assert_eq!((whole.len() as u64, whole.device()), (len, dev));
    let words = f.device_buffer::<u32>(&dev, 8..4104).unwrap();
    assert_eq!(words.len(), 1024);
    assert_eq!(f.device_buffer::<f64>(&dev, 3..3).unwrap().len(), 0);
    assert!(matches!(f.device_buffer::<u32>(&dev, 0..6), Err(Error::InvalidArgument { .. })));
    assert!(matches!(f.device_buffer::<u8>(&dev, reversed), Err(Error::BadRange { .. })));
    assert!(matches!(f.device_buffer::<u8>(&dev, 0..len + 1), Err(Error::BadRange { .. })));
    drop((whole, words));
    t.assert_clean();
}

/// KiB of the mapping at `ptr` that have page-table entries now (`Rss` of
/// its area in `/proc/self/smaps`), or `None` where that cannot be read.
fn mapped_kib(ptr: *const u8) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let at = ptr as u64;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            inside = a <= at && at < b;
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            return kb.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// `populate` maps the pages of a fresh mapping without reading them (where
/// the kernel has `MADV_POPULATE_READ`), refuses ranges outside the file,
/// and the streamer's ring threads populate each 2 MiB part of a fresh
/// mapping before they first copy from it: one page copied maps its part.
#[test]
fn populate_maps_the_pages_of_a_fresh_mapping() {
    use wirespeed_cuda::{Device, DeviceBuffer};
    use wirespeed_pinned::{Strategy, StreamConfig, Streamer};
    let t = start();
    let dir = TempDir::new("pm-map-populate");
    let path = dir.join("data.bin");
    let data = write_pattern_file(&path, 5, (8 << 20) + 123); // written: in the page cache
    let f = open_mapped(&path).unwrap();
    let base = f.as_bytes().as_ptr();
    assert!(matches!(f.populate(0..f.len() + 1), Err(Error::BadRange { .. })));
    #[allow(clippy::reversed_empty_ranges)] // on purpose
    let reversed = 10..5;
    assert!(matches!(f.populate(reversed), Err(Error::BadRange { .. })));
    assert!(f.populate(7..7).unwrap());
    let Some(fresh) = mapped_kib(base) else {
        eprintln!("no /proc/self/smaps here: the mapping's page tables cannot be seen; skipped");
        return;
    };
    if !f.populate(4096..(4 << 20) + 1).unwrap() {
        eprintln!("this kernel lacks MADV_POPULATE_READ: skipped");
        return;
    }
    let populated = mapped_kib(base).unwrap();
    assert!(populated >= fresh + 4096, "{fresh} KiB mapped, then {populated} KiB after populating 4 MiB");
    assert_eq!(f.as_bytes(), &data[..]);
    // The ring threads, on a fresh mapping: one page copied maps its 2 MiB.
    // The file is written a page at a time, so that its page cache holds
    // pages, not large folios (a fault maps a whole folio, and then the
    // populating could not be told from the fault).
    let paged = dir.join("paged.bin");
    {
        use std::io::Write;
        let mut w = std::fs::File::create(&paged).unwrap();
        for page in data.chunks(4096) {
            w.write_all(page).unwrap();
        }
    }
    let g = open_mapped(&paged).unwrap();
    let base = g.as_bytes().as_ptr();
    let before = mapped_kib(base).unwrap();
    let dev = Device::get(0).unwrap();
    let strategy = Strategy::Ring { slots: 2, slot: 4096, threads: 1 };
    let s = Streamer::new(&[dev], StreamConfig::new(strategy, PinBudget::new(1 << 20))).unwrap();
    let mut dst = DeviceBuffer::<u8>::new(&dev, 4096).unwrap();
    s.to_device(&g, 0..4096, &mut dst).unwrap();
    assert_eq!(dst.to_vec().unwrap(), &data[..4096]);
    let after = mapped_kib(base).unwrap();
    assert!(after >= before + 2048, "{before} KiB mapped, then {after} KiB after copying one page");
    drop((s, dst));
    t.assert_clean();
}
