//! How a [`Streamer`](super::Streamer) is configured: [`StreamConfig`] and its
//! [`Progress`] callback.

use std::sync::Arc;
use std::time::Duration;

use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::strategy::Strategy;
use crate::util::MAX_THREADS;

/// The longest [`StreamConfig::read_ahead`] a streamer takes.
pub const MAX_READ_AHEAD: Duration = Duration::from_secs(60);

/// A progress callback: `(bytes done, bytes in all)`, called from worker
/// threads or the calling thread (whole-file passes run on it).
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How a [`Streamer`](super::Streamer) works.
///
/// The struct may gain fields in a minor release, so it is built from
/// [`StreamConfig::new`] (the strategy and the budget: neither has a default
/// that suits every program) and the `with_*` builder methods, one for every
/// field; the fields stay public for reading and assigning.
///
/// ```
/// use std::time::Duration;
/// use wirespeed_pinned::{CopyStreams, PinBudget, StreamConfig, Strategy};
/// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30))
///     .with_strategy(Strategy::WholeFile)
///     .with_budget(PinBudget::new(4 << 30))
///     .with_mlock(false)
///     .with_verify(true)
///     .with_progress(|done, total| eprintln!("{done}/{total}"))
///     .with_second_context(true)
///     .with_copy_streams(CopyStreams::One)
///     .with_reserve_threads(1)
///     .with_reserve_room(0.25)
///     .with_read_ahead(Duration::ZERO);
/// assert!(cfg.verify && cfg.progress.is_some());
/// assert_eq!((cfg.strategy, cfg.budget.limit(), cfg.reserve_room), (Strategy::WholeFile, 4 << 30, 0.25));
/// let mut cfg = cfg;
/// cfg.verify = false; // fields may still be assigned
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct StreamConfig {
    /// The strategy, or [`Strategy::Auto`].
    pub strategy: Strategy,
    /// What every registration, window, slot and bounce buffer draws from.
    pub budget: PinBudget,
    /// `mlock` registered windows too (see
    /// [`PinOptions::mlock`](crate::PinOptions#structfield.mlock)); with `Auto`, windows
    /// are also kept within the `RLIMIT_MEMLOCK` headroom.
    pub mlock: bool,
    /// Copy the data back and compare it with the file
    /// ([`Report::verified`](super::Report::verified)).
    pub verify: bool,
    /// Called as copies complete, with `(bytes done, bytes in all)`, from worker
    /// threads or the calling thread. It must be quick. Calling back into the
    /// same streamer from it fails with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument); a panic in it
    /// ends the transfer with [`Error::WorkerPanicked`](crate::Error::WorkerPanicked).
    pub progress: Option<Progress>,
    /// Register sliding windows in a second CUDA context of the first device
    /// (default `true`): there registering and unregistering neither wait for
    /// nor stall the copies in flight, which is what lets windows keep up with
    /// the line rate. `false`, or a context that cannot be made, uses the
    /// primary context ([`Report::windows`](super::Report::windows) says which
    /// and why).
    pub second_context: bool,
    /// Which streams the copies go on (default [`CopyStreams::One`]).
    pub copy_streams: CopyStreams,
    /// Ring threads that [`Strategy::Auto`]'s hybrid keeps in reserve (default
    /// 1; 0 turns them off). A reserve thread watches the pass and joins the
    /// ring once the copy engine shows room: over the span of its last look
    /// (it looks again and again while the pass runs) the ring's threads
    /// waited for free slots less than [`StreamConfig::reserve_room`] of
    /// their time. That
    /// happens where the window thread registers slowly (the driver registers
    /// one call at a time for the whole device), and there one more thread
    /// filling slots carries bytes the copy engine had room for, at the
    /// ring's CPU cost per byte. Where the copy engine is already the bound
    /// the reserve stays asleep. [`Breakdown::reserve_threads`] says how many
    /// joined. A strategy given explicitly runs exactly its threads. At most
    /// 1024: [`Streamer::new`](super::Streamer::new) refuses more with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    ///
    /// [`Strategy::Auto`]: crate::Strategy::Auto
    /// [`Breakdown::reserve_threads`]: super::Breakdown::reserve_threads
    pub reserve_threads: usize,
    /// The share of their time the ring's threads may have spent waiting
    /// for free slots over a reserve thread's last look for it to join
    /// (default 0.10; see [`StreamConfig::reserve_threads`]). Lower keeps
    /// the reserve asleep on more machines, higher lets it join on more: 0
    /// keeps it asleep; 1 or more lets it join at once, as the pass starts,
    /// whatever the ring's threads do. The share
    /// a whole pass saw is its
    /// [`Breakdown::slot_wait_seconds`](super::Breakdown::slot_wait_seconds)
    /// over its ring threads' time. Not a number (NaN) is refused by
    /// [`Streamer::new`](super::Streamer::new).
    pub reserve_room: f64,
    /// How long a pass through the ring keeps reading ahead for the next
    /// transfer (default zero: it does not). A program that reads a file in
    /// sequential pieces, one transfer at a time (each started once the one
    /// before has its copies enqueued, as a loop of
    /// [`Transfer::then_on`](super::Transfer::then_on) does), otherwise pays
    /// the ring's ramp at every piece: its threads idle between transfers,
    /// and a piece's first copy waits for its first slot to be filled. With
    /// a read-ahead, once a pass of [`Strategy::Ring`] has claimed its last
    /// transfer, its threads fill up to half the ring's slots with the bytes
    /// that follow it (as many as it had, to the end of the file) and hold
    /// them for up to this long once that transfer's copies are all enqueued
    /// (when its caller learns it may go on). A transfer queued meanwhile that starts
    /// there, of the same mapping, takes them: its copies are enqueued as
    /// soon as it is queued, and the pass goes on with it. Anything else
    /// queued, a blocking call on the streamer, the time running out or the
    /// streamer dropped drops them, unread by anyone.
    ///
    /// The bytes are read from the mapping before their transfer is started,
    /// so the file must not be written there meanwhile, as while it is read.
    /// [`Breakdown::read_ahead_bytes`](super::Breakdown::read_ahead_bytes)
    /// says how much a transfer found read. At most 60 s:
    /// [`Streamer::new`](super::Streamer::new) refuses more with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    ///
    /// [`Strategy::Ring`]: crate::Strategy::Ring
    pub read_ahead: Duration,
    /// `strategy` is what [`Strategy::Auto`] resolved to, named by the
    /// library on the caller's behalf (the shuffle pool's streamer): its
    /// hybrid keeps the reserve as `Auto`'s does.
    pub(crate) planned_by_auto: bool,
}

impl std::fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamConfig")
            .field("strategy", &self.strategy)
            .field("budget", &self.budget)
            .field("mlock", &self.mlock)
            .field("verify", &self.verify)
            .field("progress", &self.progress.is_some())
            .field("second_context", &self.second_context)
            .field("copy_streams", &self.copy_streams)
            .field("reserve_threads", &self.reserve_threads)
            .field("reserve_room", &self.reserve_room)
            .field("read_ahead", &self.read_ahead)
            .finish()
    }
}

impl StreamConfig {
    /// `strategy` and `budget`, no mlock, no verification, no progress.
    ///
    /// ```
    /// let cfg = wirespeed_pinned::StreamConfig::new(wirespeed_pinned::Strategy::WholeFile, wirespeed_pinned::PinBudget::unlimited());
    /// assert!(!cfg.verify && !cfg.mlock && cfg.progress.is_none() && cfg.second_context);
    /// assert_eq!(cfg.reserve_threads, 1);
    /// ```
    pub fn new(strategy: Strategy, budget: PinBudget) -> Self {
        StreamConfig {
            strategy,
            budget,
            mlock: false,
            verify: false,
            progress: None,
            second_context: true,
            copy_streams: CopyStreams::One,
            reserve_threads: 1,
            reserve_room: 0.10,
            read_ahead: Duration::ZERO,
            planned_by_auto: false,
        }
    }

    /// With [`StreamConfig::strategy`] set to `strategy`.
    ///
    /// ```
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::unlimited()).with_strategy(Strategy::WholeFile);
    /// assert_eq!(cfg.strategy, Strategy::WholeFile);
    /// ```
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        // Named by the caller now, not by `Auto` on the caller's behalf.
        self.planned_by_auto = false;
        self
    }

    /// With [`StreamConfig::budget`] set to `budget` (a handle: clones of one
    /// budget share its limit).
    ///
    /// ```
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::unlimited()).with_budget(PinBudget::new(1 << 30));
    /// assert_eq!(cfg.budget.limit(), 1 << 30);
    /// ```
    pub fn with_budget(mut self, budget: PinBudget) -> Self {
        self.budget = budget;
        self
    }

    /// With [`StreamConfig::mlock`] set to `on`.
    ///
    /// ```
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(1 << 30)).with_mlock(true).with_verify(true);
    /// assert!(cfg.mlock && cfg.verify);
    /// ```
    pub fn with_mlock(mut self, on: bool) -> Self {
        self.mlock = on;
        self
    }

    /// With [`StreamConfig::verify`] set to `on`.
    ///
    /// ```
    /// let cfg = wirespeed_pinned::StreamConfig::new(wirespeed_pinned::Strategy::Auto, wirespeed_pinned::PinBudget::unlimited());
    /// assert!(cfg.with_verify(true).verify);
    /// ```
    pub fn with_verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    /// With a [`Progress`] callback.
    ///
    /// ```
    /// let cfg = wirespeed_pinned::StreamConfig::new(wirespeed_pinned::Strategy::Auto, wirespeed_pinned::PinBudget::unlimited())
    ///     .with_progress(|done, total| eprintln!("{done}/{total}"));
    /// assert!(cfg.progress.is_some());
    /// ```
    pub fn with_progress(mut self, f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// With [`StreamConfig::second_context`] set to `on`.
    ///
    /// ```
    /// let cfg = wirespeed_pinned::StreamConfig::new(wirespeed_pinned::Strategy::Auto, wirespeed_pinned::PinBudget::unlimited());
    /// assert!(!cfg.with_second_context(false).second_context);
    /// ```
    pub fn with_second_context(mut self, on: bool) -> Self {
        self.second_context = on;
        self
    }

    /// With [`StreamConfig::copy_streams`] set to `streams`.
    ///
    /// ```
    /// use wirespeed_pinned::{CopyStreams, PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::unlimited()).with_copy_streams(CopyStreams::RingApart);
    /// assert_eq!(cfg.copy_streams, CopyStreams::RingApart);
    /// ```
    pub fn with_copy_streams(mut self, streams: CopyStreams) -> Self {
        self.copy_streams = streams;
        self
    }

    /// With [`StreamConfig::reserve_threads`] set to `threads` (at most 1024,
    /// which [`Streamer::new`](super::Streamer::new) checks).
    ///
    /// ```
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(512 << 20)).with_reserve_threads(0);
    /// assert_eq!(cfg.reserve_threads, 0); // auto's hybrid runs its planned ring threads only
    /// ```
    pub fn with_reserve_threads(mut self, threads: usize) -> Self {
        self.reserve_threads = threads;
        self
    }

    /// With [`StreamConfig::reserve_room`] set to `share` (not a number is
    /// refused by [`Streamer::new`](super::Streamer::new)).
    ///
    /// ```
    /// use wirespeed_pinned::{PinBudget, StreamConfig, Strategy};
    /// let cfg = StreamConfig::new(Strategy::Auto, PinBudget::new(512 << 20)).with_reserve_room(1.0);
    /// assert_eq!(cfg.reserve_room, 1.0); // a reserve thread joins as the pass starts
    /// ```
    pub fn with_reserve_room(mut self, share: f64) -> Self {
        self.reserve_room = share;
        self
    }

    /// With [`StreamConfig::read_ahead`] set to `most` (at most 60 s, which
    /// [`Streamer::new`](super::Streamer::new) checks).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
    /// # let path = std::env::temp_dir().join(format!("wirespeed-doc-read-ahead-{}", std::process::id()));
    /// # std::fs::write(&path, vec![7u8; 8 << 20])?;
    /// use std::time::Duration;
    /// use wirespeed_cuda::{Device, DeviceBuffer, Stream};
    /// use wirespeed_pinned::*;
    /// let dev = Device::get(0)?;
    /// let ring = Strategy::Ring { slots: 8, slot: 256 << 10, threads: 2 };
    /// let cfg = StreamConfig::new(ring, PinBudget::new(64 << 20)).with_read_ahead(Duration::from_millis(5));
    /// let streamer = Streamer::new(&[dev], cfg)?;
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let mine = Stream::new(&dev)?;
    /// let mut pieces: Vec<DeviceBuffer<u8>> = (0..8).map(|_| DeviceBuffer::new(&dev, 1 << 20)).collect::<Result<_, _>>()?;
    /// let mut transfers = Vec::new();
    /// for (i, piece) in pieces.iter_mut().enumerate() {
    ///     let at = (i as u64) << 20;
    ///     // Each piece is started once the one before has its copies enqueued:
    ///     // its first bytes may have been read while that one ran.
    ///     let t = streamer.start(&file, at..at + (1 << 20), piece)?;
    ///     t.then_on(&mine)?;
    ///     transfers.push(t);
    /// }
    /// for t in transfers {
    ///     t.wait()?;
    /// }
    /// assert!(pieces.iter().all(|p| p.to_vec().unwrap().iter().all(|&b| b == 7)));
    /// # drop(pieces); std::fs::remove_file(&path)?; Ok(()) }
    /// ```
    pub fn with_read_ahead(mut self, most: Duration) -> Self {
        self.read_ahead = most;
        self
    }

    /// Refuses what no streamer can run: a bad strategy, more than
    /// [`MAX_THREADS`] reserve threads, a `reserve_room` that is not a
    /// number, a read-ahead longer than [`MAX_READ_AHEAD`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`].
    pub(super) fn check(&self) -> Result<()> {
        self.strategy.normalized()?;
        if self.reserve_threads > MAX_THREADS {
            return Err(Error::invalid(
                "StreamConfig",
                format!("{} reserve threads: at most {MAX_THREADS}", self.reserve_threads),
            ));
        }
        if self.reserve_room.is_nan() {
            return Err(Error::invalid("StreamConfig", "reserve_room is not a number (NaN)"));
        }
        if self.read_ahead > MAX_READ_AHEAD {
            return Err(Error::invalid(
                "StreamConfig",
                format!("a read-ahead of {:?}: at most {MAX_READ_AHEAD:?}", self.read_ahead),
            ));
        }
        Ok(())
    }
}

/// Which streams a transfer into device buffers enqueues its copies on
/// ([`StreamConfig::copy_streams`]). Whatever the choice, a transfer's
/// completion (the streamer's streams, a [`Transfer`](super::Transfer)) covers
/// every copy, and chunked passes (`for_each_chunk`, `to_scratch`) always use
/// the streamer's stream.
///
/// One stream is the default: there the copies run whole, one after the
/// other, so each ring slot comes back as early as it can. Streams of their
/// own let the ring threads' copies overlap each other's and the windows'.
///
/// ```
/// use wirespeed_pinned::{CopyStreams, StreamConfig};
/// assert_eq!(StreamConfig::new(wirespeed_pinned::Strategy::Auto, wirespeed_pinned::PinBudget::unlimited()).copy_streams, CopyStreams::One);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CopyStreams {
    /// Every copy to a device on the streamer's stream for it, in the order
    /// enqueued (the default).
    #[default]
    One,
    /// The ring threads' copies on a second stream per device, which they
    /// share; the window agent's on the streamer's: ring slots do not queue
    /// behind a window's copies.
    RingApart,
    /// A stream per ring thread and device; the window agent's copies on the
    /// streamer's.
    PerThread,
}
