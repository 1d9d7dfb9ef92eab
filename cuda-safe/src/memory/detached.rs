//! Device memory taken out of its owner's borrow: [`DetachedSliceMut`], for
//! a writer that enqueues its work later, from another thread.

use super::accessors::view_accessors;
use super::device::{DeviceSlice, DeviceSliceMut};
use super::traits::Pod;
use crate::device::Device;
use crate::error::Result;
use crate::fence::{Fence, Hold, span_of};
use std::ops::RangeBounds;
use std::sync::Arc;

impl<T: Pod> DeviceSliceMut<'_, T> {
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
    pub(super) ptr: *mut T,
    pub(super) len: usize,
    pub(super) device: Device,
    /// This writer's own record: it starts with the uses of the memory it
    /// must follow, and is handed to the hold on release.
    pub(super) fence: Fence,
    pub(super) hold: Arc<Hold>,
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
    view_accessors! {
        setup: (
            "let dev = wirespeed_cuda::Device::get(0)?;\n",
            "let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;",
        ),
        view: ("buf.slice_mut(", ")?.detach()"),
        len: len,
        device: device,
        raw_ptr: ptr, "Work given through it is not fenced: the hold's record will not include it.",
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
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when out of bounds.
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
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        DeviceSlice::within(self.ptr, self.len, self.device, &self.fence, range, "DetachedSliceMut::slice")
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
