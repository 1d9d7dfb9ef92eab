//! `wirespeed._Registration`: a host buffer registered in place with CUDA
//! (`cudaHostRegister`), until `close()`.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::{Device, HostMemory, HostRegistration, RegisterFlags};

use crate::error::err;

/// A Python buffer, held (so its exporter keeps the memory) while registered.
pub(crate) struct PyMem {
    ptr: usize,
    len: usize,
    buf: PyBuffer<u8>,
}

// SAFETY: the held buffer export keeps the exporter's memory alive and in
// place (a bytearray cannot resize while exported; a numpy array keeps its
// data); the package documents that the memory must not be freed (a torch
// tensor resized, a memmap closed) nor written while registered.
unsafe impl HostMemory for PyMem {
    fn as_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A Python buffer registered in place (`cudaHostRegister`, portable), its
/// pages counted in [`REGISTERED`] until it is unregistered or dropped
/// (dropping it waits for the copies that read it, then unregisters).
pub(crate) struct Registered {
    /// `None` only once `unregister` took it.
    reg: Option<HostRegistration<PyMem>>,
    /// The pages registered (the buffer rounded out to pages).
    pages: u64,
}

/// Bytes of the live [`Registered`] buffers, rounded out to pages.
static REGISTERED: AtomicU64 = AtomicU64::new(0);

impl Registered {
    /// Registers `buf` (C-contiguous, not empty, checked by the caller),
    /// read-only for the device when `read_only`, without the GIL.
    pub(crate) fn new(py: Python<'_>, buf: PyBuffer<u8>, read_only: bool) -> PyResult<Registered> {
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        let mem = PyMem { ptr, len, buf };
        let flags = RegisterFlags::new().portable(true).read_only(read_only);
        match py.detach(|| HostRegistration::try_new(mem, flags)) {
            Ok(reg) => {
                let pages = pages_of(ptr, len);
                REGISTERED.fetch_add(pages, Ordering::Relaxed);
                Ok(Registered { reg: Some(reg), pages })
            }
            Err((e, mem)) => {
                drop(mem.buf);
                Err(err(e))
            }
        }
    }

    /// The registration, to copy from.
    /// (`None` once unregistered.)
    pub(crate) fn memory(&self) -> Option<&HostRegistration<PyMem>> {
        self.reg.as_ref()
    }

    /// Waits for the copies that read it, unregisters, and hands back the
    /// buffer (to be released with the GIL held).
    pub(crate) fn unregister(mut self) -> wirespeed_cuda::Result<Option<PyBuffer<u8>>> {
        let Some(reg) = self.reg.take() else { return Ok(None) };
        REGISTERED.fetch_sub(self.pages, Ordering::Relaxed);
        // On error `reg`'s own drop tries once more (and leaks the memory
        // rather than free it under a copy).
        reg.into_inner().map(|m| Some(m.buf))
    }
}

impl Drop for Registered {
    /// Dropped without `unregister` (an object collected, an error on the
    /// way): `reg`'s own drop waits for the copies and unregisters.
    fn drop(&mut self) {
        if self.reg.is_some() {
            REGISTERED.fetch_sub(self.pages, Ordering::Relaxed);
        }
    }
}

/// The bytes of the pages `ptr .. ptr + len` touches.
pub(crate) fn pages_of(ptr: usize, len: usize) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let (start, end) = (ptr as u64, ptr as u64 + len as u64);
    end.div_ceil(page) * page - start / page * page
}

/// A host buffer registered in place with CUDA (`cudaHostRegister`,
/// portable), until `close()`.
#[pyclass(name = "_Registration", module = "wirespeed")]
pub(crate) struct Registration {
    reg: Option<Registered>,
    nbytes: usize,
    read_only: bool,
}

#[pymethods]
impl Registration {
    /// Registers the buffer of `obj` (C-contiguous, not empty); `read_only`
    /// for memory the device may only read (required for read-only mappings).
    #[new]
    fn new(py: Python<'_>, obj: &Bound<'_, PyAny>, read_only: bool) -> PyResult<Self> {
        let buf = PyBuffer::<u8>::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("the buffer is not C-contiguous"));
        }
        if buf.readonly() && !read_only {
            return Err(PyValueError::new_err("the buffer is read-only: register it with read_only=True"));
        }
        let len = buf.len_bytes();
        if len == 0 {
            return Err(PyValueError::new_err("cannot register an empty buffer"));
        }
        let reg = Registered::new(py, buf, read_only)?;
        Ok(Registration { reg: Some(reg), nbytes: len, read_only })
    }

    /// Bytes registered.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Registered read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }

    /// True until `close()`.
    #[getter]
    fn registered(&self) -> bool {
        self.reg.is_some()
    }

    /// Waits for all work on every device (copies of other libraries from
    /// the memory are not tracked), then unregisters and releases the buffer.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(reg) = self.reg.take() else { return Ok(()) };
        let buf = py.detach(|| -> wirespeed_cuda::Result<Option<PyBuffer<u8>>> {
            for d in Device::all()? {
                d.synchronize()?;
            }
            reg.unregister()
        });
        drop(buf.map_err(err)?);
        Ok(())
    }
}

/// Bytes of the live registrations, rounded out to pages.
pub(crate) fn pinned_bytes() -> u64 {
    REGISTERED.load(Ordering::Relaxed)
}
