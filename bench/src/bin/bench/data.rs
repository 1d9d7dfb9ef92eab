//! The data streamed: a demo file written in the temporary folder (removed at
//! the end) or the user's file; and the disk's own O_DIRECT read rate.

use crate::args::Options;
use crate::checksum;
use crate::progress::Progress;
use crate::util::{Context, Fatal, GIB, MIB, Result, disk_available, fmt_bytes, is_tmpfs, mem_available, round_down};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tempfile::NamedTempFile;
use wirespeed_pinned::MappedFile;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the deterministic pattern number `stream`, as if it
/// started at byte `start` (a multiple of 8) of that pattern.
pub fn fill_pattern(buf: &mut [u8], stream: u64, start: u64) {
    let first = start / 8;
    let mut words = buf.chunks_exact_mut(8);
    let mut i = first;
    for w in &mut words {
        w.copy_from_slice(&splitmix(i ^ stream.rotate_left(32)).to_le_bytes());
        i += 1;
    }
    let rest = words.into_remainder();
    let last = splitmix(i ^ stream.rotate_left(32)).to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

pub struct Data {
    pub file: Arc<MappedFile>,
    pub path: PathBuf,
    pub len: u64,
    pub demo: bool,
    /// Checksum of the whole file (see `checksum`).
    pub checksum: u64,
    /// The file is on tmpfs: it lives in RAM and is never read cold.
    pub tmpfs: bool,
    /// Notes for the header (e.g. the file is larger than RAM).
    pub notes: Vec<String>,
    /// How fast this host's CPUs read and copy the page-cached file, where
    /// it was page-cached (see [`MemRates`]).
    pub mem: Option<MemRates>,
    /// The demo file, removed when dropped (also when the bench fails).
    _temp: Option<NamedTempFile>,
}

impl Data {
    pub fn bytes(&self) -> &[u8] {
        self.file.as_bytes()
    }
}

/// The demo file's size: --size, else 4 GiB (256 MiB with --quick), less when
/// the temporary folder's disk or the RAM are short.
fn demo_size(opts: &Options, dir: &Path) -> Result<u64> {
    let disk = disk_available(dir);
    let ram = mem_available();
    if let Some(size) = opts.size {
        if let Some(d) = disk
            && size.saturating_add(256 * MIB) > d
        {
            return Err(Fatal::Usage(format!(
                "--size {}: {} has only {} free; pass a smaller --size or set TMPDIR to a folder with room",
                fmt_bytes(size),
                dir.display(),
                fmt_bytes(d)
            )));
        }
        return Ok(size);
    }
    let mut size = if opts.quick { 256 * MIB } else { 4 * GIB };
    if let Some(d) = disk {
        size = size.min(d / 2);
    }
    if let Some(r) = ram {
        size = size.min(r / 3);
    }
    if size < 64 * MIB {
        return Err(Fatal::Usage(format!(
            "not enough room for a demo file: {} free in {}, {} of RAM available; pass a FILE, or set TMPDIR",
            disk.map_or("?".into(), fmt_bytes),
            dir.display(),
            ram.map_or("?".into(), fmt_bytes)
        )));
    }
    Ok(round_down(size, 64 * MIB))
}

fn write_demo(file: &File, path: &Path, size: u64, threads: usize, progress: &Progress) -> Result<()> {
    file.set_len(size).context(|| format!("sizing {}", path.display()))?;
    const PIECE: u64 = 8 << 20;
    let n = size.div_ceil(PIECE);
    let threads = (threads as u64).clamp(1, n.max(1));
    let done = AtomicU64::new(0);
    let result: Result<()> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let done = &done;
                s.spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; PIECE as usize];
                    let mut i = t;
                    while i < n {
                        let at = i * PIECE;
                        let len = PIECE.min(size - at) as usize;
                        fill_pattern(&mut buf[..len], 0x5EED, at);
                        file.write_all_at(&buf[..len], at).context(|| "writing the demo file".into())?;
                        let d = done.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
                        progress.update(d, size);
                        i += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| Fatal::Run("a demo-file writer thread panicked".into()))??;
        }
        Ok(())
    });
    result?;
    // Dirty pages are never dropped from the cache: make them clean so that
    // the cold runs can drop them (and no write-back disturbs the runs).
    if size >= 4 << 30 {
        progress.note(&format!("flushing the demo file to the disk (fsync of {})", fmt_bytes(size)));
    }
    file.sync_all().context(|| format!("syncing {}", path.display()))
}

/// Checks FILE, or that the demo file fits, before any measurement starts.
/// Returns the demo file's size (0 with FILE).
pub fn preflight(opts: &Options) -> Result<u64> {
    match &opts.file {
        Some(p) => {
            let meta = std::fs::metadata(p).map_err(|e| Fatal::Usage(format!("{}: {e}", p.display())))?;
            if !meta.is_file() {
                return Err(Fatal::Usage(format!("{}: not a regular file", p.display())));
            }
            if meta.len() == 0 {
                return Err(Fatal::Usage(format!("{}: the file is empty: nothing to stream", p.display())));
            }
            std::fs::File::open(p).map_err(|e| Fatal::Usage(format!("{}: {e}", p.display())))?;
            Ok(0)
        }
        None => demo_size(opts, &std::env::temp_dir()),
    }
}

/// Opens FILE, or writes the demo file; checksums it (which also reads it into
/// the page cache).
pub fn prepare(opts: &Options, threads: usize, progress: &Progress) -> Result<Data> {
    let mut notes = Vec::new();
    let size = preflight(opts)?;
    let (path, demo, temp) = match &opts.file {
        Some(p) => (p.clone(), false, None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("wirespeed-bench-")
                .suffix(".bin")
                .tempfile()
                .context(|| format!("creating the demo file in {}", std::env::temp_dir().display()))?;
            let path = temp.path().to_path_buf();
            progress.begin(&format!("writing the demo file {} ({})", path.display(), fmt_bytes(size)), 1, 1);
            let t0 = Instant::now();
            write_demo(temp.as_file(), &path, size, threads, progress)?;
            let secs = t0.elapsed().as_secs_f64();
            progress.note(&format!(
                "wrote the demo file {} ({}) in {secs:.1} s ({:.2} GB/s, synced to the disk)",
                path.display(),
                fmt_bytes(size),
                size as f64 / secs.max(1e-9) / 1e9
            ));
            (path, true, Some(temp))
        }
    };
    // SAFETY: the demo file is the bench's own and unchanged until removed; a
    // FILE given on the command line must stay unchanged while the bench runs,
    // which --help says (as for any program reading a file through a mapping).
    let file = unsafe { MappedFile::open(&path) }.context(|| format!("opening {}", path.display()))?;
    let len = file.len();
    let tmpfs = is_tmpfs(&path);
    if tmpfs {
        notes.push(format!(
            "{} is on tmpfs (RAM): the cold runs are skipped; put the file on a disk (TMPDIR or FILE) to measure them",
            path.display()
        ));
    }
    if let Some(r) = mem_available()
        && len > r
    {
        notes.push(format!(
            "the file ({}) is larger than the available RAM ({}): 'page-cached' runs read from the disk too",
            fmt_bytes(len),
            fmt_bytes(r)
        ));
    }
    progress.begin("checksumming the file (and reading it into the page cache)", 1, 1);
    let t0 = Instant::now();
    let sum = checksum::of_host(file.as_bytes(), threads);
    progress.note(&format!(
        "file checksum {sum:#018x} ({:.1} GB/s, {} threads)",
        len as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e9,
        threads
    ));
    let mem = mem_rates(&file, threads);
    if let Some(m) = &mem {
        let text = m.describe(threads);
        progress.note(&text);
        notes.push(text);
    }
    Ok(Data { file, path, len, demo, checksum: sum, tmpfs, notes, mem, _temp: temp })
}

/// The bytes a ring thread copies at once (the slot `auto` plans).
const COPY_PIECE: usize = 4 << 20;

/// How fast this host's CPUs move the page-cached file, measured right
/// after the checksum (so the mapping is populated): anchors for the rows of
/// the same run, since lent machines differ from start to start.
#[derive(Debug, Clone, Copy)]
pub struct MemRates {
    /// Bytes per second, every filler thread checksumming the file's first GiBs.
    pub read_all: f64,
    /// Bytes per second, one thread copying them into a 4 MiB buffer, as a
    /// ring thread fills a slot.
    pub copy_one: f64,
}

impl MemRates {
    pub fn describe(&self, threads: usize) -> String {
        format!(
            "memory on this host: {threads} threads read the page-cached file at {:.1} GB/s; one thread copies it \
             into 4 MiB buffers (as a ring thread fills its slots) at {:.1} GB/s ({:.3} CPU s/GB)",
            self.read_all / 1e9,
            self.copy_one / 1e9,
            1e9 / self.copy_one.max(1.0)
        )
    }
}

/// [`MemRates`] over the file's first 4 GiB (one thread: its first GiB),
/// or None where those bytes are not all in the page cache (the rates would
/// be the disk's).
fn mem_rates(file: &MappedFile, threads: usize) -> Option<MemRates> {
    let bytes = file.as_bytes();
    let sample = &bytes[..bytes.len().min(4 << 30)];
    if sample.len() < COPY_PIECE || file.resident_bytes(0..sample.len() as u64).ok()? < sample.len() as u64 {
        return None;
    }
    let t0 = Instant::now();
    std::hint::black_box(checksum::of_host(sample, threads));
    let read_all = sample.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    let part = &sample[..sample.len().min(1 << 30)];
    let mut buf = vec![0u8; COPY_PIECE];
    buf.copy_from_slice(&part[..COPY_PIECE]); // the buffer's pages, untimed
    let t0 = Instant::now();
    for chunk in part.chunks(COPY_PIECE) {
        buf[..chunk.len()].copy_from_slice(chunk);
        std::hint::black_box(&mut buf);
    }
    let copy_one = part.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    Some(MemRates { read_all, copy_one })
}

/// O_DIRECT read size per request.
pub const DIRECT_BLOCK: usize = 16 << 20;

/// Reads the whole file with O_DIRECT on `threads` threads, each taking the
/// next [`DIRECT_BLOCK`] of the file into its own aligned buffer (no page cache,
/// no GPU): with one thread, what `dd if=FILE iflag=direct bs=16M` measures.
/// Returns the seconds taken, or (inner `Err`) why not when the filesystem
/// refuses O_DIRECT.
pub fn read_direct(
    path: &Path,
    len: u64,
    threads: usize,
    progress: &Progress,
) -> Result<std::result::Result<f64, String>> {
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => f,
        Err(e) => return Ok(Err(format!("O_DIRECT open refused ({e}): the filesystem does not support it"))),
    };
    const ALIGN: usize = 4096;
    let blocks = len.div_ceil(DIRECT_BLOCK as u64);
    let threads = (threads as u64).clamp(1, blocks.max(1)) as usize;
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let results: Vec<std::result::Result<(), std::io::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (file, next, done) = (&file, &next, &done);
                s.spawn(move || -> std::result::Result<(), std::io::Error> {
                    let mut raw = vec![0u8; DIRECT_BLOCK + ALIGN];
                    let off = raw.as_ptr().align_offset(ALIGN);
                    let buf = &mut raw[off..off + DIRECT_BLOCK];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= blocks {
                            return Ok(());
                        }
                        let mut at = i * DIRECT_BLOCK as u64;
                        let end = (at + DIRECT_BLOCK as u64).min(len);
                        // Whole aligned requests; the file's last one comes back short.
                        while at < end {
                            let want = (end - at).next_multiple_of(ALIGN as u64) as usize;
                            let from = (at - i * DIRECT_BLOCK as u64) as usize;
                            let n = read_at(file, &mut buf[from..from + want], at)?;
                            if n == 0 {
                                break;
                            }
                            at += n as u64;
                        }
                        let d = done.fetch_add(end - i * DIRECT_BLOCK as u64, Ordering::Relaxed);
                        progress.update(d + end - i * DIRECT_BLOCK as u64, len);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("reader panicked"))))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    for r in results {
        match r {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Ok(Err(format!("O_DIRECT read refused ({e}): the filesystem does not support it")));
            }
            Err(e) => return Err(Fatal::Run(format!("O_DIRECT read of {}: {e}", path.display()))),
        }
    }
    Ok(Ok(secs))
}

fn read_at(f: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    loop {
        match f.read_at(buf, at) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_positional() {
        let mut whole = vec![0u8; 1000];
        fill_pattern(&mut whole, 1, 0);
        let mut part = vec![0u8; 500];
        fill_pattern(&mut part, 1, 496);
        assert_eq!(&whole[496..996], &part[..]);
        let mut other = vec![0u8; 1000];
        fill_pattern(&mut other, 2, 0);
        assert_ne!(whole, other);
    }
}
