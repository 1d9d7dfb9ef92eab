//! Safe wrappers over the CUDA runtime for moving data between host and GPU.
//!
//! Users build a copy pipeline without writing `unsafe`, and the compiler
//! rejects the classic bugs: an asynchronous copy from pageable memory, touching
//! a host buffer while a copy uses it, reading a device buffer while a copy
//! fills it, freeing memory a stream still uses.
//!
//! # The safety model
//!
//! Asynchronous copies outlive the call that starts them, so the obvious design
//! (a guard borrowing the buffers, whose `Drop` waits) is unsound: `mem::forget`
//! on the guard ends the borrow without the wait. This crate never relies on a
//! destructor running. It combines three patterns:
//!
//! 1. **Event-guarded owners.** Every buffer ([`DeviceBuffer`], [`PinnedBuffer`],
//!    [`HostRegistration`]) owns a [`Fence`]: the last operation of each stream
//!    that reads or writes it. Host access ([`PinnedBuffer::as_mut_slice`],
//!    [`DeviceBuffer::to_vec`], …) and `Drop` first wait on the fence; an
//!    operation on another stream is ordered after it (`cudaStreamWaitEvent`).
//!    That is what keeps memory alive and unobserved during a DMA, whatever the
//!    caller leaks. If the wait itself fails (a lost context), `Drop` leaks the
//!    memory rather than free what a copy might still touch.
//! 2. **Borrows for the compiler.** Each asynchronous operation returns a
//!    [`Pending`] that borrows its buffers (and its stream), so the misuse is
//!    a compile error, not a silent wait. `Pending` has no `Drop` and owns
//!    nothing: forgetting it only ends the borrow, and leaks nothing; the
//!    fences still hold.
//! 3. **Ownership passing for registered memory.** [`HostRegistration`] owns
//!    the memory it registers: leaking the registration leaks the memory, so a
//!    copy can never read memory that was freed or reused. The same holds for
//!    memory registered in a [`RegistrationContext`] (a second driver context,
//!    whose unregister does not wait for copies): the registration waits for
//!    its fence before it unregisters, and a leaked one is never unregistered.
//! 4. **Holds for detached writers.** A writable view can be handed to a
//!    writer that enqueues its work later, from another thread (a file
//!    transfer running on a worker thread): [`DeviceSliceMut::detach`] ends
//!    the borrow and records a *hold* on the span in the buffer's fence. Until
//!    the writer releases it (dropping its [`DetachedSliceMut`], which hands
//!    over the record of what it enqueued), the buffer's `Drop`, host access
//!    and operations on that span block, because what the writer will still
//!    enqueue is not known. Leaking the writer leaves the hold: the owner
//!    blocks or leaks, it never frees or reads memory under a copy.
//!
//! Kernels loaded at run time ([`Library`], [`Kernel`]) are launched by
//! [`Stream::launch`], which is `unsafe` because nothing can check what device
//! code does: its caller vouches that the parameters ([`KernelArgs`]) match the
//! kernel and that it touches only the memory given as its reads and writes.
//! Given that, a launch is fenced as a copy is (with any number of buffers),
//! and its library stays loaded until the launch completes.
//!
//! Device memory allocated elsewhere (another library's buffer) enters through
//! the `unsafe` [`DeviceSliceMut::from_raw_parts`], whose contract says what
//! the caller vouches for; parts of one buffer written at once come from
//! [`DeviceBuffer::split_at_mut`].
//!
//! Pageable memory (`&[T]`) implements none of the source traits: it reaches
//! the device only through the explicitly synchronous
//! [`DeviceBuffer::copy_from_slice`] and [`DeviceBuffer::copy_to_slice`].
//!
//! # Example: double-buffered upload, with no `unsafe`
//!
//! ```
//! use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
//! # fn main() -> wirespeed_cuda::Result<()> {
//! # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
//! let dev = Device::get(0)?;
//! let stream = Stream::new(&dev)?;
//! let chunk = 1 << 20;
//! let mut slots = [PinnedBuffer::<f32>::new(chunk)?, PinnedBuffer::<f32>::new(chunk)?];
//! let mut on_gpu = DeviceBuffer::<f32>::zeroed(&dev, 8 * chunk)?;
//! for i in 0..8 {
//!     let slot = &mut slots[i % 2];
//!     slot.as_mut_slice()?.fill(i as f32); // waits only if this slot's last copy still runs
//!     let mut dst = on_gpu.slice_mut(i * chunk..(i + 1) * chunk)?;
//!     stream.copy_to_device(slot, &mut dst)?.detach(); // the fences keep it sound
//! }
//! let mut back = PinnedBuffer::<f32>::new(8 * chunk)?;
//! stream.copy_to_host(&on_gpu, &mut back)?.wait()?;
//! assert_eq!(back.as_slice()?[7 * chunk], 7.0);
//! # Ok(()) }
//! ```
//!
//! # Devices and threads
//!
//! The runtime's current device is per host thread. Every object here remembers
//! its [`Device`] and makes it current before each call, so objects can move
//! between threads and programs can mix GPUs. Streams, events and buffers are
//! `Send + Sync`.
//!
//! # Loading
//!
//! The runtime is loaded at first use by [`wirespeed_cuda_sys::runtime`]; see there for
//! the search order, or set `CUDA_SYS_RUNTIME`.
//!
//! The examples in these docs run as doctests on the emulated runtime (no GPU
//! needed): a hidden first line, `wirespeed_cuda::sys::emulator::install()?`,
//! points the loader at it (cuda-sys's `emulator` feature, on for this crate's
//! tests). Without that line they use the real runtime, unchanged.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod context;
mod device;
mod error;
mod fence;
mod hostfn;
mod kernel;
pub mod locks;
mod memory;
mod raw;
mod stream;
mod sync;

pub use context::RegistrationContext;
pub use device::{Device, RuntimeInfo, runtime_info};
pub use error::{Error, Result, STICKY_CODES};
pub use fence::Fence;
pub use kernel::{Kernel, LaunchConfig, Library};
pub use memory::{
    DetachedSliceMut, DeviceBuffer, DeviceSink, DeviceSlice, DeviceSliceMut, DeviceSource, HostMemory,
    HostRegistration, HostSink, HostSource, KernelArgs, Lane, Lanes, PinnedBuffer, PinnedFlags, PinnedSlice,
    PinnedSliceMut, Pod, PointerKind, RegisterFlags, host_device_pointer, host_flags, pointer_kind,
};
pub use stream::{Event, EventOptions, Pending, Stream, StreamOptions};

/// The raw bindings, re-exported for interop.
pub use wirespeed_cuda_sys as sys;
