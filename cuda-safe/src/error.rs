//! Errors: every fallible call returns [`Result`], never panics.

use std::fmt;
use wirespeed_cuda_sys::driver::CUresult;
use wirespeed_cuda_sys::{LoadError, cudaError, cudaError_t};

/// The result of every fallible call of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA runtime call returned an error.
    Cuda {
        /// The runtime function that failed (`"cudaHostRegister"`).
        call: &'static str,
        /// The raw `cudaError_t`.
        code: u32,
        /// Its enum name (`"cudaErrorInvalidValue"`).
        name: String,
        /// The runtime's description.
        message: String,
    },
    /// A CUDA driver API call returned an error (a
    /// [`RegistrationContext`](crate::RegistrationContext)'s calls).
    Driver {
        /// The driver function that failed (`"cuCtxCreate"`).
        call: &'static str,
        /// The raw `CUresult`.
        code: u32,
        /// Its enum name (`"CUDA_ERROR_DEVICE_UNAVAILABLE"`).
        name: String,
        /// The driver's description.
        message: String,
    },
    /// No CUDA runtime (or, for the driver calls, no driver API) could be loaded.
    Load(LoadError),
    /// An argument this crate checked before calling CUDA was wrong.
    InvalidArgument {
        /// The operation that refused it.
        call: &'static str,
        /// What was wrong.
        message: String,
    },
}

/// Codes after which the CUDA context is unusable: every later call fails and
/// the process must be restarted. The driver's `CUresult` has the same codes
/// for these errors.
///
/// ```
/// use wirespeed_cuda::sys::cudaError;
/// assert!(wirespeed_cuda::STICKY_CODES.contains(&cudaError::cudaErrorIllegalAddress.0));
/// ```
pub const STICKY_CODES: &[u32] = &[
    cudaError::cudaErrorIllegalAddress.0,
    cudaError::cudaErrorLaunchTimeout.0,
    cudaError::cudaErrorHardwareStackError.0,
    cudaError::cudaErrorIllegalInstruction.0,
    cudaError::cudaErrorMisalignedAddress.0,
    cudaError::cudaErrorInvalidAddressSpace.0,
    cudaError::cudaErrorInvalidPc.0,
    cudaError::cudaErrorLaunchFailure.0,
];

impl Error {
    /// Builds an error from a CUDA return code (`code` must not be success).
    /// Out of line and cold: the per-copy path then stays short.
    #[cold]
    #[inline(never)]
    pub(crate) fn cuda(call: &'static str, code: cudaError_t) -> Self {
        let (name, message) = match wirespeed_cuda_sys::runtime() {
            Ok(rt) => (rt.error_name(code), rt.error_string(code)),
            Err(_) => (format!("cudaError({})", code.0), String::new()),
        };
        Error::Cuda { call, code: code.0, name, message }
    }

    /// Builds an error from a driver return code (`code` must not be success).
    #[cold]
    #[inline(never)]
    pub(crate) fn driver(call: &'static str, code: CUresult) -> Self {
        let (name, message) = match wirespeed_cuda_sys::driver() {
            Ok(d) => (d.error_name(code), d.error_string(code)),
            Err(_) => (format!("CUresult({})", code.0), String::new()),
        };
        Error::Driver { call, code: code.0, name, message }
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn invalid(call: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument { call, message: message.into() }
    }

    /// The raw CUDA code, if this came from CUDA: a `cudaError_t` for a runtime
    /// call, a `CUresult` for a driver call ([`Error::Driver`]). The two agree on
    /// the codes this crate names (invalid value, out of memory, already
    /// registered, not registered, and the sticky ones): compare either with
    /// the runtime's [`cudaError`] constants.
    ///
    /// ```
    /// use wirespeed_cuda::sys::cudaError;
    /// # fn main() -> wirespeed_cuda::Result<()> {
    /// # wirespeed_cuda::sys::emulator::install()?; // the emulated runtime (see the crate docs)
    /// let pageable = vec![0u8; 64];
    /// let e = wirespeed_cuda::host_flags(pageable.as_ptr().cast()).unwrap_err(); // neither pinned nor registered
    /// assert_eq!(e.code(), Some(cudaError::cudaErrorInvalidValue.0));
    /// # Ok(()) }
    /// ```
    pub fn code(&self) -> Option<u32> {
        match self {
            Error::Cuda { code, .. } | Error::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The CUDA function or operation that failed.
    pub fn call(&self) -> &str {
        match self {
            Error::Cuda { call, .. } | Error::Driver { call, .. } | Error::InvalidArgument { call, .. } => call,
            Error::Load(_) => "loading the CUDA runtime",
        }
    }

    /// True when the CUDA context is lost: nothing on this device will work again
    /// in this process.
    ///
    /// ```
    /// use wirespeed_cuda::{Error, sys::cudaError};
    /// let code = cudaError::cudaErrorIllegalAddress.0;
    /// let name = "cudaErrorIllegalAddress".into();
    /// let e = Error::Cuda { call: "cudaMemcpyAsync", code, name, message: String::new() };
    /// assert!(e.is_sticky());
    /// ```
    pub fn is_sticky(&self) -> bool {
        self.code().is_some_and(|c| STICKY_CODES.contains(&c))
    }

    /// What to do about it, where there is something to say.
    pub fn hint(&self) -> Option<&'static str> {
        let code = match self {
            Error::Load(LoadError::NoDriver { .. } | LoadError::MissingDriverSymbol { .. }) => {
                return Some(
                    "no usable driver API for a registration context: register in the primary context (HostRegistration::new) instead",
                );
            }
            Error::Load(LoadError::RuntimeTooOld { .. }) => {
                return Some(
                    "this CUDA runtime predates run-time loaded kernels: use a 12.5 or later (or 13) runtime, \
                     e.g. set CUDA_SYS_RUNTIME to its libcudart.so",
                );
            }
            Error::Load(_) => return Some("install the CUDA runtime or set CUDA_SYS_RUNTIME to a libcudart.so"),
            Error::InvalidArgument { .. } => return None,
            Error::Driver { call: "cuCtxCreate", code, .. } if !STICKY_CODES.contains(code) => {
                return Some(
                    "a second context cannot be made on this device (exclusive-process compute mode, an MPS client, \
                     or no memory for it): fall back to registering in the primary context (HostRegistration::new)",
                );
            }
            Error::Driver { call: "cuMemHostUnregister", code, .. }
                if CUresult(*code) == CUresult::CUDA_ERROR_ILLEGAL_STATE =>
            {
                return Some(
                    "a copy still used the memory: a registration context's unregister does not wait for copies, \
                     wait for their events first",
                );
            }
            Error::Cuda { code, .. } | Error::Driver { code, .. } => *code,
        };
        // A driver code is read by its runtime namesake: the two agree on
        // every code named here (cuda-sys checks them).
        Some(match cudaError(code) {
            cudaError::cudaErrorMemoryAllocation => {
                "out of memory: free buffers, use smaller ones, or (pinned memory) pin less: a pinned ring or windows need only a few slots"
            }
            cudaError::cudaErrorInsufficientDriver => {
                "no usable NVIDIA driver: install one matching the runtime, or use the emulated runtime for tests"
            }
            cudaError::cudaErrorNoDevice => "no CUDA device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES",
            cudaError::cudaErrorInvalidDevice => "device index out of range: see Device::count()",
            cudaError::cudaErrorInvalidValue
                if self.call() == "cudaHostRegister" || self.call() == "cuMemHostRegister" =>
            {
                "cudaHostRegister refused the range: a read-only or file mapping needs the ReadOnly flag (PROT_READ + MAP_SHARED), and the range must be mapped"
            }
            cudaError::cudaErrorInvalidValue if self.call() == "cudaHostGetDevicePointer" => {
                "the host memory is not mapped for the device: allocate it pinned (PinnedBuffer) or register it \
                 with RegisterFlags::mapped"
            }
            cudaError::cudaErrorHostMemoryAlreadyRegistered => {
                "these pages are already registered: share the existing registration or register disjoint pages"
            }
            cudaError::cudaErrorHostMemoryNotRegistered => "this pointer is not the start of a registration",
            cudaError::cudaErrorNotReady => "the work has not finished yet",
            _ if STICKY_CODES.contains(&code) => "the CUDA context is lost (sticky error): restart the process",
            _ => return None,
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuda { call, code, name, message } | Error::Driver { call, code, name, message } => {
                write!(f, "{call} failed: {name} ({code}): {message}")?;
            }
            Error::Load(e) => write!(f, "{e}")?,
            Error::InvalidArgument { call, message } => write!(f, "{call}: {message}")?,
        }
        if let Some(h) = self.hint() {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Load(e) => Some(e),
            _ => None,
        }
    }
}

impl From<LoadError> for Error {
    fn from(e: LoadError) -> Self {
        Error::Load(e)
    }
}
