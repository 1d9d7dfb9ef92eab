//! Checks of what the memory types are given: lengths and ranges, the
//! devices of an operation's memory, what the runtime knows of an address,
//! and the pages a registration would share with another.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::raw;
use crate::stream::Stream;
use std::ffi::c_void;
use std::ops::{Bound, Range, RangeBounds};
use wirespeed_cuda_sys::cudaMemoryType;

/// The bytes of `len` values of `T`, or an error naming `call` on overflow.
pub(super) fn bytes_of<T>(len: usize, call: &'static str) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| Error::invalid(call, format!("{len} elements overflow usize bytes")))
}

/// `r` as a range within `0..len`, or an error naming `call` when out of bounds.
pub(super) fn to_range(r: impl RangeBounds<usize>, len: usize, call: &'static str) -> Result<Range<usize>> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::invalid(call, format!("range {start}..{end} out of bounds for length {len}")));
    }
    Ok(start..end)
}

/// The pages of every live [`HostRegistration`], as `first page -> (end,
/// first registered byte)` (byte addresses, disjoint). CUDA registers whole pages, so two buffers that
/// share a page cannot both be registered: the second is refused here, with
/// the page named, instead of with CUDA's bare
/// `cudaErrorHostMemoryAlreadyRegistered`. A leaked registration
/// keeps its pages (CUDA keeps them registered too).
pub(super) mod pages {
    use crate::error::{Error, Result};
    use crate::locks::lock;
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};

    static LIVE: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());

    fn page_size() -> usize {
        static PAGE: OnceLock<usize> = OnceLock::new();
        *PAGE.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            usize::try_from(n).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
        })
    }

    /// The pages `[first, end)` holding the `len > 0` bytes at `ptr`.
    fn span(ptr: *const u8, len: usize) -> (usize, usize) {
        let page = page_size();
        let first = ptr as usize & !(page - 1);
        let end = (ptr as usize).saturating_add(len).checked_next_multiple_of(page).unwrap_or(usize::MAX & !(page - 1));
        (first, end)
    }

    /// Whether CUDA still sees the registered byte at `p` as pinned host
    /// memory. A leaked registration is forgotten by CUDA when its context
    /// goes (a reset after a lost context, say), and its memory may then be
    /// reused.
    fn still_registered(p: usize) -> bool {
        match super::pointer_kind(p as *const std::ffi::c_void) {
            Ok(kind) => kind.is_pinned_host(),
            Err(_) => {
                crate::raw::clear_last_error();
                false
            }
        }
    }

    /// Claims the pages of `len > 0` bytes at `ptr` for a registration, or
    /// refuses them if a live registration holds one of them.
    pub(in crate::memory) fn claim(call: &'static str, ptr: *const u8, len: usize) -> Result<()> {
        let (first, end) = span(ptr, len);
        let mut live = lock(&LIVE);
        while let Some((&f, &(e, byte))) = live.range(..end).next_back()
            && e > first
        {
            let page = page_size();
            let (sf, se) = (first.max(f), end.min(e));
            // A byte of the live registration in the shared pages.
            if !still_registered(sf.max(byte)) {
                live.remove(&f); // a leaked registration that CUDA has dropped
                continue;
            }
            return Err(Error::invalid(
                call,
                format!(
                    "the bytes {:#x}..{:#x} share the page(s) {sf:#x}..{se:#x} with a live HostRegistration of \
                     {f:#x}..{e:#x} (CUDA registers whole {page}-byte pages, so it would answer \
                     cudaErrorHostMemoryAlreadyRegistered): page-align the buffers (start and length multiples \
                     of {page} bytes), or register one buffer that covers both",
                    ptr as usize,
                    ptr as usize + len,
                ),
            ));
        }
        live.insert(first, (end, ptr as usize));
        Ok(())
    }

    /// Gives back the pages claimed for the bytes at `ptr` (once unregistered).
    pub(in crate::memory) fn unclaim(ptr: *const u8, len: usize) {
        let (first, _) = span(ptr, len);
        lock(&LIVE).remove(&first);
    }
}

// The checks of the per-copy path are inline; their errors are built out of line.
#[inline]
pub(super) fn same_len(call: &'static str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(len_mismatch(call, a, b));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn len_mismatch(call: &'static str, a: usize, b: usize) -> Error {
    Error::invalid(call, format!("source has {a} values, destination {b}"))
}

#[inline]
pub(super) fn same_device(call: &'static str, stream: &Stream, d: Device) -> Result<()> {
    if stream.device() != d {
        return Err(device_mismatch(call, stream.device(), d));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn device_mismatch(call: &'static str, stream: Device, d: Device) -> Error {
    Error::invalid(call, format!("buffer is on device {} but the stream on device {}", d.ordinal(), stream.ordinal()))
}

/// What the runtime knows of an address ([`pointer_kind`]): which memory it
/// is, and which device it belongs to.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, pointer_kind, sys::cudaMemoryType};
/// let dev = Device::get(0)?;
/// let on_gpu = DeviceBuffer::<u8>::new(&dev, 64)?;
/// let kind = pointer_kind(on_gpu.as_raw_ptr().cast())?;
/// assert_eq!(kind.memory, cudaMemoryType::cudaMemoryTypeDevice);
/// assert_eq!(kind.device_memory(), Some(dev.ordinal()));
/// let pinned = PinnedBuffer::<u8>::new(64)?;
/// assert!(pointer_kind(pinned.as_ptr().cast())?.is_pinned_host());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PointerKind {
    /// Which memory it is: `cudaMemoryTypeUnregistered` (pageable host
    /// memory, or an address the runtime does not know), `cudaMemoryTypeHost`
    /// (pinned or registered host memory), `cudaMemoryTypeDevice` or
    /// `cudaMemoryTypeManaged`. A newer runtime may answer another value.
    pub memory: cudaMemoryType,
    /// The ordinal of the device it belongs to: where device memory lives;
    /// for host and managed memory, the device that was current when it was
    /// allocated or registered. `None` where the runtime names no device
    /// (unregistered memory).
    pub device: Option<usize>,
}

impl PointerKind {
    /// True for memory of a device: device or managed memory.
    pub fn is_device(&self) -> bool {
        self.memory == cudaMemoryType::cudaMemoryTypeDevice || self.memory == cudaMemoryType::cudaMemoryTypeManaged
    }

    /// True for pinned or registered host memory: what asynchronous copies
    /// accept as host memory.
    pub fn is_pinned_host(&self) -> bool {
        self.memory == cudaMemoryType::cudaMemoryTypeHost
    }

    /// The device whose device (or managed) memory this is: its ordinal, or
    /// `None` for other memory.
    pub fn device_memory(&self) -> Option<usize> {
        self.device.filter(|_| self.is_device())
    }
}

/// What the runtime knows of a host or device address (`cudaPointerGetAttributes`).
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// let pinned = wirespeed_cuda::PinnedBuffer::<u8>::new(64)?;
/// assert!(wirespeed_cuda::pointer_kind(pinned.as_ptr().cast())?.is_pinned_host());
/// # Ok(()) }
/// ```
///
/// # Errors
/// The runtime's error.
pub fn pointer_kind(p: *const c_void) -> Result<PointerKind> {
    let (memory, device) = raw::pointer_attributes(p)?;
    Ok(PointerKind { memory, device: usize::try_from(device).ok() })
}

/// Checks that the `len > 0` values at `ptr` start in device (or managed)
/// memory of `device`; only the first address is looked up.
pub(super) fn device_memory_of<T>(call: &'static str, ptr: *const T, device: Device) -> Result<()> {
    let kind = pointer_kind(ptr.cast())?;
    if kind.device_memory() != Some(device.ordinal()) {
        return Err(Error::invalid(
            call,
            format!("{ptr:p} is not device memory of device {} (the runtime has it as {kind:?})", device.ordinal()),
        ));
    }
    Ok(())
}

/// The `cudaHostAlloc`/`cudaHostRegister` flags of pinned or registered memory at `p`.
///
/// # Errors
/// `cudaErrorInvalidValue` for memory that is neither.
pub fn host_flags(p: *const c_void) -> Result<u32> {
    raw::host_get_flags(p)
}

/// The device address of mapped pinned or registered memory at `p`.
///
/// # Errors
/// `cudaErrorInvalidValue` for memory that is not mapped.
pub fn host_device_pointer(p: *const c_void) -> Result<*mut c_void> {
    raw::host_get_device_pointer(p)
}
