//! Pin memory-mapped files in place, a reusable pinned ring, and streaming
//! files of any size to one or more GPUs at the line rate (as fast as the
//! host-to-GPU link carries data).
//!
//! The problem: a file of tens of GB (say a large `np.memmap`) to move to the
//! GPU. Copies from pageable memory run well below the line rate, allocating a
//! fresh pinned buffer for every batch costs more than it saves, and pinning
//! the whole file is impossible when it is larger than RAM. What this crate
//! does instead:
//!
//! * [`MappedFile`]: the file mapped `PROT_READ` + `MAP_SHARED` (never
//!   `MAP_PRIVATE`, which can stall `cudaHostRegister`; never writable, which
//!   the kernel refuses to pin), shared as `Arc<MappedFile>`; its page
//!   tables are populated in bulk ([`MappedFile::populate`]) rather than a
//!   page fault every few pages.
//! * [`PinnedRange`]: any byte range of it registered **in place**
//!   (`cudaHostRegister(ReadOnly)`), rounded out to pages, optionally
//!   `mlock`-ed; copies from it run at the line rate. Overlapping pages share
//!   a registration or are refused clearly. [`PinnedRange::new_on`] names the
//!   device it is registered for (as every object of `wirespeed-cuda` names
//!   its device); with [`PinnedRange::new_in`] the range is registered in a
//!   [`wirespeed_cuda::RegistrationContext`] (a second context on the GPU).
//!   In the primary context `cudaHostUnregister` waits for every copy in
//!   flight on the device, and registering stalls other threads' copies; in a
//!   second context neither happens.
//! * [`PinBudget`]: every pinned byte is drawn from one, so running out is an
//!   [`Error::BudgetExceeded`], not a dead machine; `mlock` is checked against
//!   `RLIMIT_MEMLOCK` ([`Error::MemlockLimit`] says what to do).
//! * [`PinnedRing`]: K pinned slots allocated once, filled by producer threads,
//!   reused only after their copy's event completed — the types make any other
//!   order impossible.
//! * [`Streamer`]: moves a file range of any size to device memory with one of
//!   the [`Strategy`]s — a whole-file registration reused across passes,
//!   sliding registered windows (in a second context when one can be made:
//!   [`WindowContext`]), the ring, a hybrid of windows and ring at once, or
//!   `O_DIRECT` reads for files not in the page cache — and [`Report`]s the
//!   rate, CPU time, peak pinned bytes and registrations. Destinations are any writable
//!   device view of any [`Pod`](wirespeed_cuda::Pod) type, memory allocated
//!   elsewhere included; [`Streamer::start`] runs a transfer on the
//!   streamer's worker thread and returns a [`Transfer`] at once, which the
//!   caller's streams can be ordered after ([`Transfer::then_on`],
//!   [`StartOptions::after`]). A streamer's first transfer makes its ring and
//!   the context its windows are registered in: keep one streamer for many
//!   files, and call [`Streamer::prepare`] to make them ahead.
//!
//! # Safety model
//!
//! Built on `wirespeed-cuda`: every buffer's fence makes host access and `Drop` wait
//! for the device, and nothing relies on a destructor running. A transfer
//! started with [`Streamer::start`] owns its destination as a
//! `wirespeed_cuda::DetachedSliceMut`: the destination's owner waits for the
//! worker thread to release it (after the last copy) before it frees or reads
//! the memory, so leaking the [`Transfer`] handle is harmless. Registered file
//! windows own an `Arc<MappedFile>` inside the `wirespeed_cuda::HostRegistration`
//! that owns them, so leaking anything leaks the mapping rather than unmapping
//! it under a DMA. `unsafe` lives in `mapping.rs` (mmap, munmap, madvise,
//! mincore, the `HostMemory` impl), `memlock.rs` (mlock, munlock),
//! `hint.rs` (a CPU prefetch) and `shuffle/gather.rs` (the kernel's launch).
//!
//! One precondition cannot be checked by any code: a shared file mapping's
//! bytes belong to the file, which any process may write or truncate. So
//! [`MappedFile::open`] is `unsafe`, with that contract (as `memmap2`'s
//! `Mmap::map`): while mapped, nobody changes the file. Everything after it is
//! safe, and some breaches are still caught ([`Error::FileChanged`]).
//!
//! # Example
//!
//! ```
//! # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
//! # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see wirespeed-cuda's docs)
//! # let path = std::env::temp_dir().join(format!("wirespeed-doc-front-page-{}", std::process::id()));
//! # std::fs::write(&path, vec![7u8; 8 << 20])?;
//! use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
//! use wirespeed_cuda::{Device, DeviceBuffer};
//! let dev = Device::get(0)?;
//! // SAFETY: nobody writes or truncates the file while it is mapped.
//! let file = unsafe { MappedFile::open(&path) }?; // of any size: here 8 MiB
//! // Pin at most 2 MiB at once, and let the streamer pick the strategy.
//! let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(2 << 20)))?;
//! // The whole file to the GPU, through 1 MiB of device memory.
//! let mut scratch = DeviceBuffer::<u8>::new(&dev, 1 << 20)?;
//! let report = streamer.to_scratch(&file, 0..file.len(), &mut scratch)?;
//! assert_eq!(report.bytes, file.len());
//! println!("{report}"); // the strategy, bytes, time, rate, CPU time, peak pinned bytes, registrations
//! // Or a range of it into a device buffer of its own.
//! let mut floats = file.device_buffer::<f32>(&dev, 4096..8192)?;
//! streamer.to_device(&file, 4096..8192, &mut floats)?;
//! # std::fs::remove_file(&path)?; Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod error;
mod hint;
mod mapping;
mod memlock;
mod populate;
mod range;
mod registry;
mod ring;
mod shuffle;
mod strategy;
mod streamer;
mod util;

pub use budget::{PinBudget, Reservation};
pub use error::{Error, Result};
pub use mapping::MappedFile;
pub use memlock::{memlock_headroom, memlock_limit};
pub use range::{PinOptions, PinnedRange};
pub use ring::{FreeSlot, FullSlot, InFlightSlot, PinnedRing, SlotSource};
pub use shuffle::{
    BatchInfo, Checkpoint, DEFAULT_BLOCK_BYTES, DEFAULT_PIN_BUDGET, DEFAULT_RING_THREADS, Loader, LoaderConfig,
    LoaderState, Permutation, Records, Sharding, Way,
};
pub use strategy::Strategy;
pub use streamer::{
    Breakdown, CopyStreams, MAX_READ_AHEAD, Progress, Report, StartOptions, StreamConfig, Streamer, Transfer,
    WindowContext,
};
pub use util::Bytes;
