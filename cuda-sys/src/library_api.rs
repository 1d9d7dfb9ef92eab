//! The runtime's library functions (`cudaLibraryLoadData`,
//! `cudaLibraryGetKernel`, `cudaLibraryUnload`): not in [`Api`](crate::Api),
//! because CUDA 12 runtimes gained them during 12.x, so they are looked up
//! when first needed, by [`Runtime::library_api`].

use crate::loader::{LoadError, Runtime};
use crate::{PFN_cudaLibraryGetKernel, PFN_cudaLibraryLoadData, PFN_cudaLibraryUnload};
use std::ffi::{CStr, c_void};

/// The runtime functions that load device code at run time, independent of
/// contexts: one library serves every device. From [`Runtime::library_api`].
///
/// ```
/// # #[cfg(feature = "emulator")] {
/// let rt = wirespeed_cuda_sys::emulator::load().unwrap();
/// let lib = rt.library_api().expect("the emulator has the library functions");
/// let ptx = c".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry wirespeed_gather(\n)\n{\nret;\n}\n";
/// use std::ptr::null_mut;
/// let mut handle = null_mut();
/// // SAFETY: `handle` is a valid place; the code is NUL-terminated PTX text; no options.
/// let code =
///     unsafe { (lib.cudaLibraryLoadData)(&mut handle, ptx.as_ptr().cast(), null_mut(), null_mut(), 0, null_mut(), null_mut(), 0) };
/// assert_eq!(code.0, 0);
/// // SAFETY: the library loaded just above, unused.
/// assert_eq!(unsafe { (lib.cudaLibraryUnload)(handle) }.0, 0);
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct LibraryApi {
    /// Loads a library from a cubin, a fatbin or NUL-terminated PTX text.
    pub cudaLibraryLoadData: PFN_cudaLibraryLoadData,
    /// The handle of one kernel (entry) of a loaded library.
    pub cudaLibraryGetKernel: PFN_cudaLibraryGetKernel,
    /// Unloads a library.
    pub cudaLibraryUnload: PFN_cudaLibraryUnload,
}

impl std::fmt::Debug for LibraryApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LibraryApi")
    }
}

/// What the library functions are for, as [`LoadError::RuntimeTooOld`] says it.
const NEEDED_FOR: &str = "loading kernels at run time";

impl LibraryApi {
    /// The three functions through `lookup` (a symbol lookup in the runtime
    /// `library` of `version`), or [`LoadError::RuntimeTooOld`] naming the
    /// first one it lacks.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns is that function of a CUDA
    /// runtime that stays loaded while the table is used.
    unsafe fn resolve(
        library: &str,
        version: i32,
        lookup: impl Fn(&CStr) -> *mut c_void,
    ) -> Result<LibraryApi, LoadError> {
        let find = |name: &CStr| {
            let p = lookup(name);
            if p.is_null() {
                let symbol = name.to_string_lossy().into_owned();
                return Err(LoadError::RuntimeTooOld {
                    library: library.to_string(),
                    version,
                    symbol,
                    needed_for: NEEDED_FOR,
                });
            }
            Ok(p)
        };
        let (load, get, unload) =
            (find(c"cudaLibraryLoadData")?, find(c"cudaLibraryGetKernel")?, find(c"cudaLibraryUnload")?);
        // SAFETY: the caller's contract: each address is that runtime
        // function, whose C signature in the CUDA 12 and 13 headers is the
        // PFN type (the generator checks both).
        unsafe {
            Ok(LibraryApi {
                cudaLibraryLoadData: std::mem::transmute::<*mut c_void, PFN_cudaLibraryLoadData>(load),
                cudaLibraryGetKernel: std::mem::transmute::<*mut c_void, PFN_cudaLibraryGetKernel>(get),
                cudaLibraryUnload: std::mem::transmute::<*mut c_void, PFN_cudaLibraryUnload>(unload),
            })
        }
    }
}

impl Runtime {
    /// The library functions of this runtime ([`LibraryApi`]), looked up in
    /// it on each call (cache the answer).
    ///
    /// ```
    /// # #[cfg(feature = "emulator")] {
    /// let rt = wirespeed_cuda_sys::emulator::load().unwrap();
    /// assert!(rt.library_api().is_ok());
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LoadError::RuntimeTooOld`] naming the first function this runtime
    /// lacks (a CUDA 12 runtime from before they were added).
    pub fn library_api(&self) -> Result<LibraryApi, LoadError> {
        // SAFETY: the symbols come from this runtime, never unloaded (see
        // `optional_symbol`), loaded under `Runtime::load`'s contract that
        // it is a genuine CUDA runtime.
        unsafe { LibraryApi::resolve(self.path(), self.version(), |name| self.optional_symbol(name)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_without_them_is_too_old_and_names_the_function() {
        // SAFETY: the lookup returns null only: nothing is called.
        let e = unsafe { LibraryApi::resolve("libcudart.so.12", 12040, |_| std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(
            e,
            LoadError::RuntimeTooOld {
                library: "libcudart.so.12".into(),
                version: 12040,
                symbol: "cudaLibraryLoadData".into(),
                needed_for: NEEDED_FOR,
            }
        );
        let text = e.to_string();
        assert!(text.contains("cudaLibraryLoadData") && text.contains("12.4") && text.contains("12.5"), "{text}");
    }

    #[test]
    fn the_first_missing_function_is_named() {
        let have = |name: &CStr| {
            if name == c"cudaLibraryLoadData" { std::ptr::dangling_mut() } else { std::ptr::null_mut() }
        };
        // SAFETY: one address is a placeholder that is never called: resolving fails first.
        let e = unsafe { LibraryApi::resolve("x", 12040, have) }.unwrap_err();
        assert!(matches!(e, LoadError::RuntimeTooOld { ref symbol, .. } if symbol == "cudaLibraryGetKernel"), "{e}");
    }
}
