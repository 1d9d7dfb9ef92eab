//! The libraries the loaders open: their names, where a path to the runtime
//! may be given, and the dynamic loader's message when opening fails.

use std::ffi::CStr;

/// The environment variable naming the runtime library to load (a path or a
/// file name for the dynamic loader). It is tried before [`SEARCH_ORDER`].
pub const RUNTIME_PATH_ENV: &str = "CUDA_SYS_RUNTIME";

/// The library names tried, in order, after an explicit path.
pub const SEARCH_ORDER: &[&str] = &["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

/// The NVIDIA driver library, opened when the runtime cannot hand out the
/// driver's functions.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// The dynamic loader's message for the last failed `dl*` call on this thread.
pub(crate) fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc,
    // valid until the next dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() { "unknown error".into() } else { CStr::from_ptr(e).to_string_lossy().into_owned() }
    }
}
