//! Read-only shared mappings of files, and page windows of them that CUDA can
//! register in place.
//!
//! Always `PROT_READ` + `MAP_SHARED`: registering a `MAP_PRIVATE` mapping can
//! stall `cudaHostRegister`, and the kernel refuses writable long-term pins of
//! file pages, so neither is ever made here.
//!
//! This module and `memlock.rs` hold the crate's `unsafe` code.

use std::fs::File;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};
use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, Pod};

use crate::budget::Reservation;
use crate::error::{Error, Result};
use crate::memlock::LockTable;
use crate::populate::{Populated, mark_unsupported};
use crate::registry::Registry;
use crate::util::{align_down, align_up, page_size};

/// The registrations of a mapping's pages: each owns its [`FileWindow`].
pub(crate) type FileRegistry = Registry<HostRegistration<FileWindow>>;

/// A whole file mapped read-only and shared (`PROT_READ`, `MAP_SHARED`), handed
/// around as `Arc<MappedFile>`: every pinned range, window and in-flight copy
/// holds a clone, so the mapping outlives all of them whatever the caller drops
/// or leaks.
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let path = std::env::temp_dir().join(format!("wirespeed-doc-mapped-file-{}", std::process::id()));
/// std::fs::write(&path, b"hello")?;
/// // SAFETY: nothing writes or truncates the file while it is mapped.
/// let file = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
/// println!("{}: {} bytes, first byte {}", file.path().display(), file.len(), file.as_bytes()[0]);
/// # std::fs::remove_file(&path)?; Ok(()) }
/// ```
///
/// Opening is `unsafe`: see [`MappedFile::open`] for the contract.
///
/// A fresh mapping has no page tables: the first read of each few pages takes
/// a page fault, even where the file is in the page cache. The streamer's
/// ring threads (which copy from the mapping) therefore populate each part
/// of it, 2 MiB at a time, just before they first copy from it
/// ([`MappedFile::populate`]'s call; a part is populated once, until
/// [`MappedFile::drop_page_cache`]). Windows and whole-file registrations need
/// none: registering pins, and so maps, the pages itself. Call
/// [`MappedFile::populate`] yourself before reading a fresh mapping through
/// [`MappedFile::as_bytes`] in bulk.
pub struct MappedFile {
    ptr: NonNull<u8>,
    len: u64,
    map_len: usize,
    path: PathBuf,
    file: File,
    id: (u64, u64),
    /// The live registrations of the mapping's pages (see `registry.rs`).
    pub(crate) registry: Arc<FileRegistry>,
    /// Pages locked for ranges that share a registration made without
    /// `mlock` ([`PageLock`]).
    locks: LockTable,
    /// The parts whose page tables the ring threads populated (`populate.rs`).
    populated: Populated,
}

// SAFETY: the mapping is read-only shared memory owned by this value; reading
// it from any thread is fine, and the registry is behind a mutex.
unsafe impl Send for MappedFile {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for MappedFile {}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile").field("path", &self.path).field("len", &self.len).field("ptr", &self.ptr).finish()
    }
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_fifo() {
        "pipe"
    } else if ft.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

impl MappedFile {
    /// Opens and maps all of `path`, read-only and shared, checking that it is
    /// a non-empty regular file that fits the address space and did not change
    /// size while being mapped.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let path = std::env::temp_dir().join(format!("wirespeed-doc-open-{}", std::process::id()));
    /// std::fs::write(&path, vec![1u8; 10_000])?;
    /// // SAFETY: the file is ours and stays unchanged while mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// assert_eq!(f.len(), 10_000);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Safety
    /// While the mapping lives (as long as the returned `Arc`, or any pinned
    /// range, window, slot read or copy made from it), the file must not be
    /// written or truncated, by this process or any other. The crate hands
    /// out `&[u8]` into the mapping ([`MappedFile::as_bytes`],
    /// [`PinnedRange::as_bytes`](crate::PinnedRange::as_bytes)) and registers
    /// its pages with CUDA in place: bytes changing behind a shared reference
    /// are undefined behaviour, and reading pages a truncation removed raises
    /// `SIGBUS`. This is the contract of every shared file mapping (memmap2's
    /// `Mmap::map` is `unsafe` for the same reason).
    ///
    /// What the crate still checks, to turn some breaches into errors: pinning
    /// ([`PinnedRange::new`](crate::PinnedRange::new), the streamer's windows,
    /// and passes over a kept whole-file registration) refuses bytes the file
    /// no longer has with [`Error::FileChanged`], and the ring's and
    /// `O_DIRECT` reads (`pread`) report a short file the same way. It cannot
    /// see a change of the bytes, nor a truncation racing a registration or a
    /// copy already past its check.
    ///
    /// # Errors
    /// [`Error::Io`] (missing file, no permission, `mmap` failure),
    /// [`Error::NotAFile`], [`Error::EmptyFile`], [`Error::FileChanged`].
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Arc<MappedFile>> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io("open", &path, e))?;
        let meta = file.metadata().map_err(|e| Error::io("stat", &path, e))?;
        if !meta.file_type().is_file() {
            return Err(Error::NotAFile { path, kind: kind_of(meta.file_type()) });
        }
        let len = meta.len();
        if len == 0 {
            return Err(Error::EmptyFile { path });
        }
        let page = page_size();
        let map_len = usize::try_from(align_up(len, page))
            .ok()
            .filter(|&m| m <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid("MappedFile::open", format!("{len} bytes do not fit the address space")))?;
        let length = NonZeroUsize::new(map_len).ok_or_else(|| Error::EmptyFile { path: path.clone() })?;
        // SAFETY: a fresh mapping chosen by the kernel (no address given, no
        // MAP_FIXED), so no existing memory is affected; read-only and shared,
        // owned by the value built below, which unmaps it exactly once.
        let raw = unsafe { nix::sys::mman::mmap(None, length, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, &file, 0) }
            .map_err(|e| Error::io("mmap", &path, e.into()))?;
        let mapped = MappedFile {
            ptr: raw.cast(),
            len,
            map_len,
            id: (meta.dev(), meta.ino()),
            file,
            path,
            registry: Registry::new(),
            locks: LockTable::default(),
            populated: Populated::new(map_len as u64),
        };
        // The size was read before mapping: check it still holds (a file being
        // written or truncated now would make part of the mapping fault).
        let now = mapped.file.metadata().map_err(|e| Error::io("stat", &mapped.path, e))?.len();
        if now != len {
            return Err(Error::FileChanged {
                path: mapped.path.clone(),
                message: format!("its size went from {len} to {now} bytes while it was being mapped"),
            });
        }
        Ok(Arc::new(mapped))
    }

    /// The file's length in bytes (never 0).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-len-{}", std::process::id()));
    /// # std::fs::write(&path, vec![1u8; 10_000])?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// assert_eq!(f.len(), 10_000);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    #[allow(clippy::len_without_is_empty)] // a mapped file is never empty
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The path it was opened with.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-path-{}", std::process::id()));
    /// # std::fs::write(&path, b"data")?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// assert_eq!(f.path(), path);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file (read-only), e.g. for `pread`.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-file-{}", std::process::id()));
    /// # std::fs::write(&path, (0..=255u8).collect::<Vec<_>>())?;
    /// use std::os::unix::fs::FileExt;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// let mut head = [0u8; 4];
    /// f.file().read_exact_at(&mut head, 16)?;
    /// assert_eq!(head, [16, 17, 18, 19]);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn file(&self) -> &File {
        &self.file
    }

    /// All the file's bytes, through the mapping (pages fault in on first touch).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-as-bytes-{}", std::process::id()));
    /// # std::fs::write(&path, vec![2u8; 8192])?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// let sum: u64 = f.as_bytes()[..4096].iter().map(|&b| u64::from(b)).sum();
    /// assert_eq!(sum, 2 * 4096);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `map_len >= len` readable bytes for as long as
        // `self` lives (unmapped only in Drop); this process never writes them
        // (PROT_READ), and the caller of the unsafe `open` vouched that no one
        // writes or truncates the file while it is mapped.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }

    /// The bytes `range` of the file, through the mapping: file offsets as
    /// they are (`u64`), checked against the file, no casts to `usize`.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-bytes-{}", std::process::id()));
    /// # std::fs::write(&path, (0..=255u8).collect::<Vec<_>>())?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// assert_eq!(file.bytes(16..20)?, [16, 17, 18, 19]);
    /// assert!(file.bytes(250..260).is_err()); // past the end
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`] for a reversed range or one past the end of the file.
    pub fn bytes(&self, range: Range<u64>) -> Result<&[u8]> {
        self.check_range(&range)?;
        // Both ends are at most `len`, which `as_bytes` holds as a `usize`.
        Ok(&self.as_bytes()[range.start as usize..range.end as usize])
    }

    /// A device buffer for the bytes `range` of the file, as values of `T`
    /// (contents unspecified, as [`DeviceBuffer::new`]): the destination of a
    /// transfer of that range, sized without `u64` to `usize` arithmetic.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-device-buffer-{}", std::process::id()));
    /// # std::fs::write(&path, vec![0u8; 1 << 16])?;
    /// use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 20)))?;
    /// let mut all = file.device_buffer::<u8>(&dev, 0..file.len())?;
    /// streamer.to_device(&file, 0..file.len(), &mut all)?;
    /// let mut floats = file.device_buffer::<f32>(&dev, 4096..8192)?; // 1024 values
    /// assert_eq!(floats.len(), 1024);
    /// streamer.to_device(&file, 4096..8192, &mut floats)?;
    /// assert!(file.device_buffer::<f32>(&dev, 0..6).is_err()); // not whole f32 values
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`] for a reversed range or one past the end of the
    /// file; [`Error::InvalidArgument`] when the range is not a whole number
    /// of `T` (or `T` has no size); CUDA's error allocating.
    pub fn device_buffer<T: Pod>(&self, device: &Device, range: Range<u64>) -> Result<DeviceBuffer<T>> {
        const WHAT: &str = "MappedFile::device_buffer";
        self.check_range(&range)?;
        let (bytes, size) = (range.end - range.start, size_of::<T>() as u64);
        if size == 0 {
            return Err(Error::invalid(WHAT, "the element type has no size"));
        }
        if !bytes.is_multiple_of(size) {
            return Err(Error::invalid(
                WHAT,
                format!("the range holds {bytes} bytes, not a whole number of {size}-byte values"),
            ));
        }
        let len = usize::try_from(bytes / size)
            .map_err(|_| Error::invalid(WHAT, format!("{bytes} bytes do not fit the address space")))?;
        Ok(DeviceBuffer::new(device, len)?)
    }

    /// Refuses a reversed range, or one past the end of the file.
    fn check_range(&self, range: &Range<u64>) -> Result<()> {
        let reason = if range.start > range.end {
            "the range is reversed"
        } else if range.end > self.len {
            "the range runs past the end of the file"
        } else {
            return Ok(());
        };
        Err(Error::BadRange { range: range.clone(), len: self.len, reason })
    }

    /// Asks the kernel to drop the file's pages from the page cache (for cold
    /// runs): unmaps this mapping's page-table entries (`MADV_DONTNEED`, the data
    /// is refetched on the next touch) and advises `POSIX_FADV_DONTNEED` on the
    /// file. Dirty pages, pages pinned by a live registration and pages mapped by
    /// other processes stay. Where part of the mapping is `mlock`-ed the kernel
    /// refuses `MADV_DONTNEED` for the whole mapping (`EINVAL`): that step is
    /// then skipped, and only the pages no one maps are dropped.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-drop-page-cache-{}", std::process::id()));
    /// # std::fs::write(&path, vec![3u8; 1 << 20])?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// f.drop_page_cache()?;
    /// assert_eq!(f.as_bytes()[0], 3); // read from the file again
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when `madvise` or `posix_fadvise` fails.
    pub fn drop_page_cache(&self) -> Result<()> {
        // SAFETY: the range is exactly this value's mapping. MADV_DONTNEED on a
        // shared file mapping only drops page-table entries: later reads fault
        // the same file contents back in, so every `&[u8]` stays valid and unchanged.
        match unsafe { nix::sys::mman::madvise(self.ptr.cast(), self.map_len, MmapAdvise::MADV_DONTNEED) } {
            Ok(()) | Err(nix::errno::Errno::EINVAL) => {} // EINVAL: locked pages (see above)
            Err(e) => return Err(Error::io("madvise(MADV_DONTNEED)", &self.path, e.into())),
        }
        self.populated.clear(); // the page tables are gone
        nix::fcntl::posix_fadvise(&self.file, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            .map_err(|e| Error::io("posix_fadvise(DONTNEED)", &self.path, e.into()))
    }

    /// Populates the page tables of bytes `range` now
    /// (`MADV_POPULATE_READ`, Linux 5.14 and later), so that reading them
    /// takes no page fault: pages in the page cache are mapped at once, the
    /// others read from the file first, as a read of them would. Answers
    /// `false`, having done nothing, where the kernel lacks the call.
    ///
    /// Use it on a fresh mapping of a page-cached file before reading it in
    /// bulk through [`MappedFile::as_bytes`]: the faults it saves are a large
    /// share of a first pass's cost. The streamer does this itself for the
    /// parts its ring threads copy (see [`MappedFile`]); calling it first
    /// does no harm.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-populate-{}", std::process::id()));
    /// # std::fs::write(&path, vec![5u8; 1 << 20])?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// let done = f.populate(0..f.len())?; // false on kernels before 5.14
    /// assert_eq!(f.as_bytes().iter().map(|&b| u64::from(b)).sum::<u64>(), 5 << 20);
    /// # let _ = done; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`] for a reversed range or one past the end of the
    /// file; [`Error::Io`] when `madvise` fails otherwise (`EFAULT` for pages
    /// a truncation removed, `EIO` for a read error).
    pub fn populate(&self, range: Range<u64>) -> Result<bool> {
        self.check_range(&range)?;
        if range.start == range.end {
            return Ok(true);
        }
        let page = page_size();
        let pages = align_down(range.start, page)..align_up(range.end, page).min(self.map_len as u64);
        match self.advise_populate(pages) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
                mark_unsupported();
                Ok(false)
            }
            Err(e) => Err(Error::io("madvise(MADV_POPULATE_READ)", &self.path, e.into())),
        }
    }

    /// Populates the page tables of the parts of `range` not populated since
    /// the mapping was made or its page cache dropped, 2 MiB at a time
    /// (`populate.rs`): what the ring threads do before they first copy a
    /// part. Never fails: where the kernel lacks or refuses the call, reading
    /// faults the pages in as it would have.
    pub(crate) fn populate_fresh(&self, range: Range<u64>) {
        if let Some(span) = self.populated.claim(&range, self.map_len as u64)
            && let Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) = self.advise_populate(span)
        {
            mark_unsupported();
        }
    }

    /// `madvise(MADV_POPULATE_READ)` of `pages`, whole pages of the mapping
    /// (the last one may end at the mapping's end).
    fn advise_populate(&self, pages: Range<u64>) -> nix::Result<()> {
        if pages.start >= pages.end || pages.end > self.map_len as u64 || !pages.start.is_multiple_of(page_size()) {
            return Err(nix::errno::Errno::EINVAL);
        }
        // SAFETY: `[start, end)` lies inside this value's mapping (checked
        // above), which it keeps mapped. MADV_POPULATE_READ only fills page
        // tables (reading the file's pages in where they are not cached): the
        // contents, and every `&[u8]` into them, stay as they are.
        unsafe {
            let at = self.ptr.add(pages.start as usize);
            nix::sys::mman::madvise(at.cast(), (pages.end - pages.start) as usize, MmapAdvise::MADV_POPULATE_READ)
        }
    }

    /// How many bytes of `range` are in the page cache now (`mincore`), counted
    /// in whole pages and clipped to `range`.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-resident-bytes-{}", std::process::id()));
    /// # std::fs::write(&path, vec![4u8; 1 << 20])?;
    /// // SAFETY: nothing writes or truncates the file while it is mapped.
    /// let f = unsafe { wirespeed_pinned::MappedFile::open(&path) }?;
    /// let cached = f.resident_bytes(0..f.len())?;
    /// assert!(cached <= f.len());
    /// println!("{:.0}% cached", 100.0 * cached as f64 / f.len() as f64);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`] outside the file; [`Error::Io`] when `mincore` fails.
    pub fn resident_bytes(&self, range: Range<u64>) -> Result<u64> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::BadRange { range, len: self.len, reason: "outside the file" });
        }
        let page = page_size();
        let first = align_down(range.start, page);
        let end = align_up(range.end, page).min(self.map_len as u64);
        const STEP_PAGES: u64 = 1 << 18; // 1 GiB of 4 KiB pages per call
        let mut vec = vec![0u8; STEP_PAGES.min((end - first) / page + 1) as usize];
        let mut resident = 0u64;
        let mut at = first;
        while at < end {
            let n = ((end - at) / page).min(STEP_PAGES);
            let bytes = (n * page) as usize;
            // SAFETY: `[at, at + bytes)` lies inside this value's mapping (page
            // aligned, below `map_len`), and `vec` has room for `n` entries.
            let rc = unsafe { libc::mincore(self.ptr.as_ptr().add(at as usize).cast(), bytes, vec.as_mut_ptr()) };
            if rc != 0 {
                return Err(Error::io("mincore", &self.path, std::io::Error::last_os_error()));
            }
            for (i, v) in vec[..n as usize].iter().enumerate() {
                if v & 1 != 0 {
                    let p = at + i as u64 * page;
                    resident += (p + page).min(range.end).saturating_sub(p.max(range.start));
                }
            }
            at += n * page;
        }
        Ok(resident)
    }

    /// About how many bytes of `range` are in the page cache: exact
    /// ([`MappedFile::resident_bytes`]) up to 64 MiB, else from 256 evenly
    /// spaced samples of 64 KiB. `mincore` of a whole range costs a page
    /// cache lookup per 4 KiB page wherever the mapping's page tables are
    /// still empty (a file mapped for one pass), a large share of a pass at
    /// the line rate; the plan needs only whether most of it is cached.
    pub(crate) fn resident_estimate(&self, range: Range<u64>) -> Result<u64> {
        const PROBES: u64 = 256;
        const PROBE: u64 = 64 << 10;
        if range.start > range.end || range.end > self.len {
            return Err(Error::BadRange { range, len: self.len, reason: "outside the file" });
        }
        let len = range.end - range.start;
        if len <= 64 << 20 {
            return self.resident_bytes(range);
        }
        let mut sampled = 0u64;
        for k in 0..PROBES {
            let start = range.start + (len - PROBE) / (PROBES - 1) * k;
            sampled += self.resident_bytes(start..start + PROBE)?;
        }
        let share = sampled as f64 / (PROBES * PROBE) as f64;
        Ok((share * len as f64) as u64)
    }

    /// Opens the same file again with `O_DIRECT` (reads bypass the page cache),
    /// checking it is still the same file.
    pub(crate) fn open_direct(&self) -> Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&self.path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EINVAL) {
                Error::DirectUnsupported { path: self.path.clone(), source: e }
            } else {
                Error::io("open(O_DIRECT)", &self.path, e)
            }
        })?;
        let meta = f.metadata().map_err(|e| Error::io("stat", &self.path, e))?;
        if (meta.dev(), meta.ino()) != self.id || meta.len() != self.len {
            return Err(Error::FileChanged {
                path: self.path.clone(),
                message: "the path now names another file, or its size changed".into(),
            });
        }
        Ok(f)
    }

    /// Checks that the file still has bytes up to `end` (a truncated file's lost
    /// pages fault when read, and cannot be pinned).
    pub(crate) fn check_has(&self, end: u64) -> Result<()> {
        let now = self.file.metadata().map_err(|e| Error::io("stat", &self.path, e))?.len();
        if now < end {
            return Err(Error::FileChanged {
                path: self.path.clone(),
                message: format!(
                    "it was truncated to {now} bytes after it was mapped ({} then), so byte {} is gone",
                    self.len,
                    end - 1
                ),
            });
        }
        Ok(())
    }

    /// Length of the mapping: the file's length rounded up to pages.
    pub(crate) fn map_len(&self) -> u64 {
        self.map_len as u64
    }

    /// The pages `[start, end)` as a window that can be registered.
    pub(crate) fn window(self: &Arc<Self>, pages: Range<u64>) -> Result<FileWindow> {
        self.check_pages("MappedFile::window", &pages)?;
        Ok(FileWindow {
            file: Arc::clone(self),
            offset: pages.start as usize,
            len: (pages.end - pages.start) as usize,
            locked: false,
            reservation: None,
            gone: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl MappedFile {
    /// Locks `pages` (whole pages of the mapping) for a range that shares a
    /// registration made without `mlock`, until the answer is dropped: each
    /// page stays locked while any such range of it lives (see
    /// `memlock::LockTable`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for pages outside the mapping;
    /// [`Error::MemlockLimit`] (nothing stays locked then).
    pub(crate) fn lock_pages(self: &Arc<Self>, pages: Range<u64>) -> Result<PageLock> {
        self.check_pages("MappedFile::lock_pages", &pages)?;
        let r = pages.start as usize..pages.end as usize;
        // SAFETY: whole pages inside this mapping (checked above), which the
        // `PageLock`'s `Arc` keeps mapped until it releases them, with the
        // one `base` this table is ever used with.
        unsafe { self.locks.hold(self.ptr, r.clone(), &self.path) }?;
        Ok(PageLock { file: Arc::clone(self), pages: r })
    }

    /// Refuses `pages` that are not whole pages of the mapping.
    fn check_pages(&self, what: &'static str, pages: &Range<u64>) -> Result<()> {
        let page = page_size();
        if pages.start >= pages.end
            || !pages.start.is_multiple_of(page)
            || !pages.end.is_multiple_of(page)
            || pages.end > self.map_len()
        {
            return Err(Error::invalid(what, format!("pages {pages:?} are not whole pages of the mapping")));
        }
        Ok(())
    }
}

/// Pages of a mapping locked for one range that shares a registration made
/// without `mlock` ([`MappedFile::lock_pages`]); unlocked when dropped, where
/// no other such range covers them. Forgetting it leaves them locked (and
/// the mapping mapped).
pub(crate) struct PageLock {
    file: Arc<MappedFile>,
    pages: Range<usize>,
}

impl Drop for PageLock {
    fn drop(&mut self) {
        let f = &self.file;
        // SAFETY: held by `lock_pages` with the same base and range, and still
        // mapped (this value holds the `Arc`).
        unsafe { f.locks.release(f.ptr, self.pages.clone()) };
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; every user (windows, registrations, slices)
        // holds an Arc or a borrow of `self`, so none is left.
        let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.map_len) };
    }
}

/// Whole pages of a [`MappedFile`], owning a clone of its `Arc` so the mapping
/// outlives any registration of them, optionally `mlock`-ed (unlocked on drop).
///
/// It also holds what must live exactly as long as its pages stay pinned: the
/// budget's reservation for them. A registration that cannot be undone leaks
/// the window, and with it the reservation (the pages stay pinned, so the
/// budget stays charged); [`FileWindow::gone_flag`] tells whether that happened.
pub(crate) struct FileWindow {
    file: Arc<MappedFile>,
    offset: usize,
    len: usize,
    locked: bool,
    reservation: Option<Reservation>,
    /// Set when the window is dropped (its registration, if any, undone).
    gone: Arc<AtomicBool>,
}

impl FileWindow {
    fn start(&self) -> NonNull<u8> {
        // SAFETY: `offset < map_len` (checked in `MappedFile::window`), so the
        // result is inside the mapping and not null.
        unsafe { self.file.ptr.add(self.offset) }
    }

    /// Locks the window's pages in memory (see `memlock` for the limit policy).
    pub(crate) fn mlock(&mut self) -> Result<()> {
        if self.locked {
            return Ok(());
        }
        // SAFETY: the window lies inside the mapping, which this value keeps
        // alive (Arc) until after Drop unlocks it.
        unsafe { crate::memlock::lock(self.start(), self.len, self.file.path()) }?;
        self.locked = true;
        Ok(())
    }

    /// The mapped file the pages belong to.
    pub(crate) fn file(&self) -> &Arc<MappedFile> {
        &self.file
    }

    /// True when `mlock`-ed.
    pub(crate) fn is_locked(&self) -> bool {
        self.locked
    }

    /// Keeps `r` until the window is dropped (never, if it is leaked).
    pub(crate) fn hold(&mut self, r: Reservation) {
        self.reservation = Some(r);
    }

    /// Becomes true when the window is dropped; stays false if it is leaked.
    pub(crate) fn gone_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.gone)
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        if self.locked {
            // SAFETY: locked by `mlock` above, and still mapped (we hold the Arc).
            unsafe { crate::memlock::unlock(self.start(), self.len) };
        }
        drop(self.reservation.take()); // the budget gets the pages back
        self.gone.store(true, Ordering::Release);
    }
}

// SAFETY: `[as_ptr, as_ptr + len)` is whole pages inside the file's mapping,
// which the `Arc<MappedFile>` held by this value keeps mapped at the same
// address for the value's whole life (moving the value does not move the
// mapping). This process never writes it (PROT_READ), and the caller of the
// unsafe `MappedFile::open` vouched that no one writes or truncates the file
// while it is mapped. Registrations of it must be read-only, which
// `PinnedRange` always asks for.
unsafe impl wirespeed_cuda::HostMemory for FileWindow {
    fn as_ptr(&self) -> *const u8 {
        self.start().as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirespeed_cuda::HostMemory;

    fn open(p: impl AsRef<Path>) -> Result<Arc<MappedFile>> {
        // SAFETY: the test files are this test's own, unchanged while mapped.
        unsafe { MappedFile::open(p) }
    }

    fn temp(name: &str, data: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("pinned-mem-unit-{}-{name}", std::process::id()));
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn a_resident_estimate_samples_long_ranges() {
        let data = vec![7u8; (96 << 20) + 4321];
        let p = temp("estimate", &data);
        let f = open(&p).unwrap();
        let len = f.len();
        // Read it once: it was just written, so its pages are cached anyway.
        assert!(f.as_bytes().iter().step_by(4096).all(|&b| b == 7));
        let exact = f.resident_bytes(0..len).unwrap();
        let est = f.resident_estimate(0..len).unwrap();
        assert!(est <= len && est.abs_diff(exact) <= len / 8, "exact {exact}, estimate {est}");
        // Short ranges are exact.
        assert_eq!(f.resident_estimate(100..5000).unwrap(), f.resident_bytes(100..5000).unwrap());
        assert!(f.resident_estimate(0..len + 1).is_err());
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn maps_and_reads() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let p = temp("maps", &data);
        let f = open(&p).unwrap();
        assert_eq!(f.len(), 10_000);
        assert_eq!(f.as_bytes(), &data[..]);
        assert_eq!(f.map_len() % page_size(), 0);
        assert!(f.resident_bytes(0..f.len()).unwrap() <= 10_000);
        f.drop_page_cache().unwrap();
        assert_eq!(f.as_bytes(), &data[..]);
        let w = f.window(0..page_size()).unwrap();
        assert_eq!(w.len() as u64, page_size());
        assert_eq!(w.as_ptr(), f.as_bytes().as_ptr());
        assert!(f.window(1..page_size()).is_err());
        assert!(f.window(0..f.map_len() + page_size()).is_err());
        drop(w);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn refuses_empty_dir_missing() {
        let p = temp("empty", &[]);
        assert!(matches!(open(&p), Err(Error::EmptyFile { .. })));
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(open(&p), Err(Error::Io { op: "open", .. })));
        assert!(matches!(open(std::env::temp_dir()), Err(Error::NotAFile { kind: "directory", .. })));
    }

    #[test]
    fn mlock_window() {
        let p = temp("mlock", &vec![1u8; 3 * page_size() as usize]);
        let f = open(&p).unwrap();
        let mut w = f.window(0..page_size()).unwrap();
        match w.mlock() {
            Ok(()) => assert!(w.is_locked()),
            Err(Error::MemlockLimit { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        drop(w);
        std::fs::remove_file(p).unwrap();
    }
}
