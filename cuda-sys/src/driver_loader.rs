//! Reaching the few CUDA driver API functions of [`DriverApi`] at run time.

use crate::driver::CUresult;
use crate::libraries::{DRIVER_LIBRARY, dlerror_text};
use crate::loader::{LoadError, Runtime, runtime};
use crate::{DriverApi, cudaDriverEntryPointQueryResult, cudaError, cudaGetDriverEntryPointFlags};
use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::sync::OnceLock;

/// The driver functions of [`DriverApi`], resolved once, and where they came from.
///
/// Like [`Runtime`], a `Driver` is never unloaded: the loaders return a
/// `&'static`, so the function pointers stay valid for the life of the process.
pub struct Driver {
    api: DriverApi,
    source: String,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").field("source", &self.source).finish()
    }
}

impl Driver {
    /// The driver functions handed out by `runtime`'s
    /// `cudaGetDriverEntryPointByVersion`, each asked for at the ABI version of
    /// [`DRIVER_SYMBOLS`](crate::DRIVER_SYMBOLS). The emulated runtime and a real CUDA 12.5+ or 13
    /// runtime take this path.
    ///
    /// ```
    /// # #[cfg(feature = "emulator")] {
    /// let rt = wirespeed_cuda_sys::emulator::load().unwrap();
    /// let drv = wirespeed_cuda_sys::Driver::from_runtime(rt).unwrap();
    /// assert!(drv.source().contains("cudaGetDriverEntryPointByVersion"));
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LoadError::MissingSymbol`] when the runtime lacks
    /// `cudaGetDriverEntryPointByVersion` (before 12.5), [`LoadError::NoDriver`]
    /// when that lookup fails (no driver: `cudaErrorInsufficientDriver`),
    /// [`LoadError::MissingDriverSymbol`] when the driver lacks a function.
    ///
    /// `cudaGetDriverEntryPoint` (without a version) is never used: it answers
    /// at the runtime's own version, where `cuCtxCreate` has another ABI (the
    /// `_v3` of 11.4, the `_v4` of 12.5).
    pub fn from_runtime(rt: &'static Runtime) -> Result<&'static Driver, LoadError> {
        const NAME: &CStr = c"cudaGetDriverEntryPointByVersion";
        let source = format!("cudaGetDriverEntryPointByVersion of {}", rt.path());
        let p = rt.optional_symbol(NAME);
        if p.is_null() {
            return Err(LoadError::MissingSymbol {
                library: rt.path().to_string(),
                symbol: NAME.to_string_lossy().into_owned(),
            });
        }
        // SAFETY: the symbol comes from a CUDA runtime (the contract under which
        // `rt` was loaded), whose cudaGetDriverEntryPointByVersion has this C
        // signature in the 12 and 13 headers (the generator checks both).
        let get = unsafe { std::mem::transmute::<*mut c_void, crate::PFN_cudaGetDriverEntryPointByVersion>(p) };
        let mut why = String::new();
        let mut failed = (String::new(), 0);
        let mut call_failed = false;
        let lookup = |symbol: &'static str, base: &'static str, version: u32| {
            let mut f = std::ptr::null_mut();
            let mut status = cudaDriverEntryPointQueryResult::cudaDriverEntryPointSuccess;
            // SAFETY: `base` is NUL-terminated (the generated table appends
            // `\0`); `f` and `status` are valid places.
            let code = unsafe {
                get(
                    base.as_ptr().cast::<c_char>(),
                    &mut f,
                    version,
                    u64::from(cudaGetDriverEntryPointFlags::cudaEnableLegacyStream.0),
                    &mut status,
                )
            };
            if code != cudaError::cudaSuccess || f.is_null() {
                call_failed = code != cudaError::cudaSuccess;
                why = if call_failed {
                    format!("it returned {} ({})", rt.error_name(code), rt.error_string(code))
                } else if status == cudaDriverEntryPointQueryResult::cudaDriverEntryPointVersionNotSufficent {
                    "the driver has it, but not at this ABI version".to_string()
                } else {
                    "the driver does not have it".to_string()
                };
                failed = (symbol.trim_end_matches('\0').to_string(), version);
                return std::ptr::null_mut();
            }
            f
        };
        // SAFETY: every address comes from the runtime's entry point lookup,
        // asked for the base name at the ABI version of that field; the
        // runtime is never unloaded.
        let api = unsafe { DriverApi::resolve(lookup) };
        match api {
            Ok(api) => Ok(Box::leak(Box::new(Driver { api, source }))),
            // The lookup itself failed (no driver, or one too old for the runtime).
            Err(_) if call_failed => Err(LoadError::NoDriver { tried: vec![(source, why)] }),
            Err(_) => Err(LoadError::MissingDriverSymbol { source, symbol: failed.0, version: failed.1, why }),
        }
    }

    /// The driver functions of the library at `path` (`libcuda.so.1`, or a
    /// library exporting the same versioned symbols), found with `dlsym` by their
    /// versioned names (`cuCtxCreate_v2`).
    ///
    /// ```
    /// // Without an NVIDIA driver: a typed error, never a panic.
    /// // SAFETY: had it existed, it would have been the driver library.
    /// match unsafe { wirespeed_cuda_sys::Driver::load_library("libcuda-that-does-not-exist.so.1") } {
    ///     Err(e) => assert!(matches!(e, wirespeed_cuda_sys::LoadError::NotFound { .. })),
    ///     Ok(_) => unreachable!(),
    /// }
    /// ```
    ///
    /// # Safety
    /// `path` must name the NVIDIA driver library (or one with its ABI, such as
    /// the emulated runtime): every symbol of [`DRIVER_SYMBOLS`](crate::DRIVER_SYMBOLS) found there is
    /// called with the signature of the driver headers.
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when it cannot be opened,
    /// [`LoadError::MissingDriverSymbol`] when a function is missing.
    pub unsafe fn load_library(path: &str) -> Result<&'static Driver, LoadError> {
        let c = CString::new(path).map_err(|_| LoadError::BadPath(path.to_string()))?;
        // SAFETY: a valid NUL-terminated name; loading runs the library's
        // initializers, which is what loading the driver means.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::NotFound { tried: vec![(path.to_string(), dlerror_text())] });
        }
        let mut failed = (String::new(), 0);
        let lookup = |symbol: &'static str, _: &'static str, version: u32| {
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, symbol.as_ptr().cast::<c_char>()) };
            if p.is_null() {
                failed = (symbol.trim_end_matches('\0').to_string(), version);
            }
            p
        };
        // SAFETY: the caller vouched that the library is the driver; its
        // versioned symbols have the ABI of the table's types; it is never closed.
        let api = unsafe { DriverApi::resolve(lookup) };
        match api {
            Ok(api) => Ok(Box::leak(Box::new(Driver { api, source: path.to_string() }))),
            Err(_) => Err(LoadError::MissingDriverSymbol {
                source: path.to_string(),
                symbol: failed.0,
                version: failed.1,
                why: "the library does not export it".to_string(),
            }),
        }
    }

    /// The function table.
    pub fn api(&self) -> &DriverApi {
        &self.api
    }

    /// Where the functions came from: `cudaGetDriverEntryPointByVersion of
    /// <runtime>`, or the library's path.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The name of a driver error code (`"CUDA_ERROR_INVALID_VALUE"`), or
    /// `CUresult(<n>)` for a code the driver does not know.
    pub fn error_name(&self, code: CUresult) -> String {
        self.text(self.api.cuGetErrorName, code)
    }

    /// The driver's description of an error code, or `CUresult(<n>)`.
    pub fn error_string(&self, code: CUresult) -> String {
        self.text(self.api.cuGetErrorString, code)
    }

    fn text(&self, f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult, code: CUresult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName/String accept any code and write a static
        // NUL-terminated string or fail; `p` is a valid place.
        let r = unsafe { f(code, &mut p) };
        if r.0 != 0 || p.is_null() {
            return format!("CUresult({})", code.0);
        }
        // SAFETY: non-null strings from cuGetErrorName/String are static and NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The process-wide driver functions, resolved on first use: through the
/// process-wide [`runtime()`]'s `cudaGetDriverEntryPointByVersion` (so that the
/// emulated runtime and a real one take the same path), else, when a real
/// runtime lacks it (before 12.5), cannot answer, or does not load, from
/// [`DRIVER_LIBRARY`] by the versioned names. The emulated runtime's answer is
/// final: a program never mixes it with a real driver. The outcome of the first
/// attempt is kept.
///
/// ```
/// match wirespeed_cuda_sys::driver() {
///     Ok(d) => println!("driver functions from {}", d.source()),
///     Err(e) => println!("no CUDA driver API: {e}"),
/// }
/// ```
///
/// # Errors
/// [`LoadError::NoDriver`] listing each way tried and why it failed, or
/// [`LoadError::MissingDriverSymbol`] when the driver lacks a function.
pub fn driver() -> Result<&'static Driver, LoadError> {
    static DRIVER: OnceLock<Result<&'static Driver, LoadError>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let mut tried = Vec::new();
            match runtime() {
                Ok(rt) => match Driver::from_runtime(rt) {
                    Ok(d) => return Ok(d),
                    // The emulator (it exports its controls) is never mixed with a real driver.
                    Err(e) if !rt.optional_symbol(c"cudaEmuGetCounters").is_null() => return Err(e),
                    Err(LoadError::MissingSymbol { library, symbol }) => {
                        tried.push((format!("{symbol} of {library}"), "the runtime does not export it".to_string()));
                    }
                    Err(LoadError::NoDriver { tried: t }) => tried.extend(t),
                    Err(e) => tried.push((format!("cudaGetDriverEntryPointByVersion of {}", rt.path()), e.to_string())),
                },
                Err(e) => tried.push(("the CUDA runtime".to_string(), e.to_string())),
            }
            // SAFETY: DRIVER_LIBRARY is the NVIDIA driver's library name, trusted as
            // the dynamic loader trusts its search path.
            match unsafe { Driver::load_library(DRIVER_LIBRARY) } {
                Ok(d) => Ok(d),
                Err(LoadError::NotFound { tried: t }) => {
                    tried.extend(t);
                    Err(LoadError::NoDriver { tried })
                }
                Err(e) => Err(e),
            }
        })
        .clone()
}
