//! Device memory, pinned host memory, registered host memory, and the copies
//! between them.
//!
//! Every buffer owns a [`Fence`](crate::Fence). Asynchronous copies borrow
//! their buffers for the [`Pending`](crate::Pending) they return and record
//! themselves in the fences; host access (`as_slice`, `as_mut_slice`,
//! `to_vec`) and `Drop` wait on the fence first.
//!
//! - [`traits`]: what copies accept ([`Pod`] values, the sealed source and
//!   sink traits);
//! - [`checks`]: checks of lengths, ranges, devices and addresses, and of the
//!   pages registrations share;
//! - [`device`], [`detached`], [`lanes`]: device memory, its views, and its
//!   writers that enqueue later;
//! - [`pinned`] and [`registered`]: host memory that copies accept;
//! - [`copies`]: the operations of [`Stream`](crate::Stream) on all of them;
//! - [`args`]: the parameters of a kernel launch that point to them.

mod accessors;
mod args;
mod checks;
mod copies;
mod detached;
mod device;
mod lanes;
mod pinned;
mod registered;
mod traits;

pub use args::KernelArgs;
pub use checks::{PointerKind, host_device_pointer, host_flags, pointer_kind};
pub use detached::DetachedSliceMut;
pub use device::{DeviceBuffer, DeviceSlice, DeviceSliceMut};
pub use lanes::{Lane, Lanes};
pub use pinned::{PinnedBuffer, PinnedFlags, PinnedSlice, PinnedSliceMut};
pub use registered::{HostMemory, HostRegistration, RegisterFlags};
pub use traits::{DeviceSink, DeviceSource, HostSink, HostSource, Pod};
