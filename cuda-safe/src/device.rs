//! Devices: enumeration, names, memory and the attributes that matter for copies.

use crate::error::{Error, Result};
use crate::raw;
use wirespeed_cuda_sys::cudaDeviceAttr;

/// One CUDA device, by ordinal. Every object made on a device remembers it and
/// makes it current before each call, so a value moved to another thread, or
/// two GPUs in one program, never use the wrong device.
///
/// ```
/// # fn main() -> wirespeed_cuda::Result<()> {
/// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
/// for d in wirespeed_cuda::Device::all()? {
///     let (free, total) = d.mem_info()?;
///     println!("{}: {} ({free} of {total} bytes free)", d.ordinal(), d.name()?);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    ordinal: i32,
}

impl Device {
    /// The number of visible devices. No driver, or no device, is an error
    /// from the runtime (`cudaErrorInsufficientDriver`, `cudaErrorNoDevice`).
    ///
    /// # Errors
    /// The runtime's error, e.g. `cudaErrorInsufficientDriver` without a driver.
    pub fn count() -> Result<usize> {
        Ok(usize::try_from(raw::device_count()?).unwrap_or(0))
    }

    /// All visible devices.
    ///
    /// # Errors
    /// As [`Device::count`].
    pub fn all() -> Result<Vec<Device>> {
        Ok((0..raw::device_count()?).map(|ordinal| Device { ordinal }).collect())
    }

    /// Device `ordinal`, checked against the device count.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the count when out of range.
    pub fn get(ordinal: usize) -> Result<Device> {
        let n = Device::count()?;
        if ordinal >= n {
            return Err(Error::invalid(
                "Device::get",
                format!("device {ordinal} does not exist: {n} device(s) visible"),
            ));
        }
        Ok(Device { ordinal: ordinal as i32 })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// The device the runtime has as current on the calling thread: the one
    /// this crate last made current there (every object makes its own device
    /// current before each call), one that other code set, or device 0 before
    /// any. What a registration that names no device belongs to.
    ///
    /// ```
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let dev = wirespeed_cuda::Device::get(0)?;
    /// dev.make_current()?;
    /// assert_eq!(wirespeed_cuda::Device::current()?, dev);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The runtime's error (`cudaGetDevice`).
    pub fn current() -> Result<Device> {
        Ok(Device { ordinal: raw::current_device()? })
    }

    /// Makes this device current on the calling thread.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn make_current(&self) -> Result<()> {
        raw::set_device(self.ordinal)
    }

    /// Makes this device current unless it is current on this thread. It
    /// asks the runtime (`cudaGetDevice`, a thread-local read there) rather
    /// than remembering what it set: other code on the thread (PyTorch's
    /// `torch.cuda.set_device`, say) may have made another device current
    /// since.
    /// Where the runtime cannot say (a sticky error: every call fails
    /// with it), the call that follows reports the error under its own name.
    #[inline]
    pub(crate) fn ensure_current(&self) -> Result<()> {
        match raw::current_device() {
            Ok(d) if d != self.ordinal => self.switch_to(),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn switch_to(&self) -> Result<()> {
        self.make_current()
    }

    /// The product name, as `nvidia-smi` shows it.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn name(&self) -> Result<String> {
        raw::device_name(self.ordinal)
    }

    /// `(free, total)` device memory in bytes.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.make_current()?;
        raw::mem_info()
    }

    /// One integer attribute.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn attribute(&self, attr: cudaDeviceAttr) -> Result<i32> {
        raw::device_attribute(attr, self.ordinal)
    }

    /// Whether `cudaHostRegister` works on this device.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn supports_host_register(&self) -> Result<bool> {
        Ok(self.attribute(cudaDeviceAttr::cudaDevAttrHostRegisterSupported)? != 0)
    }

    /// Whether read-only registration (`cudaHostRegisterReadOnly`, needed for
    /// file mappings) works on this device.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn supports_read_only_register(&self) -> Result<bool> {
        Ok(self.attribute(cudaDeviceAttr::cudaDevAttrHostRegisterReadOnlySupported)? != 0)
    }

    /// How many copy engines can run copies concurrently with kernels.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn async_engine_count(&self) -> Result<i32> {
        self.attribute(cudaDeviceAttr::cudaDevAttrAsyncEngineCount)
    }

    /// Whether host and device share one address space (unified addressing).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn unified_addressing(&self) -> Result<bool> {
        Ok(self.attribute(cudaDeviceAttr::cudaDevAttrUnifiedAddressing)? != 0)
    }

    /// `(least, greatest)` stream priorities; greater priority is the lower number.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.make_current()?;
        raw::stream_priority_range()
    }

    /// Waits for all work on this device.
    ///
    /// # Errors
    /// The runtime's error (including errors of earlier asynchronous work).
    pub fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        raw::device_synchronize()
    }
}

/// The loaded runtime's version and path, and the driver's version.
///
/// ```
/// match wirespeed_cuda::runtime_info() {
///     Ok(i) => println!("{i:?}"),
///     Err(e) => println!("{e}"),
/// }
/// ```
///
/// # Errors
/// [`Error::Load`] when no runtime can be loaded.
pub fn runtime_info() -> Result<RuntimeInfo> {
    let rt = wirespeed_cuda_sys::runtime()?;
    let driver = raw::driver_version()?;
    Ok(RuntimeInfo { runtime_version: rt.version(), driver_version: driver, path: rt.path().to_string() })
}

/// See [`runtime_info`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// `1000 * major + 10 * minor` of the runtime.
    pub runtime_version: i32,
    /// The newest version the driver supports; 0 without a driver.
    pub driver_version: i32,
    /// Where the runtime was loaded from.
    pub path: String,
}
