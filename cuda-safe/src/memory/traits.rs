//! What copies accept: [`Pod`] values, and the sealed source and sink traits
//! through which a copy reaches a buffer's memory and fence.

use crate::device::Device;
use crate::fence::Fence;

/// Plain old data: any bit pattern is a valid value, no padding, no pointers
/// that matter. Only such types may be copied to and from a GPU.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid `Self`, and
/// `Self` must have no padding bytes.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: primitive numbers: every bit pattern is valid, no padding.
        unsafe impl Pod for $t {}
    )* };
}
pod!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);
// SAFETY: an array of Pod has no padding between elements and every bit pattern is valid.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// Seals the source and sink traits: only this crate's types implement them,
/// and only this crate calls their methods.
pub(super) mod sealed {
    /// The supertrait that keeps other crates from implementing the traits.
    pub trait Sealed {}
    /// The argument of the source and sink traits' methods. Only this crate
    /// can make one, so only this crate can call them: they hand out a
    /// buffer's fence (`&mut` for sinks), and safe code that could swap or
    /// reset a fence could touch memory a copy still uses. (`Sealed` alone
    /// stops other crates from implementing the traits, not from calling them.)
    #[derive(Clone, Copy)]
    pub struct Token(pub(super) ());
}

/// The token this crate passes to the source and sink traits' methods.
pub(super) const TOKEN: sealed::Token = sealed::Token(());

/// Host memory an asynchronous copy may read: pinned or registered only. A
/// pageable `&[T]` does not implement it, so it cannot reach an async copy.
pub trait HostSource<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn host_src(&self, _: sealed::Token) -> (*const T, usize, &Fence);
}
/// Host memory an asynchronous copy may write: pinned memory only.
pub trait HostSink<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn host_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence);
}
/// Device memory an operation may read.
pub trait DeviceSource<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn device_src(&self, _: sealed::Token) -> (*const T, usize, &Fence, Device);
}
/// Device memory an operation may write.
pub trait DeviceSink<T: Pod>: sealed::Sealed {
    #[doc(hidden)]
    fn device_dst(&mut self, _: sealed::Token) -> (*mut T, usize, &mut Fence, Device);
}

/// A `T` of all zero bits.
pub(super) fn zeroed_pod<T: Pod>() -> T {
    // SAFETY: T is Pod, so the all-zero bit pattern is a valid value.
    unsafe { std::mem::zeroed() }
}
