//! The native part of the Python package `wirespeed` (`wirespeed._native`).
//!
//! The package's Python layer (python/wirespeed/__init__.py) works out what
//! the user's objects are (a torch tensor, an object with
//! `__cuda_array_interface__`, an `np.memmap`, a path, a host buffer) and
//! calls the functions here with plain values: device pointers, byte counts,
//! stream handles, paths. This crate does the transfers through
//! `wirespeed-pinned` and `wirespeed-cuda`:
//!
//! * [`mod@read_file`]: a file range into device memory given by pointer, as
//!   a `Streamer` transfer ordered after the consumer's stream and before its
//!   later work, with no host wait unless asked; [`inflight`] keeps the
//!   transfer and the Python object that owns the destination until the
//!   transfer has ended, so that nothing frees the destination under a DMA,
//!   whatever the caller drops or interrupts; [`streamers`] keeps the
//!   streamers and mapped files for later calls, and makes a streamer's
//!   ring and registration context ready before a first pass (`_prepare`);
//!   `read_file_many` starts many pieces of one file back to back, so that
//!   the streamer runs them as one pass;
//! * [`mod@read_host`]: host memory (any buffer) into device memory, through
//!   [`host_ring`], a pinned ring per device filled by a pool of threads
//!   (made ahead by `_prepare_host`), or registered in place;
//! * [`registration`]: `_Registration`, a host buffer registered in place
//!   (`cudaHostRegister`);
//! * [`device_array`]: `_DeviceArray`, device memory owned by the library, or
//!   a view of part of it, exposing `__cuda_array_interface__` (for callers
//!   without torch, `batches`' spans, and the tests);
//! * [`loader`]: `_Loader`, shuffled batches of records gathered on the GPU
//!   (`wirespeed.Loader`);
//! * [`report`]: `Report`, a transfer's report, settled when first read
//!   (its figures: [`summary`]);
//! * [`held`]: `pinned_bytes`, what the package holds pinned now, and
//!   `release`;
//! * [`runtime`]: choosing and loading the CUDA runtime (or the emulator);
//! * [`emulator`]: `_emulator_*`, the emulated runtime's counters, delay and
//!   injected faults, for the tests (builds with the feature `emulator`).
//!
//! Every wait releases the GIL and waits in slices of [`inflight::SLICE`],
//! checking for signals between them, so Ctrl-C interrupts it with
//! `KeyboardInterrupt`.

// Everything here is private to the extension module (its API is Python's):
// these docs are for its readers, and link to private items.
#![allow(rustdoc::private_intra_doc_links)]

mod device_array;
mod emulator;
mod error;
mod handles;
mod held;
mod host_ring;
mod inflight;
mod loader;
mod read_file;
mod read_host;
mod registration;
mod report;
mod runtime;
mod streamers;
mod summary;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<error::Error>())?;
    m.add_class::<report::PyReport>()?;
    m.add_class::<registration::Registration>()?;
    m.add_class::<device_array::DeviceArray>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_function(wrap_pyfunction!(runtime::_configure_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::runtime_path, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_use_emulator, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(loader::_mem_info, m)?)?;
    m.add_function(wrap_pyfunction!(loader::_current_device, m)?)?;
    m.add_function(wrap_pyfunction!(read_file::read_file, m)?)?;
    m.add_function(wrap_pyfunction!(read_file::read_file_many, m)?)?;
    m.add_function(wrap_pyfunction!(streamers::_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(read_host::read_host, m)?)?;
    m.add_function(wrap_pyfunction!(read_host::_prepare_host, m)?)?;
    m.add_function(wrap_pyfunction!(held::release, m)?)?;
    m.add_function(wrap_pyfunction!(inflight::drain, m)?)?;
    m.add_function(wrap_pyfunction!(inflight::_reap, m)?)?;
    m.add_function(wrap_pyfunction!(inflight::_waits, m)?)?;
    m.add_function(wrap_pyfunction!(held::pinned_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(emulator::_emulator_counters, m)?)?;
    m.add_function(wrap_pyfunction!(emulator::_emulator_set_delay_us, m)?)?;
    m.add_function(wrap_pyfunction!(emulator::_emulator_hold, m)?)?;
    m.add_function(wrap_pyfunction!(emulator::_emulator_inject_fault, m)?)?;
    m.add_function(wrap_pyfunction!(emulator::_emulator_reset, m)?)?;
    Ok(())
}
