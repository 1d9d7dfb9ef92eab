//! `_Loader`: the Rust shuffled-batch loader (`wirespeed_pinned::Loader`)
//! behind `wirespeed.Loader`. The Python layer allocates each batch's tensors
//! (from torch's caching allocator, on the consumer's stream) and passes
//! their pointers; the gather is ordered after the consumer's work so far
//! and before its later work, with no host wait.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, DeviceSliceMut};
use wirespeed_pinned::{Loader, LoaderConfig, LoaderState, MappedFile, PinBudget, Records, Way};

use crate::error::err;
use crate::handles::consumer;

/// One array: `(path, header bytes, record bytes, records or None for as many as the file holds)`.
type ArraySpec = (String, u64, u64, Option<u64>);

/// A loader of shuffled batches (see `wirespeed.Loader`).
#[pyclass(name = "_Loader", module = "wirespeed._native")]
pub(crate) struct PyLoader {
    inner: Mutex<Option<Loader>>,
    device: Device,
    record_bytes: Vec<u64>,
}

fn way_of(name: &str) -> PyResult<Way> {
    Ok(match name {
        "auto" => Way::Auto,
        "full" => Way::Full,
        "pool" => Way::Pool,
        "resident" => Way::Resident,
        "registered" => Way::Registered,
        "ring" => Way::Ring,
        other => {
            return Err(err(format!("unknown way {other:?}: one of auto, full, pool, resident, registered, ring")));
        }
    })
}

fn records_of(spec: &ArraySpec) -> PyResult<Records> {
    let (path, header, record, count) = spec;
    // SAFETY: the package's contract, as for read_into: nobody writes or
    // truncates the file while the loader maps it.
    let file: Arc<MappedFile> = unsafe { MappedFile::open(path) }.map_err(err)?;
    let r = Records::ignoring_tail(&file, *header, *record).map_err(err)?;
    match count {
        Some(n) => r.take(*n).map_err(err),
        None => Records::new(&file, *header, *record).map_err(err),
    }
}

/// The closed loader's error.
fn closed() -> PyErr {
    err("the loader is closed")
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (arrays, batch_size, shuffle, way, seed, drop_last, rank, world, device, pin_budget, device_budget, block_bytes))]
    #[allow(clippy::too_many_arguments)] // one Rust parameter per Python one
    fn new(
        py: Python<'_>,
        arrays: Vec<ArraySpec>,
        batch_size: u64,
        shuffle: bool,
        way: &str,
        seed: u64,
        drop_last: bool,
        rank: u64,
        world: u64,
        device: usize,
        pin_budget: u64,
        device_budget: Option<u64>,
        block_bytes: u64,
    ) -> PyResult<Self> {
        let way = way_of(way)?;
        let dev = Device::get(device).map_err(err)?;
        let records = arrays.iter().map(records_of).collect::<PyResult<Vec<_>>>()?;
        let mut config = LoaderConfig::new(batch_size)
            .shuffle(shuffle)
            .seed(seed)
            .drop_last(drop_last)
            .rank(rank, world)
            .way(way)
            .pin_budget(PinBudget::new(pin_budget))
            .block_bytes(block_bytes);
        config.device_budget = device_budget;
        let record_bytes = records.iter().map(Records::record_bytes).collect();
        let loader = py.detach(|| Loader::new(&dev, &records, config)).map_err(err)?;
        Ok(PyLoader { inner: Mutex::new(Some(loader)), device: dev, record_bytes })
    }

    /// Batches of one epoch.
    fn __len__(&self) -> PyResult<usize> {
        let g = lock(&self.inner);
        Ok(g.as_ref().ok_or_else(closed)?.len() as usize)
    }

    /// The way chosen ("resident", "registered", "pool", "ring").
    fn way(&self) -> PyResult<String> {
        let g = lock(&self.inner);
        Ok(format!("{:?}", g.as_ref().ok_or_else(closed)?.way()).to_lowercase())
    }

    /// `(epoch, next batch)`.
    fn state(&self) -> PyResult<(u64, u64)> {
        let g = lock(&self.inner);
        let s = g.as_ref().ok_or_else(closed)?.state();
        Ok((s.epoch, s.batch))
    }

    /// Resumes at `(epoch, batch)`.
    fn load_state(&self, py: Python<'_>, epoch: u64, batch: u64) -> PyResult<()> {
        py.detach(|| {
            let mut g = lock(&self.inner);
            g.as_mut().ok_or_else(closed)?.load_state(LoaderState { epoch, batch }).map_err(err)
        })
    }

    /// Records of the next batch, or None at the end of the epoch.
    fn next_size(&self) -> PyResult<Option<u64>> {
        let g = lock(&self.inner);
        let l = g.as_ref().ok_or_else(closed)?;
        let b = l.state().batch;
        let r = l.sharding().batch(b);
        Ok((b < l.len()).then_some(r.end - r.start))
    }

    /// The file records of batch `b` of the current epoch.
    fn batch_records(&self, b: u64) -> PyResult<Vec<u64>> {
        let mut g = lock(&self.inner);
        Ok(g.as_mut().ok_or_else(closed)?.batch_records(b))
    }

    /// Gathers the next batch into the memory at `ptrs` (one per array,
    /// `records * record bytes` each, on the loader's device), ordered after
    /// the work on the consumer's `stream` so far and before its later work;
    /// without a stream it waits for the gather. Returns `(epoch, index,
    /// records)`, or None at the end of the epoch.
    #[pyo3(signature = (ptrs, records, stream = None))]
    fn next_into(
        &self,
        py: Python<'_>,
        ptrs: Vec<usize>,
        records: u64,
        stream: Option<usize>,
    ) -> PyResult<Option<(u64, u64, u64)>> {
        if ptrs.len() != self.record_bytes.len() {
            return Err(err(format!("{} destinations for {} arrays", ptrs.len(), self.record_bytes.len())));
        }
        py.detach(|| {
            let mut g = lock(&self.inner);
            let loader = g.as_mut().ok_or_else(closed)?;
            let consumer = stream.map(|h| consumer(h, self.device)).transpose()?;
            if let Some(c) = &consumer {
                loader.after(c).map_err(err)?;
            }
            let mut dsts = Vec::with_capacity(ptrs.len());
            for (&p, &rec) in ptrs.iter().zip(&self.record_bytes) {
                // SAFETY: the Python layer passes memory it allocated for this
                // batch on the loader's device, `records * rec` bytes, kept
                // alive by the tensor it returns; its allocation is ordered
                // before the gather (`after` the consumer's stream), and the
                // consumer's later work after it (`ready_on`, below); without
                // a consumer stream the gather is waited for before returning.
                let d = unsafe { DeviceSliceMut::from_raw_parts(p as *mut u8, (records * rec) as usize, self.device) }
                    .map_err(err)?;
                dsts.push(d);
            }
            let got = loader.next_into(&mut dsts).map_err(err)?;
            match &consumer {
                Some(c) => loader.ready_on(c).map_err(err)?,
                None => loader.stream().synchronize().map_err(err)?,
            }
            Ok(got.map(|b| (b.epoch, b.index, b.records)))
        })
    }

    /// Waits for the transfers and gathers in flight, then frees everything.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let l = lock(&self.inner).take();
        py.detach(|| {
            if let Some(l) = l {
                l.stream().synchronize().map_err(err)?;
                drop(l);
            }
            Ok(())
        })
    }
}
