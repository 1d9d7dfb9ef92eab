//! The package's exception, `wirespeed.Error`, and the conversion every
//! failing call uses.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

pyo3::create_exception!(
    wirespeed,
    Error,
    PyRuntimeError,
    "An error of the CUDA runtime or of the library (bad range, budget exceeded, ...)."
);

/// The error as a Python `wirespeed.Error`.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    Error::new_err(e.to_string())
}

/// The error of a call that needs the emulated runtime, in a build without it.
#[cfg(not(feature = "emulator"))]
pub(crate) fn no_emulator() -> PyErr {
    err("this build of wirespeed has no emulator (build it with the cargo feature `emulator`)")
}
