//! [`KernelArgs`]: the parameter list of a kernel launch, built from the
//! sources and sinks of [`super::traits`] (whose fences the launch records
//! in) and plain values.

use super::traits::{DeviceSink, DeviceSource, HostSource, Pod, TOKEN};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fence::{Access, Fence, FenceUse, Span, span_of};
use std::ffi::c_void;

/// The parameters of a kernel launch, in the order of the kernel's
/// signature, for [`Stream::launch`](crate::Stream::launch): the memory the
/// kernel reads ([`read`](KernelArgs::read), [`read_host`](KernelArgs::read_host))
/// and writes ([`write`](KernelArgs::write)), passed as pointers, and plain
/// values ([`value`](KernelArgs::value)). Every pointer and value takes an
/// 8-byte parameter slot.
///
/// It borrows the memory for `'a`, as a copy does: the launch's
/// [`Pending`](crate::Pending) keeps the borrows, so the compiler rejects
/// touching a buffer from the host while the kernel may use it, and the
/// fences of the memory record the launch, so that host access and `Drop`
/// wait for it however the `Pending` ends.
///
/// Mistakes found while building (a value wider than 8 bytes) are reported
/// by the launch, which then enqueues nothing.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// use wirespeed_cuda::{Device, DeviceBuffer, KernelArgs};
/// let dev = Device::get(0)?;
/// let src = DeviceBuffer::<u8>::zeroed(&dev, 64)?;
/// let mut dst = DeviceBuffer::<u8>::zeroed(&dev, 64)?;
/// let args = KernelArgs::new().write(&mut dst).read(&src).value(64u64);
/// assert_eq!(args.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct KernelArgs<'a> {
    /// One 8-byte slot per parameter: a value's bytes (zero-padded), or an
    /// address (for host memory: filled in at launch, by `resolve_host`).
    params: Vec<u64>,
    /// The memory the parameters point to, and how the kernel uses it.
    uses: Vec<ArgUse<'a>>,
    /// The first mistake found while building.
    error: Option<Error>,
}

/// One parameter that points to memory.
struct ArgUse<'a> {
    fence: &'a Fence,
    span: Span,
    access: Access,
    /// The device of device memory; `None` for host memory, whose slot
    /// (`param`) gets its device address at launch.
    device: Option<Device>,
    param: usize,
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("params", &self.params.len())
            .field("memory", &self.uses.len())
            .field("error", &self.error)
            .finish()
    }
}

impl<'a> KernelArgs<'a> {
    /// An empty parameter list.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of parameters so far.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// True when there is no parameter.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Appends a pointer to device memory the kernel writes (and may read):
    /// the launch is ordered after every other stream's use of it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let mut batch = wirespeed_cuda::DeviceBuffer::<u8>::zeroed(&wirespeed_cuda::Device::get(0)?, 4096)?;
    /// let mut tail = batch.slice_mut(1024..)?;
    /// let args = wirespeed_cuda::KernelArgs::new().write(&mut tail);
    /// assert_eq!(args.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn write<T: Pod>(mut self, dst: &'a mut (impl DeviceSink<T> + ?Sized)) -> Self {
        let (ptr, len, fence, device) = dst.device_dst(TOKEN);
        let param = self.push(ptr as u64);
        let fence: &'a Fence = fence;
        self.uses.push(ArgUse { fence, span: span_of(ptr, len), access: Access::Write, device: Some(device), param });
        self
    }

    /// Appends a pointer to device memory the kernel only reads: the launch
    /// is ordered after every other stream's write of it.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let offsets = wirespeed_cuda::DeviceBuffer::<u64>::zeroed(&wirespeed_cuda::Device::get(0)?, 256)?;
    /// let args = wirespeed_cuda::KernelArgs::new().read(&offsets);
    /// assert_eq!(args.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn read<T: Pod>(mut self, src: &'a (impl DeviceSource<T> + ?Sized)) -> Self {
        let (ptr, len, fence, device) = src.device_src(TOKEN);
        let param = self.push(ptr as u64);
        self.uses.push(ArgUse { fence, span: span_of(ptr, len), access: Access::Read, device: Some(device), param });
        self
    }

    /// Appends a pointer to pinned or registered host memory that the kernel
    /// reads in place, over the bus: the kernel gets the address the device
    /// sees it at (`cudaHostGetDevicePointer` on the stream's device, at
    /// launch; the host address itself on systems where the two agree). The
    /// launch is ordered after every other stream's write of it.
    ///
    /// The memory must be mapped for the device: pinned memory always is
    /// where the device has unified addressing (every 64-bit CUDA 12 or 13
    /// system), and registered memory where the runtime maps it (ask for it
    /// with [`RegisterFlags::mapped`](crate::RegisterFlags::mapped)); the
    /// launch fails with `cudaHostGetDevicePointer`'s error otherwise.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let records = wirespeed_cuda::PinnedBuffer::<u8>::new(1 << 16)?;
    /// let args = wirespeed_cuda::KernelArgs::new().read_host(&records);
    /// assert_eq!(args.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn read_host<T: Pod>(mut self, src: &'a (impl HostSource<T> + ?Sized)) -> Self {
        let (ptr, len, fence) = src.host_src(TOKEN);
        // An empty span is passed as null (the kernel may touch none of it).
        let param = self.push(if len == 0 { 0 } else { ptr as u64 });
        self.uses.push(ArgUse { fence, span: span_of(ptr, len), access: Access::Read, device: None, param });
        self
    }

    /// Appends a plain value of at most 8 bytes (an integer, a float, a
    /// small array), passed by value in an 8-byte slot, zero-padded: the
    /// kernel's parameter may be narrower (a `u32` reads the first 4 bytes).
    /// A wider `T` is reported by the launch.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let args = wirespeed_cuda::KernelArgs::new().value(2883u64).value(0.5f32).value([1u8, 2, 3]);
    /// assert_eq!(args.len(), 3);
    /// # Ok(()) }
    /// ```
    pub fn value<T: Pod>(mut self, v: T) -> Self {
        let size = size_of::<T>();
        if size > size_of::<u64>() {
            let n = self.params.len();
            self.error.get_or_insert_with(|| {
                Error::invalid(
                    "KernelArgs::value",
                    format!(
                        "parameter {n} is a {} of {size} bytes: a value takes one 8-byte slot; pass larger data in \
                         device memory",
                        std::any::type_name::<T>()
                    ),
                )
            });
        }
        let mut slot = 0u64;
        // SAFETY: `T` is Pod (no padding, any bytes valid to read) and at
        // most 8 bytes are copied (`min`) into the 8-byte slot; the two do
        // not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), (&raw mut slot).cast::<u8>(), size.min(8));
        }
        self.push(slot);
        self
    }

    fn push(&mut self, slot: u64) -> usize {
        self.params.push(slot);
        self.params.len() - 1
    }

    /// Checks the list for a launch on `device`: the first mistake found
    /// while building, then that every device pointer is memory of `device`.
    pub(crate) fn check(&self, call: &'static str, device: Device) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        match self.uses.iter().find(|u| u.device.is_some_and(|d| d != device)) {
            Some(u) => Err(Error::invalid(
                call,
                format!(
                    "parameter {} is memory of device {}, but the stream is on device {}",
                    u.param,
                    u.device.map_or(0, |d| d.ordinal()),
                    device.ordinal()
                ),
            )),
            None => Ok(()),
        }
    }

    /// Fills in the device addresses of the host memory parameters, with
    /// the launch's device current.
    pub(crate) fn resolve_host(&mut self) -> Result<()> {
        for u in self.uses.iter().filter(|u| u.device.is_none() && !u.span.is_empty()) {
            let at = super::checks::host_device_pointer(u.span.start as *const c_void);
            if at.is_err() {
                crate::raw::clear_last_error(); // reported here
            }
            self.params[u.param] = at? as u64;
        }
        Ok(())
    }

    /// The fences the launch records in, with the spans and how it uses them.
    pub(crate) fn fence_uses(&self) -> impl Iterator<Item = FenceUse<'a>> + '_ {
        self.uses.iter().map(|u| FenceUse { fence: u.fence, span: u.span.clone(), access: u.access })
    }

    /// One pointer per parameter, to its slot, as `cudaLaunchKernel` takes
    /// them; valid while `self` is neither moved nor changed.
    pub(crate) fn param_pointers(&mut self) -> Vec<*mut c_void> {
        self.params.iter_mut().map(|p| std::ptr::from_mut(p).cast::<c_void>()).collect()
    }
}
