//! What the package holds for the process: how much of it is pinned, and
//! letting it all go.

use pyo3::prelude::*;

use crate::{inflight, read_host, registration, streamers};

/// Drops the cached streamers (their pinned ring and registrations), mapped
/// files and `read_host`'s pinned rings (ending their threads), after
/// waiting for every transfer and copy in flight.
#[pyfunction]
pub(crate) fn release(py: Python<'_>) -> PyResult<()> {
    inflight::drain(py)?;
    let kept = streamers::take();
    let rings = read_host::take();
    py.detach(move || {
        drop(kept);
        drop(rings);
    });
    Ok(())
}

/// Host bytes the package holds pinned now: what the cached streamers pin
/// (drawn from their budgets: the ring, registered windows and kept file
/// registrations, those of transfers in flight included), `read_host`'s
/// pinned rings, and the live registrations in place (`_Registration`s, and
/// host sources registered for their copy), rounded out to pages.
#[pyfunction]
pub(crate) fn pinned_bytes() -> u64 {
    streamers::pinned_bytes() + read_host::pinned_bytes() + registration::pinned_bytes()
}
