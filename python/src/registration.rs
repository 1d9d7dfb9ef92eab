//! `wirespeed._Registration`: a host buffer registered in place with CUDA
//! (`cudaHostRegister`), until `close()`.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::{Device, HostMemory, HostRegistration, RegisterFlags};

use crate::error::err;

/// A Python buffer, held (so its exporter keeps the memory) while registered.
struct PyMem {
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

/// A host buffer registered in place with CUDA (`cudaHostRegister`,
/// portable), until `close()`.
#[pyclass(name = "_Registration", module = "wirespeed")]
pub(crate) struct Registration {
    reg: Option<HostRegistration<PyMem>>,
    nbytes: usize,
    /// The pages registered (`nbytes` rounded out to pages), counted in
    /// [`REGISTERED`] while `reg` is there.
    pages: u64,
    read_only: bool,
}

/// Bytes of the live [`Registration`]s, rounded out to pages.
static REGISTERED: AtomicU64 = AtomicU64::new(0);

impl Drop for Registration {
    /// A registration dropped without `close()` (its object collected) is
    /// unregistered by `reg`'s own drop, after its fence.
    fn drop(&mut self) {
        if self.reg.is_some() {
            REGISTERED.fetch_sub(self.pages, Ordering::Relaxed);
        }
    }
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
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        if len == 0 {
            return Err(PyValueError::new_err("cannot register an empty buffer"));
        }
        let mem = PyMem { ptr, len, buf };
        let flags = RegisterFlags { portable: true, mapped: false, read_only };
        let reg = py.detach(|| HostRegistration::try_new(mem, flags));
        match reg {
            Ok(reg) => {
                // SAFETY: sysconf has no preconditions.
                let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
                let (start, end) = (ptr as u64, ptr as u64 + len as u64);
                let pages = end.div_ceil(page) * page - start / page * page;
                REGISTERED.fetch_add(pages, Ordering::Relaxed);
                Ok(Registration { reg: Some(reg), nbytes: len, pages, read_only })
            }
            Err((e, mem)) => {
                drop(mem.buf);
                Err(err(e))
            }
        }
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
        REGISTERED.fetch_sub(self.pages, Ordering::Relaxed);
        let mem = py.detach(|| -> wirespeed_cuda::Result<PyMem> {
            for d in Device::all()? {
                d.synchronize()?;
            }
            reg.into_inner()
        });
        let mem = mem.map_err(err)?;
        drop(mem.buf);
        Ok(())
    }
}

/// Bytes of the live registrations, rounded out to pages.
pub(crate) fn pinned_bytes() -> u64 {
    REGISTERED.load(Ordering::Relaxed)
}
