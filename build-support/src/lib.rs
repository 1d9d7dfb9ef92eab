//! Build-script helpers for crates that use CUDA.
//!
//! * [`find_cuda`] looks for a CUDA installation the way users expect: the
//!   `CUDA_PATH`, `CUDA_HOME`, `CUDA_ROOT` and `CUDA_TOOLKIT_ROOT_DIR` variables,
//!   the default install folders, then a pip-installed `nvidia-cuda-runtime`
//!   wheel. Every variable it reads is announced with `rerun-if-env-changed`.
//! * [`emit_link`] prints the `cargo:` lines that link `libcudart`.
//! * [`build_shared_library`] compiles C sources into a shared library with
//!   the `cc` crate (used for the emulated runtime).
//! * [`is_docs_rs`] tells a build script to return early on docs.rs.
//!
//! The `gen-bindings` binary (feature `generator`) regenerates the checked-in
//! bindings of `cuda-sys`.
//!
//! ```no_run
//! // build.rs
//! if wirespeed_build::is_docs_rs() {
//!     return;
//! }
//! if let Some(cuda) = wirespeed_build::find_cuda() {
//!     wirespeed_build::emit_link(&cuda);
//! }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::path::{Path, PathBuf};

/// Environment variables naming a CUDA installation, in the order they are tried.
pub const CUDA_ROOT_VARS: &[&str] = &["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"];

/// Install folders tried when no variable names one.
pub const DEFAULT_ROOTS: &[&str] = &["/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda", "/usr"];

/// A CUDA installation found by [`find_cuda`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInstall {
    /// The root folder.
    pub root: PathBuf,
    /// The folder holding `cuda_runtime_api.h`.
    pub include: PathBuf,
    /// The folder holding `libcudart.so*`.
    pub lib: PathBuf,
    /// How it was found (a variable's name, `default path` or `pip wheel`).
    pub found_by: String,
}

/// Include folders of the pip wheels `nvidia-cuda-runtime` (13.x) and
/// `nvidia-cuda-runtime-cu12`, if installed for some Python on `PATH` or under
/// `CUDA_WHEELS_DIR`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WheelIncludes {
    /// `nvidia/cu13/include`.
    pub cuda13: Option<PathBuf>,
    /// `nvidia/cuda_runtime/include`.
    pub cuda12: Option<PathBuf>,
}

/// True when building on docs.rs (`DOCS_RS` is set): build scripts should then
/// neither look for CUDA nor link it.
///
/// ```
/// let _ = wirespeed_build::is_docs_rs();
/// ```
pub fn is_docs_rs() -> bool {
    env_var("DOCS_RS").is_some()
}

/// Reads an environment variable and tells cargo to rerun the build script when
/// it changes. Empty values count as unset.
///
/// ```
/// assert_eq!(wirespeed_build::env_var("BUILD_SUPPORT_SURELY_UNSET"), None);
/// ```
pub fn env_var(name: &str) -> Option<String> {
    if std::env::var_os("CARGO").is_some() && std::env::var_os("OUT_DIR").is_some() {
        println!("cargo:rerun-if-env-changed={name}");
    }
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn install_at(root: &Path, found_by: &str) -> Option<CudaInstall> {
    let include = [root.join("include"), root.join("targets/x86_64-linux/include")]
        .into_iter()
        .find(|d| d.join("cuda_runtime_api.h").is_file())?;
    let lib = [
        root.join("lib64"),
        root.join("lib"),
        root.join("lib/x86_64-linux-gnu"),
        root.join("targets/x86_64-linux/lib"),
    ]
    .into_iter()
    .find(|d| has_cudart(d))?;
    Some(CudaInstall { root: root.to_path_buf(), include, lib, found_by: found_by.to_string() })
}

fn has_cudart(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libcudart.so")))
        .unwrap_or(false)
}

/// Finds a CUDA installation with headers and `libcudart`: the variables of
/// [`CUDA_ROOT_VARS`] first, then [`DEFAULT_ROOTS`], then a pip wheel's runtime.
/// Returns `None` when there is none.
///
/// ```
/// match wirespeed_build::find_cuda() {
///     Some(c) => println!("CUDA at {} ({})", c.root.display(), c.found_by),
///     None => println!("no CUDA here"),
/// }
/// ```
pub fn find_cuda() -> Option<CudaInstall> {
    for var in CUDA_ROOT_VARS {
        if let Some(v) = env_var(var)
            && let Some(c) = install_at(Path::new(&v), var)
        {
            return Some(c);
        }
    }
    for root in DEFAULT_ROOTS {
        if let Some(c) = install_at(Path::new(root), "default path") {
            return Some(c);
        }
    }
    for dir in wheel_site_dirs() {
        for sub in ["nvidia/cu13", "nvidia/cuda_runtime"] {
            if let Some(c) = install_at(&dir.join(sub), "pip wheel") {
                return Some(c);
            }
        }
    }
    None
}

/// Site-packages-like folders where the nvidia wheels may be: `CUDA_WHEELS_DIR`
/// (a folder the wheels were unpacked into), then every `sys.path` entry of
/// `python3` if it runs.
pub fn wheel_site_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = env_var("CUDA_WHEELS_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(out) = std::process::Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(p for p in sys.path if p))"])
        .output()
        && out.status.success()
    {
        dirs.extend(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from));
    }
    dirs
}

/// Finds the include folders of the CUDA runtime wheels (see [`WheelIncludes`]).
///
/// ```
/// let w = wirespeed_build::find_cuda_wheel_includes();
/// if let Some(dir) = w.cuda13 { assert!(dir.join("cuda_runtime_api.h").is_file()); }
/// ```
pub fn find_cuda_wheel_includes() -> WheelIncludes {
    let mut w = WheelIncludes::default();
    for dir in wheel_site_dirs() {
        let c13 = dir.join("nvidia/cu13/include");
        if w.cuda13.is_none() && c13.join("cuda_runtime_api.h").is_file() {
            w.cuda13 = Some(c13);
        }
        let c12 = dir.join("nvidia/cuda_runtime/include");
        if w.cuda12.is_none() && c12.join("cuda_runtime_api.h").is_file() {
            w.cuda12 = Some(c12);
        }
    }
    w
}

/// Prints the cargo lines that link `libcudart` from `cuda` dynamically.
/// A wheel ships only `libcudart.so.N`, so linking by `-lcudart` needs the
/// unversioned name: in that case link with the runtime's full file name.
///
/// When the calling package declares `links` in its manifest, the CUDA root
/// and include folder are also passed on to dependents (`DEP_<LINKS>_ROOT`,
/// `DEP_<LINKS>_INCLUDE`); without `links` cargo has no place for them.
pub fn emit_link(cuda: &CudaInstall) {
    println!("cargo:rustc-link-search=native={}", cuda.lib.display());
    if cuda.lib.join("libcudart.so").exists() {
        println!("cargo:rustc-link-lib=dylib=cudart");
    } else if let Some(name) = std::fs::read_dir(&cuda.lib).ok().and_then(|rd| {
        rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).find(|n| n.starts_with("libcudart.so."))
    }) {
        println!("cargo:rustc-link-arg=-l:{name}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda.lib.display());
    if std::env::var_os("CARGO_MANIFEST_LINKS").is_some() {
        println!("cargo:root={}", cuda.root.display());
        println!("cargo:include={}", cuda.include.display());
    }
}

/// Compiles C `sources` with the `cc` crate (position independent, `-O2`,
/// pthreads) and links them into `<out_dir>/lib<name>.so`. Returns that path.
///
/// # Errors
/// A message when the compiler or the link step fails.
pub fn build_shared_library(name: &str, sources: &[PathBuf], out_dir: &Path) -> Result<PathBuf, String> {
    let mut build = cc::Build::new();
    build.pic(true).opt_level(2).warnings(true).extra_warnings(true).flag_if_supported("-std=gnu11");
    for s in sources {
        build.file(s);
        println!("cargo:rerun-if-changed={}", s.display());
    }
    let objects = build.try_compile_intermediates().map_err(|e| e.to_string())?;
    let out = out_dir.join(format!("lib{name}.so"));
    let status = build
        .get_compiler()
        .to_command()
        .arg("-shared")
        .arg("-o")
        .arg(&out)
        .args(&objects)
        .arg("-lpthread")
        .status()
        .map_err(|e| format!("running the linker: {e}"))?;
    if !status.success() {
        return Err(format!("linking {} failed: {status}", out.display()));
    }
    Ok(out)
}
