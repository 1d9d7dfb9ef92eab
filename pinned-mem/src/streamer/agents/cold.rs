//! How `Auto` reads a cold range (one mostly not in the page cache) into
//! the ring ([`ColdReads`]), chosen per file: with `O_DIRECT` straight from
//! the disk (`direct.rs`), or through the page cache with readahead (plain
//! `pread` into the slot, the file advised `SEQUENTIAL` and each stretch
//! ahead of the readers `WILLNEED`, so the kernel reads ahead of them).
//!
//! `O_DIRECT` costs no CPU copy, and on most disks reads as fast as the disk
//! goes; some devices (a virtual disk its host caches, network and FUSE file
//! systems) serve buffered reads with readahead faster, and some file
//! systems refuse `O_DIRECT`. So:
//!
//! * a file whose file system refuses `O_DIRECT` is read buffered;
//! * otherwise the first pass over a file probes: the first stretch of the
//!   range is read with `O_DIRECT`, the next one buffered, and the rest the
//!   way whose reads went faster per thread ([`decide`]: buffered only when
//!   clearly faster, since it copies every byte once more on the CPU);
//! * the streamer remembers the choice per file ([`ColdMemo`]), and later
//!   passes over it read that way from their first byte.
//!
//! [`Breakdown::buffered_bytes`](crate::Breakdown::buffered_bytes) says how
//! many bytes of a pass were read buffered.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::direct::direct_read;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::ring::{FreeSlot, FullSlot};

/// How a cold range is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::streamer) enum Way {
    /// `O_DIRECT` reads into the slot.
    Direct,
    /// `pread` through the page cache, with readahead.
    Buffered,
}

/// Each probing stretch is this share of the range (`1 / PROBE_SHARE`) ...
const PROBE_SHARE: u64 = 8;
/// ... at least this many bytes ...
const PROBE_MIN: u64 = 1 << 20;
/// ... and at most this many.
const PROBE_MAX: u64 = 32 << 20;
/// Buffered reads are chosen when their rate per thread is more than this
/// many times `O_DIRECT`'s (they cost a CPU copy of every byte).
const BUFFERED_MARGIN: f64 = 1.1;
/// Buffered readers keep the file advised `WILLNEED` this far ahead of the
/// part just claimed.
const READAHEAD: u64 = 32 << 20;
/// The files whose way a streamer remembers.
const MEMO_FILES: usize = 64;

/// The way that read faster per thread, from each way's (bytes, seconds of
/// reading summed over the threads): buffered only when more than
/// [`BUFFERED_MARGIN`] times as fast as `O_DIRECT`. `None` until both read
/// something.
pub(in crate::streamer) fn decide(direct: (u64, f64), buffered: (u64, f64)) -> Option<Way> {
    let rate = |(bytes, secs): (u64, f64)| (bytes > 0 && secs > 0.0).then(|| bytes as f64 / secs);
    let (d, b) = (rate(direct)?, rate(buffered)?);
    Some(if b > d * BUFFERED_MARGIN { Way::Buffered } else { Way::Direct })
}

/// Bytes read one way and the nanoseconds it took, summed over the threads.
#[derive(Default)]
struct Tally {
    bytes: AtomicU64,
    ns: AtomicU64,
}

impl Tally {
    fn add(&self, bytes: u64, ns: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, f64) {
        (self.bytes.load(Ordering::Relaxed), self.ns.load(Ordering::Relaxed) as f64 / 1e9)
    }
}

/// The first pass's probe: from `start`, a stretch of `stretch` bytes read
/// with `O_DIRECT`, then one read buffered, then the faster way.
struct Probe {
    start: u64,
    stretch: u64,
    direct: Tally,
    buffered: Tally,
    decided: OnceLock<Way>,
}

impl Probe {
    /// The probe of a pass whose range starts at `start`, `len` bytes long.
    fn new(start: u64, len: u64) -> Probe {
        let stretch = (len / PROBE_SHARE).clamp(PROBE_MIN, PROBE_MAX);
        let (direct, buffered) = (Tally::default(), Tally::default());
        Probe { start, stretch, direct, buffered, decided: OnceLock::new() }
    }

    /// How the part starting at `off` is read.
    fn way(&self, off: u64) -> Way {
        if let Some(w) = self.decided.get() {
            return *w;
        }
        let second = self.start.saturating_add(self.stretch);
        if (second..second.saturating_add(self.stretch)).contains(&off) { Way::Buffered } else { Way::Direct }
    }

    /// Counts a read of `bytes` at `off` that took `ns`; decides once both
    /// stretches are read.
    fn count(&self, off: u64, way: Way, bytes: u64, ns: u64) {
        if self.decided.get().is_some() {
            return;
        }
        let stretch_of = |w: Way| match w {
            Way::Direct => (self.start..self.start.saturating_add(self.stretch), &self.direct),
            Way::Buffered => {
                let s = self.start.saturating_add(self.stretch);
                (s..s.saturating_add(self.stretch), &self.buffered)
            }
        };
        let (within, tally) = stretch_of(way);
        if !within.contains(&off) {
            return; // read that way before the decision, outside its stretch
        }
        tally.add(bytes, ns);
        let full = |t: &Tally| t.bytes.load(Ordering::Relaxed) >= self.stretch;
        if full(&self.direct)
            && full(&self.buffered)
            && let Some(w) = decide(self.direct.get(), self.buffered.get())
        {
            let _ = self.decided.set(w);
        }
    }

    /// The way decided, or the one the stretches read so far favour.
    fn decision(&self) -> Option<Way> {
        self.decided.get().copied().or_else(|| decide(self.direct.get(), self.buffered.get()))
    }
}

/// Which way a cold pass reads.
enum Choice {
    /// One way for the whole pass.
    Fixed(Way),
    /// Probing (the first pass over a file).
    Probe(Probe),
}

/// How a cold pass of `Auto` reads its parts into the ring: the descriptors,
/// the way (fixed, or being probed) and the readahead of buffered reads.
pub(in crate::streamer) struct ColdReads {
    /// The file's identity (device, inode), for the memo.
    id: (u64, u64),
    /// The `O_DIRECT` descriptor, where the file system takes it.
    direct: Option<File>,
    choice: Choice,
    /// The file is advised `WILLNEED` up to here.
    advised: AtomicU64,
}

impl ColdReads {
    /// The reads of a pass over `range` of `file`, the way `known` says (the
    /// memo's) or probing; buffered where the file system refuses `O_DIRECT`.
    ///
    /// # Errors
    /// [`Error::Io`] opening or examining the file; [`Error::FileChanged`]
    /// for a path that names another file now.
    pub(in crate::streamer) fn new(file: &MappedFile, range: &Range<u64>, memo: &ColdMemo) -> Result<ColdReads> {
        let meta = file.file().metadata().map_err(|e| Error::io("stat", file.path(), e))?;
        let id = (meta.dev(), meta.ino());
        let direct = match file.open_direct() {
            Ok(f) => Some(f),
            Err(Error::DirectUnsupported { .. }) => None,
            Err(e) => return Err(e),
        };
        let choice = match (&direct, memo.get(id)) {
            (None, _) => Choice::Fixed(Way::Buffered),
            (Some(_), Some(w)) => Choice::Fixed(w),
            (Some(_), None) => Choice::Probe(Probe::new(range.start, range.end - range.start)),
        };
        if !matches!(choice, Choice::Fixed(Way::Direct)) {
            // Readahead in larger steps; only a hint: a refusal changes nothing.
            let _ = nix::fcntl::posix_fadvise(file.file(), 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
        }
        Ok(ColdReads { id, direct, choice, advised: AtomicU64::new(range.start) })
    }

    /// How the part starting at `off` is read.
    pub(in crate::streamer) fn way(&self, off: u64) -> Way {
        match &self.choice {
            Choice::Fixed(w) => *w,
            Choice::Probe(p) => p.way(off),
        }
    }

    /// Reads bytes `r` of `file` into `slot`, the way this pass reads them;
    /// answers the slot and that way.
    ///
    /// # Errors
    /// As [`direct_read`] and [`FreeSlot::read_from`].
    pub(in crate::streamer) fn read(
        &self,
        slot: FreeSlot,
        file: &MappedFile,
        r: Range<u64>,
    ) -> Result<(FullSlot, Way)> {
        let t0 = Instant::now();
        let bytes = r.end - r.start;
        let (full, way) = match (self.way(r.start), &self.direct) {
            (Way::Direct, Some(f)) => (direct_read(slot, f, file, r.clone())?, Way::Direct),
            _ => {
                self.read_ahead(file, r.end);
                (slot.read_from(file, r.start, bytes as usize)?, Way::Buffered)
            }
        };
        if let Choice::Probe(p) = &self.choice {
            p.count(r.start, way, bytes, u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        Ok((full, way))
    }

    /// Keeps the file advised `WILLNEED` up to [`READAHEAD`] past `end`
    /// (in steps of half that), so the kernel reads ahead of the readers.
    fn read_ahead(&self, file: &MappedFile, end: u64) {
        let want = end.saturating_add(READAHEAD).min(file.len());
        let from = self.advised.load(Ordering::Relaxed).max(end);
        if want <= from || want - from < READAHEAD / 2 {
            return;
        }
        if self.advised.compare_exchange(from, want, Ordering::Relaxed, Ordering::Relaxed).is_err()
            && self.advised.load(Ordering::Relaxed) >= want
        {
            return; // another reader advised it
        }
        let (Ok(at), Ok(len)) = (i64::try_from(from), i64::try_from(want - from)) else { return };
        // Only a hint: a refusal changes nothing.
        let _ = nix::fcntl::posix_fadvise(file.file(), at, len, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED);
    }

    /// What the streamer remembers of this pass: the file and the way
    /// decided, if it was probing and has one.
    pub(in crate::streamer) fn learned(&self) -> Option<((u64, u64), Way)> {
        match &self.choice {
            Choice::Probe(p) => p.decision().map(|w| (self.id, w)),
            Choice::Fixed(Way::Buffered) if self.direct.is_none() => Some((self.id, Way::Buffered)),
            Choice::Fixed(_) => None,
        }
    }
}

/// The way a streamer reads each cold file it has probed (the most recent
/// [`MEMO_FILES`] files).
#[derive(Default)]
pub(in crate::streamer) struct ColdMemo(Vec<((u64, u64), Way)>);

impl ColdMemo {
    /// The way remembered for the file `id`.
    pub(in crate::streamer) fn get(&self, id: (u64, u64)) -> Option<Way> {
        self.0.iter().find(|(i, _)| *i == id).map(|(_, w)| *w)
    }

    /// Remembers `way` for the file `id` (forgetting the oldest beyond [`MEMO_FILES`]).
    pub(in crate::streamer) fn put(&mut self, id: (u64, u64), way: Way) {
        self.0.retain(|(i, _)| *i != id);
        if self.0.len() >= MEMO_FILES {
            self.0.remove(0);
        }
        self.0.push((id, way));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffered_reads_are_chosen_only_when_clearly_faster() {
        let gb = 1u64 << 30;
        assert_eq!(decide((gb, 1.0), (gb, 1.0)), Some(Way::Direct), "as fast: no CPU copy");
        assert_eq!(decide((gb, 1.0), (gb, 0.95)), Some(Way::Direct), "a little faster: not worth the copy");
        assert_eq!(decide((gb, 1.0), (gb, 0.5)), Some(Way::Buffered));
        assert_eq!(decide((gb, 0.5), (gb, 1.0)), Some(Way::Direct));
        assert_eq!(decide((0, 0.0), (gb, 1.0)), None, "nothing read one way");
        assert_eq!(decide((gb, 1.0), (gb, 0.0)), None);
    }

    #[test]
    fn a_probe_reads_a_stretch_each_way_then_the_faster() {
        let mib = 1u64 << 20;
        let p = Probe::new(10 * mib, 64 * mib); // stretches of 8 MiB
        assert_eq!(p.stretch, 8 * mib);
        assert_eq!(p.way(10 * mib), Way::Direct);
        assert_eq!(p.way(18 * mib - 1), Way::Direct);
        assert_eq!(p.way(18 * mib), Way::Buffered);
        assert_eq!(p.way(26 * mib), Way::Direct, "undecided past both stretches: O_DIRECT");
        // The direct stretch read at half the buffered one's rate.
        for k in 0..8 {
            p.count(10 * mib + k * mib, Way::Direct, mib, 2_000_000);
            assert_eq!(p.decided.get(), None, "the buffered stretch is not read yet");
            p.count(18 * mib + k * mib, Way::Buffered, mib, 1_000_000);
        }
        assert_eq!(p.decided.get(), Some(&Way::Buffered));
        assert_eq!((p.way(10 * mib), p.way(40 * mib)), (Way::Buffered, Way::Buffered));
        assert_eq!(p.decision(), Some(Way::Buffered));
        // Stretch sizes follow the range, within their bounds.
        assert_eq!(Probe::new(0, 2 * mib).stretch, PROBE_MIN);
        assert_eq!(Probe::new(0, 1 << 40).stretch, PROBE_MAX);
    }

    #[test]
    fn reads_outside_their_stretch_count_for_nothing() {
        let mib = 1u64 << 20;
        let p = Probe::new(0, 16 * mib); // stretches of 2 MiB
        p.count(10 * mib, Way::Direct, mib, 1);
        p.count(0, Way::Buffered, mib, 1);
        assert_eq!((p.direct.get().0, p.buffered.get().0), (0, 0));
        assert_eq!(p.decision(), None);
        // A pass that ends before its stretches are read decides from what they read.
        p.count(0, Way::Direct, mib, 3_000_000);
        p.count(2 * mib, Way::Buffered, mib, 1_000_000);
        assert_eq!(p.decided.get(), None);
        assert_eq!(p.decision(), Some(Way::Buffered));
    }

    #[test]
    fn the_memo_keeps_the_latest_files() {
        let mut m = ColdMemo::default();
        for i in 0..MEMO_FILES as u64 + 3 {
            m.put((1, i), Way::Direct);
        }
        assert_eq!(m.get((1, 0)), None, "the oldest are forgotten");
        assert_eq!(m.get((1, 3)), Some(Way::Direct));
        m.put((1, 3), Way::Buffered);
        assert_eq!(m.get((1, 3)), Some(Way::Buffered));
        assert_eq!(m.0.len(), MEMO_FILES);
    }

    /// A file on a file system that refuses `O_DIRECT` (tmpfs) is read
    /// buffered from its first byte, and the streamer remembers that.
    #[test]
    fn a_file_system_without_o_direct_reads_buffered() {
        let dir = std::path::Path::new("/dev/shm");
        if !dir.is_dir() {
            eprintln!("note: no /dev/shm here; skipped");
            return;
        }
        let path = dir.join(format!("wirespeed-cold-{}", std::process::id()));
        std::fs::write(&path, vec![5u8; 1 << 16]).unwrap();
        // SAFETY: the test's own file, not written while mapped.
        let file = unsafe { MappedFile::open(&path) }.unwrap();
        let reads = ColdReads::new(&file, &(0..1 << 16), &ColdMemo::default()).unwrap();
        std::fs::remove_file(&path).unwrap();
        if reads.direct.is_some() {
            eprintln!("note: this /dev/shm takes O_DIRECT; skipped");
            return;
        }
        assert_eq!((reads.way(0), reads.way(1 << 15)), (Way::Buffered, Way::Buffered));
        assert_eq!(reads.learned().map(|(_, w)| w), Some(Way::Buffered));
    }
}
