//! The pinned ring `read_host` copies host memory through: one
//! `PinnedRing` per device, kept for the process, and a pool of threads
//! (as many as the cores, up to [`MAX_THREADS`], unless [`set_threads`]
//! says otherwise) that fill its slots, the caller filling some too.
//!
//! A copy is a [`Job`]: the source cut into pieces ([`Shape::pieces`]: a few
//! per thread, none smaller than [`BALANCED_PIECE`] unless the source is).
//! Each thread takes the next piece, waits for a free slot (one whose last
//! copy has completed: the ring decides), copies the piece into it and
//! enqueues the slot's copy to the piece's place on the ring's stream. The
//! caller takes pieces too while it finds a slot ready, then waits until
//! every piece is enqueued, not for the copies themselves: by then the source
//! was read in full, so the caller may reuse it, and the next copy's pieces
//! are filled while this one's are still on their way to the device.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use wirespeed_cuda::locks::lock;
use wirespeed_cuda::{Device, DeviceSliceMut, Stream};
use wirespeed_pinned::{FreeSlot, PinBudget, PinnedRing};

use crate::error::err;
use crate::inflight::{SLICE, Waiting};

/// The most threads filling a device's ring by default (one per core up to
/// this): each byte is read, written to a slot and read again by the DMA, so
/// host memory traffic bounds them, and more slow them down.
const MAX_THREADS: usize = 12;
/// Slots of the ring per thread where the budget holds that many of
/// [`MAX_SLOT`]: a thread's filled slots wait for the copy engine while it
/// fills the next.
const SLOTS_PER_THREAD: usize = 4;
/// Slots of the ring per thread on a smaller budget: one filled while the
/// other is copied.
const FEWEST_SLOTS_PER_THREAD: usize = 2;
/// Pieces per thread a source is cut into where they stay at least
/// [`BALANCED_PIECE`]: the threads then finish a source close together.
const PIECES_PER_THREAD: usize = 4;
/// The smallest piece cut for balance: a smaller one costs a thread's hand-over
/// and a copy more than it saves.
const BALANCED_PIECE: usize = 512 << 10;
/// The largest slot (a piece a thread fills at once stays in its cache).
const MAX_SLOT: usize = 4 << 20;
/// The smallest slot.
const MIN_SLOT: usize = 64 << 10;

/// The ring's shape: `slots` slots of `slot` bytes, `threads` threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) slots: usize,
    pub(crate) slot: usize,
    pub(crate) threads: usize,
}

impl Shape {
    /// The ring for a pin budget of `budget` bytes: [`SLOTS_PER_THREAD`]
    /// slots of [`MAX_SLOT`] per thread where the budget holds them (a page
    /// of each kept for its alignment), else [`FEWEST_SLOTS_PER_THREAD`]
    /// slots per thread, each as large as the budget allows; fewer slots of
    /// [`MIN_SLOT`] where the budget is smaller still.
    ///
    /// # Errors
    /// A budget without room for two slots of [`MIN_SLOT`].
    pub(crate) fn for_budget(budget: u64) -> Result<Shape, String> {
        let threads = threads();
        let page = page_size();
        let most = (SLOTS_PER_THREAD * threads) as u64 * (MAX_SLOT + page) as u64;
        let per_thread = if budget >= most { SLOTS_PER_THREAD } else { FEWEST_SLOTS_PER_THREAD };
        let slots = per_thread * threads;
        let per = usize::try_from(budget / slots as u64).unwrap_or(usize::MAX);
        let slot = (per.saturating_sub(page) / page * page).min(MAX_SLOT);
        if slot >= MIN_SLOT {
            return Ok(Shape { slots, slot, threads });
        }
        let slots = usize::try_from(budget / (MIN_SLOT + page) as u64).unwrap_or(usize::MAX).min(slots);
        if slots < 2 {
            return Err(format!(
                "a pin budget of {budget} bytes has no room for the pinned ring a host source is copied through \
                 (two slots of {MIN_SLOT} bytes)"
            ));
        }
        Ok(Shape { slots, slot: MIN_SLOT, threads: threads.min(slots) })
    }

    /// The pieces a source of `len` bytes is cut into: (piece bytes,
    /// pieces). [`PIECES_PER_THREAD`] pieces per thread where those are at
    /// least [`BALANCED_PIECE`], else pieces of that size (a small source
    /// keeps fewer threads busy, the caller taking the first piece): whole
    /// pages, at most a slot.
    fn pieces(&self, len: usize) -> (usize, usize) {
        let page = page_size();
        let share = len.div_ceil(PIECES_PER_THREAD * self.threads).max(BALANCED_PIECE);
        let piece = (share.div_ceil(page) * page).min(self.slot);
        (piece, len.div_ceil(piece))
    }
}

/// The threads a ring is made with: as set by [`set_threads`], else one
/// per core up to [`MAX_THREADS`].
fn threads() -> usize {
    // Asked once: the answer reads the process's cgroup files.
    static CORES: OnceLock<usize> = OnceLock::new();
    match THREADS.load(Ordering::Relaxed) {
        0 => (*CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))).clamp(1, MAX_THREADS),
        n => n,
    }
}

/// The most threads a caller may ask for.
const MOST_THREADS: usize = 64;

/// The threads set by [`set_threads`] (0: the default).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the threads the rings are made with from now on (`None`: one per
/// core up to [`MAX_THREADS`]); a kept ring of another shape is made anew
/// on its next use.
///
/// # Errors
/// A count of 0 or more than [`MOST_THREADS`].
pub(crate) fn set_threads(threads: Option<usize>) -> Result<(), String> {
    match threads {
        Some(n) if !(1..=MOST_THREADS).contains(&n) => {
            Err(format!("threads must be between 1 and {MOST_THREADS}, not {n}"))
        }
        n => {
            THREADS.store(n.unwrap_or(0), Ordering::Relaxed);
            Ok(())
        }
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

/// What the ring's threads share: the ring, the stream its copies go on,
/// and the jobs to do.
struct Pool {
    ring: PinnedRing,
    stream: Stream,
    jobs: Mutex<Jobs>,
    posted: Condvar,
}

/// The jobs with pieces left to take, oldest first; `stop` ends the threads.
#[derive(Default)]
struct Jobs {
    queue: VecDeque<Arc<Job>>,
    stop: bool,
}

/// A device's ring, its threads and its stream.
pub(crate) struct HostRing {
    shape: Shape,
    device: Device,
    pool: Arc<Pool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for HostRing {
    /// Ends the threads (once they have finished their pieces), then frees
    /// the ring (whose slots wait for their copies).
    fn drop(&mut self) {
        lock(&self.pool.jobs).stop = true;
        self.pool.posted.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl HostRing {
    /// A ring of `shape` for `device`, its threads started.
    fn new(device: Device, shape: Shape) -> Result<HostRing, String> {
        let ring = PinnedRing::new(shape.slots, shape.slot, &PinBudget::unlimited()).map_err(|e| e.to_string())?;
        let stream = Stream::new(&device).map_err(|e| e.to_string())?;
        let pool = Arc::new(Pool { ring, stream, jobs: Mutex::default(), posted: Condvar::new() });
        let mut this = HostRing { shape, device, pool, threads: Vec::new() };
        for i in 0..shape.threads {
            let pool = this.pool.clone();
            let t = std::thread::Builder::new()
                .name(format!("wirespeed-host-{i}"))
                .spawn(move || fill(&pool))
                .map_err(|e| format!("starting a thread of the host ring: {e}"))?;
            this.threads.push(t);
        }
        Ok(this)
    }

    /// The ring's shape.
    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    /// The stream the ring's copies go on.
    pub(crate) fn stream(&self) -> &Stream {
        &self.pool.stream
    }

    /// Host bytes the ring pins.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pool.ring.pinned_bytes()
    }

    /// Copies `len` bytes at `src` to the device memory at `dst` through the
    /// ring: returns once every piece's copy is enqueued on [`Self::stream`]
    /// (waiting interruptibly; on an interrupt or an error, once no thread
    /// reads the source any more, the copies enqueued so far still going on).
    ///
    /// # Safety
    /// `src .. src + len` is host memory that stays readable and in place
    /// during the call; `dst .. dst + len` is device memory of this ring's
    /// device that stays valid until the copies enqueued on the stream have
    /// completed, and that nothing else uses meanwhile.
    pub(crate) unsafe fn copy(&self, py: Python<'_>, src: usize, dst: usize, len: usize) -> PyResult<()> {
        let (piece, pieces) = self.shape.pieces(len);
        let job = Arc::new(Job {
            src,
            dst,
            len,
            piece,
            pieces,
            device: self.device,
            next: AtomicUsize::new(0),
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let post = || {
            lock(&self.pool.jobs).queue.push_back(job.clone());
            // As many threads as the pieces beyond the caller's first need
            // (one for a piece the caller found no slot for).
            for _ in 0..pieces.saturating_sub(1).clamp(1, self.shape.threads) {
                self.pool.posted.notify_one();
            }
        };
        // The threads take pieces of a source of several; the caller takes
        // pieces too while it finds slots ready, so that a source of one
        // piece needs no thread, and the threads' waking up overlaps the
        // caller's copying.
        let posted = pieces > 1;
        if posted {
            post();
        }
        loop {
            match py.detach(|| job.help(&self.pool.ring, &self.pool.stream)) {
                Help::Took => {}
                Help::NoSlot => {
                    if !posted {
                        post();
                    }
                    break;
                }
                Help::Taken => break,
            }
            if let Err(e) = py.check_signals() {
                py.detach(|| job.abandon());
                return Err(e);
            }
        }
        let waiting = Waiting::enter();
        loop {
            if py.detach(|| job.finished_within(SLICE)) {
                break;
            }
            if let Err(e) = py.check_signals() {
                py.detach(|| job.abandon());
                return Err(e);
            }
        }
        drop(waiting);
        match lock(&job.state).error.take() {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }
}

/// A thread of the ring: takes the oldest job with pieces left, fills
/// pieces of it until none is left, and so on until the ring is dropped.
fn fill(pool: &Pool) {
    loop {
        let job = {
            let mut jobs = lock(&pool.jobs);
            loop {
                if jobs.stop {
                    return;
                }
                while jobs.queue.front().is_some_and(|j| j.taken()) {
                    jobs.queue.pop_front();
                }
                if let Some(j) = jobs.queue.front() {
                    break j.clone();
                }
                jobs = pool.posted.wait(jobs).unwrap_or_else(PoisonError::into_inner);
            }
        };
        job.run(&pool.ring, &pool.stream);
    }
}

/// One copy through the ring: `len` bytes from host memory at `src` to
/// device memory at `dst`, in `pieces` pieces of `piece` bytes (the last
/// shorter).
struct Job {
    src: usize,
    dst: usize,
    len: usize,
    piece: usize,
    pieces: usize,
    device: Device,
    /// The next piece to take.
    next: AtomicUsize,
    state: Mutex<JobState>,
    /// Signalled when a piece is finished or a thread stops reading the source.
    changed: Condvar,
}

/// What the caller's [`Job::help`] did.
enum Help {
    /// Filled a piece.
    Took,
    /// Found no slot ready: the threads go on.
    NoSlot,
    /// Found every piece taken (or the job stopped).
    Taken,
}

/// How far a [`Job`] is.
#[derive(Default)]
struct JobState {
    /// Pieces whose copy is enqueued, failed, or skipped.
    finished: usize,
    /// Threads copying from the source now.
    reading: usize,
    /// The caller has stopped waiting: no thread reads the source any more.
    abandoned: bool,
    /// The first error.
    error: Option<String>,
}

impl Job {
    /// Every piece was taken by a thread.
    fn taken(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.pieces
    }

    /// Takes pieces until none is left (a thread of the ring).
    fn run(&self, ring: &PinnedRing, stream: &Stream) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.pieces {
                return;
            }
            let res = if self.stopped() { Ok(()) } else { self.piece(i, ring, stream) };
            self.finish(res);
        }
    }

    /// Takes one piece if a slot is ready now (the caller, which must not
    /// wait for the copy engine: it answers signals between pieces).
    fn help(&self, ring: &PinnedRing, stream: &Stream) -> Help {
        if self.taken() || self.stopped() {
            return Help::Taken;
        }
        // An error asking for a slot is left to the threads to meet.
        let Ok(Some(slot)) = ring.acquire_if_ready() else {
            return Help::NoSlot;
        };
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.pieces {
            return Help::Taken; // the slot goes back to the ring
        }
        self.finish(self.fill(i, slot, stream));
        Help::Took
    }

    /// Counts a piece finished (and its error).
    fn finish(&self, res: Result<(), String>) {
        let mut st = lock(&self.state);
        if let Err(e) = res {
            st.error.get_or_insert(e);
        }
        st.finished += 1;
        self.changed.notify_all();
    }

    /// Piece `i`: into a free slot, and the slot's copy enqueued.
    fn piece(&self, i: usize, ring: &PinnedRing, stream: &Stream) -> Result<(), String> {
        let slot = ring.acquire().map_err(|e| e.to_string())?;
        self.fill(i, slot, stream)
    }

    /// Piece `i` into `slot`, and the slot's copy enqueued (skipped once the
    /// job failed or was abandoned; the slot then goes back to the ring).
    fn fill(&self, i: usize, slot: FreeSlot, stream: &Stream) -> Result<(), String> {
        let (off, n) = (i * self.piece, self.piece.min(self.len - i * self.piece));
        {
            let mut st = lock(&self.state);
            if st.abandoned || st.error.is_some() {
                return Ok(());
            }
            st.reading += 1;
        }
        // SAFETY: the caller of `HostRing::copy` keeps `src .. src + len`
        // readable and in place until no thread reads it: it waits for every
        // piece to finish, or (abandoning the job) for `reading` to drop to
        // 0, and no thread starts reading once the job is abandoned (checked
        // above under the lock). `off + n <= len`.
        let from = unsafe { std::slice::from_raw_parts((self.src + off) as *const u8, n) };
        let full = slot.copy_from(from);
        {
            let mut st = lock(&self.state);
            st.reading -= 1;
            self.changed.notify_all();
        }
        let full = full.map_err(|e| e.to_string())?;
        // SAFETY: `dst .. dst + len` is device memory of `device`, valid until
        // the copies on the stream have completed and used by nothing else
        // (`HostRing::copy`'s contract); the pieces are disjoint.
        let mut view = unsafe { DeviceSliceMut::<u8>::from_raw_parts((self.dst + off) as *mut u8, n, self.device) }
            .map_err(|e| e.to_string())?;
        // Back to the ring at once: free again once its copy has completed.
        drop(full.copy_to_device(stream, &mut view).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// The job failed or was abandoned: the pieces left are skipped.
    fn stopped(&self) -> bool {
        let st = lock(&self.state);
        st.abandoned || st.error.is_some()
    }

    /// Waits at most `slice` for every piece to finish.
    fn finished_within(&self, slice: Duration) -> bool {
        let end = Instant::now() + slice;
        let mut st = lock(&self.state);
        while st.finished < self.pieces {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            st = self.changed.wait_timeout(st, end - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    /// Stops the job: the pieces not yet read are skipped; returns once no
    /// thread reads the source.
    fn abandon(&self) {
        let mut st = lock(&self.state);
        st.abandoned = true;
        while st.reading > 0 {
            st = self.changed.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The rings, one per device, kept for the process.
static RINGS: Mutex<BTreeMap<usize, Arc<HostRing>>> = Mutex::new(BTreeMap::new());

/// The ring of `device` for a pin budget of `budget` bytes, made on first
/// use (or made anew when the budget gives another shape; the old one is
/// dropped once its last copy is enqueued).
pub(crate) fn ring(py: Python<'_>, device: Device, budget: u64) -> PyResult<Arc<HostRing>> {
    let shape = Shape::for_budget(budget).map_err(err)?;
    let old = {
        let mut rings = lock(&RINGS);
        match rings.get(&device.ordinal()) {
            Some(r) if r.shape == shape => return Ok(r.clone()),
            _ => rings.remove(&device.ordinal()),
        }
    };
    let made = py.detach(move || {
        drop(old);
        HostRing::new(device, shape).map(Arc::new)
    });
    let made = made.map_err(err)?;
    Ok(lock(&RINGS).entry(device.ordinal()).or_insert(made).clone())
}

/// Host bytes the rings pin now.
pub(crate) fn pinned_bytes() -> u64 {
    lock(&RINGS).values().map(|r| r.pinned_bytes()).sum()
}

/// The rings, taken out (to be dropped without the GIL).
pub(crate) fn take() -> impl Send {
    std::mem::take(&mut *lock(&RINGS))
}
