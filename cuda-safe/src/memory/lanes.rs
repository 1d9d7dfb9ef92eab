//! Several writers of one detached span at once, each on its own stream,
//! not ordered against each other: [`Lanes`].

use super::accessors::view_accessors;
use super::detached::DetachedSliceMut;
use super::device::DeviceSliceMut;
use super::traits::Pod;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fence::{Fence, Hold, span_of};
use crate::locks::lock;
use std::ops::RangeBounds;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A [`DetachedSliceMut`] split into *lanes*: writers that may each write any
/// part of the span, from their own thread and stream, without being ordered
/// against each other. Made by [`DetachedSliceMut::into_lanes`], for a
/// writer that knows its lanes write disjoint parts (a file transfer whose
/// threads claim disjoint parts of the range, say).
///
/// Each lane has a fence of its own, which starts with every use of the span
/// known to the detached slice: a lane's first operation is ordered after
/// them, and its later ones only after that lane's own earlier operations on
/// other streams. Lanes are *not* ordered against each other: two lanes that
/// write the same bytes at once leave them holding either value (device
/// memory: no host memory is ever involved, so this is a wrong result, never
/// undefined behaviour). Keep what each lane writes disjoint.
///
/// [`Lanes::join`] (or dropping) hands every lane's record back to the
/// detached slice as a released hold, so host access, `Drop` and later
/// operations on the buffer wait for every lane's work, with no host wait
/// and no call to CUDA here. Leaking a `Lanes` leaks the detached slice with
/// it: its hold on the owner stays, and the owner blocks or leaks, never
/// frees or reads memory under a copy.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, DeviceSliceMut, PinnedBuffer, Stream};
/// let dev = Device::get(0)?;
/// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 8192)?;
/// let lanes = DeviceSliceMut::from(&mut buf).detach().into_lanes(2);
/// let (a, b) = (PinnedBuffer::from_slice(&[1u8; 4096])?, PinnedBuffer::from_slice(&[2u8; 4096])?);
/// std::thread::scope(|s| -> wirespeed_cuda::Result<()> {
///     let one = s.spawn(|| -> wirespeed_cuda::Result<()> {
///         let stream = Stream::new(&dev)?; // each lane on a stream of its own
///         stream.copy_to_device(&a, &mut lanes.lane(0)?.slice_mut(..4096)?)?.detach();
///         Ok(())
///     });
///     let stream = Stream::new(&dev)?;
///     stream.copy_to_device(&b, &mut lanes.lane(1)?.slice_mut(4096..)?)?.detach();
///     one.join().unwrap()
/// })?;
/// lanes.join().release(); // every lane's copies are now known to `buf`
/// let v = buf.to_vec()?; // waits for both copies
/// assert_eq!((v[4095], v[4096]), (1, 2));
/// # Ok(()) }
/// ```
pub struct Lanes<T: Pod> {
    slice: DetachedSliceMut<T>,
    lanes: Vec<Mutex<Fence>>,
}

// SAFETY: as DetachedSliceMut: exclusive access to device memory its owner
// keeps allocated while the hold lasts; each lane's fence is behind a Mutex.
unsafe impl<T: Pod> Send for Lanes<T> {}
// SAFETY: shared access only reaches a lane's fence through its Mutex.
unsafe impl<T: Pod> Sync for Lanes<T> {}

impl<T: Pod> std::fmt::Debug for Lanes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").field("lanes", &self.lanes.len()).field("len", &self.slice.len).finish()
    }
}

impl<T: Pod> DetachedSliceMut<T> {
    /// Splits this writer into `n` lanes (at least one) that write at once,
    /// unordered against each other: see [`Lanes`].
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u8>::zeroed(&wirespeed_cuda::Device::get(0)?, 64)?;
    /// let lanes = buf.slice_mut(..)?.detach().into_lanes(4);
    /// assert_eq!(lanes.lanes(), 4);
    /// # Ok(()) }
    /// ```
    pub fn into_lanes(mut self, n: usize) -> Lanes<T> {
        let lanes = (0..n.max(1)).map(|_| Mutex::new(self.fence.fork())).collect();
        Lanes { lanes, slice: self }
    }
}

impl<T: Pod> Lanes<T> {
    /// The number of lanes.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u8>::zeroed(&wirespeed_cuda::Device::get(0)?, 64)?;
    /// assert_eq!(buf.slice_mut(..)?.detach().into_lanes(0).lanes(), 1); // at least one
    /// # Ok(()) }
    /// ```
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    view_accessors! {
        setup: (
            "let dev = wirespeed_cuda::Device::get(0)?;\n",
            "let mut buf = wirespeed_cuda::DeviceBuffer::<u16>::zeroed(&dev, 10)?;",
        ),
        view: ("buf.slice_mut(", ")?.detach().into_lanes(2)"),
        len: slice.len,
    }

    /// Lane `k`, for one writer at a time (it locks the lane; give each
    /// thread a lane of its own and it never waits).
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let mut buf = DeviceBuffer::<u8>::zeroed(&dev, 64)?;
    /// let lanes = buf.slice_mut(..)?.detach().into_lanes(2);
    /// Stream::new(&dev)?.memset(&mut lanes.lane(1)?.slice_mut(32..)?, 9)?.detach();
    /// assert!(lanes.lane(2).is_err());
    /// lanes.join().release();
    /// assert_eq!(buf.to_vec()?[31..33], [0, 9]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `k` is not a lane.
    pub fn lane(&self, k: usize) -> Result<Lane<'_, T>> {
        let fence = self.lanes.get(k).ok_or_else(|| {
            Error::invalid(
                "Lanes::lane",
                format!("lane {k} of {}: lanes are 0..{}", self.lanes.len(), self.lanes.len()),
            )
        })?;
        Ok(Lane { fence: lock(fence), ptr: self.slice.ptr, len: self.slice.len, device: self.slice.device })
    }

    /// Ends the lanes: every lane's record goes back to the detached slice
    /// (see [`Lanes`]), which is handed back. Dropping does the same.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut buf = wirespeed_cuda::DeviceBuffer::<u8>::zeroed(&wirespeed_cuda::Device::get(0)?, 64)?;
    /// let detached = buf.slice_mut(..)?.detach().into_lanes(3).join();
    /// assert_eq!(detached.len(), 64);
    /// # Ok(()) }
    /// ```
    pub fn join(mut self) -> DetachedSliceMut<T> {
        self.merge();
        // Leaves an empty writer of nothing in its place, for `Drop` (whose
        // merge then finds no lane left).
        let empty = DetachedSliceMut {
            ptr: self.slice.ptr,
            len: 0,
            device: self.slice.device,
            fence: Fence::default(),
            hold: std::sync::Arc::new(Hold::new(span_of(self.slice.ptr, 0))),
        };
        std::mem::replace(&mut self.slice, empty)
    }

    fn merge(&mut self) {
        let span = span_of(self.slice.ptr, self.slice.len);
        for lane in self.lanes.drain(..) {
            let fence = lane.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.slice.fence.absorb(fence, span.clone());
        }
    }
}

impl<T: Pod> Drop for Lanes<T> {
    fn drop(&mut self) {
        self.merge(); // then `slice` drops, releasing its hold with the lanes' records
    }
}

/// One lane of a [`Lanes`], locked for one writer: views through it record
/// their operations in the lane's fence.
pub struct Lane<'a, T: Pod> {
    fence: MutexGuard<'a, Fence>,
    ptr: *mut T,
    len: usize,
    device: Device,
}

impl<T: Pod> std::fmt::Debug for Lane<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("len", &self.len).finish()
    }
}

impl<T: Pod> Lane<'_, T> {
    /// A writable view of `range` of the span, whose operations are recorded
    /// in this lane's fence.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
    /// let dev = Device::get(0)?;
    /// let mut buf = DeviceBuffer::<u16>::zeroed(&dev, 8)?;
    /// let lanes = buf.slice_mut(..)?.detach().into_lanes(1);
    /// let src = PinnedBuffer::from_slice(&[5u16; 4])?;
    /// Stream::new(&dev)?.copy_to_device(&src, &mut lanes.lane(0)?.slice_mut(4..)?)?.detach();
    /// drop(lanes);
    /// assert_eq!(buf.to_vec()?, [0, 0, 0, 0, 5, 5, 5, 5]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        DeviceSliceMut::within(self.ptr, self.len, self.device, &mut self.fence, range, "Lane::slice_mut")
    }
}
