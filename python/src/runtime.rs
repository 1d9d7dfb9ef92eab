//! Choosing and loading the CUDA runtime: the one torch loaded, a wheel's
//! copy, or the emulator.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use wirespeed_cuda::Device;

use crate::error::err;
#[cfg(not(feature = "emulator"))]
use crate::error::no_emulator;

/// Set once the emulated runtime was chosen: the runtime search is skipped.
static EMULATED: AtomicBool = AtomicBool::new(false);

/// Chooses the CUDA runtime before its first use: a `libcudart.so.13` or
/// `.so.12` the process has already loaded (PyTorch's, when torch was
/// imported first), else the first of `candidates` that exists (the Python
/// layer lists the copies next to torch and in the nvidia wheels), else the
/// loader's own search. Nothing is chosen when `CUDA_SYS_RUNTIME` is set, the
/// emulator is in use, or the runtime is already loaded. Answers the path set.
#[pyfunction]
pub(crate) fn _configure_runtime(candidates: Vec<String>) -> Option<String> {
    if EMULATED.load(Ordering::Relaxed)
        || std::env::var_os(wirespeed_cuda_sys::RUNTIME_PATH_ENV).is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    let chosen = match ["libcudart.so.13", "libcudart.so.12"].into_iter().find(|name| already_loaded(name)) {
        Some(name) => name.to_string(),
        None => candidates.into_iter().find(|c| std::path::Path::new(c).is_file())?,
    };
    // SAFETY: a CUDA runtime the process already loaded under this name, or a
    // libcudart shipped with torch or NVIDIA's runtime wheels.
    unsafe { wirespeed_cuda_sys::set_runtime_path(chosen.clone()) }.ok().map(|()| chosen)
}

/// Whether the process has loaded a library of this name (loading nothing).
fn already_loaded(name: &str) -> bool {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: a valid C string; RTLD_NOLOAD only looks the library up
    // among those loaded (running no initializer), and the reference it
    // took is given back at once.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            false
        } else {
            libc::dlclose(h);
            true
        }
    }
}

/// The path of the CUDA runtime in use (loading it if needed).
#[pyfunction]
pub(crate) fn runtime_path() -> PyResult<String> {
    Ok(wirespeed_cuda_sys::runtime().map_err(err)?.path().to_string())
}

/// Makes the emulated CUDA runtime (a host-only stand-in, for tests without a
/// GPU) the one used; call it before anything else of the package.
#[pyfunction]
pub(crate) fn _use_emulator() -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::install().map_err(err)?;
        EMULATED.store(true, Ordering::Relaxed);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    Err(no_emulator())
}

/// The number of CUDA devices.
#[pyfunction]
pub(crate) fn device_count() -> PyResult<usize> {
    Device::count().map_err(err)
}
