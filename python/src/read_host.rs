//! `read_host`: host memory (any buffer) into device memory, through the CPU
//! and two pinned bounce buffers kept per device.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Mutex;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{DeviceSliceMut, Event, EventOptions, PinnedBuffer, Stream};

use crate::error::err;
use crate::handles::{consumer, device_of};
use crate::report::{PyReport, Summary};

/// The size of each of `read_host`'s two bounce buffers.
const CHUNK: usize = 16 << 20;

/// A stream and two pinned bounce buffers of `read_host`, per device.
struct Bounce {
    stream: Stream,
    slots: [PinnedBuffer<u8>; 2],
}

/// The bounce buffers, kept for the process (one user at a time).
static BOUNCES: Mutex<BTreeMap<usize, Bounce>> = Mutex::new(BTreeMap::new());

/// Host bytes the bounce buffers pin now.
pub(crate) fn pinned_bytes() -> u64 {
    lock(&BOUNCES).values().map(|b| b.slots.iter().map(|s| s.len() as u64).sum::<u64>()).sum()
}

/// The bounce buffers, taken out (to be dropped without the GIL).
pub(crate) fn take() -> impl Send {
    std::mem::take(&mut *lock(&BOUNCES))
}

/// Process CPU seconds so far.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Copies the host buffer `src` (any object with the buffer protocol, C
/// contiguous) to `nbytes` bytes of device memory at `ptr`, through the CPU
/// and two pinned bounce buffers of [`CHUNK`] bytes (kept per device for
/// later calls), ordered as `read_file`; returns once the copies have ended.
#[pyfunction]
#[pyo3(signature = (src, ptr, nbytes, device, stream))]
pub(crate) fn read_host(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    ptr: usize,
    nbytes: usize,
    device: Option<usize>,
    stream: Option<usize>,
) -> PyResult<PyReport> {
    let buf = PyBuffer::<u8>::get(src)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("the source is not C-contiguous"));
    }
    let len = buf.len_bytes();
    if len != nbytes {
        return Err(err(format!("the destination holds {nbytes} bytes, the source {len}")));
    }
    let dev = device_of(ptr, device)?;
    let then = consumer(stream.unwrap_or(0), dev)?;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut bounces = lock(&BOUNCES);
    let bounce = match bounces.entry(dev.ordinal()) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(Bounce {
            stream: Stream::new(&dev).map_err(err)?,
            slots: [PinnedBuffer::<u8>::new(CHUNK).map_err(err)?, PinnedBuffer::<u8>::new(CHUNK).map_err(err)?],
        }),
    };
    if let Some(h) = stream {
        let ev = Event::new(&dev, EventOptions::default()).map_err(err)?;
        consumer(h, dev)?.record(&ev).map_err(err)?;
        bounce.stream.wait_event(&ev).map_err(err)?;
    }
    // SAFETY: as in `read_file`; here the copies are waited for before this
    // returns (the bounce buffers' drop waits for them), and `src` outlives it.
    let mut view = unsafe { DeviceSliceMut::<u8>::from_raw_parts(ptr as *mut u8, nbytes, dev) }.map_err(err)?;
    copy_through(py, bounce, &buf, &mut view)?;
    let done = Event::new(&dev, EventOptions::default()).map_err(err)?;
    bounce.stream.record(&done).map_err(err)?;
    then.wait_event(&done).map_err(err)?;
    // Waits for the last copies (the slots' next user would wait for them
    // anyway; this also makes the report's time the copies' time).
    py.detach(|| bounce.stream.synchronize()).map_err(err)?;
    drop(bounces);
    Ok(PyReport::finished(dev, summary(nbytes, t0.elapsed().as_secs_f64(), cpu_seconds() - c0)))
}

/// Enqueues the copies of `buf` to `view` on the bounce's stream, a chunk at
/// a time through its two slots (filling one while the other is copied);
/// checks for signals between chunks.
fn copy_through(
    py: Python<'_>,
    bounce: &mut Bounce,
    buf: &PyBuffer<u8>,
    view: &mut DeviceSliceMut<u8>,
) -> PyResult<()> {
    let Bounce { stream: ours, slots } = bounce;
    let nbytes = buf.len_bytes();
    let src_ptr = buf.buf_ptr() as usize;
    let mut off = 0;
    let mut i = 0;
    while off < nbytes {
        let n = CHUNK.min(nbytes - off);
        let slot = &mut slots[i % 2];
        py.detach(|| -> wirespeed_cuda::Result<()> {
            // SAFETY: `buf` holds the exporter's buffer (C-contiguous,
            // `nbytes` long) for the whole call; `off + n <= nbytes`.
            let from = unsafe { std::slice::from_raw_parts((src_ptr + off) as *const u8, n) };
            slot.as_mut_slice()?[..n].copy_from_slice(from);
            ours.copy_to_device(&slot.slice(..n)?, &mut view.slice_mut(off..off + n)?)?.detach();
            Ok(())
        })
        .map_err(err)?;
        py.check_signals()?;
        off += n;
        i += 1;
    }
    Ok(())
}

/// The report of a host array's copy of `nbytes` bytes.
fn summary(nbytes: usize, seconds: f64, cpu_seconds: f64) -> Summary {
    let mut s = Summary {
        strategy: "host array through two pinned bounce buffers".to_string(),
        bytes: nbytes as u64,
        seconds,
        cpu_seconds,
        registrations: 0,
        peak_pinned: 2 * CHUNK as u64,
        chained: false,
        breakdown: None,
        text: String::new(),
    };
    s.text = format!(
        "{}: {nbytes} bytes in {seconds:.3} s ({:.2} GB/s), {:.3} CPU s/GB",
        s.strategy,
        s.gbps(),
        s.cpu_per_gb()
    );
    s
}
