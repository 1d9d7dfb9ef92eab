//! Pin memory-mapped files in place, a reusable pinned ring, and streaming
//! files of any size to one or more GPUs at the line rate.
//!
//! The problem: a file of tens of GB (say a 68 GB `np.memmap`) to move to the
//! GPU. Pageable copies run at 8-16 GB/s, allocating a fresh pinned buffer for
//! every batch costs more than it saves (`cudaHostAlloc` takes about 0.34 s per
//! GiB), and pinning the whole file is impossible when it is larger than RAM.
//! What this crate does instead:
//!
//! * [`MappedFile`]: the file mapped `PROT_READ` + `MAP_SHARED` (never
//!   `MAP_PRIVATE`, which stalled `cudaHostRegister`; never writable, which the
//!   kernel refuses to pin), shared as `Arc<MappedFile>`.
//! * [`PinnedRange`]: any byte range of it registered **in place**
//!   (`cudaHostRegister(ReadOnly)`), rounded out to pages, optionally
//!   `mlock`-ed; copies from it run at the line rate (55 GB/s). Overlapping
//!   pages share a registration or are refused clearly.
//!   [`PinnedRange::new_on`] names the device it is registered for (as every
//!   object of `wirespeed-cuda` names its device); with
//!   [`PinnedRange::new_in`] the range is registered in a
//!   [`wirespeed_cuda::RegistrationContext`] (a second context on the GPU),
//!   whose unregister neither waits for nor stalls the other copies.
//! * [`PinBudget`]: every pinned byte is drawn from one, so running out is an
//!   [`Error::BudgetExceeded`], not a dead machine; `mlock` is checked against
//!   `RLIMIT_MEMLOCK` ([`Error::MemlockLimit`] says what to do).
//! * [`PinnedRing`]: K pinned slots allocated once, filled by producer threads,
//!   reused only after their copy's event completed — the types make any other
//!   order impossible.
//! * [`Streamer`]: moves a file range of any size to device memory with one of
//!   the [`Strategy`]s — a whole-file registration reused across passes,
//!   sliding registered windows, the ring, a hybrid of windows and ring at
//!   once, or `O_DIRECT` reads for cold files — and [`Report`]s the rate, CPU
//!   time, peak pinned bytes and registrations. Destinations are any writable
//!   device view of any [`Pod`](wirespeed_cuda::Pod) type, memory allocated
//!   elsewhere included; [`Streamer::start`] runs a transfer on the
//!   streamer's worker thread and returns a [`Transfer`] at once, which the
//!   caller's streams can be ordered after ([`Transfer::then_on`],
//!   [`StartOptions::after`]).
//!
//! # What was measured (H200, driver 580; the project's benchmark measures it again on your machine)
//!
//! * A registration reused across passes copies at the line rate (0.98-1.00
//!   of it, 512 MiB registered once).
//! * In the primary context `cudaHostUnregister` waits for every copy in
//!   flight on the device, and registering stalls other threads' copies. In a
//!   second context of the device neither happens, so windows are registered
//!   there when one can be made ([`WindowContext`]).
//! * Registering costs per byte, not per call (windows of 16 to 512 MiB alike;
//!   2 MiB windows three times as much): 4 GiB registers and unregisters in
//!   about 100-130 ms of one thread. The driver registers one call at a time
//!   for the whole device: two or four threads, each with a context of its
//!   own, go no faster than one, and registering runs about a third slower
//!   while copies are in flight. Memory in 4 KiB pages (a tmpfs without huge
//!   pages such as `/dev/shm`, most anonymous memory) takes twice as long as
//!   the 2 MiB folios of a page cache on ext4 or xfs of recent kernels, or of
//!   a tmpfs mounted with huge pages (`huge=always`).
//! * The ring's `memcpy` from a page-cached mapping fills about 8.5 GB/s per
//!   thread (0.115 CPU s/GB), whatever the method (glibc, `rep movsb`, AVX2
//!   stores, non-temporal stores), and 5-8 GB/s per thread with several, as
//!   fast as the host's memory allows: on lent machines that changes from
//!   start to start (16 threads read a page-cached file at 27 to 73 GB/s).
//!   Non-temporal stores into the ring's slots were slower end to end.
//! * A page-cached file 8 times the budget (4 GiB, 512 MiB): [`Strategy::Auto`]
//!   (windows beside a 4-thread ring) reached 0.73-0.96 of the line rate at
//!   0.067-0.14 CPU s/GB, as fast as the machine registered and copied; the
//!   16-thread ring 0.66-0.84 at 0.23-0.42; KvikIO 26.10 0.80-0.87 at
//!   0.33-0.36. A 40 GiB file with a 4 GiB budget: 0.68-0.97 at 0.052-0.16.
//! * A streamer's first transfer makes its ring and the context windows are
//!   registered in (about 150 ms together; a 4 GiB transfer takes about 90):
//!   keep one streamer for many files, and call [`Streamer::prepare`] to make
//!   them ahead.
//! * Cold files: `O_DIRECT` into the ring, 0.96-1.10 of the disk's parallel
//!   `O_DIRECT` rate.
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
//! mincore, the `HostMemory` impl) and `memlock.rs` (mlock, munlock).
//!
//! One precondition cannot be checked by any code: a shared file mapping's
//! bytes belong to the file, which any process may write or truncate. So
//! [`MappedFile::open`] is `unsafe`, with that contract (as `memmap2`'s
//! `Mmap::map`): while mapped, nobody changes the file. Everything after it is
//! safe, and some breaches are still caught ([`Error::FileChanged`]).
//!
//! # Example
//!
//! ```no_run
//! use wirespeed_pinned::{MappedFile, PinBudget, StreamConfig, Strategy, Streamer};
//! use wirespeed_cuda::{Device, DeviceBuffer};
//! # fn main() -> wirespeed_pinned::Result<()> {
//! let dev = Device::get(0)?;
//! // SAFETY: nobody writes or truncates the file while it is mapped.
//! let file = unsafe { MappedFile::open("/data/train.bin") }?;
//! let streamer = Streamer::new(&[dev], StreamConfig::new(Strategy::Auto, PinBudget::new(8 << 30)))?;
//! let mut scratch = DeviceBuffer::<u8>::new(&dev, 4 << 30)?;
//! let report = streamer.to_scratch(&file, 0..file.len(), &mut scratch)?;
//! println!("{report}"); // "hybrid 1 GiB windows + 16 MiB slots, 4 threads: 63.3 GiB in ... s (... GB/s), ..."
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod error;
mod mapping;
mod memlock;
mod range;
mod ring;
mod strategy;
mod streamer;
mod util;

pub use budget::{PinBudget, Reservation};
pub use error::{Error, Result};
pub use mapping::MappedFile;
pub use memlock::{memlock_headroom, memlock_limit};
pub use range::{PinOptions, PinnedRange};
pub use ring::{FreeSlot, FullSlot, InFlightSlot, PinnedRing, SlotSource};
pub use strategy::Strategy;
pub use streamer::{
    Breakdown, CopyStreams, Progress, Report, StartOptions, StreamConfig, Streamer, Transfer, WindowContext,
};
pub use util::Bytes;
