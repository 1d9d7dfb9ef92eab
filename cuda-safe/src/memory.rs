//! Device memory, pinned host memory, registered host memory, and the copies
//! between them.
//!
//! Every buffer owns a [`Fence`]. Asynchronous copies borrow their buffers for
//! the [`Pending`] they return and record themselves in the fences; host access
//! (`as_slice`, `as_mut_slice`, `to_vec`) and `Drop` wait on the fence first.

use crate::context::RegistrationContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fence::{Fence, Hold, span_of};
use crate::raw;
use crate::stream::{Pending, Stream};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Bound, Range, RangeBounds};
use std::sync::Arc;
use wirespeed_cuda_sys::cudaMemcpyKind;

mod lanes;
pub use lanes::{Lane, Lanes};

/// Plain old data: any bit pattern is a valid value, no padding, no pointers
/// that matter. Only such types may be copied to and from a GPU.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid `Self`, and
/// `Self` must have no padding bytes.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: primitive numbers: every bit pattern is valid, no padding.
        unsafe impl Pod for $t {}
    )* };
}
pod!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);
// SAFETY: an array of Pod has no padding between elements and every bit pattern is valid.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

fn bytes_of<T>(len: usize, call: &'static str) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| Error::invalid(call, format!("{len} elements overflow usize bytes")))
}

fn to_range(r: impl RangeBounds<usize>, len: usize, call: &'static str) -> Result<Range<usize>> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::invalid(call, format!("range {start}..{end} out of bounds for length {len}")));
    }
    Ok(start..end)
}

mod sealed {
    pub trait Sealed {}
    /// The argument of the source and sink traits' methods. Only this crate
    /// can make one, so only this crate can call them: they hand out a
    /// buffer's fence (`&mut` for sinks), and safe code that could swap or
    /// reset a fence could touch memory a copy still uses. (`Sealed` alone
    /// stops other crates from implementing the traits, not from calling them.)
    #[derive(Clone, Copy)]
    pub struct Token(pub(super) ());
}

const TOKEN: sealed::Token = sealed::Token(());

/// Host memory an asynchronous copy may read: pinned or registered only. A
/// pageable `&[T]` does not implement it, so it cannot reach an async copy.
pub trait HostSource<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn host_src(&self, _: sealed::Token) -> (*const T, usize, &Fence);
}
/// Host memory an asynchronous copy may write: pinned memory only.
pub trait HostSink<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn host_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence);
}
/// Device memory an operation may read.
pub trait DeviceSource<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn device_src(&self, _: sealed::Token) -> (*const T, usize, &Fence, Device);
}
/// Device memory an operation may write.
pub trait DeviceSink<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn device_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence, Device);
}

// ---------------------------------------------------------------- device memory

/// Memory on one device (`cudaMalloc`), holding `len` values of `T`.
///
/// The host never dereferences it: copies move data in and out. `Drop` waits
/// for every stream still using it, then frees it.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// let dev = wirespeed_cuda::Device::get(0)?;
/// let mut d = wirespeed_cuda::DeviceBuffer::<u32>::zeroed(&dev, 1024)?;
/// d.copy_from_slice(&[7; 1024])?;            // synchronous, from pageable memory
/// assert_eq!(d.to_vec()?[0], 7);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: Pod> {
    ptr: *mut T,
    len: usize,
    device: Device,
    fence: Fence,
}

// SAFETY: the buffer owns device memory, usable from any thread; T is Send + Sync.
unsafe impl<T: Pod> Send for DeviceBuffer<T> {}
// SAFETY: shared access only enqueues reads, ordered by the fence's mutex.
unsafe impl<T: Pod> Sync for DeviceBuffer<T> {}

impl<T: Pod> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// `len` values on `device`, contents unspecified (whatever the memory held).
    ///
    /// # Errors
    /// `cudaErrorMemoryAllocation` when the device is full.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "DeviceBuffer::new")?;
        device.ensure_current()?;
        let ptr = if bytes == 0 { std::ptr::null_mut() } else { raw::malloc(bytes)?.cast() };
        Ok(DeviceBuffer { ptr, len, device: *device, fence: Fence::default() })
    }

    /// `len` zeroed values on `device`.
    ///
    /// # Errors
    /// As [`DeviceBuffer::new`].
    pub fn zeroed(device: &Device, len: usize) -> Result<Self> {
        let b = Self::new(device, len)?;
        if len > 0 {
            // SAFETY: the whole fresh allocation, on the current device, unused by any stream.
            unsafe { raw::memset(b.ptr.cast(), 0, len * size_of::<T>()) }?;
            // cudaMemset returns before the device has finished (5 µs for 1 GiB
            // on the H200), on the legacy stream, which non-blocking streams do
            // not wait for: wait, or a later copy on any stream could be overwritten.
            // SAFETY: null is the legacy stream of the current device.
            unsafe { raw::stream_synchronize(std::ptr::null_mut()) }?;
        }
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

    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device address, for calls this crate does not wrap (e.g. a kernel).
    /// Work given through it is not fenced: synchronize before touching `self`.
    pub fn as_raw_ptr(&self) -> *mut T {
        self.ptr
    }

    /// A view of `range` that operations can read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let r = to_range(range, self.len, "DeviceBuffer::slice")?;
        Ok(DeviceSlice {
            ptr: self.ptr.wrapping_add(r.start),
            len: r.len(),
            device: self.device,
            fence: &self.fence,
            _p: PhantomData,
        })
    }

    /// A view of `range` that operations can write.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        DeviceSliceMut::within(self.ptr, self.len, self.device, &mut self.fence, range, "DeviceBuffer::slice_mut")
    }

    /// Two writable views, of `..mid` and `mid..`, usable at once (by two
    /// streams, two threads, two transfers). Both record their operations in
    /// the buffer's one fence, so host access and `Drop` wait for both.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let (s1, s2) = (Stream::new(&dev)?, Stream::new(&dev)?);
    /// let mut buf = DeviceBuffer::<u16>::new(&dev, 1000)?;
    /// let (mut low, mut high) = buf.split_at_mut(400)?;
    /// s1.memset(&mut low, 0x01)?.detach();
    /// s2.memset(&mut high, 0x02)?.detach();
    /// let v = buf.to_vec()?; // waits for both
    /// assert_eq!((v[399], v[400]), (0x0101, 0x0202));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `mid > len`.
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        if mid > self.len {
            return Err(Error::invalid("DeviceBuffer::split_at_mut", format!("{mid} is past the end ({})", self.len)));
        }
        Ok(split_view(self.ptr, self.len, self.device, &self.fence, mid))
    }

    /// Copies `src` (any host memory) in, synchronously, after every stream has
    /// finished with the buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a length mismatch; the runtime's error.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::invalid(
                "DeviceBuffer::copy_from_slice",
                format!("source has {} values, buffer {}", src.len(), self.len),
            ));
        }
        self.fence.wait_all()?;
        if self.len == 0 {
            return Ok(());
        }
        self.device.ensure_current()?;
        // SAFETY: `src` is valid for reads of the whole buffer's bytes; the
        // buffer is exclusively borrowed and no stream uses it (fence waited).
        unsafe {
            raw::memcpy(self.ptr.cast(), src.as_ptr().cast(), size_of_val(src), cudaMemcpyKind::cudaMemcpyHostToDevice)
        }?;
        // From pageable memory, cudaMemcpy returns once `src` is staged; the
        // DMA into the buffer may still run, on the legacy stream, which
        // non-blocking streams do not wait for (CUDA's "API synchronization
        // behavior"). Wait for it, as `zeroed` does after its memset, or a
        // later copy on any stream could read stale bytes or be overwritten.
        // SAFETY: null is the legacy stream of the current device.
        unsafe { raw::stream_synchronize(std::ptr::null_mut()) }
    }

    /// Copies the contents out into `dst` (any host memory), synchronously,
    /// after every stream writing the buffer has finished.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a length mismatch; the runtime's error.
    pub fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid(
                "DeviceBuffer::copy_to_slice",
                format!("destination has {} values, buffer {}", dst.len(), self.len),
            ));
        }
        self.fence.wait_writes()?;
        if self.len == 0 {
            return Ok(());
        }
        self.device.ensure_current()?;
        // SAFETY: `dst` is valid for writes of the whole buffer's bytes and
        // exclusively borrowed; no stream writes the buffer (fence waited).
        unsafe {
            raw::memcpy(
                dst.as_mut_ptr().cast(),
                self.ptr.cast(),
                size_of_val(dst),
                cudaMemcpyKind::cudaMemcpyDeviceToHost,
            )
        }
    }

    /// The contents, copied to a new `Vec`, synchronously.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len);
        // Pod values: zero is a valid value; it is overwritten by the copy.
        v.resize(self.len, zeroed_pod::<T>());
        self.copy_to_slice(&mut v)?;
        Ok(v)
    }
}

fn zeroed_pod<T: Pod>() -> T {
    // SAFETY: T is Pod, so the all-zero bit pattern is a valid value.
    unsafe { std::mem::zeroed() }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        if self.fence.wait_all().is_err() {
            // A stream may still use the memory and CUDA cannot tell us when it
            // stops: leak it rather than free memory a copy may write.
            return;
        }
        let _ = self.device.ensure_current();
        // SAFETY: we own the allocation and no stream uses it any more.
        let _ = unsafe { raw::free(self.ptr.cast()) };
    }
}

/// A read-only view of part of a [`DeviceBuffer`] (or of a writable view).
pub struct DeviceSlice<'a, T: Pod> {
    ptr: *const T,
    len: usize,
    device: Device,
    fence: &'a Fence,
    _p: PhantomData<&'a [T]>,
}

/// A writable view of part of a [`DeviceBuffer`], of device memory allocated
/// elsewhere ([`DeviceSliceMut::from_raw_parts`]), or of a
/// [`DetachedSliceMut`]. `&mut DeviceBuffer` converts into a view of all of it.
pub struct DeviceSliceMut<'a, T: Pod> {
    ptr: *mut T,
    len: usize,
    device: Device,
    fence: ViewFence<'a>,
    _p: PhantomData<&'a mut [T]>,
}

/// Where a writable view records its operations.
enum ViewFence<'a> {
    /// The fence of the buffer (or of the view) it borrows exclusively.
    Buffer(&'a mut Fence),
    /// A fence of its own: one that records into the fence of the buffer it
    /// is a part of ([`Fence::part_of`]: `split_at_mut`), or a fresh one
    /// (`from_raw_parts`: the caller vouches for the memory).
    Own(Fence),
}

impl ViewFence<'_> {
    fn get(&self) -> &Fence {
        match self {
            ViewFence::Buffer(f) => f,
            ViewFence::Own(f) => f,
        }
    }

    fn get_mut(&mut self) -> &mut Fence {
        match self {
            ViewFence::Buffer(f) => f,
            ViewFence::Own(f) => f,
        }
    }
}

// SAFETY: a DeviceSlice is a shared view of device memory, like `&[T]` with T: Sync;
// its fence is Sync.
unsafe impl<T: Pod> Send for DeviceSlice<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Pod> Sync for DeviceSlice<'_, T> {}
// SAFETY: a DeviceSliceMut is an exclusive view, like `&mut [T]` with T: Send;
// its fence is Send and Sync.
unsafe impl<T: Pod> Send for DeviceSliceMut<'_, T> {}
// SAFETY: shared access to a DeviceSliceMut only enqueues reads, ordered by the fence's lock.
unsafe impl<T: Pod> Sync for DeviceSliceMut<'_, T> {}

/// The views of `..mid` and `mid..` of `len` values at `ptr`, recording into
/// `fence` (`mid <= len`, checked by the callers).
fn split_view<'a, T: Pod>(
    ptr: *mut T,
    len: usize,
    device: Device,
    fence: &'a Fence,
    mid: usize,
) -> (DeviceSliceMut<'a, T>, DeviceSliceMut<'a, T>) {
    let part = |ptr: *mut T, len| DeviceSliceMut {
        ptr,
        len,
        device,
        fence: ViewFence::Own(Fence::part_of(fence)),
        _p: PhantomData,
    };
    (part(ptr, mid), part(ptr.wrapping_add(mid), len - mid))
}

impl<T: Pod> DeviceSlice<'_, T> {
    /// Number of values.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;
    /// assert_eq!(buf.slice(2..)?.len(), 8);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no value.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;
    /// assert!(buf.slice(10..)?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;
    /// assert_eq!(buf.slice(..)?.device(), dev);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// A view of `range` of this view.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let buf = wirespeed_cuda::DeviceBuffer::<u32>::zeroed(&dev, 100)?;
    /// let view = buf.slice(10..90)?;
    /// assert_eq!(view.slice(..20)?.len(), 20);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let r = to_range(range, self.len, "DeviceSlice::slice")?;
        Ok(DeviceSlice {
            ptr: self.ptr.wrapping_add(r.start),
            len: r.len(),
            device: self.device,
            fence: self.fence,
            _p: PhantomData,
        })
    }
}

impl<'a, T: Pod> From<&'a mut DeviceBuffer<T>> for DeviceSliceMut<'a, T> {
    /// A writable view of the whole buffer.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut};
    /// let mut buf = DeviceBuffer::<u8>::new(&Device::get(0)?, 64)?;
    /// let view = DeviceSliceMut::from(&mut buf);
    /// assert_eq!(view.len(), 64);
    /// # Ok(()) }
    /// ```
    fn from(buf: &'a mut DeviceBuffer<T>) -> Self {
        DeviceSliceMut {
            ptr: buf.ptr,
            len: buf.len,
            device: buf.device,
            fence: ViewFence::Buffer(&mut buf.fence),
            _p: PhantomData,
        }
    }
}

impl<'b, T: Pod> From<&'b mut DeviceSliceMut<'_, T>> for DeviceSliceMut<'b, T> {
    /// The same view, reborrowed (to pass it on without giving it up).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut};
    /// let mut buf = DeviceBuffer::<u8>::new(&Device::get(0)?, 64)?;
    /// let mut view = buf.slice_mut(8..)?;
    /// assert_eq!(DeviceSliceMut::from(&mut view).len(), 56);
    /// assert_eq!(view.len(), 56); // still ours
    /// # Ok(()) }
    /// ```
    fn from(view: &'b mut DeviceSliceMut<'_, T>) -> Self {
        DeviceSliceMut {
            ptr: view.ptr,
            len: view.len,
            device: view.device,
            fence: ViewFence::Buffer(view.fence.get_mut()),
            _p: PhantomData,
        }
    }
}

impl<'a, T: Pod> DeviceSliceMut<'a, T> {
    /// A writable view of device memory that this crate did not allocate
    /// (another library's buffer: cudarc's `CudaSlice`, a framework's tensor,
    /// `cudaMallocAsync`), for as long as `'a`, which the caller chooses.
    ///
    /// Operations through the view (and its parts, and a [`DetachedSliceMut`]
    /// made from it) are ordered among themselves like any buffer's, but
    /// nothing here knows of the memory's other users: the contract below is
    /// how they stay apart. Ordering with work of the other library goes
    /// through streams: see `wirespeed_pinned`'s `Transfer::then_on` and
    /// `StartOptions::after`, or [`Stream::wait_event`] and [`Stream::record`].
    ///
    /// Checks what it can: `ptr` aligned for `T`, the byte length within
    /// `isize`, and (for `len > 0`) the runtime knowing `ptr` as device (or
    /// managed) memory of `device`; only the first address is looked up.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, PinnedBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let stream = Stream::new(&dev)?;
    /// // Memory from elsewhere: here a buffer whose address is all we pass on.
    /// let backing = DeviceBuffer::<f32>::zeroed(&dev, 256)?;
    /// let host = PinnedBuffer::from_slice(&[2.5f32; 256])?;
    /// // SAFETY: `backing` is device memory of `dev`, alive until the end of
    /// // the block, and nothing else touches it until `wait` returns.
    /// let mut view = unsafe { DeviceSliceMut::from_raw_parts(backing.as_raw_ptr(), 256, dev) }?;
    /// stream.copy_to_device(&host, &mut view)?.wait()?;
    /// assert_eq!(backing.to_vec()?[255], 2.5);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// From this call until every operation given the view (or a part of it,
    /// or a [`DetachedSliceMut`] made from it) is *observed complete*:
    ///
    /// * `ptr .. ptr + len` is device memory of `device`, allocated and not
    ///   freed (nor given back to a pool), in the context the runtime uses for
    ///   `device` (its primary context, which cudarc and the frameworks use too);
    /// * nothing else reads or writes that memory: no kernel, copy or memset
    ///   of another library or stream, no other view of it, except work
    ///   ordered after those operations through a stream as below, or before
    ///   them (work on a stream they are made to wait for: the streamer's
    ///   `StartOptions::after`, or [`Stream::wait_event`] on an event recorded
    ///   after that work).
    ///
    /// An operation is *observed complete* once a wait on it returned (its
    /// [`Pending::wait`], a [`Stream::synchronize`] of its stream, or, for a
    /// `wirespeed_pinned` transfer, `Transfer::wait` or `Transfer::is_done`
    /// returning done), and, for work on a stream, once that work was enqueued
    /// after an event or wait that follows the operation (for a transfer,
    /// work enqueued on a stream after `Transfer::then_on(stream)` returned;
    /// that work, and only it, may touch the memory). Dropping or leaking the
    /// view or a handle observes nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a misaligned pointer, a length whose
    /// bytes overflow `isize`, or memory that the runtime does not know as
    /// device memory of `device`; the runtime's error from
    /// `cudaPointerGetAttributes`.
    pub unsafe fn from_raw_parts(ptr: *mut T, len: usize, device: Device) -> Result<DeviceSliceMut<'a, T>> {
        const CALL: &str = "DeviceSliceMut::from_raw_parts";
        let bytes = bytes_of::<T>(len, CALL)?;
        if bytes > isize::MAX as usize {
            return Err(Error::invalid(CALL, format!("{bytes} bytes exceed isize::MAX")));
        }
        if !ptr.is_aligned() {
            return Err(Error::invalid(CALL, format!("{ptr:p} is not aligned for its type")));
        }
        if bytes > 0 {
            let (kind, dev) = raw::pointer_attributes(ptr.cast_const().cast())?;
            // 2: device memory, 3: managed memory (cudaMemoryType).
            if !matches!(kind, 2 | 3) || dev != device.ordinal() as i32 {
                return Err(Error::invalid(
                    CALL,
                    format!(
                        "{ptr:p} is not device memory of device {} (memory type {kind}, device {dev})",
                        device.ordinal()
                    ),
                ));
            }
        }
        Ok(DeviceSliceMut { ptr, len, device, fence: ViewFence::Own(Fence::default()), _p: PhantomData })
    }

    /// The writable view of `range` of the `len` values from `ptr` on
    /// `device`, whose operations record in `fence`: the one constructor of
    /// sub-views (of a buffer, a view, a detached writer, a lane).
    fn within(
        ptr: *mut T,
        len: usize,
        device: Device,
        fence: &'a mut Fence,
        range: impl RangeBounds<usize>,
        call: &'static str,
    ) -> Result<DeviceSliceMut<'a, T>> {
        let r = to_range(range, len, call)?;
        Ok(DeviceSliceMut {
            ptr: ptr.wrapping_add(r.start),
            len: r.len(),
            device,
            fence: ViewFence::Buffer(fence),
            _p: PhantomData,
        })
    }

    /// Number of values.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// assert_eq!(buf.slice_mut(3..)?.len(), 7);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no value.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// assert!(buf.slice_mut(..0)?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&dev, 10)?;
    /// assert_eq!(buf.slice_mut(..)?.device(), dev);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device address, for calls this crate does not wrap (a kernel of
    /// yours). Work given through it is not fenced: order it yourself.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// let base = buf.as_raw_ptr();
    /// assert_eq!(buf.slice_mut(4..)?.as_raw_ptr(), base.wrapping_add(4));
    /// # Ok(()) }
    /// ```
    pub fn as_raw_ptr(&self) -> *mut T {
        self.ptr
    }

    /// A writable view of `range` of this view.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 100)?;
    /// let mut view = buf.slice_mut(10..)?;
    /// Stream::new(&dev)?.memset(&mut view.slice_mut(..5)?, 9)?.wait()?;
    /// assert_eq!(buf.to_vec()?[10..16], [9, 9, 9, 9, 9, 0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let (ptr, len, device) = (self.ptr, self.len, self.device);
        DeviceSliceMut::within(ptr, len, device, self.fence.get_mut(), range, "DeviceSliceMut::slice_mut")
    }

    /// Two writable views, of `..mid` and `mid..`, usable at once, as
    /// [`DeviceBuffer::split_at_mut`] (both record in the buffer's fence).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let s = Stream::new(&dev)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 30)?;
    /// let mut tail = buf.slice_mut(10..)?;
    /// let (mut a, mut b) = tail.split_at_mut(10)?;
    /// s.memset(&mut a, 1)?.detach();
    /// s.memset(&mut b, 2)?.detach();
    /// assert_eq!(buf.to_vec()?[9..21], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `mid > len`.
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        if mid > self.len {
            return Err(Error::invalid(
                "DeviceSliceMut::split_at_mut",
                format!("{mid} is past the end ({})", self.len),
            ));
        }
        Ok(split_view(self.ptr, self.len, self.device, self.fence.get(), mid))
    }

    /// The same memory as bytes (for byte-oriented producers, such as file
    /// transfers), keeping the borrow and the fence.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<f64>::new(&dev, 8)?;
    /// assert_eq!(buf.slice_mut(2..)?.into_bytes().len(), 48);
    /// # Ok(()) }
    /// ```
    pub fn into_bytes(self) -> DeviceSliceMut<'a, u8> {
        DeviceSliceMut {
            ptr: self.ptr.cast(),
            // At most isize::MAX bytes: a buffer's or checked by from_raw_parts.
            len: self.len * size_of::<T>(),
            device: self.device,
            fence: self.fence,
            _p: PhantomData,
        }
    }

    /// Ends the borrow, handing the memory to a writer that enqueues its work
    /// later, from any thread (a file transfer running on a worker thread,
    /// say): see [`DetachedSliceMut`]. The buffer's fence records a *hold*
    /// on this span, so that the buffer's `Drop`, host access and operations
    /// on the span first wait for the detached writer to release it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 1024)?;
    /// let mut part = buf.slice_mut(512..)?.detach();
    /// let worker = std::thread::spawn(move || -> wirespeed_cuda::Result<()> {
    ///     let s = Stream::new(&dev)?;
    ///     let src = PinnedBuffer::from_slice(&[7u8; 512])?;
    ///     s.copy_to_device(&src, &mut part.slice_mut(..)?)?.detach();
    ///     drop(part); // releases the hold: its copy is known to the buffer
    ///     Ok(()) // (`src` waits for its copy as it drops)
    /// });
    /// let v = buf.to_vec()?; // waits for the release, then for the copy
    /// assert_eq!((v[511], v[512]), (0, 7));
    /// worker.join().unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn detach(mut self) -> DetachedSliceMut<T> {
        let (fence, hold) = self.fence.get_mut().hold(span_of(self.ptr, self.len));
        DetachedSliceMut { ptr: self.ptr, len: self.len, device: self.device, fence, hold }
    }
}

/// A writable span of device memory taken out of its owner's borrow
/// ([`DeviceSliceMut::detach`]): `'static` and `Send`, for a writer that
/// enqueues its work later, from another thread, after the call that made it
/// has returned (and the caller's borrow has ended).
///
/// The owner's fence keeps a *hold* on the span until this value is dropped
/// ([`DetachedSliceMut::release`]); until then, the owner's `Drop`, its host
/// access (`to_vec`, `copy_to_slice`, ...) and every operation on memory that
/// overlaps the span block, because they cannot know yet what the writer will
/// enqueue. On release the hold hands over the record of what was enqueued
/// through this value, and they wait for exactly that. So nothing depends on
/// a destructor running: leaking this value leaves the hold in place forever,
/// and the owner can never free or read the memory (it blocks, or leaks it),
/// rather than free memory that a copy may still write.
///
/// Operations through it ([`DetachedSliceMut::slice_mut`]) are first ordered
/// after every use of the memory known when it was detached, including
/// earlier detached writers of the span (waiting for their release when it
/// has not come yet: see [`DetachedSliceMut::settle`]).
///
/// Holding one and, on the same thread, dropping or reading its owner blocks
/// forever: release it first.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
/// let dev = Device::get(0)?;
/// let mut buf = DeviceBuffer::<u32>::zeroed(&dev, 64)?;
/// let mut all = DeviceSliceMut::from(&mut buf).detach(); // `buf` is no longer borrowed
/// let stream = Stream::new(&dev)?;
/// stream.memset(&mut all.slice_mut(..32)?, 0xff)?.detach(); // recorded in `all`'s fence
/// all.release(); // ... and now in `buf`'s
/// let v = buf.to_vec()?; // waits for the memset
/// assert_eq!((v[31], v[32]), (u32::MAX, 0));
/// # Ok(()) }
/// ```
pub struct DetachedSliceMut<T: Pod> {
    ptr: *mut T,
    len: usize,
    device: Device,
    /// This writer's own record: it starts with the uses of the memory it
    /// must follow, and is handed to the hold on release.
    fence: Fence,
    hold: Arc<Hold>,
}

// SAFETY: it stands for exclusive access to device memory that its owner keeps
// allocated until the hold is released (like `&mut [T]` with T: Send); the
// fence and the hold are Send and Sync.
unsafe impl<T: Pod> Send for DetachedSliceMut<T> {}
// SAFETY: shared access only makes read-only views, whose operations lock the fence.
unsafe impl<T: Pod> Sync for DetachedSliceMut<T> {}

impl<T: Pod> std::fmt::Debug for DetachedSliceMut<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetachedSliceMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl<T: Pod> DetachedSliceMut<T> {
    /// Number of values.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// assert_eq!(buf.slice_mut(2..)?.detach().len(), 8);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no value.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// assert!(buf.slice_mut(10..)?.detach().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&dev, 10)?;
    /// assert_eq!(buf.slice_mut(..)?.detach().device(), dev);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device address, for calls this crate does not wrap. Work given
    /// through it is not fenced: the hold's record will not include it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::new(&wirespeed_cuda::Device::get(0)?, 10)?;
    /// let base = buf.as_raw_ptr();
    /// assert_eq!(buf.slice_mut(1..)?.detach().as_raw_ptr(), base.wrapping_add(1));
    /// # Ok(()) }
    /// ```
    pub fn as_raw_ptr(&self) -> *mut T {
        self.ptr
    }

    /// A writable view of `range`, for operations recorded in this writer's
    /// fence (and so handed to the owner on release).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, Stream};
    /// let dev = Device::get(0)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 100)?;
    /// let mut detached = DeviceSliceMut::from(&mut buf).detach();
    /// Stream::new(&dev)?.memset(&mut detached.slice_mut(50..)?, 1)?.detach();
    /// detached.release();
    /// assert_eq!(buf.to_vec()?[49..51], [0, 1]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        DeviceSliceMut::within(self.ptr, self.len, self.device, &mut self.fence, range, "DetachedSliceMut::slice_mut")
    }

    /// A read-only view of `range` (to check what was written, say).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, PinnedBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let stream = Stream::new(&dev)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 100)?;
    /// let detached = DeviceSliceMut::from(&mut buf).detach();
    /// let mut back = PinnedBuffer::<u8>::new(10)?;
    /// stream.copy_to_host(&detached.slice(..10)?, &mut back)?.wait()?;
    /// assert_eq!(back.as_slice()?, [0; 10]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let r = to_range(range, self.len, "DetachedSliceMut::slice")?;
        Ok(DeviceSlice {
            ptr: self.ptr.wrapping_add(r.start),
            len: r.len(),
            device: self.device,
            fence: &self.fence,
            _p: PhantomData,
        })
    }

    /// Blocks until the earlier detached writers of this span (known when it
    /// was detached) have released their holds. Operations through this value
    /// wait for that anyway, on whatever thread enqueues them; settling first
    /// keeps the wait out of places that must not block on another writer
    /// (a writer that holds a lock the other one needs, say).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut};
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&Device::get(0)?, 100)?;
    /// let first = DeviceSliceMut::from(&mut buf).detach();
    /// let mut second = DeviceSliceMut::from(&mut buf).detach(); // must follow `first`
    /// first.release();
    /// second.settle(); // returns at once: `first` was released
    /// # Ok(()) }
    /// ```
    pub fn settle(&mut self) {
        self.fence.settle();
    }

    /// True when no earlier detached writer of this span still holds it:
    /// operations through this value will not wait for another writer's
    /// release (the answer cannot turn false later: releases are final). The
    /// test [`DetachedSliceMut::settle`] would block on, without blocking.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut};
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&Device::get(0)?, 100)?;
    /// let first = DeviceSliceMut::from(&mut buf).detach();
    /// let second = DeviceSliceMut::from(&mut buf).detach(); // must follow `first`
    /// assert!(!second.is_settled());
    /// first.release();
    /// assert!(second.is_settled());
    /// # Ok(()) }
    /// ```
    pub fn is_settled(&self) -> bool {
        self.fence.is_settled()
    }

    /// Releases the hold (the same as dropping it): the owner's fence learns
    /// what was enqueued through this value and stops blocking on it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer};
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&Device::get(0)?, 100)?;
    /// let detached = buf.slice_mut(..)?.detach();
    /// detached.release();
    /// assert_eq!(buf.to_vec()?, vec![0; 100]); // would block forever before the release
    /// # Ok(()) }
    /// ```
    pub fn release(self) {}
}

impl<T: Pod> Drop for DetachedSliceMut<T> {
    fn drop(&mut self) {
        self.fence.release_into(&self.hold);
    }
}

impl<T: Pod> sealed::Sealed for DeviceBuffer<T> {}
impl<T: Pod> sealed::Sealed for DeviceSlice<'_, T> {}
impl<T: Pod> sealed::Sealed for DeviceSliceMut<'_, T> {}

impl<T: Pod> DeviceSource<T> for DeviceBuffer<T> {
    fn device_src(&self, _: sealed::Token) -> (*const T, usize, &Fence, Device) {
        (self.ptr, self.len, &self.fence, self.device)
    }
}
impl<T: Pod> DeviceSink<T> for DeviceBuffer<T> {
    fn device_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence, Device) {
        (self.ptr, self.len, &mut self.fence, self.device)
    }
}
impl<T: Pod> DeviceSource<T> for DeviceSlice<'_, T> {
    fn device_src(&self, _: sealed::Token) -> (*const T, usize, &Fence, Device) {
        (self.ptr, self.len, self.fence, self.device)
    }
}
impl<T: Pod> DeviceSource<T> for DeviceSliceMut<'_, T> {
    fn device_src(&self, _: sealed::Token) -> (*const T, usize, &Fence, Device) {
        (self.ptr, self.len, self.fence.get(), self.device)
    }
}
impl<T: Pod> DeviceSink<T> for DeviceSliceMut<'_, T> {
    fn device_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence, Device) {
        (self.ptr, self.len, self.fence.get_mut(), self.device)
    }
}

// ---------------------------------------------------------------- pinned memory

/// Flags for [`PinnedBuffer::with_flags`]. The default (all off) is right for
/// copies: write-combined memory makes CPU reads very slow, so it is never on
/// unless asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinnedFlags {
    /// Pinned for every device, not only the current one (several GPUs).
    pub portable: bool,
    /// Mapped into the device address space.
    pub mapped: bool,
    /// Write-combined: faster host-to-device copies on some systems, very slow CPU reads.
    pub write_combined: bool,
}

impl PinnedFlags {
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
/// Allocating it is slow (about 0.34 s per GiB on an H200) and synchronizes the
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
        Ok(PinnedSlice { ptr: self.ptr.wrapping_add(r.start), len: r.len(), fence: &self.fence, _p: PhantomData })
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
impl<T: Pod> std::fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSlice")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}
impl<T: Pod> std::fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSliceMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl<T: Pod> PinnedSlice<'_, T> {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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

// ---------------------------------------------------------------- registered memory

/// Host memory that can be registered: a stable address range that its owner
/// keeps mapped for as long as the owner lives.
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must be mapped and keep the same address and
/// contents' validity for the whole life of the value (moving the value must
/// not move the memory), and nothing may write it while a `HostRegistration`
/// owns the value, except through the registration's sinks when not read-only.
pub unsafe trait HostMemory: Send + Sync {
    /// Start of the range.
    fn as_ptr(&self) -> *const u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a boxed slice's heap memory does not move with the box, and the
// registration owning it is the only one who can reach it.
unsafe impl HostMemory for Box<[u8]> {
    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// The pages of every live [`HostRegistration`], as `first page -> (end,
/// first registered byte)` (byte addresses, disjoint). CUDA registers whole pages, so two buffers that
/// share a page cannot both be registered: the second is refused here, with
/// the page named, instead of with CUDA's bare 712. A leaked registration
/// keeps its pages (CUDA keeps them registered too).
mod pages {
    use crate::error::{Error, Result};
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock, PoisonError};

    static LIVE: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());

    fn page_size() -> usize {
        static PAGE: OnceLock<usize> = OnceLock::new();
        *PAGE.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            usize::try_from(n).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
        })
    }

    /// The pages `[first, end)` holding the `len > 0` bytes at `ptr`.
    fn span(ptr: *const u8, len: usize) -> (usize, usize) {
        let page = page_size();
        let first = ptr as usize & !(page - 1);
        let end = (ptr as usize).saturating_add(len).checked_next_multiple_of(page).unwrap_or(usize::MAX & !(page - 1));
        (first, end)
    }

    /// Whether CUDA still sees the registered byte at `p` as pinned host
    /// memory. A leaked registration is forgotten by CUDA when its context
    /// goes (a reset after a lost context, say), and its memory may then be
    /// reused.
    fn still_registered(p: usize) -> bool {
        match crate::raw::pointer_attributes(p as *const std::ffi::c_void) {
            Ok((ty, _)) => ty == wirespeed_cuda_sys::cudaMemoryType::cudaMemoryTypeHost.0,
            Err(_) => {
                crate::raw::clear_last_error();
                false
            }
        }
    }

    /// Claims the pages of `len > 0` bytes at `ptr` for a registration, or
    /// refuses them if a live registration holds one of them.
    pub(super) fn claim(call: &'static str, ptr: *const u8, len: usize) -> Result<()> {
        let (first, end) = span(ptr, len);
        let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((&f, &(e, byte))) = live.range(..end).next_back()
            && e > first
        {
            let page = page_size();
            let (sf, se) = (first.max(f), end.min(e));
            // A byte of the live registration in the shared pages.
            if !still_registered(sf.max(byte)) {
                live.remove(&f); // a leaked registration that CUDA has dropped
                continue;
            }
            return Err(Error::invalid(
                call,
                format!(
                    "the bytes {:#x}..{:#x} share the page(s) {sf:#x}..{se:#x} with a live HostRegistration of \
                     {f:#x}..{e:#x} (CUDA registers whole {page}-byte pages, so it would answer \
                     cudaErrorHostMemoryAlreadyRegistered): page-align the buffers (start and length multiples \
                     of {page} bytes), or register one buffer that covers both",
                    ptr as usize,
                    ptr as usize + len,
                ),
            ));
        }
        live.insert(first, (end, ptr as usize));
        Ok(())
    }

    /// Gives back the pages claimed for the bytes at `ptr` (once unregistered).
    pub(super) fn unclaim(ptr: *const u8, len: usize) {
        let (first, _) = span(ptr, len);
        LIVE.lock().unwrap_or_else(PoisonError::into_inner).remove(&first);
    }
}

/// Flags for [`HostRegistration::new`] and [`HostRegistration::new_in`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegisterFlags {
    /// Registered for every device (several GPUs).
    pub portable: bool,
    /// Mapped into the device address space.
    pub mapped: bool,
    /// The device only reads it. Required for read-only and file mappings
    /// (`PROT_READ` + `MAP_SHARED`): without it CUDA answers `cudaErrorInvalidValue`.
    pub read_only: bool,
}

impl RegisterFlags {
    /// The raw `cudaHostRegister*` bits (the same bits as the driver's
    /// `CU_MEMHOSTREGISTER_*`).
    pub fn bits(self) -> u32 {
        let mut b = wirespeed_cuda_sys::cudaHostRegisterDefault;
        if self.portable {
            b |= wirespeed_cuda_sys::cudaHostRegisterPortable;
        }
        if self.mapped {
            b |= wirespeed_cuda_sys::cudaHostRegisterMapped;
        }
        if self.read_only {
            b |= wirespeed_cuda_sys::cudaHostRegisterReadOnly;
        }
        b
    }
}

/// Host memory `M` registered with CUDA (`cudaHostRegister`) for as long as
/// this value owns it: copies from it run at the line rate, asynchronously.
///
/// It *owns* the memory (ownership passing): leaking the registration leaks
/// the memory too, so a copy can never outlive what it reads. `Drop` waits for
/// every stream still reading it, unregisters, then drops `M`.
///
/// [`HostRegistration::new`] registers in the device's primary context (the
/// runtime's); [`HostRegistration::new_in`] in a [`RegistrationContext`],
/// whose unregister neither waits for nor stalls the primary context's copies.
/// Copies from either are issued the same way, by [`Stream`]'s methods.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, Stream};
/// let dev = Device::get(0)?;
/// let data: Box<[u8]> = vec![1u8; 1 << 20].into_boxed_slice();
/// let reg = HostRegistration::new(data, RegisterFlags::default())?;
/// let mut d = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
/// Stream::new(&dev)?.copy_to_device(&reg, &mut d)?.wait()?;
/// let data = reg.into_inner()?; // unregistered, yours again
/// # let _ = data; Ok(()) }
/// ```
pub struct HostRegistration<M: HostMemory> {
    mem: std::mem::ManuallyDrop<M>,
    ptr: *const u8,
    len: usize,
    flags: RegisterFlags,
    /// Without `portable`, the registration belongs to the device (context)
    /// current when it was made: unregistering makes that device current again.
    device: Option<Device>,
    /// The registration context it was made in (`None`: the primary context),
    /// kept alive until it is unregistered; leaked with the memory otherwise.
    context: Option<Arc<RegistrationContext>>,
    fence: Fence,
}

// SAFETY: M is Send + Sync; the pointer is into memory M owns.
unsafe impl<M: HostMemory> Send for HostRegistration<M> {}
// SAFETY: shared access only reads the memory.
unsafe impl<M: HostMemory> Sync for HostRegistration<M> {}

impl<M: HostMemory> std::fmt::Debug for HostRegistration<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("flags", &self.flags)
            .field("context", &self.context.as_ref().map(|c| c.id()))
            .finish()
    }
}

impl<M: HostMemory> HostRegistration<M> {
    /// Registers all of `mem`. On error `mem` is dropped; use
    /// [`HostRegistration::try_new`] to get it back.
    ///
    /// # Errors
    /// `cudaErrorInvalidValue` (e.g. a read-only mapping without `read_only`),
    /// `cudaErrorHostMemoryAlreadyRegistered` (memory registered or allocated
    /// pinned by other means), or [`Error::InvalidArgument`] when empty or when
    /// `mem` shares a page with a live `HostRegistration` (CUDA registers whole
    /// pages; the message names the shared pages: page-align the buffers, or
    /// register one buffer that covers both).
    pub fn new(mem: M, flags: RegisterFlags) -> Result<Self> {
        Self::try_new(mem, flags).map_err(|(e, _)| e)
    }

    /// Registers all of `mem`, handing it back with the error on failure.
    ///
    /// # Errors
    /// As [`HostRegistration::new`].
    pub fn try_new(mem: M, flags: RegisterFlags) -> std::result::Result<Self, (Error, M)> {
        let (ptr, len) = (mem.as_ptr(), mem.len());
        if len == 0 {
            return Err((Error::invalid("HostRegistration::new", "cannot register an empty range"), mem));
        }
        let device = if flags.portable {
            None
        } else {
            match Device::current() {
                Ok(d) => Some(d),
                Err(e) => return Err((e, mem)),
            }
        };
        if let Err(e) = pages::claim("HostRegistration::new", ptr, len) {
            return Err((e, mem));
        }
        // SAFETY: `HostMemory` guarantees the range is mapped while `mem`
        // lives; we keep `mem` until after unregistering.
        if let Err(e) = unsafe { raw::host_register(ptr.cast_mut().cast(), len, flags.bits()) } {
            raw::clear_last_error();
            pages::unclaim(ptr, len);
            return Err((e, mem));
        }
        Ok(HostRegistration {
            mem: std::mem::ManuallyDrop::new(mem),
            ptr,
            len,
            flags,
            device,
            context: None,
            fence: Fence::default(),
        })
    }

    /// Registers all of `mem` in the registration context `ctx`
    /// (`cuMemHostRegister`, with `ctx` current on the calling thread for that
    /// call only), always `portable` (whatever `flags` says): the copies from it
    /// run in the primary context. `read_only` is needed for read-only and file
    /// mappings, as for [`HostRegistration::new`]. On error `mem` is dropped;
    /// use [`HostRegistration::try_new_in`] to get it back.
    ///
    /// The registration holds `ctx` until it is unregistered. Unregistering in
    /// a registration context does not wait for copies: this type waits for
    /// every copy that read the memory first, on every path (`Drop`,
    /// [`into_inner`](HostRegistration::into_inner), after errors), and a
    /// registration that is leaked (`mem::forget`) or that cannot be released
    /// is never unregistered: its memory and `ctx` leak with it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use std::sync::Arc;
    /// use wirespeed_cuda::{Device, DeviceBuffer, HostRegistration, RegisterFlags, RegistrationContext, Stream};
    /// let dev = Device::get(0)?;
    /// let ctx = Arc::new(RegistrationContext::new(&dev)?);
    /// let reg = HostRegistration::new_in(&ctx, vec![3u8; 4096].into_boxed_slice(), RegisterFlags::default())?;
    /// assert!(reg.flags().portable);
    /// let mut d = DeviceBuffer::<u8>::new(&dev, 4096)?;
    /// Stream::new(&dev)?.copy_to_device(&reg, &mut d)?.wait()?;
    /// let data = reg.into_inner()?; // unregistered in `ctx`, yours again
    /// # let _ = data; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostRegistration::new`], from `cuMemHostRegister` as
    /// [`Error::Driver`]; [`Error::Driver`] from `cuCtxPushCurrent` or
    /// `cuCtxPopCurrent`.
    pub fn new_in(ctx: &Arc<RegistrationContext>, mem: M, flags: RegisterFlags) -> Result<Self> {
        Self::try_new_in(ctx, mem, flags).map_err(|(e, _)| e)
    }

    /// As [`HostRegistration::new_in`], handing `mem` back with the error on failure.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use std::sync::Arc;
    /// use wirespeed_cuda::{Device, HostRegistration, RegisterFlags, RegistrationContext};
    /// let ctx = Arc::new(RegistrationContext::new(&Device::get(0)?)?);
    /// let (e, empty) = HostRegistration::try_new_in(&ctx, Box::<[u8]>::default(), RegisterFlags::default()).unwrap_err();
    /// assert!(empty.is_empty() && e.to_string().contains("empty"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostRegistration::new_in`].
    pub fn try_new_in(
        ctx: &Arc<RegistrationContext>,
        mem: M,
        flags: RegisterFlags,
    ) -> std::result::Result<Self, (Error, M)> {
        let (ptr, len) = (mem.as_ptr(), mem.len());
        if len == 0 {
            return Err((Error::invalid("HostRegistration::new_in", "cannot register an empty range"), mem));
        }
        let flags = RegisterFlags { portable: true, ..flags };
        if let Err(e) = pages::claim("HostRegistration::new_in", ptr, len) {
            return Err((e, mem));
        }
        let p = ptr.cast_mut().cast::<c_void>();
        // SAFETY: `HostMemory` guarantees the range is mapped while `mem`
        // lives; we keep `mem` until after unregistering (or leak both).
        let registered = ctx.with_current(|| unsafe { raw::mem_host_register(p, len, flags.bits()) });
        match registered {
            Err(e) | Ok((Err(e), _)) => {
                pages::unclaim(ptr, len);
                Err((e, mem)) // not pushed, or not registered
            }
            Ok((Ok(()), Ok(()))) => Ok(HostRegistration {
                mem: std::mem::ManuallyDrop::new(mem),
                ptr,
                len,
                flags,
                device: None,
                context: Some(Arc::clone(ctx)),
                fence: Fence::default(),
            }),
            Ok((Ok(()), Err(popped))) => {
                // Registered, but the context may still be current on this
                // thread. Undo the registration (no copy can have used it: no
                // registration was handed out) and report. Should the undo fail
                // too, the range stays registered in `ctx` until it is
                // destroyed; no copy reads it, so handing `mem` back is sound.
                // SAFETY: registered just above in `ctx`, never used.
                if let Ok((Ok(()), _)) = ctx.with_current(|| unsafe { raw::mem_host_unregister(p) }) {
                    pages::unclaim(ptr, len);
                }
                Err((popped, mem))
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never: empty ranges are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags it was registered with (always `portable` in a registration context).
    pub fn flags(&self) -> RegisterFlags {
        self.flags
    }

    /// The registration context it was made in, or `None` for the primary context.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{HostRegistration, RegisterFlags};
    /// let reg = HostRegistration::new(vec![0u8; 64].into_boxed_slice(), RegisterFlags::default())?;
    /// assert!(reg.context().is_none());
    /// # Ok(()) }
    /// ```
    pub fn context(&self) -> Option<&Arc<RegistrationContext>> {
        self.context.as_ref()
    }

    /// The memory it owns (reading it from the host is always fine: the device
    /// only reads registered memory through this type).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The registered bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `HostMemory` guarantees the range is mapped and valid while
        // `mem` lives, and no one writes it while we own `mem`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// A view of byte `range` that copies can read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<PinnedSlice<'_, u8>> {
        let r = to_range(range, self.len, "HostRegistration::slice")?;
        Ok(PinnedSlice { ptr: self.ptr.wrapping_add(r.start), len: r.len(), fence: &self.fence, _p: PhantomData })
    }

    /// Like [`HostRegistration::slice`], but never fails: `range` is clamped to
    /// the registration (a range past the end gives a shorter or empty view).
    /// For owners that know their range is in bounds and must not panic.
    pub fn slice_clamped(&self, range: Range<usize>) -> PinnedSlice<'_, u8> {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        PinnedSlice { ptr: self.ptr.wrapping_add(start), len: end - start, fence: &self.fence, _p: PhantomData }
    }

    /// Waits for every stream reading it, unregisters, and returns the memory.
    ///
    /// # Errors
    /// The runtime's error. The registration is then dropped: its `Drop` tries
    /// once more and, if it still cannot confirm that no stream reads the
    /// memory (a lost context), leaks the memory rather than hand it back.
    pub fn into_inner(mut self) -> Result<M> {
        self.release()?;
        // SAFETY: released: `mem` is taken out once and `self` is forgotten
        // so Drop does not touch it again.
        let mem = unsafe { std::mem::ManuallyDrop::take(&mut self.mem) };
        let context = self.context.take(); // unregistered: the context may go
        std::mem::forget(self);
        drop(context);
        Ok(mem)
    }

    /// Waits for every copy that reads the memory, then unregisters it. Every
    /// way the registration ends comes here first (`into_inner`, `Drop`, which
    /// retries once after an error), and only `Ok` frees the memory (and its
    /// pages, for later registrations).
    fn release(&mut self) -> Result<()> {
        let res = self.unregister();
        if res.is_ok() {
            pages::unclaim(self.ptr, self.len);
        }
        res
    }

    fn unregister(&mut self) -> Result<()> {
        self.fence.wait_all()?;
        if let Some(ctx) = &self.context {
            let p = self.ptr.cast_mut().cast::<c_void>();
            // SAFETY: `ptr` starts our registration in `ctx`. In a registration
            // context the driver does not wait for copies, so this is the only
            // wait, and it covers every copy that reads the memory: each copy
            // records itself in the fence when it is enqueued, before its
            // `Pending` exists (so a forgotten `Pending` is covered too), a
            // failed enqueue enqueued nothing, and no copy can start meanwhile
            // (`&mut self`; copies borrow the registration). `wait_all` has just
            // returned `Ok`: all of them have completed.
            let (unregistered, popped) = ctx.with_current(|| unsafe { raw::mem_host_unregister(p) })?;
            return unregistered.and(popped);
        }
        // Unregister even if the device cannot be made current (after a sticky
        // error, say): the call may still work. Only its outcome decides
        // whether the memory is free; if it failed, the first error is reported.
        let switched = self.device.map_or(Ok(()), |d| d.ensure_current());
        // SAFETY: we registered `ptr`; no stream reads it any more.
        match unsafe { raw::host_unregister(self.ptr.cast_mut().cast()) } {
            Ok(()) => Ok(()),
            Err(e) => Err(switched.err().unwrap_or(e)),
        }
    }
}

impl<M: HostMemory> Drop for HostRegistration<M> {
    fn drop(&mut self) {
        if self.release().is_ok() {
            // SAFETY: dropped once, here, after unregistering.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.mem) };
        } else if let Some(ctx) = self.context.take() {
            // The registration context is leaked with the memory: destroying
            // it would unregister the range under a copy that may still read it.
            std::mem::forget(ctx);
        }
        // Otherwise the memory is leaked: a copy might still read it.
    }
}

impl<M: HostMemory> sealed::Sealed for HostRegistration<M> {}
impl<M: HostMemory> HostSource<u8> for HostRegistration<M> {
    fn host_src(&self, _: sealed::Token) -> (*const u8, usize, &Fence) {
        (self.ptr, self.len, &self.fence)
    }
}

// ---------------------------------------------------------------- copies

// The checks of the per-copy path are inline; their errors are built out of line.
#[inline]
fn same_len(call: &'static str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(len_mismatch(call, a, b));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn len_mismatch(call: &'static str, a: usize, b: usize) -> Error {
    Error::invalid(call, format!("source has {a} values, destination {b}"))
}

#[inline]
fn same_device(call: &'static str, stream: &Stream, d: Device) -> Result<()> {
    if stream.device() != d {
        return Err(device_mismatch(call, stream.device(), d));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn device_mismatch(call: &'static str, stream: Device, d: Device) -> Error {
    Error::invalid(call, format!("buffer is on device {} but the stream on device {}", d.ordinal(), stream.ordinal()))
}

impl Stream {
    /// Copies pinned or registered host memory to the device, asynchronously.
    /// Lengths must match. The returned [`Pending`] borrows both until waited.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a length or device mismatch; the runtime's error.
    pub fn copy_to_device<'a, T: Pod>(
        &'a self,
        src: &'a (impl HostSource<T> + ?Sized),
        dst: &'a mut (impl DeviceSink<T> + ?Sized),
    ) -> Result<Pending<'a>> {
        let (s, n, sf) = src.host_src(TOKEN);
        let (d, m, df, dev) = dst.device_dst(TOKEN);
        same_len("Stream::copy_to_device", n, m)?;
        same_device("Stream::copy_to_device", self, dev)?;
        let bytes = n * size_of::<T>();
        self.enqueue(Some((sf, span_of(s, n))), (df, span_of(d, n)), |q| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: source is pinned/registered host memory valid for `bytes`,
            // kept alive and unwritten by its owner until the fence clears;
            // destination is device memory of this stream's device, ordered by
            // its fence.
            unsafe { raw::memcpy_async(q, d.cast(), s.cast(), bytes, cudaMemcpyKind::cudaMemcpyHostToDevice) }
        })
    }

    /// Copies device memory to pinned host memory, asynchronously.
    ///
    /// # Errors
    /// As [`Stream::copy_to_device`].
    pub fn copy_to_host<'a, T: Pod>(
        &'a self,
        src: &'a (impl DeviceSource<T> + ?Sized),
        dst: &'a mut (impl HostSink<T> + ?Sized),
    ) -> Result<Pending<'a>> {
        let (s, n, sf, dev) = src.device_src(TOKEN);
        let (d, m, df) = dst.host_dst(TOKEN);
        same_len("Stream::copy_to_host", n, m)?;
        same_device("Stream::copy_to_host", self, dev)?;
        let bytes = n * size_of::<T>();
        self.enqueue(Some((sf, span_of(s, n))), (df, span_of(d, n)), |q| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: as in copy_to_device, with the pinned buffer written: no
            // host access to it until its fence clears.
            unsafe { raw::memcpy_async(q, d.cast(), s.cast(), bytes, cudaMemcpyKind::cudaMemcpyDeviceToHost) }
        })
    }

    /// Copies between two device buffers of this stream's device, asynchronously.
    ///
    /// # Errors
    /// As [`Stream::copy_to_device`].
    pub fn copy_device_to_device<'a, T: Pod>(
        &'a self,
        src: &'a (impl DeviceSource<T> + ?Sized),
        dst: &'a mut (impl DeviceSink<T> + ?Sized),
    ) -> Result<Pending<'a>> {
        let (s, n, sf, sdev) = src.device_src(TOKEN);
        let (d, m, df, ddev) = dst.device_dst(TOKEN);
        same_len("Stream::copy_device_to_device", n, m)?;
        same_device("Stream::copy_device_to_device", self, sdev)?;
        same_device("Stream::copy_device_to_device", self, ddev)?;
        let bytes = n * size_of::<T>();
        self.enqueue(Some((sf, span_of(s, n))), (df, span_of(d, n)), |q| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: both ranges are device memory of this device, ordered by fences.
            unsafe { raw::memcpy_async(q, d.cast(), s.cast(), bytes, cudaMemcpyKind::cudaMemcpyDeviceToDevice) }
        })
    }

    /// Sets every byte of device memory to `byte`, asynchronously.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a device mismatch; the runtime's error.
    pub fn memset<'a, T: Pod>(&'a self, dst: &'a mut (impl DeviceSink<T> + ?Sized), byte: u8) -> Result<Pending<'a>> {
        let (d, n, df, dev) = dst.device_dst(TOKEN);
        same_device("Stream::memset", self, dev)?;
        let bytes = n * size_of::<T>();
        self.enqueue(None, (df, span_of(d, n)), |q| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: device memory of this device, ordered by its fence.
            unsafe { raw::memset_async(q, d.cast::<c_void>(), byte, bytes) }
        })
    }
}

/// What the runtime knows of a host or device address: `(memory type, device)`,
/// memory type 0 unregistered, 1 host (pinned or registered), 2 device, 3 managed.
///
/// # Errors
/// The runtime's error.
pub fn pointer_kind(p: *const c_void) -> Result<(u32, i32)> {
    raw::pointer_attributes(p)
}

/// The `cudaHostAlloc`/`cudaHostRegister` flags of pinned or registered memory at `p`.
///
/// # Errors
/// `cudaErrorInvalidValue` for memory that is neither.
pub fn host_flags(p: *const c_void) -> Result<u32> {
    raw::host_get_flags(p)
}

/// The device address of mapped pinned or registered memory at `p`.
///
/// # Errors
/// `cudaErrorInvalidValue` for memory that is not mapped.
pub fn host_device_pointer(p: *const c_void) -> Result<*mut c_void> {
    raw::host_get_device_pointer(p)
}
