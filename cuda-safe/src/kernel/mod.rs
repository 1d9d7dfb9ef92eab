//! Kernels loaded at run time: a [`Library`] of device code (PTX text),
//! its [`Kernel`]s, and their launches ([`Stream::launch`](crate::Stream::launch)),
//! whose parameters ([`KernelArgs`](crate::KernelArgs)) borrow memory and
//! are fenced as copies are.
//!
//! - [`library`]: loading and unloading, and the kernels' handles;
//! - [`launch`]: the shape of a launch and the launch itself.

mod launch;
mod library;

pub use launch::LaunchConfig;
pub use library::{Kernel, Library};
