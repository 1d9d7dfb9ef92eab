//! pinned-mem: `Auto` over a cold file (one not in the page cache) reads it
//! into the ring with `O_DIRECT` or through the page cache with readahead,
//! chosen per file: the first pass probes both ways on a stretch each, and
//! later passes read the way chosen from their first byte. Which way wins
//! depends on the machine, so only what does not is asserted: every byte
//! lands, and a later pass reads all one way. The choice itself is tested in
//! the crate (`streamer/agents/cold.rs`), on figures given to it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use wirespeed_cuda::{Device, DeviceBuffer};
use wirespeed_pinned::{MappedFile, PinBudget, Report, Strategy, StreamConfig, Streamer};
use wirespeed_tests::{Watchdog, open_mapped, pattern, start};

const LEN: usize = (24 << 20) + 777;

/// A file of `LEN` bytes written to disk (the target folder, where the page
/// cache can be dropped; /tmp may be tmpfs), removed when dropped.
struct DiskFile(PathBuf);

impl DiskFile {
    fn new(tag: &str, seed: u64) -> (DiskFile, Vec<u8>) {
        // The build's target folder where it exists (a GPU machine running a
        // packed binary has none: the temporary folder then).
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = if dir.is_dir() { dir } else { std::env::temp_dir() };
        let path = dir.join(format!("cold-{tag}-{}.bin", std::process::id()));
        let data = pattern(seed, LEN);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap(); // dirty pages would stay cached
        (DiskFile(path), data)
    }
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Drops the file's page cache; false where it stays mostly cached.
fn cold(file: &Arc<MappedFile>) -> bool {
    file.drop_page_cache().unwrap();
    file.resident_bytes(0..file.len()).unwrap() < file.len() / 2
}

/// A pass of `s` over the whole file, checked.
fn pass(s: &Streamer, file: &Arc<MappedFile>, data: &[u8]) -> Report {
    let mut dst = DeviceBuffer::<u8>::new(&s.devices()[0], LEN).unwrap();
    let r = s.to_device(file, 0..LEN as u64, &mut dst).unwrap();
    assert!(dst.to_vec().unwrap() == data, "{r}");
    r
}

#[test]
fn auto_reads_a_cold_file_the_way_chosen_for_it() {
    let t = start();
    let _w = Watchdog::new(120);
    let (path, data) = DiskFile::new("auto", 1);
    let file = open_mapped(&path.0).unwrap();
    if !cold(&file) {
        eprintln!("note: the page cache of {} could not be dropped here; skipped", path.0.display());
        return;
    }
    let dev = Device::get(0).unwrap();
    // Far less than the file: a cold pass, not a registration.
    let s = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(4 << 20))).unwrap();
    let first = pass(&s, &file, &data);
    assert!(matches!(first.strategy, Strategy::Direct { .. }), "{first}");
    eprintln!("first pass: {first}: {}", first.breakdown);
    let b = first.breakdown;
    assert_eq!(b.ring_bytes, LEN as u64, "{first}");
    assert!(b.buffered_bytes <= b.ring_bytes, "{first}");
    for k in 0..2 {
        assert!(cold(&file));
        let later = pass(&s, &file, &data);
        eprintln!("pass {}: {later}: {}", k + 2, later.breakdown);
        let b = later.breakdown.buffered_bytes;
        assert!(b == 0 || b == LEN as u64, "pass {}: the way chosen, from the first byte: {later}", k + 2);
    }
    drop((s, file));
    t.assert_clean();
}
