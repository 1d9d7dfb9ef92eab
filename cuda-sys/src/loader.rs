//! Finding and loading `libcudart` at run time (dlopen through libc).

use crate::libraries::{DRIVER_LIBRARY, RUNTIME_PATH_ENV, SEARCH_ORDER, dlerror_text};
use crate::{Api, cudaError_t};
use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// Why no runtime could be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// None of the candidates could be opened: each with the loader's message.
    NotFound {
        /// `(candidate, dlerror text)` for every candidate tried.
        tried: Vec<(String, String)>,
    },
    /// The library opened but lacks a function the table needs.
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The symbol that was looked up.
        symbol: String,
    },
    /// `cudaRuntimeGetVersion` failed, so the symbol set cannot be chosen.
    Version {
        /// The library that was opened.
        library: String,
        /// The raw error code it returned.
        code: u32,
    },
    /// A path contained a NUL byte.
    BadPath(String),
    /// [`set_runtime_path`] was called after the runtime had been loaded.
    AlreadyLoaded {
        /// The library already in use.
        library: String,
    },
    /// The library is a CUDA runtime of a major version these bindings do not
    /// describe (only 12 and 13 are), or the `link` feature found one other
    /// than 13: its structures may differ, so it is not used.
    UnsupportedVersion {
        /// The library that was opened.
        library: String,
        /// What `cudaRuntimeGetVersion` said (`1000 * major + 10 * minor`).
        version: i32,
    },
    /// The CUDA driver API could not be reached ([`crate::driver()`]): each way
    /// tried, with why it failed.
    NoDriver {
        /// `(way, why)`: the runtime's `cudaGetDriverEntryPointByVersion`, then
        /// `libcuda.so.1`.
        tried: Vec<(String, String)>,
    },
    /// The driver lacks a function of [`DriverApi`](crate::DriverApi) at the
    /// ABI version the bindings use.
    MissingDriverSymbol {
        /// Where it was looked up.
        source: String,
        /// The versioned symbol (`"cuCtxCreate_v2"`).
        symbol: String,
        /// The ABI version asked for (3020 for `cuCtxCreate_v2`).
        version: u32,
        /// What the lookup said.
        why: String,
    },
    /// The runtime lacks an optional function that one of its features needs
    /// (it predates the function): [`Runtime::library_api`]'s library
    /// functions, which CUDA 12 runtimes gained in 12.5.
    RuntimeTooOld {
        /// The runtime library.
        library: String,
        /// Its version (`1000 * major + 10 * minor`).
        version: i32,
        /// The function it lacks (`"cudaLibraryLoadData"`).
        symbol: String,
        /// What needs it (`"loading kernels at run time"`).
        needed_for: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound { tried } => {
                write!(f, "no CUDA runtime library could be loaded; tried")?;
                for (name, why) in tried {
                    write!(f, " {name} ({why});")?;
                }
                write!(
                    f,
                    " install the CUDA runtime (libcudart.so.13 or .so.12, e.g. `pip install nvidia-cuda-runtime`) \
                     or point {RUNTIME_PATH_ENV} at a libcudart.so"
                )
            }
            LoadError::MissingSymbol { library, symbol } => write!(
                f,
                "{library} has no symbol {symbol}: it is not a CUDA 12 or 13 runtime; point {RUNTIME_PATH_ENV} at one"
            ),
            LoadError::Version { library, code } => {
                write!(f, "{library}: cudaRuntimeGetVersion failed with code {code}")
            }
            LoadError::BadPath(p) => write!(f, "runtime path {p:?} contains a NUL byte"),
            LoadError::AlreadyLoaded { library } => {
                write!(f, "the CUDA runtime is already loaded from {library}; set the path before first use")
            }
            LoadError::UnsupportedVersion { library, version } => write!(
                f,
                "{library} is CUDA runtime {}.{}; these bindings support 12 and 13 (with the `link` feature: 13); \
                 install one of those, or point {RUNTIME_PATH_ENV} at one",
                version / 1000,
                version % 1000 / 10
            ),
            LoadError::NoDriver { tried } => {
                write!(f, "the CUDA driver API could not be reached; tried")?;
                for (way, why) in tried {
                    write!(f, " {way} ({why});")?;
                }
                write!(f, " install or update the NVIDIA driver (it provides {DRIVER_LIBRARY})")
            }
            LoadError::MissingDriverSymbol { source, symbol, version, why } => write!(
                f,
                "{source}: no driver function {symbol} (ABI version {}.{}): {why}; update the NVIDIA driver",
                version / 1000,
                version % 1000 / 10
            ),
            LoadError::RuntimeTooOld { library, version, symbol, needed_for } => write!(
                f,
                "{library} (CUDA runtime {}.{}) has no {symbol}, which {needed_for} needs: use a CUDA runtime \
                 12.5 or later (13 has it), e.g. `pip install 'nvidia-cuda-runtime-cu12>=12.5'`, and point \
                 {RUNTIME_PATH_ENV} at its libcudart.so",
                version / 1000,
                version % 1000 / 10
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// A loaded CUDA runtime: its function table, version and where it came from.
///
/// Runtimes are never unloaded: [`Runtime::load`] returns a `&'static`, so the
/// function pointers stay valid for the life of the process.
pub struct Runtime {
    api: Api,
    version: i32,
    path: String,
    /// The `dlopen` handle (never closed), for functions outside [`Api`]; 0 for
    /// the runtime linked at build time (looked up in the global scope).
    handle: usize,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("path", &self.path).field("version", &self.version).finish()
    }
}

/// The major versions whose headers these bindings were generated from.
const SUPPORTED_MAJORS: [i32; 2] = [12, 13];

impl Runtime {
    /// Loads the runtime library at `path` (a path, or a name the dynamic loader
    /// resolves) and resolves every entry point of [`Api`].
    ///
    /// ```
    /// // A name that does not exist gives a typed error, never a panic.
    /// // SAFETY: had it existed, it would have been a CUDA runtime.
    /// let err = unsafe { wirespeed_cuda_sys::Runtime::load("libcudart-that-does-not-exist.so") }.unwrap_err();
    /// assert!(matches!(err, wirespeed_cuda_sys::LoadError::NotFound { .. }));
    /// ```
    ///
    /// # Safety
    /// `path` must name a genuine CUDA runtime library (`libcudart`). Loading
    /// runs its initializers, and every function is then called through the
    /// signatures of the CUDA 12 or 13 headers: another library exporting the
    /// same names would be called with the wrong types. What is checked: the
    /// version (12 or 13, else [`LoadError::UnsupportedVersion`]) and that every
    /// symbol exists; what cannot be: that the symbols are what they say. (As
    /// with `libloading::Library::new`, which is `unsafe` for the same reason.)
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when it cannot be opened, [`LoadError::MissingSymbol`]
    /// when a function is missing, [`LoadError::UnsupportedVersion`].
    pub unsafe fn load(path: &str) -> Result<&'static Runtime, LoadError> {
        let c = CString::new(path).map_err(|_| LoadError::BadPath(path.to_string()))?;
        // SAFETY: `c` is a valid NUL-terminated string; dlopen has no other
        // preconditions. Loading runs the library's initializers, which is
        // what loading a CUDA runtime means.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::NotFound { tried: vec![(path.to_string(), dlerror_text())] });
        }
        let lookup = |name: &'static str| -> *mut c_void {
            // SAFETY: `handle` is a live handle (never closed) and `name` is
            // NUL-terminated (the generated table appends `\0`).
            unsafe { libc::dlsym(handle, name.as_ptr().cast()) }
        };
        let missing = |symbol: &str| LoadError::MissingSymbol {
            library: path.to_string(),
            symbol: symbol.trim_end_matches('\0').to_string(),
        };
        let get_version = lookup("cudaRuntimeGetVersion\0");
        if get_version.is_null() {
            return Err(missing("cudaRuntimeGetVersion"));
        }
        // SAFETY: the caller vouched that this is a CUDA runtime, whose
        // cudaRuntimeGetVersion has the C signature `cudaError_t (int *)`.
        let get_version: unsafe extern "C" fn(*mut i32) -> cudaError_t = unsafe { std::mem::transmute(get_version) };
        let mut version = 0;
        // SAFETY: `version` is a valid place to write an int.
        let code = unsafe { get_version(&mut version) };
        if code.0 != 0 {
            return Err(LoadError::Version { library: path.to_string(), code: code.0 });
        }
        if !SUPPORTED_MAJORS.contains(&(version / 1000)) {
            return Err(LoadError::UnsupportedVersion { library: path.to_string(), version });
        }
        // SAFETY: every symbol comes from this runtime library, which is never
        // unloaded, and the table selects the names for its major version.
        let api = unsafe { Api::resolve(version / 1000, lookup) }.map_err(missing)?;
        Ok(Box::leak(Box::new(Runtime { api, version, path: path.to_string(), handle: handle as usize })))
    }

    /// Loads the first library that opens from: `explicit`, then the
    /// [`RUNTIME_PATH_ENV`] variable, then [`SEARCH_ORDER`]. A candidate that
    /// opens but is broken (a missing symbol) stops the search with that error.
    ///
    /// # Safety
    /// As [`Runtime::load`], for `explicit`. The environment variable and the
    /// library names are trusted as the dynamic loader trusts
    /// `LD_LIBRARY_PATH`: they name the process's CUDA runtime.
    ///
    /// # Errors
    /// [`LoadError::NotFound`] listing every candidate and why it failed.
    pub unsafe fn search(explicit: Option<&str>) -> Result<&'static Runtime, LoadError> {
        let env = std::env::var(RUNTIME_PATH_ENV).ok().filter(|s| !s.is_empty());
        let candidates =
            explicit.into_iter().map(str::to_string).chain(env).chain(SEARCH_ORDER.iter().map(|s| s.to_string()));
        let mut tried = Vec::new();
        for cand in candidates {
            // SAFETY: the caller's contract for `explicit`; the environment and
            // the names are the process's configuration (see above).
            match unsafe { Runtime::load(&cand) } {
                Ok(rt) => return Ok(rt),
                Err(LoadError::NotFound { tried: t }) => tried.extend(t),
                Err(e) => return Err(e),
            }
        }
        Err(LoadError::NotFound { tried })
    }

    /// The runtime linked at build time (feature `link`), bound to the CUDA 13
    /// symbols: a runtime of another major version is refused.
    ///
    /// # Errors
    /// [`LoadError::Version`] when `cudaRuntimeGetVersion` fails,
    /// [`LoadError::UnsupportedVersion`] for a runtime other than 13.
    #[cfg(feature = "link")]
    #[cfg_attr(docsrs, doc(cfg(feature = "link")))]
    pub fn linked() -> Result<&'static Runtime, LoadError> {
        static LINKED: OnceLock<Result<Runtime, LoadError>> = OnceLock::new();
        let library = || "linked libcudart".to_string();
        LINKED
            .get_or_init(|| {
                let api = Api::linked();
                let mut version = 0;
                // SAFETY: `version` is a valid place to write an int.
                let code = unsafe { (api.cudaRuntimeGetVersion)(&mut version) };
                if code.0 != 0 {
                    return Err(LoadError::Version { library: library(), code: code.0 });
                }
                if version / 1000 != 13 {
                    return Err(LoadError::UnsupportedVersion { library: library(), version });
                }
                Ok(Runtime { api, version, path: library(), handle: 0 })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The function table.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The runtime version, `1000 * major + 10 * minor` (13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The major version (12 or 13).
    pub fn major(&self) -> i32 {
        self.version / 1000
    }

    /// The path or name the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The address of `name` (NUL-terminated) in this runtime, or null: for the
    /// functions that only some supported runtimes export (not in [`Api`]).
    pub(crate) fn optional_symbol(&self, name: &std::ffi::CStr) -> *mut c_void {
        let handle = if self.handle == 0 { libc::RTLD_DEFAULT } else { self.handle as *mut c_void };
        // SAFETY: `handle` is this runtime's live handle (never closed), or the
        // global scope, which holds the linked runtime; `name` is NUL-terminated.
        unsafe { libc::dlsym(handle, name.as_ptr()) }
    }

    /// The name of an error code (`"cudaErrorInvalidValue"`), from the runtime.
    pub fn error_name(&self, code: cudaError_t) -> String {
        // SAFETY: cudaGetErrorName accepts any code and returns a static
        // NUL-terminated string (or null, handled).
        cstr_or(unsafe { (self.api.cudaGetErrorName)(code) }, code)
    }

    /// The description of an error code, from the runtime.
    pub fn error_string(&self, code: cudaError_t) -> String {
        // SAFETY: as for cudaGetErrorName.
        cstr_or(unsafe { (self.api.cudaGetErrorString)(code) }, code)
    }
}

fn cstr_or(p: *const std::ffi::c_char, code: cudaError_t) -> String {
    if p.is_null() {
        format!("cudaError({})", code.0)
    } else {
        // SAFETY: non-null pointers from cudaGetErrorName/String are static
        // NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The path given to [`set_runtime_path`], and whether the process-wide load
/// has begun (after which the path can no longer change what is loaded).
struct Explicit {
    path: Option<String>,
    started: bool,
}

static EXPLICIT: Mutex<Explicit> = Mutex::new(Explicit { path: None, started: false });
static GLOBAL: OnceLock<Result<&'static Runtime, LoadError>> = OnceLock::new();

/// Sets the library the process-wide [`runtime`] loads, before its first use.
///
/// ```
/// // Before anything used the runtime:
/// // SAFETY: the path names a CUDA runtime.
/// let _ = unsafe { wirespeed_cuda_sys::set_runtime_path("/opt/cuda/lib64/libcudart.so.13") };
/// ```
///
/// # Safety
/// As [`Runtime::load`]: `path` must name a genuine CUDA runtime library.
///
/// # Errors
/// [`LoadError::AlreadyLoaded`] once the runtime is loaded (or being loaded,
/// on another thread).
pub unsafe fn set_runtime_path(path: impl Into<String>) -> Result<(), LoadError> {
    let mut g = EXPLICIT.lock().unwrap_or_else(|p| p.into_inner());
    if g.started {
        let library = match GLOBAL.get() {
            Some(Ok(r)) => r.path().to_string(),
            Some(Err(_)) => "<failed load>".into(),
            None => "<being loaded on another thread>".into(),
        };
        return Err(LoadError::AlreadyLoaded { library });
    }
    g.path = Some(path.into());
    Ok(())
}

/// The process-wide runtime, loaded on first use from (in order) the path given
/// to [`set_runtime_path`], the [`RUNTIME_PATH_ENV`] variable, then (feature
/// `link`) the library linked at build time, else `libcudart.so.13`,
/// `libcudart.so.12` and `libcudart.so`. The outcome of the first attempt is kept.
///
/// # Errors
/// The [`LoadError`] of that first attempt.
pub fn runtime() -> Result<&'static Runtime, LoadError> {
    GLOBAL
        .get_or_init(|| {
            let explicit = {
                let mut g = EXPLICIT.lock().unwrap_or_else(|p| p.into_inner());
                g.started = true; // a later set_runtime_path is refused, not ignored
                g.path.clone()
            };
            #[cfg(feature = "link")]
            if explicit.is_none() && std::env::var_os(RUNTIME_PATH_ENV).is_none_or(|v| v.is_empty()) {
                return Runtime::linked();
            }
            // SAFETY: `explicit` came through the unsafe `set_runtime_path`,
            // whose caller vouched for it; the rest is the process's configuration.
            unsafe { Runtime::search(explicit.as_deref()) }
        })
        .clone()
}
