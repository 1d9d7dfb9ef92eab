//! Pinned ranges: any byte range of a [`MappedFile`], rounded out to pages,
//! optionally `mlock`-ed, and registered in place with
//! `cudaHostRegister(ReadOnly [| Portable])`.
//!
//! CUDA refuses a page registered twice, so each mapping keeps a registry of
//! its live registrations (`registry.rs`): a range inside a live registration
//! **shares** it (no new registration, no new budget); a range that overlaps
//! one without being inside it is refused with [`Error::Overlap`]. A range
//! that asks for `mlock` inside a registration made without it locks its own
//! pages (`mapping::PageLock`): each page stays locked while any range that
//! asked for it lives.
//!
//! [`PinnedRange::new_in`] registers in a [`RegistrationContext`] instead of
//! the primary context: unregistering there neither waits for nor stalls the
//! copies of the primary context. A range inside a live registration shares
//! it whatever context either asks for: copies run in the primary context,
//! which sees portable registrations of every context, and the owner
//! unregisters in its own.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use wirespeed_cuda::{Device, HostRegistration, PinnedSlice, RegisterFlags, RegistrationContext};

use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::mapping::{FileWindow, MappedFile, PageLock};
use crate::registry::{Claim, Lease, Terms};
use crate::util::{align_down, align_up, page_size};

/// How to pin a range: every option off by default ([`PinOptions::new`]),
/// each set by its builder method.
///
/// The struct may gain fields in a minor release, so outside this crate it is
/// built from [`PinOptions::new`] (or `Default`) and the builder methods, not
/// with a struct literal; its fields stay public for reading.
///
/// ```
/// use wirespeed_pinned::PinOptions;
/// let opts = PinOptions::new().mlock(true);
/// assert!(opts.mlock && !opts.portable && !opts.mapped);
/// assert_eq!(PinOptions::new(), PinOptions::default());
/// let all = PinOptions::new().mlock(true).portable(true).mapped(true);
/// assert!(all.mlock && all.portable && all.mapped);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PinOptions {
    /// Also `mlock` the pages (counted against `RLIMIT_MEMLOCK`, checked
    /// beforehand unless the process has `CAP_IPC_LOCK`; see
    /// [`Error::MemlockLimit`]). `cudaHostRegister` pins the pages by itself, so
    /// this only matters where locked memory must show up as such. A range
    /// asking for it inside a live registration made without it shares that
    /// registration and locks its own pages, until it ends.
    pub mlock: bool,
    /// Register for every device (`cudaHostRegisterPortable`), for several GPUs.
    /// Without it the registration belongs to one device: the calling
    /// thread's current one ([`PinnedRange::new`]) or the one named
    /// ([`PinnedRange::new_on`]).
    pub portable: bool,
    /// Also map the pages for the device's kernels (`cudaHostRegisterMapped`),
    /// so that a kernel reads them in place, through
    /// [`wirespeed_cuda::KernelArgs::read_host`] (the shuffle [`Loader`](crate::Loader)'s
    /// registered way does). Copies need no mapping.
    pub mapped: bool,
}

impl PinOptions {
    /// Every option off: no `mlock`, one device, not mapped (the default).
    pub const fn new() -> PinOptions {
        PinOptions { mlock: false, portable: false, mapped: false }
    }

    /// With [`PinOptions::mlock`](PinOptions#structfield.mlock) set to `on`.
    pub const fn mlock(mut self, on: bool) -> Self {
        self.mlock = on;
        self
    }

    /// With [`PinOptions::portable`](PinOptions#structfield.portable) set to `on`.
    pub const fn portable(mut self, on: bool) -> Self {
        self.portable = on;
        self
    }

    /// With [`PinOptions::mapped`](PinOptions#structfield.mapped) set to `on`.
    pub const fn mapped(mut self, on: bool) -> Self {
        self.mapped = on;
        self
    }
}

/// A registration of file pages, shared by every [`PinnedRange`] inside it.
/// Dropping the registration waits for copies, unregisters, then drops its
/// window: unlock, the budget's reservation, the window's `Arc` of the mapping.
type Registration = HostRegistration<FileWindow>;

/// A byte range of a [`MappedFile`] registered with CUDA in place (no copy of
/// the file), usable as the source of asynchronous copies at the line rate.
///
/// It holds an `Arc` of the mapping, so the mapping lives as long as the
/// registration and any copy still reading it. The pages are rounded out, but
/// [`PinnedRange::source`] is exactly the bytes asked for. Unregistering (and
/// `munlock`) happen when the last range sharing the registration is dropped or
/// [released](PinnedRange::release); `Drop` first waits for copies reading it.
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// # let path = std::env::temp_dir().join(format!("wirespeed-doc-pinned-range-{}", std::process::id()));
/// # std::fs::write(&path, vec![7u8; 2 << 20])?;
/// use wirespeed_pinned::{MappedFile, PinBudget, PinOptions, PinnedRange};
/// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let budget = PinBudget::new(4 << 20);
/// let range = PinnedRange::new(&file, 1000..(1 << 20) + 1000, PinOptions::default(), &budget)?;
/// let dev = Device::get(0)?;
/// let mut dst = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// Stream::new(&dev)?.copy_to_device(&range.source(), &mut dst)?.wait()?;
/// assert_eq!(dst.to_vec()?, range.as_bytes());
/// range.release()?; // or just drop it
/// assert_eq!(budget.used(), 0);
/// # std::fs::remove_file(&path)?; Ok(()) }
/// ```
pub struct PinnedRange {
    /// This range's pages, locked by it where it asked for `mlock` and shares
    /// a registration made without (declared first: unlocked before the lease
    /// can undo the registration).
    lock: Option<PageLock>,
    lease: Lease<Registration>,
    range: Range<u64>,
    /// The device it was made for.
    device: Device,
}

impl std::fmt::Debug for PinnedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedRange")
            .field("file", &self.file().path())
            .field("range", &self.range)
            .field("pages", self.lease.pages())
            .field("portable", &self.is_portable())
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl PinnedRange {
    /// Pins bytes `range` of `file`: rounds out to pages, draws the pages from
    /// `budget`, `mlock`s them if asked, and registers them read-only (plus
    /// portable if asked) for the calling thread's current device. A range
    /// inside a live registration of the same mapping shares it instead (no
    /// budget, no registration).
    ///
    /// The current device is the one the thread's last call of
    /// `wirespeed-cuda` made current (every object there makes its own
    /// device current before each call; device 0 before any call), or one
    /// that other code set. With one GPU that is always it; with several,
    /// name the device ([`PinnedRange::new_on`]) or ask for a portable
    /// registration ([`PinOptions::portable`](PinOptions#structfield.portable)): a registration that is
    /// neither belongs to whichever device happened to be current, and copies
    /// to the others read it as pageable memory (staged by the driver, far
    /// from the line rate). A range inside a live registration shares it
    /// whatever device that was made for.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-new-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..file.len(), PinOptions::new().portable(true), &PinBudget::unlimited())?;
    /// assert_eq!(r.len(), file.len());
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRange`] (empty, past the end), [`Error::FileChanged`] (the
    /// file was truncated since it was mapped), [`Error::Overlap`],
    /// [`Error::BudgetExceeded`], [`Error::MemlockLimit`], and CUDA's errors
    /// from `cudaGetDevice` (the range's [`PinnedRange::device`]) and
    /// `cudaHostRegister`. Nothing stays pinned, locked or drawn on error.
    pub fn new(file: &Arc<MappedFile>, range: Range<u64>, opts: PinOptions, budget: &PinBudget) -> Result<PinnedRange> {
        Self::create(file, range, opts, budget).map(|(r, _)| r)
    }

    /// As [`PinnedRange::new`], registered for `device` (made current on the
    /// calling thread first), as every object of `wirespeed-cuda` is made on
    /// a device it names. With [`PinOptions::portable`](PinOptions#structfield.portable) the registration is
    /// for every device, this one included.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-new-on-{}", std::process::id()));
    /// # std::fs::write(&path, vec![9u8; 1 << 16])?;
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// use wirespeed_pinned::{MappedFile, PinBudget, PinOptions, PinnedRange};
    /// let dev = Device::get(0)?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let range = PinnedRange::new_on(&dev, &file, 0..4096, PinOptions::default(), &PinBudget::new(1 << 20))?;
    /// let mut dst = file.device_buffer::<u8>(&dev, 0..4096)?;
    /// Stream::new(&dev)?.copy_to_device(&range.source(), &mut dst)?.wait()?;
    /// assert_eq!(dst.to_vec()?, range.as_bytes());
    /// # drop(range); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRange::new`]; CUDA's error making `device` current.
    pub fn new_on(
        device: &Device,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        opts: PinOptions,
        budget: &PinBudget,
    ) -> Result<PinnedRange> {
        device.make_current()?;
        Self::new(file, range, opts, budget)
    }

    /// As [`PinnedRange::new`], but registered in the registration context
    /// `ctx` (always portable: the copies run in the primary context), not in
    /// the calling thread's current one. Releasing it then neither waits for
    /// nor stalls unrelated copies: only the copies that read this range are
    /// waited for, as always. A range inside a live registration of the same
    /// mapping shares it, whichever context made it (the one that made it
    /// unregisters it, in its own context, once the last sharer is gone).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-new-in-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 20])?;
    /// # use wirespeed_pinned::*;
    /// use std::sync::Arc;
    /// use wirespeed_cuda::{Device, RegistrationContext};
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = Device::get(0)?;
    /// let budget = PinBudget::new(4 << 20);
    /// let r = match RegistrationContext::new(&dev) {
    ///     Ok(ctx) => PinnedRange::new_in(&Arc::new(ctx), &file, 0..file.len(), PinOptions::default(), &budget)?,
    ///     Err(_) => PinnedRange::new(&file, 0..file.len(), PinOptions::default(), &budget)?, // the fallback
    /// };
    /// assert!(r.is_portable() || r.context().is_none());
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`PinnedRange::new`], with CUDA's errors from `cuMemHostRegister`.
    pub fn new_in(
        ctx: &Arc<RegistrationContext>,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        opts: PinOptions,
        budget: &PinBudget,
    ) -> Result<PinnedRange> {
        Self::create_in(Some(ctx), file, range, opts, budget).map(|(r, _)| r)
    }

    /// As [`PinnedRange::new`], also telling whether a new registration was made
    /// (`false`: shared an existing one).
    pub(crate) fn create(
        file: &Arc<MappedFile>,
        range: Range<u64>,
        opts: PinOptions,
        budget: &PinBudget,
    ) -> Result<(PinnedRange, bool)> {
        Self::create_in(None, file, range, opts, budget)
    }

    /// As [`PinnedRange::create`], in `ctx` when given (see [`PinnedRange::new_in`]).
    pub(crate) fn create_in(
        ctx: Option<&Arc<RegistrationContext>>,
        file: &Arc<MappedFile>,
        range: Range<u64>,
        opts: PinOptions,
        budget: &PinBudget,
    ) -> Result<(PinnedRange, bool)> {
        // In a registration context the range is always portable (copies run
        // in the primary context); a live registration it shares need only be
        // as portable as the caller asked.
        let want = Terms { portable: opts.portable, mlock: opts.mlock, mapped: opts.mapped };
        let terms = Terms { portable: opts.portable || ctx.is_some(), ..want };
        let pages = pages_of(file, &range)?;
        let device = match ctx {
            Some(c) => c.device(),
            None => Device::current()?,
        };
        let vacancy = match file.registry.claim(&range, pages.clone(), want)? {
            Claim::Shared(lease) => {
                // Made without the mlock this range asks for: it locks its own pages.
                let lock = (want.mlock && !lease.terms().mlock).then(|| file.lock_pages(pages)).transpose()?;
                return Ok((PinnedRange { lock, lease, range, device }, false));
            }
            Claim::Vacant(vacancy) => vacancy,
        };
        let (reg, window_gone) = register(ctx, file, pages, terms, budget)?;
        Ok((PinnedRange { lock: None, lease: vacancy.insert(reg, terms, window_gone), range, device }, true))
    }

    /// Exactly the bytes asked for, as a source of asynchronous copies.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-source-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 10..20, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.source().len(), 10);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn source(&self) -> PinnedSlice<'_, u8> {
        let base = self.lease.pages().start;
        let (a, b) = ((self.range.start - base) as usize, (self.range.end - base) as usize);
        self.lease.value().slice_clamped(a..b)
    }

    /// Bytes `r` of the range (relative to its start) as a copy source.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-slice-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..4096, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.slice(100..200)?.len(), 100);
    /// assert!(r.slice(4000..5000).is_err()); // past the range
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `r` is not inside the range.
    pub fn slice(&self, r: Range<usize>) -> Result<PinnedSlice<'_, u8>> {
        if r.start > r.end || r.end as u64 > self.len() {
            return Err(Error::invalid(
                "PinnedRange::slice",
                format!("{r:?} is outside a range of {} bytes", self.len()),
            ));
        }
        let base = (self.range.start - self.lease.pages().start) as usize;
        Ok(self.lease.value().slice_clamped(base + r.start..base + r.end))
    }

    /// The bytes, read through the mapping.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-range-as-bytes-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..16, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.as_bytes(), &file.as_bytes()[..16]);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        &self.file().as_bytes()[self.range.start as usize..self.range.end as usize]
    }

    /// The file bytes asked for.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-range-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 5..9, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.range(), 5..9);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn range(&self) -> Range<u64> {
        self.range.clone()
    }

    /// The number of bytes asked for (never 0).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-range-len-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// assert_eq!(PinnedRange::new(&file, 5..9, PinOptions::default(), &PinBudget::unlimited())?.len(), 4);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    #[allow(clippy::len_without_is_empty)] // never empty: empty ranges are refused
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// The registered pages (file offsets, rounded out), possibly those of a
    /// larger registration this range shares.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-pinned-pages-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 5..9, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.pinned_pages().start, 0);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn pinned_pages(&self) -> Range<u64> {
        self.lease.pages().clone()
    }

    /// True when the pages are also `mlock`-ed: by the registration, or by
    /// this range itself where it asked for `mlock` and shares a registration
    /// made without it.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-is-mlocked-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..9, PinOptions::new().mlock(true), &PinBudget::unlimited())?;
    /// assert!(r.is_mlocked());
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn is_mlocked(&self) -> bool {
        self.lock.is_some() || self.lease.value().memory().is_locked()
    }

    /// True when registered for every device.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-is-portable-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..9, PinOptions::new().portable(true), &PinBudget::unlimited())?;
    /// assert!(r.is_portable());
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn is_portable(&self) -> bool {
        self.lease.terms().portable
    }

    /// The device it was made for: the calling thread's current device for
    /// [`PinnedRange::new`], the one named for [`PinnedRange::new_on`], the
    /// context's for [`PinnedRange::new_in`]. Copies to it read the range at
    /// the line rate; with [`PinnedRange::is_portable`] so do copies to every
    /// other device. A range that shares a live registration names the device
    /// it was asked for, whatever device that registration was made for.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-device-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let r = PinnedRange::new_on(&dev, &file, 0..9, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert_eq!(r.device(), dev);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// The registration context it is registered in, or `None` for the primary
    /// context ([`PinnedRange::new`]).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-context-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..9, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert!(r.context().is_none());
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn context(&self) -> Option<&Arc<RegistrationContext>> {
        self.lease.value().context()
    }

    /// How many ranges share this registration (1 when alone).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-sharers-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let b = PinBudget::unlimited();
    /// let all = PinnedRange::new(&file, 0..8192, PinOptions::default(), &b)?;
    /// let part = PinnedRange::new(&file, 100..200, PinOptions::default(), &b)?; // shares `all`
    /// assert_eq!(part.sharers(), 2);
    /// drop(all);
    /// assert_eq!(part.sharers(), 1);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn sharers(&self) -> usize {
        self.lease.sharers()
    }

    /// The mapped file.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-range-file-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let r = PinnedRange::new(&file, 0..9, PinOptions::default(), &PinBudget::unlimited())?;
    /// assert!(std::sync::Arc::ptr_eq(r.file(), &file));
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn file(&self) -> &Arc<MappedFile> {
        self.lease.value().memory().file()
    }

    /// Ends this range now: when it is the last sharer, waits for copies still
    /// reading it, unregisters, unlocks and returns the budget, reporting
    /// `cudaHostUnregister`'s error (dropping does the same, silently).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-release-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 1 << 16])?;
    /// # use wirespeed_pinned::*;
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// PinnedRange::new(&file, 0..9, PinOptions::default(), &PinBudget::unlimited())?.release()?;
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's error from waiting or unregistering. The registration is then
    /// retried once more; if that fails too, it is leaked (with the mapping)
    /// rather than unmapped under a copy.
    pub fn release(self) -> Result<()> {
        let PinnedRange { lock, lease, .. } = self;
        drop(lock);
        // When others still share it, they release it.
        lease.end_with(|reg| reg.into_inner().map(drop).map_err(Error::from)).unwrap_or(Ok(()))
    }
}

/// The pages of `file` to register for bytes `range`, rounded out.
///
/// # Errors
/// [`Error::BadRange`] for an empty range or one past the end of the file,
/// [`Error::FileChanged`] when the file was truncated since it was mapped.
fn pages_of(file: &MappedFile, range: &Range<u64>) -> Result<Range<u64>> {
    let bad = |reason| Err(Error::BadRange { range: range.clone(), len: file.len(), reason });
    if range.start >= range.end {
        return bad("the range is empty: there is nothing to pin");
    }
    if range.end > file.len() {
        return bad("the range runs past the end of the file");
    }
    // A file truncated since it was mapped: copies from its lost pages would
    // fault (SIGBUS), and CUDA cannot pin them.
    file.check_has(range.end)?;
    let page = page_size();
    Ok(align_down(range.start, page)..align_up(range.end, page).min(file.map_len()))
}

/// Registers `pages` of `file` read-only on `terms`, in `ctx` when given (else
/// in the calling thread's current context), drawing them from `budget`.
/// Returns the registration and its window's
/// [`gone_flag`](FileWindow::gone_flag).
///
/// # Errors
/// [`Error::BudgetExceeded`], [`Error::MemlockLimit`], CUDA's error
/// registering. Nothing stays pinned, locked or drawn on error.
fn register(
    ctx: Option<&Arc<RegistrationContext>>,
    file: &Arc<MappedFile>,
    pages: Range<u64>,
    terms: Terms,
    budget: &PinBudget,
) -> Result<(Registration, Arc<AtomicBool>)> {
    let reservation = budget.reserve(pages.end - pages.start)?;
    let mut window = file.window(pages)?;
    window.hold(reservation);
    let window_gone = window.gone_flag();
    if terms.mlock {
        window.mlock()?;
    }
    let flags = RegisterFlags::new().portable(terms.portable).mapped(terms.mapped).read_only(true);
    let reg = match ctx {
        Some(ctx) => HostRegistration::try_new_in(ctx, window, flags),
        None => HostRegistration::try_new(window, flags),
    }
    .map_err(|(e, window)| {
        drop(window); // munlock before reporting
        Error::Cuda(e)
    })?;
    Ok((reg, window_gone))
}
