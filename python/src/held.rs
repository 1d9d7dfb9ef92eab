//! What the package holds for the process: how much of it is pinned, and
//! letting it all go.

use pyo3::prelude::*;

use crate::{inflight, read_host, registration, streamers};

/// Drops the cached streamers (their pinned ring and registrations), mapped
/// files and bounce buffers, after waiting for every transfer in flight.
#[pyfunction]
pub(crate) fn release(py: Python<'_>) -> PyResult<()> {
    inflight::drain(py)?;
    let kept = streamers::take();
    let bounces = read_host::take();
    py.detach(move || {
        drop(kept);
        drop(bounces);
    });
    Ok(())
}

/// Host bytes the package holds pinned now: what the cached streamers pin
/// (drawn from their budgets: the ring, registered windows and kept file
/// registrations, those of transfers in flight included), `read_host`'s
/// bounce buffers, and the live `_Registration`s (rounded out to pages).
#[pyfunction]
pub(crate) fn pinned_bytes() -> u64 {
    streamers::pinned_bytes() + read_host::pinned_bytes() + registration::pinned_bytes()
}
