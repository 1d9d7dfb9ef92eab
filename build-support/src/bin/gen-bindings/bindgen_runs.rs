//! Runs bindgen over the CUDA headers of one include folder, with the options
//! every generated file shares.

use std::path::{Path, PathBuf};

use crate::lists::{DriverList, RuntimeList};

/// The stand-in headers the runtime headers need (build-support's `shim/`).
fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim")
}

/// A builder over `contents` (an `#include` line) with the options of every run.
fn builder(name: &str, contents: &str, include: &Path) -> bindgen::Builder {
    bindgen::Builder::default()
        .header_contents(name, contents)
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg("-xc")
        .use_core()
        .generate_comments(false)
        .layout_tests(true)
        .formatter(bindgen::Formatter::Prettyplease)
}

/// The builder of the runtime files: `cuda_runtime_api.h` with the shim.
fn runtime_builder(include: &Path) -> bindgen::Builder {
    builder("wrapper.h", "#include <cuda_runtime_api.h>\n", include)
        .clang_arg(format!("-I{}", shim_dir().display()))
        .merge_extern_blocks(true)
}

/// The options of the type files: C enums as newtypes over their integer (a
/// value from a newer runtime is never undefined behaviour), common derives.
fn type_options(b: bindgen::Builder, enums: &[&str]) -> bindgen::Builder {
    let mut b = b
        .default_enum_style(bindgen::EnumVariation::NewType { is_bitfield: false, is_global: false })
        .derive_default(true)
        .derive_debug(true)
        .derive_eq(true)
        .derive_hash(true)
        .prepend_enum_name(false)
        .impl_debug(false);
    for e in enums {
        b = b.newtype_enum(e);
    }
    b
}

/// Runs a builder; `what` names the run in an error.
fn generate(b: bindgen::Builder, what: &str, include: &Path) -> Result<String, String> {
    let out = b.generate().map_err(|e| format!("bindgen ({what}) in {}: {e}", include.display()))?;
    Ok(out.to_string())
}

/// The runtime types and constants (`cudaNN.rs`).
pub fn runtime_types(include: &Path, list: &RuntimeList) -> Result<String, String> {
    let mut b = type_options(runtime_builder(include), list.enums);
    for t in list.types {
        b = b.allowlist_type(t);
    }
    for v in list.vars {
        b = b.allowlist_var(v);
    }
    generate(b, "types", include)
}

/// The runtime functions' `extern "C"` declarations (`cudaNN_fns.rs`).
pub fn runtime_functions(include: &Path, list: &RuntimeList) -> Result<String, String> {
    let mut b = runtime_builder(include).allowlist_recursively(false);
    for (f, _) in list.functions.iter().chain(list.optional) {
        // CUDA 12 renames some entry points with macros (cudaGetDeviceProperties -> _v2).
        b = b.allowlist_function(format!("{f}(_v2)?"));
    }
    generate(b, "functions", include)
}

/// The driver types and constants, with the bound functions' `PFN_*` types (`driver.rs`).
pub fn driver_types(include: &Path, list: &DriverList) -> Result<String, String> {
    let mut b = type_options(builder("driver.h", "#include <cudaTypedefs.h>\n", include), list.enums);
    for t in list.types {
        b = b.allowlist_type(t);
    }
    for pfn in list.pfn_names() {
        b = b.allowlist_type(pfn);
    }
    for v in list.vars {
        b = b.allowlist_var(v);
    }
    generate(b, "driver types", include)
}
