//! `_Loader`: the Rust shuffled-batch loader (`wirespeed_pinned::Loader`)
//! behind `wirespeed.Loader`. The Python layer allocates each batch's tensors
//! from torch's caching allocator *on the loader's stream* (so the allocator
//! orders their reuse after the gather) and submits their pointers; a thread
//! of the loader's own enqueues each batch's gather on the loader's stream
//! and records one of the loader's events after it, so that the caller's
//! thread does none of the gathering's host work (the pool's waits for its
//! blocks, the ring's slots), never waiting for the consumer's work; `collect`
//! waits (interruptibly) only where that thread is behind, and `ready` makes
//! the consumer's stream wait for the batch's event. Every call leaves the
//! thread's current CUDA device as it found it.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pyo3::prelude::*;
use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, DeviceSliceMut, Event, EventOptions};
use wirespeed_pinned::{Checkpoint, Loader, LoaderConfig, LoaderState, MappedFile, PinBudget, Records, Way};

use crate::error::err;
use crate::handles::{consumer, keeping_device};
use crate::inflight::{SLICE, Waiting};

/// One array: `(path, header bytes, record bytes, records or None for as many as the file holds)`.
type ArraySpec = (String, u64, u64, Option<u64>);

/// A loader of shuffled batches (see `wirespeed.Loader`).
#[pyclass(name = "_Loader", module = "wirespeed._native")]
pub(crate) struct PyLoader {
    inner: Arc<Mutex<Option<Loader>>>,
    device: Device,
    record_bytes: Vec<u64>,
    /// Recorded on the loader's stream after a batch's gather (`gather`,
    /// `submit`), waited for by the consumer's stream (`ready`): one per
    /// batch gathered ahead and two spare, used in turn (a wait already
    /// enqueued keeps the record it was made after).
    marks: Arc<Vec<Event>>,
    turn: Mutex<usize>,
    /// The thread that runs submitted gathers, in order, and their results.
    worker: Mutex<Option<Worker>>,
    /// Locked by the one thread that collects (a `Receiver` is not `Sync`:
    /// the lock's guard is moved into the wait that releases the GIL).
    done: Arc<Mutex<Option<Receiver<Done>>>>,
}

/// A batch's gather, submitted: its destinations and its event.
struct Job {
    ptrs: Vec<usize>,
    records: u64,
    mark: usize,
}

/// What a submitted gather came to: `(epoch, index, records)`, None at the
/// end of the epoch, or the loader's error (its message).
type Done = std::result::Result<Option<(u64, u64, u64)>, String>;

struct Worker {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

/// What a gather needs of the loader.
struct Gathering<'a> {
    inner: &'a Mutex<Option<Loader>>,
    record_bytes: &'a [u64],
    device: Device,
    marks: &'a [Event],
}

impl Gathering<'_> {
    /// Enqueues the next batch's gather into `ptrs` on the loader's stream
    /// and records event `mark` after it. On an error it waits for the
    /// loader's stream first, so that nothing writes the memory once the
    /// error is known.
    fn run(&self, ptrs: &[usize], records: u64, mark: usize) -> Done {
        let mut g = lock(self.inner);
        let Some(loader) = g.as_mut() else {
            return Err("the loader is closed".into());
        };
        // SAFETY: the Python layer passes memory it allocated for this batch
        // from torch's caching allocator on the loader's stream (so any
        // earlier use of it is ordered before the gather, and any later one
        // after it), `records * rec` bytes on the loader's device, kept alive
        // by the tensors it holds until the gather's result is collected; on
        // an error the stream is waited for before the result is given.
        let mut dsts =
            unsafe { destinations(ptrs, self.record_bytes, records, self.device) }.map_err(|e| e.to_string())?;
        let got = match loader.next_into(&mut dsts) {
            Ok(got) => got,
            Err(e) => {
                let _ = loader.stream().synchronize();
                return Err(e.to_string());
            }
        };
        if got.is_some() {
            loader.stream().record(&self.marks[mark]).map_err(|e| e.to_string())?;
        }
        Ok(got.map(|b| (b.epoch, b.index, b.records)))
    }
}

/// The destinations of a batch of `records` records at `ptrs`.
///
/// # Safety
/// Each pointer is device memory of `device`, at least `records * rec` bytes
/// (`rec` of its array), live and unused by any other work until the batch's
/// gather is complete.
unsafe fn destinations(
    ptrs: &[usize],
    record_bytes: &[u64],
    records: u64,
    device: Device,
) -> PyResult<Vec<DeviceSliceMut<'static, u8>>> {
    let mut dsts = Vec::with_capacity(ptrs.len());
    for (&p, &rec) in ptrs.iter().zip(record_bytes) {
        // SAFETY: the caller's contract above.
        let d =
            unsafe { DeviceSliceMut::from_raw_parts(p as *mut u8, (records * rec) as usize, device) }.map_err(err)?;
        dsts.push(d);
    }
    Ok(dsts)
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
    #[pyo3(signature = (arrays, batch_size, shuffle, way, seed, drop_last, rank, world, device, pin_budget, device_budget, block_bytes, pool_slots = None, depth = 2))]
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
        pool_slots: Option<u64>,
        depth: usize,
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
        config.pool_slots = pool_slots;
        let record_bytes = records.iter().map(Records::record_bytes).collect();
        let (loader, marks) = py.detach(|| {
            keeping_device(|| {
                let loader = Loader::new(&dev, &records, config).map_err(err)?;
                let opts = EventOptions::new();
                let marks = (0..depth.saturating_add(2).min(64))
                    .map(|_| Event::new(&dev, opts))
                    .collect::<wirespeed_cuda::Result<Vec<_>>>()
                    .map_err(err)?;
                Ok((loader, marks))
            })
        })?;
        Ok(PyLoader {
            inner: Arc::new(Mutex::new(Some(loader))),
            device: dev,
            record_bytes,
            marks: Arc::new(marks),
            turn: Mutex::new(0),
            worker: Mutex::new(None),
            done: Arc::new(Mutex::new(None)),
        })
    }

    /// The handle of the loader's stream (for `torch.cuda.ExternalStream`).
    fn stream(&self) -> PyResult<usize> {
        let g = lock(&self.inner);
        Ok(g.as_ref().ok_or_else(closed)?.stream().as_raw() as usize)
    }

    /// `(records per block, blocks per half)` of the pool, or None for a full shuffle.
    fn pool_shape(&self) -> PyResult<Option<(u64, u64)>> {
        let g = lock(&self.inner);
        Ok(g.as_ref().ok_or_else(closed)?.checkpoint().pool)
    }

    /// `(epoch, batch, records, batch_size, shuffle, seed, drop_last, world, pool)`: where the
    /// loader is and what its order depends on.
    #[allow(clippy::type_complexity)] // the tuple Python unpacks
    fn checkpoint(&self) -> PyResult<(u64, u64, u64, u64, bool, u64, bool, u64, Option<(u64, u64)>)> {
        let g = lock(&self.inner);
        let c = g.as_ref().ok_or_else(closed)?.checkpoint();
        Ok((c.state.epoch, c.state.batch, c.records, c.batch_size, c.shuffle, c.seed, c.drop_last, c.world, c.pool))
    }

    /// Resumes from a checkpoint of these fields (None: this loader's own,
    /// for a state saved before the field existed); refuses one of another
    /// order, naming what differs.
    #[pyo3(signature = (epoch, batch, records = None, batch_size = None, shuffle = None, seed = None, drop_last = None, world = None, pool = None, pool_known = false))]
    #[allow(clippy::too_many_arguments)] // one per field of the checkpoint
    fn resume(
        &self,
        py: Python<'_>,
        epoch: u64,
        batch: u64,
        records: Option<u64>,
        batch_size: Option<u64>,
        shuffle: Option<bool>,
        seed: Option<u64>,
        drop_last: Option<bool>,
        world: Option<u64>,
        pool: Option<(u64, u64)>,
        pool_known: bool,
    ) -> PyResult<()> {
        py.detach(|| {
            keeping_device(|| {
                let mut g = lock(&self.inner);
                let loader = g.as_mut().ok_or_else(closed)?;
                let mut c: Checkpoint = loader.checkpoint();
                c.state = LoaderState { epoch, batch };
                c.records = records.unwrap_or(c.records);
                c.batch_size = batch_size.unwrap_or(c.batch_size);
                c.shuffle = shuffle.unwrap_or(c.shuffle);
                c.seed = seed.unwrap_or(c.seed);
                c.drop_last = drop_last.unwrap_or(c.drop_last);
                c.world = world.unwrap_or(c.world);
                if pool_known {
                    c.pool = pool;
                }
                loader.resume(&c).map_err(err)
            })
        })
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
            keeping_device(|| {
                let mut g = lock(&self.inner);
                g.as_mut().ok_or_else(closed)?.load_state(LoaderState { epoch, batch }).map_err(err)
            })
        })
    }

    /// Records of batch `b` of an epoch (of this rank).
    fn batch_len(&self, b: u64) -> PyResult<u64> {
        let g = lock(&self.inner);
        let r = g.as_ref().ok_or_else(closed)?.sharding().batch(b);
        Ok(r.end - r.start)
    }

    /// The file records of batch `b` of the current epoch.
    fn batch_records(&self, b: u64) -> PyResult<Vec<u64>> {
        let mut g = lock(&self.inner);
        Ok(g.as_mut().ok_or_else(closed)?.batch_records(b))
    }

    /// Hands the next batch's gather into the memory at `ptrs` (one per
    /// array, `records * record bytes` each, on the loader's device) to the
    /// loader's thread, which enqueues it on the loader's stream and records
    /// one of the loader's events after it; returns that event's index (for
    /// `ready`) at once. Results come back in order through `collect`. The
    /// memory must stay alive until its result is collected.
    fn submit(&self, ptrs: Vec<usize>, records: u64) -> PyResult<usize> {
        self.check_destinations(&ptrs)?;
        let mark = self.next_mark();
        let mut w = lock(&self.worker);
        if w.is_none() {
            *w = Some(self.start_worker()?);
        }
        let job = Job { ptrs, records, mark };
        w.as_ref().map(|w| w.jobs.send(job)).transpose().map_err(|_| err("the loader's thread has stopped"))?;
        Ok(mark)
    }

    /// The result of the oldest gather submitted and not yet collected:
    /// `(epoch, index, records)`, or None at the end of the epoch; raises
    /// its error. Waits (interruptibly) only while the loader's thread has
    /// not enqueued it yet.
    fn collect(&self, py: Python<'_>) -> PyResult<Option<(u64, u64, u64)>> {
        let done = Arc::clone(&self.done);
        let mut waiting = None;
        loop {
            let got = py.detach(|| lock(&done).as_ref().map(|rx| rx.recv_timeout(SLICE)));
            let Some(got) = got else { return Err(err("no gather was submitted")) };
            match got {
                Ok(result) => return result.map_err(err),
                Err(RecvTimeoutError::Timeout) => {
                    waiting.get_or_insert_with(Waiting::enter);
                    py.check_signals()?;
                }
                Err(RecvTimeoutError::Disconnected) => return Err(err("the loader's thread has stopped")),
            }
        }
    }

    /// Makes work enqueued on the consumer's `stream` from now on wait, on
    /// the device, for the batch whose gather recorded event `mark`.
    fn ready(&self, py: Python<'_>, mark: usize, stream: usize) -> PyResult<()> {
        let ev = self.marks.get(mark).ok_or_else(|| err(format!("no mark {mark}")))?;
        py.detach(|| {
            keeping_device(|| {
                let c = consumer(stream, self.device)?;
                c.wait_event(ev).map_err(err)
            })
        })
    }

    /// Waits on the host for the batch whose gather recorded event `mark`
    /// (for the package's own device arrays, which no stream orders).
    fn wait(&self, py: Python<'_>, mark: usize) -> PyResult<()> {
        let ev = self.marks.get(mark).ok_or_else(|| err(format!("no mark {mark}")))?;
        py.detach(|| keeping_device(|| ev.synchronize().map_err(err)))
    }

    /// Waits for the transfers and gathers in flight, then frees everything.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let worker = lock(&self.worker).take();
        py.detach(|| stop(worker));
        let l = lock(&self.inner).take();
        py.detach(|| {
            keeping_device(|| {
                if let Some(l) = l {
                    l.stream().synchronize().map_err(err)?;
                    drop(l);
                }
                Ok(())
            })
        })
    }
}

impl Drop for PyLoader {
    /// Frees the events and a loader never closed keeping the thread's current device.
    fn drop(&mut self) {
        stop(lock(&self.worker).take());
        let marks = std::mem::take(&mut self.marks);
        let inner = lock(&self.inner).take();
        let _ = keeping_device(|| {
            drop(inner);
            drop(marks);
            Ok(())
        });
    }
}

/// Lets the loader's thread finish the gathers submitted, and waits for it.
fn stop(worker: Option<Worker>) {
    if let Some(w) = worker {
        drop(w.jobs);
        let _ = w.thread.join();
    }
}

impl PyLoader {
    fn next_mark(&self) -> usize {
        let mut turn = lock(&self.turn);
        let mark = *turn;
        *turn = (mark + 1) % self.marks.len();
        mark
    }

    /// The loader's thread, and where its results go.
    fn start_worker(&self) -> PyResult<Worker> {
        let (jobs, todo) = channel::<Job>();
        let (results, done) = channel::<Done>();
        let (inner, marks, record_bytes, device) =
            (Arc::clone(&self.inner), Arc::clone(&self.marks), self.record_bytes.clone(), self.device);
        let thread = std::thread::Builder::new()
            .name("wirespeed-loader".into())
            .spawn(move || {
                let g = Gathering { inner: &inner, record_bytes: &record_bytes, device, marks: &marks };
                for job in todo {
                    if results.send(g.run(&job.ptrs, job.records, job.mark)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| err(format!("starting the loader's thread: {e}")))?;
        *lock(&self.done) = Some(done);
        Ok(Worker { jobs, thread })
    }

    fn check_destinations(&self, ptrs: &[usize]) -> PyResult<()> {
        if ptrs.len() != self.record_bytes.len() {
            return Err(err(format!("{} destinations for {} arrays", ptrs.len(), self.record_bytes.len())));
        }
        Ok(())
    }
}

/// `(free, total)` bytes of device `device`'s memory (the current device is kept).
#[pyfunction]
pub(crate) fn _mem_info(py: Python<'_>, device: usize) -> PyResult<(u64, u64)> {
    py.detach(|| {
        keeping_device(|| {
            let (free, total) = Device::get(device).map_err(err)?.mem_info().map_err(err)?;
            Ok((free as u64, total as u64))
        })
    })
}

/// The device current on the calling thread (the runtime's, as torch sees it).
#[pyfunction]
pub(crate) fn _current_device() -> PyResult<usize> {
    Ok(Device::current().map_err(err)?.ordinal())
}
