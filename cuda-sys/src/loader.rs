//! Finding and loading `libcudart` at run time (dlopen through libc).

use crate::{Api, cudaError_t};
use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// The environment variable naming the runtime library to load (a path or a
/// file name for the dynamic loader). It is tried before [`SEARCH_ORDER`].
pub const RUNTIME_PATH_ENV: &str = "CUDA_SYS_RUNTIME";

/// The library names tried, in order, after an explicit path.
pub const SEARCH_ORDER: &[&str] = &["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

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
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("path", &self.path).field("version", &self.version).finish()
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc,
    // valid until the next dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() { "unknown error".into() } else { CStr::from_ptr(e).to_string_lossy().into_owned() }
    }
}

impl Runtime {
    /// Loads the runtime library at `path` (a path, or a name the dynamic loader
    /// resolves) and resolves every entry point of [`Api`].
    ///
    /// ```
    /// // A name that does not exist gives a typed error, never a panic.
    /// let err = cuda_sys::Runtime::load("libcudart-that-does-not-exist.so").unwrap_err();
    /// assert!(matches!(err, cuda_sys::LoadError::NotFound { .. }));
    /// ```
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when it cannot be opened, [`LoadError::MissingSymbol`]
    /// when a function is missing.
    pub fn load(path: &str) -> Result<&'static Runtime, LoadError> {
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
        // SAFETY: the symbol is the runtime's cudaRuntimeGetVersion, whose C
        // signature is `cudaError_t (int *)`.
        let get_version: unsafe extern "C" fn(*mut i32) -> cudaError_t = unsafe { std::mem::transmute(get_version) };
        let mut version = 0;
        // SAFETY: `version` is a valid place to write an int.
        let code = unsafe { get_version(&mut version) };
        if code.0 != 0 {
            return Err(LoadError::Version { library: path.to_string(), code: code.0 });
        }
        // SAFETY: every symbol comes from this runtime library, which is never
        // unloaded, and the table selects the names for its major version.
        let api = unsafe { Api::resolve(version / 1000, lookup) }.map_err(missing)?;
        Ok(Box::leak(Box::new(Runtime { api, version, path: path.to_string() })))
    }

    /// Loads the first library that opens from: `explicit`, then the
    /// [`RUNTIME_PATH_ENV`] variable, then [`SEARCH_ORDER`]. A candidate that
    /// opens but is broken (a missing symbol) stops the search with that error.
    ///
    /// # Errors
    /// [`LoadError::NotFound`] listing every candidate and why it failed.
    pub fn search(explicit: Option<&str>) -> Result<&'static Runtime, LoadError> {
        let env = std::env::var(RUNTIME_PATH_ENV).ok().filter(|s| !s.is_empty());
        let candidates =
            explicit.into_iter().map(str::to_string).chain(env).chain(SEARCH_ORDER.iter().map(|s| s.to_string()));
        let mut tried = Vec::new();
        for cand in candidates {
            match Runtime::load(&cand) {
                Ok(rt) => return Ok(rt),
                Err(LoadError::NotFound { tried: t }) => tried.extend(t),
                Err(e) => return Err(e),
            }
        }
        Err(LoadError::NotFound { tried })
    }

    /// The runtime linked at build time (feature `link`), bound to the CUDA 13 symbols.
    #[cfg(feature = "link")]
    pub fn linked() -> &'static Runtime {
        static LINKED: OnceLock<Runtime> = OnceLock::new();
        LINKED.get_or_init(|| {
            let api = Api::linked();
            let mut version = 0;
            // SAFETY: `version` is a valid place to write an int.
            unsafe { (api.cudaRuntimeGetVersion)(&mut version) };
            Runtime { api, version, path: "linked libcudart".into() }
        })
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

static EXPLICIT: Mutex<Option<String>> = Mutex::new(None);
static GLOBAL: OnceLock<Result<&'static Runtime, LoadError>> = OnceLock::new();

/// Sets the library the process-wide [`runtime`] loads, before its first use.
///
/// ```
/// // Before anything used the runtime:
/// let _ = cuda_sys::set_runtime_path("/opt/cuda/lib64/libcudart.so.13");
/// ```
///
/// # Errors
/// [`LoadError::AlreadyLoaded`] once the runtime has been loaded.
pub fn set_runtime_path(path: impl Into<String>) -> Result<(), LoadError> {
    if let Some(r) = GLOBAL.get() {
        return Err(LoadError::AlreadyLoaded {
            library: r.as_ref().map(|r| r.path().to_string()).unwrap_or_else(|_| "<failed load>".into()),
        });
    }
    let mut g = EXPLICIT.lock().unwrap_or_else(|p| p.into_inner());
    *g = Some(path.into());
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
            let explicit = EXPLICIT.lock().unwrap_or_else(|p| p.into_inner()).clone();
            #[cfg(feature = "link")]
            if explicit.is_none() && std::env::var_os(RUNTIME_PATH_ENV).is_none_or(|v| v.is_empty()) {
                return Ok(Runtime::linked());
            }
            Runtime::search(explicit.as_deref())
        })
        .clone()
}
