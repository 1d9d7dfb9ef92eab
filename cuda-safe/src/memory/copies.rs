//! The asynchronous operations on memory: [`Stream`]'s copies and memset,
//! between any sources and sinks of [`super::traits`], each recorded in the
//! fences of the memory it uses.

use super::checks::{same_device, same_len};
use super::traits::{DeviceSink, DeviceSource, HostSink, HostSource, Pod, TOKEN};
use crate::error::Result;
use crate::fence::span_of;
use crate::raw;
use crate::stream::{Pending, Stream};
use std::ffi::c_void;
use wirespeed_cuda_sys::cudaMemcpyKind;

impl Stream {
    /// Copies pinned or registered host memory to the device, asynchronously.
    /// Lengths must match. The returned [`Pending`] borrows both until waited.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) on a length or device mismatch; the runtime's error.
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
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) on a device mismatch; the runtime's error.
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
