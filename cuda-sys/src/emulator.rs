//! The emulated CUDA runtime (feature `emulator`): a host-only `libcudart`
//! stand-in built from C by this crate's build script, for tests and CI on
//! machines without a GPU. Downstream crates can run their own CI on it.
//!
//! It exports the functions of [`Api`](crate::Api) with the real C ABI and
//! error codes, and behaves like the runtime where it matters for correctness:
//! streams run their work asynchronously on worker threads (with an optional
//! delay per operation, so a missing synchronization shows), events and
//! cross-stream waits order work, copies from pageable memory are staged
//! synchronously while copies from pinned or registered memory are truly
//! asynchronous, `cudaHostRegister` follows the real runtime's rules
//! (page rounding, `ReadOnly` needed for read-only mappings, no page registered
//! twice), device memory is bounds checked, and every live resource is counted.
//! Faults can be injected into the Nth call of any function.
//!
//! It also models the driver API slice of [`DriverApi`](crate::DriverApi), handed out by
//! its `cudaGetDriverEntryPointByVersion`: contexts made with `cuCtxCreate`
//! (a per-thread stack of current contexts), and `cuMemHostRegister` in them.
//! In such a second context, as with the real driver, unregistering does not
//! wait for the copies that read the memory: the emulator refuses an
//! unregistration while a queued or running copy still uses the range, prints
//! a line and counts it ([`unregister_violations`]), so a test proves the rule.
//!
//! Where it differs from real CUDA: see `cuda-sys/emu/DIFFERENCES.md`.
//!
//! ```
//! let rt = wirespeed_cuda_sys::emulator::load().expect("the emulator builds with this crate");
//! let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
//! let mut n = 0;
//! // SAFETY: `n` is a valid place for the count.
//! assert_eq!(unsafe { (rt.api().cudaGetDeviceCount)(&mut n) }.0, 0);
//! assert!(n >= 1);
//! assert_eq!(ctl.counters().device_allocs, 0);
//! ```

use crate::{LoadError, Runtime};
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// Where the build script put the emulated runtime (`libcudart_emu.so`).
/// Use [`library_path`], which also works where this path does not exist.
pub const LIBRARY_PATH: &str = env!("CUDA_SYS_EMULATOR_PATH");

/// The emulated runtime itself, embedded so that a binary carried to another
/// machine (without this build's folders) still has it.
static LIBRARY_BYTES: &[u8] = include_bytes!(env!("CUDA_SYS_EMULATOR_PATH"));

/// A path the emulated runtime can be loaded from: [`LIBRARY_PATH`] when it
/// exists, else a copy of the embedded library written once per process to the
/// temporary folder.
///
/// # Errors
/// [`LoadError::NotFound`] when the copy cannot be written, or when this is a
/// documentation-only build (`DOCS_RS` set), which compiles no emulator.
pub fn library_path() -> Result<String, LoadError> {
    static PATH: OnceLock<Result<String, LoadError>> = OnceLock::new();
    PATH.get_or_init(|| {
        if LIBRARY_BYTES.is_empty() {
            let why = "this is a documentation-only build (DOCS_RS was set): no emulated runtime was compiled";
            return Err(LoadError::NotFound { tried: vec![(LIBRARY_PATH.to_string(), why.to_string())] });
        }
        if std::path::Path::new(LIBRARY_PATH).is_file() {
            return Ok(LIBRARY_PATH.to_string());
        }
        // A new file (O_EXCL: never through a link someone put in the shared
        // temporary folder, never over a library another process has mapped).
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mut tried = Vec::new();
        for attempt in 0..16u32 {
            let name = format!("libcudart_emu-{}-{nanos:x}-{attempt}.so", std::process::id());
            let p = std::env::temp_dir().join(name);
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .and_then(|mut f| std::io::Write::write_all(&mut f, LIBRARY_BYTES));
            match written {
                Ok(()) => return Ok(p.display().to_string()),
                Err(e) => tried.push((p.display().to_string(), e.to_string())),
            }
        }
        Err(LoadError::NotFound { tried })
    })
    .clone()
}

/// Live resources and totals, as counted by the emulator.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Live `cudaMalloc` allocations.
    pub device_allocs: u64,
    /// Their bytes.
    pub device_bytes: u64,
    /// Live `cudaHostAlloc` allocations.
    pub pinned_allocs: u64,
    /// Their bytes.
    pub pinned_bytes: u64,
    /// Live `cudaHostRegister` ranges.
    pub registrations: u64,
    /// Their bytes, rounded out to pages.
    pub registered_bytes: u64,
    /// Live streams created by the program.
    pub streams: u64,
    /// Live events.
    pub events: u64,
    /// Stream operations executed so far.
    pub ops_executed: u64,
    /// Bytes moved by copies so far.
    pub bytes_copied: u64,
    /// Live contexts made with `cuCtxCreate` (not the primary ones).
    pub contexts: u64,
    /// `cuMemHostUnregister` calls in a created context refused so far because a
    /// queued or running copy still used the memory (and ranges `cuCtxDestroy`
    /// dropped under such a copy). Monotonic: never reset.
    pub unregister_violations: u64,
    /// Live libraries loaded with `cudaLibraryLoadData`.
    pub libraries: u64,
    /// Kernels run so far. Monotonic.
    pub kernel_launches: u64,
}

impl Counters {
    /// True when no allocation, registration, stream, event, created context or library is live.
    pub fn is_clean(&self) -> bool {
        self.libraries == 0
            && self.device_allocs == 0
            && self.pinned_allocs == 0
            && self.registrations == 0
            && self.streams == 0
            && self.events == 0
            && self.contexts == 0
    }
}

/// The emulator's control functions.
#[derive(Clone, Copy)]
pub struct Controls {
    get_counters: unsafe extern "C" fn(*mut Counters) -> c_int,
    set_delay_us: unsafe extern "C" fn(c_uint) -> c_int,
    hold: unsafe extern "C" fn(c_int) -> c_int,
    inject_fault: unsafe extern "C" fn(*const c_char, c_uint, c_int, c_int) -> c_int,
    reset: unsafe extern "C" fn() -> c_int,
    call_count: unsafe extern "C" fn(*const c_char) -> i64,
    set_context_create_error: unsafe extern "C" fn(c_int) -> c_int,
}

impl std::fmt::Debug for Controls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Controls")
    }
}

impl Controls {
    /// The live resources and totals.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        // SAFETY: `c` is a valid, correctly laid out `cudaEmuCounters`.
        unsafe { (self.get_counters)(&mut c) };
        c
    }

    /// Sets the delay each stream operation enqueued from now on waits before it runs.
    pub fn set_delay_us(&self, us: u32) {
        // SAFETY: plain value argument.
        unsafe { (self.set_delay_us)(us) };
    }

    /// `true`: the streams' workers start no further operation (one already
    /// running finishes) until `hold(false)` or [`Controls::reset`]. A test's
    /// way to keep work provably unfinished, whatever the machine's speed.
    ///
    /// ```
    /// let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
    /// ctl.hold(true);
    /// ctl.hold(false);
    /// ```
    pub fn hold(&self, on: bool) {
        // SAFETY: plain value argument.
        unsafe { (self.hold)(c_int::from(on)) };
    }

    /// Makes the `nth` call (1-based, from now) of `function` fail with `error`
    /// (a raw `cudaError_t` value); `sticky` also fails every later call until
    /// [`Controls::reset`]. Returns false for an unknown function name, and for
    /// `error` 0 (success): a call that reports success without doing its work
    /// would make safe code believe, say, that a copy had finished.
    pub fn inject_fault(&self, function: &str, nth: u32, error: u32, sticky: bool) -> bool {
        if error == 0 {
            return false;
        }
        let Ok(name) = CString::new(function) else { return false };
        // SAFETY: `name` is NUL-terminated and outlives the call.
        unsafe { (self.inject_fault)(name.as_ptr(), nth, error as c_int, c_int::from(sticky)) == 0 }
    }

    /// Clears pending faults, a sticky error and last errors, and ends a
    /// [`Controls::hold`]; resources stay.
    pub fn reset(&self) {
        // SAFETY: no arguments.
        unsafe { (self.reset)() };
    }

    /// Makes every `cuCtxCreate` from now on fail with the driver error `code`
    /// (a raw `CUresult`, e.g. 46, `CUDA_ERROR_DEVICE_UNAVAILABLE`, what
    /// exclusive-process compute mode gives), creating nothing; `None` lets them
    /// succeed again, as does [`Controls::reset`].
    ///
    /// ```
    /// let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
    /// ctl.fail_context_creation(Some(46));
    /// ctl.fail_context_creation(None);
    /// ```
    pub fn fail_context_creation(&self, code: Option<u32>) {
        // SAFETY: plain value argument.
        unsafe { (self.set_context_create_error)(code.unwrap_or(0) as c_int) };
    }

    /// How many unregistrations in a created context were refused because a
    /// copy still used the memory (see [`Counters::unregister_violations`]).
    ///
    /// ```
    /// let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
    /// assert_eq!(ctl.unregister_violations(), ctl.counters().unregister_violations);
    /// ```
    pub fn unregister_violations(&self) -> u64 {
        self.counters().unregister_violations
    }

    /// How many times `function` has been called so far, or `None` if unknown.
    pub fn call_count(&self, function: &str) -> Option<u64> {
        let name = CString::new(function).ok()?;
        // SAFETY: `name` is NUL-terminated and outlives the call.
        let n = unsafe { (self.call_count)(name.as_ptr()) };
        u64::try_from(n).ok()
    }
}

/// Loads the emulated runtime by path, once (a separate `&'static Runtime`; make
/// it the process-wide one with [`install`] instead).
///
/// # Errors
/// As [`Runtime::load`].
pub fn load() -> Result<&'static Runtime, LoadError> {
    static RT: OnceLock<Result<&'static Runtime, LoadError>> = OnceLock::new();
    // SAFETY: the library at `library_path` is this crate's own emulator, built
    // from cudart_emu.c with the CUDA 13 signatures and version.
    RT.get_or_init(|| unsafe { Runtime::load(&library_path()?) }).clone()
}

/// Makes the emulated runtime the process-wide one ([`crate::runtime`]),
/// before anything used the runtime. Safe, unlike [`crate::set_runtime_path`]:
/// the library is this crate's own.
///
/// ```
/// wirespeed_cuda_sys::emulator::install()?;
/// assert!(wirespeed_cuda_sys::runtime()?.path().contains("cudart_emu"));
/// # Ok::<(), wirespeed_cuda_sys::LoadError>(())
/// ```
///
/// # Errors
/// [`LoadError::AlreadyLoaded`] once the runtime is loaded; as [`library_path`].
pub fn install() -> Result<(), LoadError> {
    let path = library_path()?;
    // SAFETY: as in `load`: the library is this crate's emulator.
    unsafe { crate::set_runtime_path(path) }
}

/// The control functions of the emulator at [`library_path`] (loading it if needed).
///
/// # Errors
/// As [`Runtime::load`], or a missing control symbol.
pub fn controls() -> Result<Controls, LoadError> {
    static CONTROLS: OnceLock<Result<Controls, LoadError>> = OnceLock::new();
    CONTROLS
        .get_or_init(|| {
            let lib = library_path()?;
            let path = CString::new(lib.clone()).map_err(|_| LoadError::BadPath(lib.clone()))?;
            // SAFETY: a valid path; the handle is never closed.
            let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if h.is_null() {
                return Err(LoadError::NotFound { tried: vec![(lib, "dlopen failed".into())] });
            }
            let sym = |name: &str| -> Result<*mut c_void, LoadError> {
                let c = CString::new(name).map_err(|_| LoadError::BadPath(name.into()))?;
                // SAFETY: live handle, NUL-terminated name.
                let p = unsafe { libc::dlsym(h, c.as_ptr()) };
                if p.is_null() {
                    Err(LoadError::MissingSymbol { library: lib.clone(), symbol: name.into() })
                } else {
                    Ok(p)
                }
            };
            // SAFETY (all seven): the symbols are the emulator's control functions,
            // whose C signatures cudart_emu.h declares as these types.
            Ok(Controls {
                // SAFETY: see above.
                get_counters: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Counters) -> c_int>(sym("cudaEmuGetCounters")?) },
                // SAFETY: see above.
                set_delay_us: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_uint) -> c_int>(sym("cudaEmuSetDelayUs")?) },
                // SAFETY: see above.
                hold: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> c_int>(sym("cudaEmuHold")?) },
                // SAFETY: see above.
                inject_fault: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char, c_uint, c_int, c_int) -> c_int>(sym("cudaEmuInjectFault")?) },
                // SAFETY: see above.
                reset: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(sym("cudaEmuReset")?) },
                // SAFETY: see above.
                call_count: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char) -> i64>(sym("cudaEmuCallCount")?) },
                // SAFETY: see above.
                set_context_create_error: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> c_int>(sym("cudaEmuSetContextCreateError")?) },
            })
        })
        .clone()
}

/// The emulator's count of refused unregistrations (see
/// [`Counters::unregister_violations`]): 0 in a correct program.
///
/// ```
/// assert_eq!(wirespeed_cuda_sys::emulator::unregister_violations()?, 0);
/// # Ok::<(), wirespeed_cuda_sys::LoadError>(())
/// ```
///
/// # Errors
/// As [`controls`].
pub fn unregister_violations() -> Result<u64, LoadError> {
    Ok(controls()?.unregister_violations())
}

/// The emulator's driver functions, through its `cudaGetDriverEntryPointByVersion`
/// (loading it if needed, as [`load`]); [`crate::driver()`] gives the same ones
/// once the emulator is the process-wide runtime ([`install`]).
///
/// ```
/// let drv = wirespeed_cuda_sys::emulator::driver()?;
/// // SAFETY: no arguments but the flags, which must be 0.
/// assert_eq!(unsafe { (drv.api().cuInit)(0) }.0, 0);
/// # Ok::<(), wirespeed_cuda_sys::LoadError>(())
/// ```
///
/// # Errors
/// As [`load`] and [`Driver::from_runtime`](crate::Driver::from_runtime).
pub fn driver() -> Result<&'static crate::Driver, LoadError> {
    static DRIVER: OnceLock<Result<&'static crate::Driver, LoadError>> = OnceLock::new();
    DRIVER.get_or_init(|| crate::Driver::from_runtime(load()?)).clone()
}
