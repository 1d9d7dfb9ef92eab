//! [`Library`] (device code loaded at run time, `cudaLibraryLoadData`) and
//! [`Kernel`] (one of its entries).

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::raw;
use std::ffi::CString;
use std::sync::Arc;
use wirespeed_cuda_sys::{cudaKernel_t, cudaLibrary_t};

/// A loaded library, shared by its [`Library`] handles and [`Kernel`]s.
///
/// Unloading waits for every launch of its kernels: each launch records
/// itself in `launches` (as a read, by its stream and number) when it is
/// enqueued, before [`Stream::launch`](crate::Stream::launch) returns, while
/// the launching [`Kernel`] holds this value alive. So when the last handle
/// goes and `Drop` runs, every launch there will ever be is recorded, and
/// waiting for the fence waits for all of them, however their `Pending`s
/// ended (dropped, forgotten). Should the wait fail (a lost context), the
/// library is leaked, never unloaded under a kernel that may still run.
pub(super) struct LibraryInner {
    raw: cudaLibrary_t,
    pub(super) launches: Fence,
}

// SAFETY: a library handle may be used from any host thread (it is
// context-independent); `launches` is Send and Sync.
unsafe impl Send for LibraryInner {}
// SAFETY: as above; shared access only gets kernels and records launches,
// under the fence's lock.
unsafe impl Sync for LibraryInner {}

impl Drop for LibraryInner {
    fn drop(&mut self) {
        if self.launches.wait_all().is_err() {
            return; // a kernel may still run: leak the library rather than unload it
        }
        // SAFETY: loaded by us; no handle remains (this is the last owner),
        // and every launch of its kernels has completed (waited just above).
        let _ = unsafe { raw::library_unload(self.raw) };
    }
}

/// Device code loaded at run time (`cudaLibraryLoadData`), for every device
/// at once: get its kernels with [`Library::kernel`] and launch them with
/// [`Stream::launch`](crate::Stream::launch).
///
/// Cloning gives another handle to the same library. It is unloaded when
/// the last handle and the last [`Kernel`] of it are gone, after every launch
/// of its kernels has completed (a launch records itself in the library, as a
/// copy does in its buffers, so forgetting its `Pending` changes nothing).
///
/// Needs a CUDA runtime with the library functions (12.5 or later, or 13);
/// an older one gives [`Error::Load`] naming the missing function.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::Library;
/// let ptx = ".version 7.0\n.target sm_70\n.address_size 64\n\
///            .visible .entry wirespeed_gather(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d, .param .u64 e)\n\
///            { ret; }\n";
/// let library = Library::load_ptx(ptx)?;
/// let gather = library.kernel("wirespeed_gather")?;
/// assert_eq!(gather.name(), "wirespeed_gather");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Library {
    inner: Arc<LibraryInner>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library").field("raw", &self.inner.raw).finish()
    }
}

impl Library {
    /// Loads PTX text (the NUL the runtime needs is appended here). The
    /// driver compiles it for each device when one first needs it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `ptx` holds a NUL byte;
    /// [`Error::Load`] when the runtime lacks the library functions;
    /// `cudaLibraryLoadData`'s error (`cudaErrorInvalidPtx`, say; where the
    /// runtime loads lazily, some come from [`Library::kernel`] or the launch).
    pub fn load_ptx(ptx: &str) -> Result<Library> {
        let text = CString::new(ptx).map_err(|e| {
            Error::invalid("Library::load_ptx", format!("the PTX text holds a NUL byte at {}", e.nul_position()))
        })?;
        let raw = raw::library_load_data(&text)?;
        Ok(Library { inner: Arc::new(LibraryInner { raw, launches: Fence::default() }) })
    }

    /// The kernel (`.entry`) named `name`.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let ptx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry wirespeed_gather() { ret; }\n";
    /// let library = wirespeed_cuda::Library::load_ptx(ptx)?;
    /// assert!(library.kernel("wirespeed_gather").is_ok());
    /// let e = library.kernel("no_such_kernel").unwrap_err();
    /// assert_eq!(e.call(), "cudaLibraryGetKernel");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `name` holds a NUL byte;
    /// `cudaLibraryGetKernel`'s error (`cudaErrorSymbolNotFound` for a name
    /// the library does not have).
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let c = CString::new(name).map_err(|_| Error::invalid("Library::kernel", "the name holds a NUL byte"))?;
        // SAFETY: the library is loaded while `self` holds it.
        let raw = unsafe { raw::library_get_kernel(self.inner.raw, &c) }?;
        Ok(Kernel { raw, name: name.into(), library: self.inner.clone() })
    }

    /// The raw handle, for calls this crate does not wrap. Launches made
    /// through it are not recorded: they must complete before the library
    /// is dropped.
    pub fn as_raw(&self) -> cudaLibrary_t {
        self.inner.raw
    }
}

/// One kernel of a [`Library`], which it keeps loaded. Launch it with
/// [`Stream::launch`](crate::Stream::launch). Cloning gives another handle
/// to the same kernel; it may be sent to and shared between threads.
#[derive(Clone)]
pub struct Kernel {
    raw: cudaKernel_t,
    name: Arc<str>,
    pub(super) library: Arc<LibraryInner>,
}

// SAFETY: a kernel handle may be used from any host thread; the library it
// belongs to is Send and Sync.
unsafe impl Send for Kernel {}
// SAFETY: as above; it is only read.
unsafe impl Sync for Kernel {}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).field("raw", &self.raw).finish()
    }
}

impl Kernel {
    /// Its entry name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library it belongs to.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let ptx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry wirespeed_gather() { ret; }\n";
    /// let gather = wirespeed_cuda::Library::load_ptx(ptx)?.kernel("wirespeed_gather")?;
    /// let library = gather.library(); // still loaded: the kernel kept it
    /// assert!(library.kernel("wirespeed_gather").is_ok());
    /// # Ok(()) }
    /// ```
    pub fn library(&self) -> Library {
        Library { inner: self.library.clone() }
    }

    /// The raw handle (a `cudaKernel_t`), for calls this crate does not wrap;
    /// see [`Library::as_raw`].
    pub fn as_raw(&self) -> cudaKernel_t {
        self.raw
    }
}
