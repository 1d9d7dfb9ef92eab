//! Device memory: [`DeviceBuffer`] (`cudaMalloc`) and its views, read-only
//! ([`DeviceSlice`]) and writable ([`DeviceSliceMut`]).

use super::accessors::view_accessors;
use super::checks::{bytes_of, device_memory_of, to_range};
use super::traits::{DeviceSink, DeviceSource, Pod, sealed, zeroed_pod};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::raw;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use wirespeed_cuda_sys::cudaMemcpyKind;

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
            // cudaMemset returns before the device has finished, on the
            // legacy stream, which non-blocking streams do not wait for: wait,
            // or a later copy on any stream could be overwritten.
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
        DeviceSlice::within(self.ptr, self.len, self.device, &self.fence, range, "DeviceBuffer::slice")
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
/// [`DetachedSliceMut`](crate::DetachedSliceMut). `&mut DeviceBuffer`
/// converts into a view of all of it.
pub struct DeviceSliceMut<'a, T: Pod> {
    pub(super) ptr: *mut T,
    pub(super) len: usize,
    pub(super) device: Device,
    pub(super) fence: ViewFence<'a>,
    _p: PhantomData<&'a mut [T]>,
}

/// Where a writable view records its operations.
pub(super) enum ViewFence<'a> {
    /// The fence of the buffer (or of the view) it borrows exclusively.
    Buffer(&'a mut Fence),
    /// A fence of its own: one that records into the fence of the buffer it
    /// is a part of ([`Fence::part_of`]: `split_at_mut`), or a fresh one
    /// (`from_raw_parts`: the caller vouches for the memory).
    Own(Fence),
}

impl ViewFence<'_> {
    pub(super) fn get(&self) -> &Fence {
        match self {
            ViewFence::Buffer(f) => f,
            ViewFence::Own(f) => f,
        }
    }

    pub(super) fn get_mut(&mut self) -> &mut Fence {
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

impl<'a, T: Pod> DeviceSlice<'a, T> {
    view_accessors! {
        setup: (
            "let dev = wirespeed_cuda::Device::get(0)?;\n",
            "let buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;",
        ),
        view: ("buf.slice(", ")?"),
        len: len,
        device: device,
    }

    /// The read-only view of `range` of the `len` values from `ptr` on
    /// `device`, whose operations record in `fence`: the one constructor of
    /// read-only views (of a buffer, a view, a detached writer).
    pub(super) fn within(
        ptr: *const T,
        len: usize,
        device: Device,
        fence: &'a Fence,
        range: impl RangeBounds<usize>,
        call: &'static str,
    ) -> Result<DeviceSlice<'a, T>> {
        let r = to_range(range, len, call)?;
        Ok(DeviceSlice { ptr: ptr.wrapping_add(r.start), len: r.len(), device, fence, _p: PhantomData })
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
        DeviceSlice::within(self.ptr, self.len, self.device, self.fence, range, "DeviceSlice::slice")
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
    ///   `StartOptions::after`, or [`Stream::wait_event`](crate::Stream::wait_event) on an event recorded
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
    ///
    /// [`DetachedSliceMut`]: crate::DetachedSliceMut
    /// [`Pending::wait`]: crate::Pending::wait
    /// [`Stream::wait_event`]: crate::Stream::wait_event
    /// [`Stream::record`]: crate::Stream::record
    /// [`Stream::synchronize`]: crate::Stream::synchronize
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
            device_memory_of(CALL, ptr, device)?;
        }
        Ok(DeviceSliceMut { ptr, len, device, fence: ViewFence::Own(Fence::default()), _p: PhantomData })
    }

    /// The writable view of `range` of the `len` values from `ptr` on
    /// `device`, whose operations record in `fence`: the one constructor of
    /// sub-views (of a buffer, a view, a detached writer, a lane).
    pub(super) fn within(
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

    view_accessors! {
        setup: (
            "let dev = wirespeed_cuda::Device::get(0)?;\n",
            "let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;",
        ),
        view: ("buf.slice_mut(", ")?"),
        len: len,
        device: device,
        raw_ptr: ptr, "Work given through it is not fenced: order it yourself.",
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
