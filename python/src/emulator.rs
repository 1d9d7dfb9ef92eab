//! The emulated runtime's controls, for the tests: its counters, a delay, a
//! hold on its streams and injected faults. Each raises `wirespeed.Error` in
//! a build without the cargo feature `emulator`.

#[cfg(feature = "emulator")]
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[cfg(feature = "emulator")]
use crate::error::err;
#[cfg(not(feature = "emulator"))]
use crate::error::no_emulator;

/// The emulated runtime's counters (live allocations, registrations,
/// streams, events, contexts; totals of operations and bytes copied), and
/// `calls`: the calls so far of each function named in `functions`.
#[pyfunction]
#[pyo3(signature = (functions = Vec::new()))]
pub(crate) fn _emulator_counters<'py>(py: Python<'py>, functions: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
    #[cfg(feature = "emulator")]
    {
        let ctl = wirespeed_cuda_sys::emulator::controls().map_err(err)?;
        let c = ctl.counters();
        let d = PyDict::new(py);
        d.set_item("device_allocs", c.device_allocs)?;
        d.set_item("device_bytes", c.device_bytes)?;
        d.set_item("pinned_allocs", c.pinned_allocs)?;
        d.set_item("pinned_bytes", c.pinned_bytes)?;
        d.set_item("registrations", c.registrations)?;
        d.set_item("registered_bytes", c.registered_bytes)?;
        d.set_item("streams", c.streams)?;
        d.set_item("events", c.events)?;
        d.set_item("ops_executed", c.ops_executed)?;
        d.set_item("bytes_copied", c.bytes_copied)?;
        d.set_item("contexts", c.contexts)?;
        d.set_item("unregister_violations", c.unregister_violations)?;
        let calls = PyDict::new(py);
        for f in functions {
            let n = ctl.call_count(&f).ok_or_else(|| PyValueError::new_err(format!("unknown function {f:?}")))?;
            calls.set_item(f, n)?;
        }
        d.set_item("calls", calls)?;
        Ok(d)
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = (py, functions);
        Err(no_emulator())
    }
}

/// Makes every stream operation enqueued from now on wait `us` microseconds
/// before it runs (emulator only): slow copies, for tests of ordering and
/// of interrupts.
#[pyfunction]
pub(crate) fn _emulator_set_delay_us(us: u32) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::controls().map_err(err)?.set_delay_us(us);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = us;
        Err(no_emulator())
    }
}

/// `True`: the emulated streams start no further operation until
/// `_emulator_hold(False)` or `_emulator_reset()` (emulator only): work that
/// provably does not finish, for tests of interrupts.
#[pyfunction]
pub(crate) fn _emulator_hold(on: bool) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        wirespeed_cuda_sys::emulator::controls().map_err(err)?.hold(on);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = on;
        Err(no_emulator())
    }
}

/// Makes the `nth` call from now (1-based) of the runtime function
/// `function` fail with the CUDA error `error` (not 0); `sticky`: every
/// later call too, until `_emulator_reset()` (emulator only).
#[pyfunction]
#[pyo3(signature = (function, nth, error, sticky = false))]
pub(crate) fn _emulator_inject_fault(function: &str, nth: u32, error: u32, sticky: bool) -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        if wirespeed_cuda_sys::emulator::controls().map_err(err)?.inject_fault(function, nth, error, sticky) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("cannot inject error {error} into {function:?}")))
        }
    }
    #[cfg(not(feature = "emulator"))]
    {
        let _ = (function, nth, error, sticky);
        Err(no_emulator())
    }
}

/// Clears pending injected faults and sticky errors, and the delay (emulator only).
#[pyfunction]
pub(crate) fn _emulator_reset() -> PyResult<()> {
    #[cfg(feature = "emulator")]
    {
        let ctl = wirespeed_cuda_sys::emulator::controls().map_err(err)?;
        ctl.reset();
        ctl.set_delay_us(0);
        Ok(())
    }
    #[cfg(not(feature = "emulator"))]
    Err(no_emulator())
}
