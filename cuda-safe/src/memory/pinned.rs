//! Pinned host memory: [`PinnedBuffer`] (`cudaHostAlloc`) and its views.

use super::accessors::view_accessors;
use super::checks::{bytes_of, to_range};
use super::traits::{HostSink, HostSource, Pod, sealed};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::raw;
use std::marker::PhantomData;
use std::ops::RangeBounds;

/// Flags for [`PinnedBuffer::with_flags`]. The default (all off) is right for
/// copies: write-combined memory makes CPU reads very slow, so it is never on
/// unless asked for.
///
/// The struct may gain fields in a minor release, so outside this crate it is
/// built from `Default` (or `new`) and the builder methods, not with a struct
/// literal; its fields stay public for reading.
///
/// ```
/// use wirespeed_cuda::PinnedFlags;
/// let f = PinnedFlags::new().portable(true).mapped(true).write_combined(false);
/// assert!(f.portable && f.mapped && !f.write_combined);
/// assert_eq!(PinnedFlags::new(), PinnedFlags::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PinnedFlags {
    /// Pinned for every device, not only the current one (several GPUs).
    pub portable: bool,
    /// Mapped into the device address space.
    pub mapped: bool,
    /// Write-combined: faster host-to-device copies on some systems, very slow CPU reads.
    pub write_combined: bool,
}

impl PinnedFlags {
    /// Every flag off (the default).
    pub const fn new() -> PinnedFlags {
        PinnedFlags { portable: false, mapped: false, write_combined: false }
    }

    /// With [`PinnedFlags::portable`](PinnedFlags#structfield.portable) set to `on`.
    pub const fn portable(mut self, on: bool) -> Self {
        self.portable = on;
        self
    }

    /// With [`PinnedFlags::mapped`](PinnedFlags#structfield.mapped) set to `on`.
    pub const fn mapped(mut self, on: bool) -> Self {
        self.mapped = on;
        self
    }

    /// With [`PinnedFlags::write_combined`](PinnedFlags#structfield.write_combined) set to `on`.
    pub const fn write_combined(mut self, on: bool) -> Self {
        self.write_combined = on;
        self
    }

    fn bits(self) -> u32 {
        let mut b = wirespeed_cuda_sys::cudaHostAllocDefault;
        if self.portable {
            b |= wirespeed_cuda_sys::cudaHostAllocPortable;
        }
        if self.mapped {
            b |= wirespeed_cuda_sys::cudaHostAllocMapped;
        }
        if self.write_combined {
            b |= wirespeed_cuda_sys::cudaHostAllocWriteCombined;
        }
        b
    }
}

/// Page-locked host memory (`cudaHostAlloc`), zero-initialized: the only host
/// memory besides registered memory that asynchronous copies accept.
///
/// Allocating it takes time in proportion to its size and synchronizes the
/// device: allocate once and reuse it.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// let mut p = wirespeed_cuda::PinnedBuffer::<u8>::new(4096)?;
/// p.as_mut_slice()?[0] = 42;
/// assert_eq!(p.as_slice()?[0], 42);
/// # Ok(()) }
/// ```
pub struct PinnedBuffer<T: Pod> {
    ptr: *mut T,
    len: usize,
    flags: PinnedFlags,
    fence: Fence,
}

// SAFETY: the buffer owns its memory; T is Send + Sync.
unsafe impl<T: Pod> Send for PinnedBuffer<T> {}
// SAFETY: shared access reads only (host reads wait for device writes via the fence).
unsafe impl<T: Pod> Sync for PinnedBuffer<T> {}

impl<T: Pod> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("flags", &self.flags)
            .finish()
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// `len` zeroed values of pinned memory with default flags.
    ///
    /// # Errors
    /// `cudaErrorMemoryAllocation` when the system cannot pin that much.
    pub fn new(len: usize) -> Result<Self> {
        Self::with_flags(len, PinnedFlags::default())
    }

    /// `len` zeroed values of pinned memory with `flags`.
    ///
    /// # Errors
    /// As [`PinnedBuffer::new`].
    pub fn with_flags(len: usize, flags: PinnedFlags) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "PinnedBuffer::new")?;
        if bytes == 0 {
            return Ok(PinnedBuffer {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
                flags,
                fence: Fence::default(),
            });
        }
        let ptr = raw::host_alloc(bytes, flags.bits())?.cast::<T>();
        if ptr.is_null() || !ptr.is_aligned() {
            if !ptr.is_null() {
                // SAFETY: just allocated by cudaHostAlloc and never handed out.
                let _ = unsafe { raw::free_host(ptr.cast()) };
            }
            return Err(Error::invalid("PinnedBuffer::new", "cudaHostAlloc returned a null or misaligned pointer"));
        }
        // SAFETY: `ptr` is valid for writes of `bytes` bytes, freshly allocated.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(PinnedBuffer { ptr, len, flags, fence: Fence::default() })
    }

    /// A pinned copy of `src`.
    ///
    /// # Errors
    /// As [`PinnedBuffer::new`].
    pub fn from_slice(src: &[T]) -> Result<Self> {
        let mut b = Self::new(src.len())?;
        b.as_mut_slice()?.copy_from_slice(src);
        Ok(b)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags it was allocated with.
    pub fn flags(&self) -> PinnedFlags {
        self.flags
    }

    /// The host address, for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *const T {
        self.ptr
    }

    /// Reads the contents, after any device write into it has finished.
    ///
    /// # Errors
    /// The runtime's error while waiting.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.fence.wait_writes()?;
        // SAFETY: `ptr` is valid and initialized for `len` values; no stream
        // writes it (fence waited), and new writes need `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Mutable access, after every stream has finished with the buffer.
    ///
    /// # Errors
    /// The runtime's error while waiting.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.fence.wait_all()?;
        // SAFETY: valid and initialized for `len` values; exclusively borrowed;
        // no stream uses it (fence waited) and none can start meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// A view of `range` that copies can read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<PinnedSlice<'_, T>> {
        let r = to_range(range, self.len, "PinnedBuffer::slice")?;
        Ok(PinnedSlice::new(self.ptr.wrapping_add(r.start), r.len(), &self.fence))
    }

    /// A view of `range` that copies can write.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<PinnedSliceMut<'_, T>> {
        let r = to_range(range, self.len, "PinnedBuffer::slice_mut")?;
        Ok(PinnedSliceMut {
            ptr: self.ptr.wrapping_add(r.start),
            len: r.len(),
            fence: &mut self.fence,
            _p: PhantomData,
        })
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if self.len == 0 || size_of::<T>() == 0 {
            return;
        }
        if self.fence.wait_all().is_err() {
            return; // a copy may still use it: leak rather than free (see DeviceBuffer)
        }
        // SAFETY: we own the allocation and no stream uses it any more.
        let _ = unsafe { raw::free_host(self.ptr.cast()) };
    }
}

/// A read-only view of part of a [`PinnedBuffer`] or of registered memory.
pub struct PinnedSlice<'a, T: Pod> {
    ptr: *const T,
    len: usize,
    fence: &'a Fence,
    _p: PhantomData<&'a [T]>,
}

/// A writable view of part of a [`PinnedBuffer`].
pub struct PinnedSliceMut<'a, T: Pod> {
    ptr: *mut T,
    len: usize,
    fence: &'a mut Fence,
    _p: PhantomData<&'a mut [T]>,
}

// SAFETY: a PinnedSlice is a shared view of pinned memory, like `&[T]` with T: Sync.
unsafe impl<T: Pod> Send for PinnedSlice<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Pod> Sync for PinnedSlice<'_, T> {}
// SAFETY: a PinnedSliceMut is an exclusive view, like `&mut [T]` with T: Send.
unsafe impl<T: Pod> Send for PinnedSliceMut<'_, T> {}
// SAFETY: shared access to a PinnedSliceMut gives no access to the memory.
unsafe impl<T: Pod> Sync for PinnedSliceMut<'_, T> {}

impl<T: Pod> std::fmt::Debug for PinnedSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSlice").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}
impl<T: Pod> std::fmt::Debug for PinnedSliceMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSliceMut").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl<'a, T: Pod> PinnedSlice<'a, T> {
    /// The view of the `len` values at `ptr`, whose copies record in `fence`.
    pub(super) fn new(ptr: *const T, len: usize, fence: &'a Fence) -> Self {
        PinnedSlice { ptr, len, fence, _p: PhantomData }
    }

    view_accessors! {
        setup: ("let buf = wirespeed_cuda::PinnedBuffer::<u16>::new(10)?;"),
        view: ("buf.slice(", ")?"),
        len: len,
    }
}

impl<T: Pod> sealed::Sealed for PinnedBuffer<T> {}
impl<T: Pod> sealed::Sealed for PinnedSlice<'_, T> {}
impl<T: Pod> sealed::Sealed for PinnedSliceMut<'_, T> {}

impl<T: Pod> HostSource<T> for PinnedBuffer<T> {
    fn host_src(&self, _: sealed::Token) -> (*const T, usize, &Fence) {
        (self.ptr, self.len, &self.fence)
    }
}
impl<T: Pod> HostSink<T> for PinnedBuffer<T> {
    fn host_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence) {
        (self.ptr, self.len, &mut self.fence)
    }
}
impl<T: Pod> HostSource<T> for PinnedSlice<'_, T> {
    fn host_src(&self, _: sealed::Token) -> (*const T, usize, &Fence) {
        (self.ptr, self.len, self.fence)
    }
}
impl<T: Pod> HostSink<T> for PinnedSliceMut<'_, T> {
    fn host_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence) {
        (self.ptr, self.len, self.fence)
    }
}
