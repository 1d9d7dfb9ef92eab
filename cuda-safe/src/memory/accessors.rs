//! The accessors that the views of memory share, written once: each view
//! gets them with docs and examples of its own.

/// Defines, inside the `impl` of a view, `len` and `is_empty` (reading the
/// field path after `len:`), and where asked `device` (reading the field
/// `device`) and `as_raw_ptr` (reading the field `ptr`; the literal says what
/// work given through the address misses).
///
/// Each method's example runs `setup` (the lines of a `concat!`), which makes
/// `buf`, ten `u16` values (and `dev`, the device of device memory), then
/// takes a view of a range of it as `view` says: the two literals go before
/// and after the range.
macro_rules! view_accessors {
    (
        setup: $setup:tt,
        view: ($before:literal, $after:literal),
        len: $($len:ident).+
        $(, device: $device:ident)?
        $(, raw_ptr: $ptr:ident, $unfenced:literal)?
        $(,)?
    ) => {
        /// Number of values.
        ///
        /// ```
        /// # fn main() -> wirespeed_cuda::Result<()> {
        /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
        #[doc = concat! $setup]
        #[doc = concat!("assert_eq!(", $before, "2..", $after, ".len(), 8);")]
        /// # Ok(()) }
        /// ```
        pub fn len(&self) -> usize {
            self.$($len).+
        }

        /// True when it holds no value.
        ///
        /// ```
        /// # fn main() -> wirespeed_cuda::Result<()> {
        /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
        #[doc = concat! $setup]
        #[doc = concat!("assert!(", $before, "10..", $after, ".is_empty());")]
        /// # Ok(()) }
        /// ```
        pub fn is_empty(&self) -> bool {
            self.$($len).+ == 0
        }

        $(
            /// The device the memory is on.
            ///
            /// ```
            /// # fn main() -> wirespeed_cuda::Result<()> {
            /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
            #[doc = concat! $setup]
            #[doc = concat!("assert_eq!(", $before, "..", $after, ".device(), dev);")]
            /// # Ok(()) }
            /// ```
            pub fn device(&self) -> $crate::device::Device {
                self.$device
            }
        )?

        $(
            /// The device address, for calls this crate does not wrap (a
            /// kernel of yours).
            #[doc = $unfenced]
            ///
            /// ```
            /// # fn main() -> wirespeed_cuda::Result<()> {
            /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
            #[doc = concat! $setup]
            /// let base = buf.as_raw_ptr();
            #[doc = concat!("assert_eq!(", $before, "4..", $after, ".as_raw_ptr(), base.wrapping_add(4));")]
            /// # Ok(()) }
            /// ```
            pub fn as_raw_ptr(&self) -> *mut T {
                self.$ptr
            }
        )?
    };
}

pub(super) use view_accessors;
