//! `wirespeed._DeviceArray`: device memory owned by the library, or a view of
//! part of it, exposing `__cuda_array_interface__` (for callers without
//! torch, `batches`' spans, and the tests).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};

use crate::error::err;
use crate::handles::keeping_device;

/// Device memory allocated by the library, or a part of it (`_view`),
/// exposing `__cuda_array_interface__` (version 3, no stream: work on it is
/// ordered through the legacy default stream). Views share the allocation,
/// which is freed when the last of them goes.
#[pyclass(name = "_DeviceArray", module = "wirespeed", frozen)]
pub(crate) struct DeviceArray {
    buf: Shared,
    /// Where this array starts in `buf`.
    offset: usize,
    typestr: String,
    shape: Vec<usize>,
}

/// The allocation, shared by an array and its views, freed (by the last)
/// keeping the thread's current device: a batch dropped in a loop must not
/// leave the loader's device current under torch.
struct Shared(Option<Arc<DeviceBuffer<u8>>>);

impl std::ops::Deref for Shared {
    type Target = Arc<DeviceBuffer<u8>>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the allocation is taken only when the array is dropped")
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let buf = self.0.take();
        let _ = keeping_device(|| {
            drop(buf);
            Ok(())
        });
    }
}

/// The bytes of `typestr` x `shape`, checked against `nbytes`.
fn described_bytes(typestr: &str, shape: &[usize], nbytes: usize) -> PyResult<()> {
    let itemsize: usize = typestr.get(2..).and_then(|s| s.parse().ok()).unwrap_or(0);
    let n = shape.iter().try_fold(itemsize, |acc, &d| acc.checked_mul(d));
    if itemsize == 0 || n != Some(nbytes) {
        return Err(PyValueError::new_err(format!("{typestr:?} x {shape:?} is not {nbytes} bytes")));
    }
    Ok(())
}

#[pymethods]
impl DeviceArray {
    /// `nbytes` bytes (uninitialized) on `device`; `typestr` and `shape`
    /// (default: bytes) only describe them to consumers.
    #[new]
    #[pyo3(signature = (nbytes, device = 0, typestr = "|u1".to_string(), shape = None))]
    fn new(py: Python<'_>, nbytes: usize, device: usize, typestr: String, shape: Option<Vec<usize>>) -> PyResult<Self> {
        let shape = shape.unwrap_or_else(|| vec![nbytes]);
        described_bytes(&typestr, &shape, nbytes)?;
        let dev = Device::get(device).map_err(err)?;
        let buf = py.detach(|| keeping_device(|| DeviceBuffer::<u8>::new(&dev, nbytes.max(1)).map_err(err)))?;
        Ok(DeviceArray { buf: Shared(Some(Arc::new(buf))), offset: 0, typestr, shape })
    }

    /// `nbytes` bytes of this array from byte `offset`, described as
    /// `typestr` x `shape` (default: bytes), sharing its memory.
    #[pyo3(signature = (offset, nbytes, typestr = "|u1".to_string(), shape = None))]
    fn _view(&self, offset: usize, nbytes: usize, typestr: String, shape: Option<Vec<usize>>) -> PyResult<Self> {
        let shape = shape.unwrap_or_else(|| vec![nbytes]);
        described_bytes(&typestr, &shape, nbytes)?;
        if offset.checked_add(nbytes).is_none_or(|end| end > self.nbytes()) {
            return Err(PyValueError::new_err(format!(
                "bytes {offset}..{offset}+{nbytes} are outside the array's {}",
                self.nbytes()
            )));
        }
        Ok(DeviceArray { buf: Shared(Some(Arc::clone(&self.buf))), offset: self.offset + offset, typestr, shape })
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.typestr.get(2..).and_then(|s| s.parse().ok()).unwrap_or(1)
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.buf.device().ordinal()
    }

    /// The device address.
    #[getter]
    fn ptr(&self) -> usize {
        self.buf.as_raw_ptr() as usize + self.offset
    }

    /// The CUDA array interface.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", &self.typestr)?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// The bytes, read back after all work on the device has ended.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (off, n) = (self.offset, self.nbytes());
        let v = py.detach(|| {
            keeping_device(|| {
                (|| -> wirespeed_cuda::Result<Vec<u8>> {
                    let dev = self.buf.device();
                    dev.synchronize()?;
                    if off == 0 && n == self.buf.len() {
                        return self.buf.to_vec();
                    }
                    if n == 0 {
                        return Ok(Vec::new());
                    }
                    // A part: through a pinned buffer of its size, not the whole allocation.
                    let stream = Stream::new(&dev)?;
                    let mut host = PinnedBuffer::<u8>::new(n)?;
                    stream.copy_to_host(&self.buf.slice(off..off + n)?, &mut host)?.wait()?;
                    Ok(host.as_slice()?.to_vec())
                })()
                .map_err(err)
            })
        })?;
        Ok(PyBytes::new(py, &v))
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
}
