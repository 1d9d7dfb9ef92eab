//! [`Loader`]: shuffled batches of records from files of any size, gathered
//! on the GPU into device memory the caller owns.

use wirespeed_cuda::{
    Device, DeviceBuffer, DeviceSliceMut, Event, EventOptions, PinnedBuffer, RegistrationContext, Stream,
};

use super::config::{LoaderConfig, Way};
use super::gather::{self, Kernels, Source};
use super::order::Sharding;
use super::plan::{Drawn, FullOrder, Piece, PoolOrder, PoolShape};
use super::pool::{PAD, Pool};
use super::records::Records;
use super::ring::RingGather;
use crate::error::{Error, Result};
use crate::range::{PinOptions, PinnedRange};
use crate::strategy::Strategy;
use crate::streamer::{StreamConfig, Streamer};

/// Batches in flight at once: the offsets of a batch are staged in one of
/// this many pinned and device buffers, reused once their copy and gather
/// have run.
const STAGES: usize = 4;

/// Where a loader is in its epochs: what [`Loader::state`] saves and
/// [`Loader::load_state`] resumes from (as PyTorch's `state_dict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct LoaderState {
    /// The epoch.
    pub epoch: u64,
    /// The next batch of the epoch to hand out.
    pub batch: u64,
}

/// Where a loader is, and everything its order depends on: what a training
/// checkpoint saves ([`Loader::checkpoint`]) and a resumed run hands back
/// ([`Loader::resume`]), which refuses a checkpoint of another order and
/// names what differs. Ranks are not part of it: every rank is at the same
/// batch, so any rank's checkpoint resumes every rank.
///
/// The order is the same for [`Way::Resident`], [`Way::Registered`] and
/// [`Way::Ring`] (a full shuffle), so a checkpoint of one resumes another;
/// [`Way::Pool`]'s differs, and depends on the pool's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Checkpoint {
    /// The epoch and the next batch.
    pub state: LoaderState,
    /// Records of the arrays.
    pub records: u64,
    /// Records per batch.
    pub batch_size: u64,
    /// Shuffled, or in file order.
    pub shuffle: bool,
    /// The seed.
    pub seed: u64,
    /// Whether the short last batch and the records that do not divide among the ranks are dropped.
    pub drop_last: bool,
    /// The number of ranks.
    pub world: u64,
    /// With [`Way::Pool`], the pool's shape, `(records per block, blocks per
    /// half)`; `None` for a full shuffle.
    pub pool: Option<(u64, u64)>,
}

/// A batch handed out by [`Loader::next_into`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    /// Its epoch.
    pub epoch: u64,
    /// Its index in the epoch (of this rank).
    pub index: u64,
    /// Its records (the batch size, or fewer for the last batch of an epoch).
    pub records: u64,
}

enum Store {
    Resident(Vec<DeviceBuffer<u8>>),
    Registered(Vec<PinnedRange>),
    Pool(Box<Pool>),
    Ring(RingGather),
}

enum Order {
    Full(FullOrder),
    Pool(PoolOrder),
}

/// A batch's record offsets for the pool's gather, per array, in pinned
/// memory the kernel reads over the bus (an upload through the copy engine
/// would queue behind the pool's streaming copies).
struct Stage {
    host: Vec<PinnedBuffer<u64>>,
}

/// Shuffled batches of records, shaped like PyTorch's `DataLoader` with a
/// `DistributedSampler`: every epoch (see [`Loader::set_epoch`]) hands each
/// record out once over all ranks (apart from the padding that makes the
/// ranks' shares equal, the first records repeated, or with `drop_last` the
/// few records cut and a short last batch), in an order fixed by the
/// configuration and the epoch, cut into batches of this rank's contiguous
/// share ([`Sharding`]; `DistributedSampler` strides the order instead);
/// [`Loader::checkpoint`] and [`Loader::resume`] go on mid-epoch with
/// exactly the batches an uninterrupted run would have handed out.
///
/// Every rank must resolve the same order: with more than one rank, give
/// every rank the same [`LoaderConfig::device_budget`], or name the way (see
/// [`LoaderConfig`]). [`Loader::next_into`] never waits on the host for work
/// the caller queued on its own streams (its earlier work on the
/// destination is ordered on the device, by the destination's fence), unless
/// the caller orders the loader after it ([`Loader::after`]).
///
/// Several arrays of the same number of records (features and labels, say)
/// are gathered with the same records into one destination each.
///
/// Each batch is gathered by a kernel into device memory the caller owns
/// ([`Loader::next_into`]), on the loader's stream, without a host wait:
/// work the caller enqueues through `wirespeed-cuda` on that memory is
/// ordered after it by the memory's fence, and other streams are ordered
/// with [`Loader::ready_on`]. Where the records are gathered from is the
/// [`Way`]: a copy of the arrays in device memory, the arrays registered in
/// place, a pool of blocks in device memory (for files larger than device
/// memory), or the pinned ring.
///
/// With [`Way::Pool`], the order is quasi-random: the file's blocks (of
/// [`LoaderConfig::block_bytes`]) come in a random order each epoch, each
/// rank takes a contiguous share of them, and the share's blocks are taken a
/// group at a time (as many as half the pool holds); each group's records
/// are handed out in a random order of their own, while the next group
/// streams into the other half. A batch then draws from about as many blocks
/// as a group holds, and never mixes records more than two groups apart.
///
/// ```
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
/// use wirespeed_cuda::{Device, DeviceBuffer};
/// use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, Records};
/// let path = std::env::temp_dir().join(format!("loader-doc-{}.bin", std::process::id()));
/// std::fs::write(&path, (0..100u32).flat_map(|i| [i as u8; 3]).collect::<Vec<u8>>())?; // 100 records of 3 bytes
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let dev = Device::get(0)?;
/// let mut loader = Loader::new(&dev, &[Records::new(&file, 0, 3)?], LoaderConfig::new(32).seed(1))?;
/// assert_eq!(loader.len(), 4); // 32 + 32 + 32 + 4
/// let mut batch = DeviceBuffer::<u8>::new(&dev, 32 * 3)?;
/// let mut seen = Vec::new();
/// while let Some(b) = loader.next_into(&mut [batch.slice_mut(..)?])? {
///     let bytes = batch.to_vec()?; // waits for the gather
///     seen.extend(bytes[..b.records as usize * 3].chunks(3).map(|r| r[0]));
/// }
/// seen.sort();
/// assert_eq!(seen, (0..100u8).collect::<Vec<_>>()); // every record once
/// # std::fs::remove_file(&path)?; Ok(()) }
/// ```
pub struct Loader {
    // Dropped first: the pool's buffers wait for the streamer's transfers into them.
    store: Store,
    stages: Vec<Stage>,
    streamer: Streamer,
    stream: Stream,
    kernels: Option<Kernels>,
    device: Device,
    arrays: Vec<Records>,
    config: LoaderConfig,
    way: Way,
    cut: Sharding,
    order: Order,
    state: LoaderState,
    /// An error ended the epoch midway: the next batch restarts its order.
    broken: bool,
    turn: usize,
    records: Vec<u64>,
    drawn: Vec<Drawn>,
    pieces: Vec<Piece>,
    offsets: Vec<u64>,
    /// Recorded on the loader's stream by [`Loader::ready_on`], and on the
    /// caller's stream by [`Loader::after`]: made once, recorded again each
    /// batch (a wait already enqueued keeps the record it was made after).
    marks: Marks,
}

/// The two events [`Loader::ready_on`] and [`Loader::after`] record.
struct Marks {
    ready: Event,
    after: Event,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("way", &self.way).field("state", &self.state).field("cut", &self.cut).finish()
    }
}

impl Loader {
    /// A loader of `arrays` (one or more, of the same record count) on `device`.
    ///
    /// It resolves [`Way::Auto`], makes its stream and streamer, and makes
    /// the arrays' store: with [`Way::Resident`] it streams the arrays to the
    /// device now; with [`Way::Registered`] it registers them now.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no arrays, arrays of different record
    /// counts, a batch size of 0, `rank >= world`, a budget too small for the
    /// way asked for (or for one block of the pool); CUDA's errors (loading
    /// the gather kernel, allocating, registering); the streamer's. Nothing
    /// stays allocated or pinned after an error.
    pub fn new(device: &Device, arrays: &[Records], config: LoaderConfig) -> Result<Loader> {
        let first = arrays.first().ok_or_else(|| Error::invalid("Loader::new", "no arrays"))?;
        if let Some(a) = arrays.iter().find(|a| a.count() != first.count()) {
            return Err(Error::invalid(
                "Loader::new",
                format!(
                    "arrays of different lengths: {} has {} records, {} has {}",
                    first.file().path().display(),
                    first.count(),
                    a.file().path().display(),
                    a.count()
                ),
            ));
        }
        let cut = Sharding::new(first.count(), config.batch_size, config.rank, config.world, config.drop_last)?;
        let device_budget = match config.device_budget {
            Some(b) => b,
            None => {
                check_ranks_agree(&config)?;
                device.mem_info()?.0 as u64 / 2
            }
        };
        let way = resolve(&config, arrays, device_budget);
        let streamer = pool_streamer(device, way, &config)?;
        if way == Way::Pool {
            // The ring and the registration context now: made by the first
            // transfer, the ring's pinned allocation (cudaFreeHost of a slot
            // it realigns, at least) would wait for every stream of the
            // device, the caller's queued work included.
            // Where the budget cannot hold it now, the first transfer tries
            // again, and says so if it still cannot.
            let widest = arrays.iter().map(|a| a.count().saturating_mul(a.record_bytes())).max().unwrap_or(0);
            let _ = streamer.prepare(widest);
        }
        let stream = Stream::new(device)?;
        let marks = Marks {
            ready: Event::new(device, EventOptions::default())?,
            after: Event::new(device, EventOptions::default())?,
        };
        let kernels = if way == Way::Ring { None } else { Some(gather::kernels()?) };
        if let Some(k) = &kernels {
            gather::warm_up(k, &stream, device)?;
        }
        let store = make_store(way, device, arrays, &config, device_budget, &streamer, cut)?;
        let order = make_order(&store, cut, &config, 0)?;
        let mut stages = Vec::with_capacity(STAGES);
        if way == Way::Pool {
            for _ in 0..STAGES {
                let mut st = Stage { host: Vec::new() };
                for _ in arrays {
                    st.host.push(PinnedBuffer::new(config.batch_size as usize)?);
                }
                stages.push(st);
            }
        }
        Ok(Loader {
            store,
            stages,
            streamer,
            stream,
            kernels,
            device: *device,
            arrays: arrays.to_vec(),
            config,
            way,
            cut,
            order,
            state: LoaderState::default(),
            broken: false,
            turn: 0,
            records: Vec::new(),
            drawn: Vec::new(),
            pieces: Vec::new(),
            offsets: Vec::new(),
            marks,
        })
    }

    /// Batches of one epoch (of this rank).
    pub fn len(&self) -> u64 {
        self.cut.batches()
    }

    /// True when an epoch has no batch (`drop_last` with fewer records than a batch).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the records are gathered from (never [`Way::Auto`]).
    pub fn way(&self) -> Way {
        self.way
    }

    /// The cut of each epoch between ranks and into batches.
    pub fn sharding(&self) -> Sharding {
        self.cut
    }

    /// The stream the batches are gathered on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The streamer that feeds the arrays to the device (its budget, its reports).
    pub fn streamer(&self) -> &Streamer {
        &self.streamer
    }

    /// With [`Way::Pool`]: the report of a transfer that filled a whole
    /// slot of the pool (its strategy, rate and breakdown), from the middle
    /// of the latest epoch that had one (a pass's last blocks are streamed
    /// as it ends, not as it runs), and how many of the transfers so far ran
    /// chained to the one before, of how many.
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer};
    /// use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, Records, Way};
    /// # let path = std::env::temp_dir().join(format!("loader-doc-pool-{}.bin", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 256 * 4])?; // 256 records of 4 bytes
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = Device::get(0)?;
    /// // Blocks of 16 records, a pool of two halves of 4 blocks.
    /// let config = LoaderConfig::new(16).way(Way::Pool).block_bytes(64).device_budget(2 * 4 * 64 + 32);
    /// let mut loader = Loader::new(&dev, &[Records::new(&file, 0, 4)?], config)?;
    /// let mut batch = DeviceBuffer::<u8>::new(&dev, 16 * 4)?;
    /// while loader.next_into(&mut [batch.slice_mut(..)?])?.is_some() {}
    /// let (last, chained, transfers) = loader.pool_report().expect("a pool");
    /// assert_eq!(last.bytes, 64); // a whole block
    /// assert!(chained <= transfers);
    /// let waited = loader.pool_waited_seconds().expect("a pool");
    /// assert!(waited >= 0.0);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn pool_report(&self) -> Option<(&crate::streamer::Report, u64, u64)> {
        match &self.store {
            Store::Pool(p) => p.last.as_ref().map(|r| (r, p.chained, p.transfers)),
            _ => None,
        }
    }

    /// With [`Way::Pool`]: the seconds batches have waited on the host, so
    /// far, for the pool's blocks to land (the rest of an epoch's time is
    /// the batches' own). Where it is most of an epoch, the streaming bounds
    /// the loader; where it is little, the batches' own work does. See
    /// [`Loader::pool_report`] for an example.
    pub fn pool_waited_seconds(&self) -> Option<f64> {
        match &self.store {
            Store::Pool(p) => Some(p.waited),
            _ => None,
        }
    }

    /// Starts epoch `epoch` from its first batch (as `DistributedSampler.set_epoch`).
    ///
    /// # Errors
    /// A transfer of the pool's last epoch that failed.
    pub fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        self.load_state(LoaderState { epoch, batch: 0 })
    }

    /// Where the loader is: the epoch and the next batch.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Where the loader is and what its order depends on, to save with a
    /// training checkpoint and give to [`Loader::resume`].
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer};
    /// use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, Records};
    /// # let path = std::env::temp_dir().join(format!("loader-doc-ckpt-{}.bin", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 64 * 4])?; // 64 records of 4 bytes
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = Device::get(0)?;
    /// let arrays = [Records::new(&file, 0, 4)?];
    /// let mut loader = Loader::new(&dev, &arrays, LoaderConfig::new(16).seed(3))?;
    /// let mut batch = DeviceBuffer::<u8>::new(&dev, 16 * 4)?;
    /// loader.next_into(&mut [batch.slice_mut(..)?])?;
    /// let saved = loader.checkpoint(); // saved with the model
    /// // After a restart: the same configuration goes on exactly where it was.
    /// let mut again = Loader::new(&dev, &arrays, LoaderConfig::new(16).seed(3))?;
    /// again.resume(&saved)?;
    /// assert_eq!(again.state().batch, 1);
    /// // Another seed is another order: refused, and the error says which setting differs.
    /// let mut other = Loader::new(&dev, &arrays, LoaderConfig::new(16).seed(4))?;
    /// assert!(other.resume(&saved).unwrap_err().to_string().contains("seed"));
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            state: self.state,
            records: self.cut.records(),
            batch_size: self.config.batch_size,
            shuffle: self.config.shuffle,
            seed: self.config.seed,
            drop_last: self.config.drop_last,
            world: self.config.world,
            pool: match &self.store {
                Store::Pool(p) => Some((p.shape.block_records, p.shape.slots)),
                _ => None,
            },
        }
    }

    /// Goes on from `saved` (from [`Loader::checkpoint`]): the batches that
    /// follow are exactly those the run that saved it would have handed out.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first setting that differs
    /// (records, batch size, shuffle, seed, drop_last, world, the pool's
    /// shape or a full shuffle), with what to set; as [`Loader::load_state`].
    pub fn resume(&mut self, saved: &Checkpoint) -> Result<()> {
        let mine = self.checkpoint();
        let order = |pool: Option<(u64, u64)>| match pool {
            None => "a full shuffle (Way::Resident, Registered or Ring)".to_string(),
            Some((records, slots)) => {
                format!("the pool's order, blocks of {records} records, {slots} blocks a half (Way::Pool, pool_slots)")
            }
        };
        let differs = [
            ("records", mine.records != saved.records, saved.records.to_string(), mine.records.to_string()),
            (
                "batch_size",
                mine.batch_size != saved.batch_size,
                saved.batch_size.to_string(),
                mine.batch_size.to_string(),
            ),
            ("shuffle", mine.shuffle != saved.shuffle, saved.shuffle.to_string(), mine.shuffle.to_string()),
            ("seed", mine.seed != saved.seed, saved.seed.to_string(), mine.seed.to_string()),
            ("drop_last", mine.drop_last != saved.drop_last, saved.drop_last.to_string(), mine.drop_last.to_string()),
            ("world", mine.world != saved.world, saved.world.to_string(), mine.world.to_string()),
            ("order", mine.pool != saved.pool, order(saved.pool), order(mine.pool)),
        ];
        if let Some((what, _, was, is)) = differs.into_iter().find(|d| d.1) {
            return Err(Error::invalid(
                "Loader::resume",
                format!(
                    "the checkpoint was made with {what} {was}, this loader has {is}: build the loader with the \
                     checkpoint's {what} to go on in its order"
                ),
            ));
        }
        self.load_state(saved.state)
    }

    /// Resumes at `state` (from [`Loader::state`], of a loader of the same
    /// arrays and configuration): the batches that follow are exactly those an
    /// uninterrupted run would have handed out from there. With
    /// [`Way::Ring`], what the threads gathered ahead is kept if `state` is
    /// where it was gathered for (as `set_epoch` to the epoch after the one
    /// that just ended), else dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the batch is past the epoch's end; a
    /// transfer of the pool's that failed.
    pub fn load_state(&mut self, state: LoaderState) -> Result<()> {
        if state.batch > self.len() {
            return Err(Error::invalid(
                "Loader::load_state",
                format!("batch {} of an epoch of {} batches", state.batch, self.len()),
            ));
        }
        match &mut self.store {
            Store::Pool(p) => p.reset(state.epoch, state.batch)?,
            // What the ring's threads gathered ahead is kept only if it is what comes next.
            Store::Ring(r) => r.seek(state.epoch, state.batch),
            _ => {}
        }
        self.order = make_order(&self.store, self.cut, &self.config, state.epoch)?;
        self.state = state;
        self.broken = false;
        Ok(())
    }

    /// The records of the file (their indices) of batch `b` of the current epoch.
    pub fn batch_records(&mut self, b: u64) -> Vec<u64> {
        self.fill_records(b);
        self.records.clone()
    }

    fn fill_records(&mut self, b: u64) {
        match &self.order {
            Order::Full(o) => o.batch(b, &mut self.records),
            Order::Pool(o) => {
                o.batch(b, &mut self.pieces, &mut self.drawn);
                self.records.clear();
                self.records.extend(self.drawn.iter().map(|d| d.record));
            }
        }
    }

    /// Gathers the next batch into `dsts` (one per array, each at least the
    /// batch's records times the array's record size; the batch fills its
    /// start) and returns what it holds, or `None` at the end of the epoch
    /// (call [`Loader::set_epoch`] for the next one).
    ///
    /// The gather is enqueued on [`Loader::stream`]; the call waits on the
    /// host only for what the gather needs: the pool's transfers of the
    /// blocks it reads, and a staging buffer of batch `n - 4`'s offsets.
    /// With [`Way::Ring`], the ring's threads gather up to three batches
    /// after this one (as many as their slots hold; at an epoch's end, the
    /// next epoch's first) while the caller is elsewhere:
    /// the call waits for the threads to have filled this batch's slots,
    /// then enqueues their copies on [`Loader::stream`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the wrong number of destinations, one
    /// too small or on another device; CUDA's errors; the pool's transfers'
    /// errors. After an error the epoch restarts its order at the next call
    /// (the batch that failed is handed out again).
    pub fn next_into(&mut self, dsts: &mut [DeviceSliceMut<'_, u8>]) -> Result<Option<BatchInfo>> {
        if dsts.len() != self.arrays.len() {
            return Err(Error::invalid(
                "Loader::next_into",
                format!("{} destinations for {} arrays", dsts.len(), self.arrays.len()),
            ));
        }
        let b = self.state.batch;
        if b >= self.len() {
            return Ok(None);
        }
        let n = self.cut.batch(b).end - self.cut.batch(b).start;
        for (d, a) in dsts.iter().zip(&self.arrays) {
            if (d.len() as u64) < n * a.record_bytes() || d.device() != self.device {
                return Err(Error::invalid(
                    "Loader::next_into",
                    format!(
                        "a destination of {} bytes on device {} for {n} records of {} bytes on device {}",
                        d.len(),
                        d.device().ordinal(),
                        a.record_bytes(),
                        self.device.ordinal()
                    ),
                ));
            }
        }
        if self.broken {
            self.load_state(self.state)?;
        }
        match self.gather_batch(b, n, dsts) {
            Ok(()) => {
                self.state.batch += 1;
                Ok(Some(BatchInfo { epoch: self.state.epoch, index: b, records: n }))
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    fn gather_batch(&mut self, b: u64, n: u64, dsts: &mut [DeviceSliceMut<'_, u8>]) -> Result<()> {
        if let Store::Ring(ring) = &mut self.store {
            return ring.gather(&self.stream, &self.arrays, self.state.epoch, b, dsts);
        }
        let kernels = match (&self.store, &self.kernels) {
            (_, Some(k)) => k.clone(),
            (_, None) => return Err(Error::invalid("Loader", "no gather kernel")),
        };
        if let (Store::Pool(_), Order::Pool(order)) = (&self.store, &self.order) {
            let next = (b + 1 < self.len()).then(|| order.batch_groups(b + 1).start);
            self.gather_pooled(b, n, dsts, &kernels)?;
            // This batch's gathers are enqueued: the next group may stream,
            // and once only the last group is read, the next epoch's first.
            if let (Store::Pool(pool), Order::Pool(order)) = (&mut self.store, &self.order) {
                let ahead =
                    Ahead { streamer: &self.streamer, arrays: &self.arrays, cut: self.cut, config: &self.config };
                ahead.start(pool, order, self.state.epoch, next.unwrap_or(order.groups()))?;
            }
            return Ok(());
        }
        let Order::Full(order) = &self.order else {
            return Err(Error::invalid("Loader", "a full-shuffle store with the pool's order"));
        };
        let (first, perm) = order.kernel_params(b);
        for (i, (a, dst)) in self.arrays.iter().zip(dsts.iter_mut()).enumerate() {
            let rec = a.record_bytes();
            let src = match &self.store {
                Store::Resident(bufs) => Source::Device(bufs[i].slice(..bufs[i].len() - PAD)?),
                Store::Registered(ranges) => Source::Host(ranges[i].source()),
                _ => return Err(Error::invalid("Loader", "a store without records in place")),
            };
            let mut dst = dst.slice_mut(..(n * rec) as usize)?;
            gather::gather_permuted(&self.stream, &kernels, &mut dst, &src, first..first + n, &perm, rec)?;
        }
        Ok(())
    }

    /// The pool's gather: each record's offset in its half of the pool,
    /// written to one of the staging buffers (which the kernel reads in
    /// place), then gathered, one gather per group the batch draws from (its
    /// records of one group come before those of the next). A batch that
    /// reads the end of group `g` and the start of `g + 1` gathers `g`'s
    /// records once `g` has landed, then starts `g + 2` (into `g`'s half: no
    /// later gather reads it), and only then waits for `g + 1`: so that
    /// `g + 2` is queued while `g + 1` still streams, and joins its pass.
    fn gather_pooled(&mut self, b: u64, n: u64, dsts: &mut [DeviceSliceMut<'_, u8>], kernels: &Kernels) -> Result<()> {
        self.fill_records(b);
        let (Store::Pool(pool), Order::Pool(order)) = (&mut self.store, &self.order) else {
            return Err(Error::invalid("Loader", "no pool"));
        };
        let groups = order.batch_groups(b);
        let stage = &mut self.stages[self.turn];
        self.turn = (self.turn + 1) % STAGES;
        let k = n as usize;
        // Where the records of the first half drawn from end.
        let first_half = self.drawn.first().map_or(0, |d| pool.half_of(d));
        let split = self.drawn.iter().position(|d| pool.half_of(d) != first_half).unwrap_or(k);
        for (step, run, half) in [(0, 0..split, first_half), (1, split..k, 1 - first_half)] {
            if run.is_empty() {
                continue;
            }
            let group = groups.start + step;
            let ahead = Ahead { streamer: &self.streamer, arrays: &self.arrays, cut: self.cut, config: &self.config };
            ahead.start(pool, order, self.state.epoch, group)?;
            pool.ensure(&self.streamer, &self.arrays, order, group..group + 1)?;
            for (i, (a, dst)) in self.arrays.iter().zip(dsts.iter_mut()).enumerate() {
                let rec = a.record_bytes();
                pool.offsets(rec, &self.drawn, &mut self.offsets);
                if step == 0 {
                    stage.host[i].as_mut_slice()?[..k].copy_from_slice(&self.offsets);
                }
                let mut part = dst.slice_mut((run.start * rec as usize)..(run.end * rec as usize))?;
                let src = Source::Device(pool.source(i, half)?);
                let offsets = stage.host[i].slice(run.clone())?;
                gather::gather(&self.stream, kernels, &mut part, &src, (&offsets, &self.offsets[run.clone()]), rec)?;
            }
        }
        Ok(())
    }

    /// Makes work enqueued on `stream` from now on wait, on the device, for
    /// the batches gathered so far. Costs a record and a wait (no event is
    /// made per call).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, Records};
    /// # let path = std::env::temp_dir().join(format!("loader-doc-ready-{}.bin", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 64 * 4])?; // 64 records of 4 bytes
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = Device::get(0)?;
    /// let mut loader = Loader::new(&dev, &[Records::new(&file, 0, 4)?], LoaderConfig::new(16))?;
    /// let mine = Stream::new(&dev)?; // the stream your training step runs on
    /// let mut batch = DeviceBuffer::<u8>::new(&dev, 16 * 4)?;
    /// loader.after(&mine)?; // the gather waits for what `mine` did so far
    /// loader.next_into(&mut [batch.slice_mut(..)?])?;
    /// loader.ready_on(&mine)?; // work on `mine` from now on sees the batch
    /// # mine.synchronize()?; std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's errors recording or waiting for an event.
    pub fn ready_on(&mut self, stream: &Stream) -> Result<()> {
        self.stream.record(&self.marks.ready)?;
        stream.wait_event(&self.marks.ready)?;
        Ok(())
    }

    /// Makes the next gathers wait, on the device, for the work enqueued on
    /// `stream` so far (the stream that allocated or last read memory given
    /// to [`Loader::next_into`] through raw pointers, say). Costs a record
    /// and a wait for a stream of the loader's device (an event is made for
    /// a stream of another one).
    ///
    /// ```
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// use wirespeed_pinned::{Loader, LoaderConfig, MappedFile, Records};
    /// # let path = std::env::temp_dir().join(format!("loader-doc-after-{}.bin", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 64 * 4])?; // 64 records of 4 bytes
    /// # // SAFETY: nobody writes or truncates the file while it is mapped.
    /// # let file = unsafe { MappedFile::open(&path) }?;
    /// let dev = Device::get(0)?;
    /// let mut loader = Loader::new(&dev, &[Records::new(&file, 0, 4)?], LoaderConfig::new(16))?;
    /// let other = Stream::new(&dev)?; // a stream that last used the batch's memory
    /// loader.after(&other)?; // the next gather starts after `other`'s work so far
    /// let mut batch = DeviceBuffer::<u8>::new(&dev, 16 * 4)?;
    /// loader.next_into(&mut [batch.slice_mut(..)?])?;
    /// assert_eq!(batch.to_vec()?, vec![7u8; 64]);
    /// # std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// CUDA's errors recording or waiting for an event.
    pub fn after(&mut self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device {
            let ev = Event::new(&stream.device(), EventOptions::default())?;
            stream.record(&ev)?;
            self.stream.wait_event(&ev)?;
            return Ok(());
        }
        stream.record(&self.marks.after)?;
        self.stream.wait_event(&self.marks.after)?;
        Ok(())
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Store::Pool(p) = &mut self.store {
            let _ = p.drain(); // the buffers' fences keep it sound either way
        }
    }
}

/// The bytes of the arrays' records, all of them.
fn total_bytes(arrays: &[Records]) -> u64 {
    arrays.iter().map(|a| a.count().saturating_mul(a.record_bytes())).fold(0u64, u64::saturating_add)
}

fn resolve(config: &LoaderConfig, arrays: &[Records], device_budget: u64) -> Way {
    if !matches!(config.way, Way::Auto | Way::Full) {
        return config.way;
    }
    let total = total_bytes(arrays);
    let pad = (PAD as u64) * arrays.len() as u64;
    if total.saturating_add(pad) <= device_budget {
        Way::Resident
    } else if total <= config.pin_budget.limit() {
        Way::Registered
    } else if config.way == Way::Full {
        Way::Ring
    } else {
        Way::Pool
    }
}

/// The streamer that feeds the arrays. The pool streams each byte once, in
/// groups no larger than the pin budget may be: it streams them as `auto`
/// streams a range larger than the budget (windows and the ring at once),
/// never registering a group whole to keep it (which pays the registration
/// of every byte and keeps the budget drawn), with `auto`'s reserve ring
/// thread.
fn pool_streamer(device: &Device, way: Way, config: &LoaderConfig) -> Result<Streamer> {
    let auto = Streamer::new(&[*device], StreamConfig::new(Strategy::Auto, config.pin_budget.clone()))?;
    if way != Way::Pool {
        return Ok(auto);
    }
    let plan = auto.resolve(config.pin_budget.limit().saturating_mul(8).max(1 << 30));
    if matches!(plan, Strategy::WholeFile | Strategy::Auto) {
        return Ok(auto);
    }
    drop(auto);
    let mut stream_config = StreamConfig::new(plan, config.pin_budget.clone());
    // `auto`'s plan, so `auto`'s reserve ring thread too.
    stream_config.planned_by_auto = true;
    Streamer::new(&[*device], stream_config)
}

fn make_store(
    way: Way,
    device: &Device,
    arrays: &[Records],
    config: &LoaderConfig,
    device_budget: u64,
    streamer: &Streamer,
    cut: Sharding,
) -> Result<Store> {
    match way {
        Way::Resident => resident(device, arrays, device_budget, streamer).map(Store::Resident),
        Way::Registered => registered(device, arrays, config).map(Store::Registered),
        Way::Pool => {
            Pool::new(device, arrays, pool_shape(arrays, config, device_budget)?).map(|p| Store::Pool(Box::new(p)))
        }
        Way::Ring => RingGather::new(device, arrays, cut, config).map(Store::Ring),
        Way::Auto | Way::Full => Err(Error::invalid("Loader", "the way is resolved before the store is made")),
    }
}

fn resident(device: &Device, arrays: &[Records], budget: u64, streamer: &Streamer) -> Result<Vec<DeviceBuffer<u8>>> {
    let total = total_bytes(arrays);
    if total.saturating_add((PAD * arrays.len()) as u64) > budget {
        return Err(Error::invalid(
            "Loader (resident)",
            format!("the arrays hold {total} bytes, more than the device budget of {budget}: use Way::Pool"),
        ));
    }
    let mut bufs = Vec::with_capacity(arrays.len());
    for a in arrays {
        let len = usize::try_from(a.count() * a.record_bytes())
            .map_err(|_| Error::invalid("Loader (resident)", "an array larger than the address space"))?;
        let mut buf = DeviceBuffer::<u8>::new(device, len + PAD)?;
        streamer.to_device(a.file(), a.span(0..a.count()), buf.slice_mut(..len)?)?;
        bufs.push(buf);
    }
    Ok(bufs)
}

fn registered(device: &Device, arrays: &[Records], config: &LoaderConfig) -> Result<Vec<PinnedRange>> {
    let ctx = RegistrationContext::shared(device).ok();
    let opts = PinOptions { mlock: false, portable: true, mapped: true };
    let mut ranges = Vec::with_capacity(arrays.len());
    for a in arrays {
        let span = a.span(0..a.count());
        let r = match &ctx {
            Some(ctx) => PinnedRange::new_in(ctx, a.file(), span, opts, &config.pin_budget)?,
            None => PinnedRange::new_on(device, a.file(), span, opts, &config.pin_budget)?,
        };
        ranges.push(r);
    }
    Ok(ranges)
}

/// With more than one rank and no device budget, the default (half of this
/// device's free memory) must not choose the order: ranks whose free memory
/// differs would hand out different orders, records twice and never.
fn check_ranks_agree(config: &LoaderConfig) -> Result<()> {
    let follows_memory = match config.way {
        Way::Auto => Some("whether the pool's order or a full shuffle is used"),
        Way::Pool if config.pool_slots.is_none() => Some("the pool's shape, hence its order"),
        _ => None,
    };
    match follows_memory {
        Some(what) if config.world > 1 => Err(Error::invalid(
            "Loader::new",
            format!(
                "rank {} of {}: without a device budget, {what} would follow this rank's free device memory, \
                 and ranks that differ hand out different orders (records twice and never): set \
                 LoaderConfig::device_budget to the same bytes on every rank (the least any rank may take), \
                 or name the way (Way::Full, or Way::Pool with pool_slots)",
                config.rank, config.world
            ),
        )),
        _ => Ok(()),
    }
}

fn pool_shape(arrays: &[Records], config: &LoaderConfig, device_budget: u64) -> Result<PoolShape> {
    let widest = arrays.iter().map(Records::record_bytes).max().unwrap_or(1);
    let per_record: u64 = arrays.iter().map(Records::record_bytes).sum();
    let block_records = (config.block_bytes / widest).clamp(1, arrays[0].count());
    let slot = block_records.saturating_mul(per_record);
    // Each array's two halves, each followed by PAD bytes.
    let pads = (2 * PAD * arrays.len()) as u64;
    let fits = device_budget.saturating_sub(pads) / slot.saturating_mul(2).max(1);
    if let Some(slots) = config.pool_slots {
        let need = slot.saturating_mul(2).saturating_mul(slots).saturating_add(pads);
        if slots == 0 || (config.device_budget.is_some() && slots > fits) {
            return Err(Error::invalid(
                "Loader (pool)",
                format!(
                    "pool_slots {slots}: the pool needs 1 or more slots a half, and two halves of {slots} blocks of \
                     {slot} bytes take {need} bytes, more than the device budget of {device_budget}: give fewer \
                     slots, smaller blocks or a larger budget"
                ),
            ));
        }
        return Ok(PoolShape { block_records, slots });
    }
    let slots = fits;
    if slots == 0 {
        return Err(Error::invalid(
            "Loader (pool)",
            format!(
                "a device budget of {device_budget} bytes holds no two blocks of {slot} bytes: give the pool \
                 more device memory or make blocks smaller"
            ),
        ));
    }
    Ok(PoolShape { block_records, slots })
}

/// What starts the pool's groups ahead of the batches that read them.
struct Ahead<'a> {
    streamer: &'a Streamer,
    arrays: &'a [Records],
    cut: Sharding,
    config: &'a LoaderConfig,
}

impl Ahead<'_> {
    /// No gather from now on reads a group of epoch `epoch` (whose order is
    /// `order`) before `first`: starts the groups up to `first + 1`, and,
    /// once only the last group is read, the next epoch's first group
    /// ([`Pool::start_next_epoch`]).
    fn start(&self, pool: &mut Pool, order: &PoolOrder, epoch: u64, first: u64) -> Result<()> {
        pool.start_ahead(self.streamer, self.arrays, order, first)?;
        if first.saturating_add(1) < order.groups() || !pool.next_epoch_fits(order) {
            return Ok(());
        }
        let epoch = epoch.saturating_add(1);
        // An order that cannot be made fails that epoch's set_epoch, not this batch.
        match PoolOrder::new(self.cut, pool.shape, self.config.seed, epoch, self.config.shuffle) {
            Ok(next) => pool.start_next_epoch(self.streamer, self.arrays, &next, epoch),
            Err(_) => Ok(()),
        }
    }
}

fn make_order(store: &Store, cut: Sharding, config: &LoaderConfig, epoch: u64) -> Result<Order> {
    Ok(match store {
        Store::Pool(p) => Order::Pool(PoolOrder::new(cut, p.shape, config.seed, epoch, config.shuffle)?),
        _ => Order::Full(FullOrder::new(cut, config.seed, epoch, config.shuffle)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PinBudget;

    #[test]
    fn the_pools_streamer_runs_autos_plan_with_its_reserve() {
        wirespeed_cuda::sys::emulator::install().expect("the emulated runtime");
        let dev = Device::get(0).expect("a device");
        let config = LoaderConfig::new(16).pin_budget(PinBudget::new(256 << 20));
        let pool = pool_streamer(&dev, Way::Pool, &config).expect("a streamer");
        assert!(matches!(pool.config().strategy, Strategy::Hybrid { .. }), "{:?}", pool.config().strategy);
        assert!(pool.config().planned_by_auto);
        let other = pool_streamer(&dev, Way::Registered, &config).expect("a streamer");
        assert!(matches!(other.config().strategy, Strategy::Auto) && !other.config().planned_by_auto);
    }
}
