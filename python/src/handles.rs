//! The caller's device memory and streams, given by raw address and handle.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::{Device, Stream};

use crate::error::err;

/// A stream of the consumer's, by raw handle (0: the legacy default stream).
pub(crate) fn consumer(handle: usize, device: Device) -> PyResult<Stream> {
    // SAFETY: the handle is the consumer's current stream (from torch or the
    // `__cuda_array_interface__`), live while the call uses it; not owned.
    unsafe { Stream::from_raw(handle as wirespeed_cuda_sys::cudaStream_t, device, false) }.map_err(err)
}

/// The device of `ptr` (which must be device memory): `device` when given.
pub(crate) fn device_of(ptr: usize, device: Option<usize>) -> PyResult<Device> {
    let ordinal = match device {
        Some(d) => d,
        None => {
            let kind = wirespeed_cuda::pointer_kind(ptr as *const std::ffi::c_void).map_err(err)?;
            kind.device_memory().ok_or_else(|| PyValueError::new_err(format!("{ptr:#x} is not CUDA device memory")))?
        }
    };
    Device::get(ordinal).map_err(err)
}

/// Runs `f` and makes the device that was current on the calling thread
/// current again: the library makes its own device current for its calls,
/// and the caller (torch) expects its own afterwards.
pub(crate) fn keeping_device<R>(f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
    let before = Device::current().ok();
    let out = f();
    if let Some(d) = before
        && Device::current().ok() != Some(d)
    {
        d.make_current().map_err(err)?;
    }
    out
}
