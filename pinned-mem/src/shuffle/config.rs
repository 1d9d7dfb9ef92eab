//! How a [`Loader`](super::Loader) draws its batches: the cut of the epoch,
//! the shuffle, and where the records are gathered from.

use crate::budget::PinBudget;

/// Where the records of a batch are gathered from, each with what it costs.
///
/// [`Way::Auto`] picks the first that fits: [`Way::Resident`] when every
/// array fits the device budget, [`Way::Registered`] when they fit the pin
/// budget, else [`Way::Pool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Way {
    /// Chooses as described on [`Way`].
    Auto,
    /// A full shuffle, the first way that fits: [`Way::Resident`],
    /// [`Way::Registered`], else [`Way::Ring`] (never the pool's
    /// quasi-random order).
    Full,
    /// The arrays are streamed to device memory once; every batch is gathered
    /// there by a kernel (a full shuffle). Needs device memory for all of them.
    Resident,
    /// The arrays are registered in place (pinned, read-only, in the
    /// registration context) for as long as the loader lives; a kernel
    /// gathers each batch's records from host memory over PCIe (a full
    /// shuffle). Needs a pin budget that holds them, and no device memory.
    Registered,
    /// Blocks of the files are streamed, in a random order, into a pool in
    /// device memory of two halves; each batch is drawn from the records of
    /// the blocks resident in the pool (a quasi-random shuffle: see
    /// [`Loader`](super::Loader)). For files larger than device memory.
    Pool,
    /// CPU threads gather each batch's records into the pinned ring, which
    /// copies them to the device (a full shuffle). Bound by host memory
    /// traffic (every byte is read, written to pinned memory and read again
    /// by the copy); for when neither device memory nor the pin budget holds
    /// the arrays and the pool's quasi-random order will not do.
    Ring,
}

/// What a [`Loader`](super::Loader) does: `batch_size` records per batch,
/// shuffled or in file order, cut between ranks, and how much memory it may
/// take.
///
/// ```
/// use wirespeed_pinned::{LoaderConfig, PinBudget, Way};
/// let c = LoaderConfig::new(4096).seed(7).rank(1, 2).way(Way::Pool).device_budget(8 << 30);
/// assert_eq!(c.batch_size, 4096);
/// assert_eq!((c.rank, c.world), (1, 2));
/// ```
///
/// Every setting the order depends on is here, so that ranks, and a run and
/// its resume, given the same configuration hand out the same order. The one
/// default that follows the machine is [`LoaderConfig::device_budget`] (half
/// of the device's free memory): with more than one rank, [`Loader::new`]
/// refuses it where it would choose the order (set it, the same on every
/// rank, or name the way and the pool's shape).
///
/// [`Loader::new`]: super::Loader::new
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// Records per batch (the last batch of an epoch may have fewer unless `drop_last`).
    pub batch_size: u64,
    /// Shuffle each epoch (true by default); false hands records out in file order.
    pub shuffle: bool,
    /// The seed of every epoch's order (with the epoch number).
    pub seed: u64,
    /// Drop the last, short batch and the records that do not divide among
    /// the ranks, rather than pad (the first records repeated).
    pub drop_last: bool,
    /// This process's rank and the number of ranks (0 of 1 by default).
    pub rank: u64,
    /// The number of ranks.
    pub world: u64,
    /// Where the records are gathered from.
    pub way: Way,
    /// Device memory the loader may take for the arrays (resident copies or
    /// the pool), in bytes; by default, half of the device's free memory
    /// (refused with more than one rank where it would choose the order:
    /// see [`LoaderConfig`]).
    pub device_budget: Option<u64>,
    /// Pinned memory for streaming and registering.
    pub pin_budget: PinBudget,
    /// Bytes of a block of the pool (of the widest array; rounded to whole
    /// records).
    pub block_bytes: u64,
    /// CPU threads of [`Way::Ring`] (default [`DEFAULT_RING_THREADS`]).
    pub ring_threads: usize,
    /// Blocks of each half of the pool: how many blocks a batch draws from
    /// (default: as many as the device budget holds).
    pub pool_slots: Option<u64>,
}

/// The default CPU threads of [`Way::Ring`]. Each byte is read, written to
/// pinned memory and read again by the DMA, so host memory traffic bounds the
/// way rather than the threads. Fewer run where the pin budget holds fewer
/// slots.
pub const DEFAULT_RING_THREADS: usize = 8;

/// The default size of a pool block. A block is streamed through windows
/// of at most its size, and registering costs a fixed time per call on top
/// of its time per byte: smaller blocks stream slower and cost more CPU. A
/// batch draws from about a half of the pool's worth of blocks, so smaller
/// blocks shuffle finer; set [`LoaderConfig::block_bytes`] to trade one for
/// the other (64 MiB: four times the blocks per batch).
pub const DEFAULT_BLOCK_BYTES: u64 = 256 << 20;
/// The default pin budget of a loader.
pub const DEFAULT_PIN_BUDGET: u64 = 4 << 30;

impl LoaderConfig {
    /// Batches of `batch_size` records, shuffled with seed 0, one rank, the
    /// way chosen automatically, a 4 GiB pin budget and 256 MiB blocks.
    pub fn new(batch_size: u64) -> LoaderConfig {
        LoaderConfig {
            batch_size,
            shuffle: true,
            seed: 0,
            drop_last: false,
            rank: 0,
            world: 1,
            way: Way::Auto,
            device_budget: None,
            pin_budget: PinBudget::new(DEFAULT_PIN_BUDGET),
            block_bytes: DEFAULT_BLOCK_BYTES,
            ring_threads: DEFAULT_RING_THREADS,
            pool_slots: None,
        }
    }

    /// Shuffle (true) or keep the file order (false).
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }

    /// The seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the last, short batch and the records that do not divide among the ranks.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// This process's `rank` of `world`.
    pub fn rank(mut self, rank: u64, world: u64) -> Self {
        self.rank = rank;
        self.world = world;
        self
    }

    /// Where the records are gathered from.
    pub fn way(mut self, way: Way) -> Self {
        self.way = way;
        self
    }

    /// Device memory the loader may take for the arrays (the way and the
    /// pool's shape follow from it: give every rank the same).
    pub fn device_budget(mut self, bytes: u64) -> Self {
        self.device_budget = Some(bytes);
        self
    }

    /// The pin budget.
    pub fn pin_budget(mut self, budget: PinBudget) -> Self {
        self.pin_budget = budget;
        self
    }

    /// Bytes of a pool block (default [`DEFAULT_BLOCK_BYTES`]): larger
    /// blocks stream faster at less CPU, smaller ones shuffle finer.
    ///
    /// ```
    /// use wirespeed_pinned::{LoaderConfig, DEFAULT_BLOCK_BYTES};
    /// assert_eq!(LoaderConfig::new(4096).block_bytes, DEFAULT_BLOCK_BYTES);
    /// let finer = LoaderConfig::new(4096).block_bytes(64 << 20);
    /// assert_eq!(finer.block_bytes, 64 << 20);
    /// ```
    pub fn block_bytes(mut self, bytes: u64) -> Self {
        self.block_bytes = bytes;
        self
    }

    /// CPU threads of [`Way::Ring`] (default [`DEFAULT_RING_THREADS`]; at
    /// most 256, and fewer where the pin budget holds fewer slots).
    ///
    /// ```
    /// use wirespeed_pinned::{LoaderConfig, DEFAULT_RING_THREADS};
    /// assert_eq!(LoaderConfig::new(4096).ring_threads, DEFAULT_RING_THREADS);
    /// assert_eq!(LoaderConfig::new(4096).ring_threads(4).ring_threads, 4);
    /// ```
    pub fn ring_threads(mut self, threads: usize) -> Self {
        self.ring_threads = threads;
        self
    }

    /// Blocks of each half of the pool (with [`Way::Pool`]): each batch
    /// draws its records from about this many blocks. By default as many as
    /// [`LoaderConfig::device_budget`] holds; set it so that the order does
    /// not depend on the budget (the pool then takes `2 * slots` blocks of
    /// device memory, which the budget, where set, must hold).
    ///
    /// ```
    /// use wirespeed_pinned::LoaderConfig;
    /// assert_eq!(LoaderConfig::new(4096).pool_slots, None);
    /// assert_eq!(LoaderConfig::new(4096).pool_slots(16).pool_slots, Some(16));
    /// ```
    pub fn pool_slots(mut self, slots: u64) -> Self {
        self.pool_slots = Some(slots);
        self
    }
}
