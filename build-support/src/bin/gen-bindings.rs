//! Regenerates `cuda-sys/src/generated/` from the CUDA runtime headers.
//!
//! ```text
//! gen-bindings --cuda13 <include dir> --cuda12 <include dir> [--out cuda-sys/src/generated] [--check]
//! ```
//!
//! For each major version it runs bindgen over `cuda_runtime_api.h` with a fixed
//! allowlist (below), writing `cudaNN.rs` (types and constants) and
//! `cudaNN_fns.rs` (the `extern "C"` declarations, used by the `link` feature).
//! From the function declarations it then writes `api.rs`: the table of function
//! pointers that `cuda-sys` fills by `dlopen` at run time, with the symbol name
//! to resolve for each major version. It refuses to write anything when a bound
//! function's signature differs between the versions in a way the table does not
//! know about.
//!
//! From the driver headers of the same folders (`cuda.h`, and the versioned
//! function pointer types of `cudaTypedefs.h`) it writes `driver.rs` (the
//! driver types and constants, from CUDA 13) and `driver_api.rs`: the table of
//! the few driver entry points the workspace binds, each at one fixed ABI
//! version (`PFN_<name>_v<version>`), checked to be the same in CUDA 12 and 13.
//!
//! With `--check` it writes nothing and exits 1 when a checked-in file differs
//! from what it would write (CI runs it that way).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Every runtime function the workspace binds, with the one-line doc the
/// generated table carries. Order is the table's order.
const FUNCTIONS: &[(&str, &str)] = &[
    // Errors.
    ("cudaGetErrorName", "Returns the enum name of an error code as a static C string."),
    ("cudaGetErrorString", "Returns the description of an error code as a static C string."),
    ("cudaGetLastError", "Returns the last error of this thread and resets it to `cudaSuccess` (sticky errors stay)."),
    ("cudaPeekAtLastError", "Returns the last error of this thread without resetting it."),
    // Versions.
    ("cudaRuntimeGetVersion", "Writes the runtime's version (1000 * major + 10 * minor)."),
    ("cudaDriverGetVersion", "Writes the latest version the installed driver supports, 0 when there is no driver."),
    // Devices.
    (
        "cudaGetDeviceCount",
        "Writes the number of CUDA devices; fails with `cudaErrorInsufficientDriver` or `cudaErrorNoDevice` when there are none.",
    ),
    ("cudaSetDevice", "Makes a device current for the calling host thread."),
    ("cudaGetDevice", "Writes the calling thread's current device."),
    ("cudaDeviceGetAttribute", "Writes one integer attribute of a device."),
    ("cudaDeviceSynchronize", "Blocks until the current device has finished all preceding work."),
    ("cudaMemGetInfo", "Writes the free and total memory of the current device, in bytes."),
    (
        "cudaGetDeviceProperties",
        "Fills a `cudaDeviceProp` of the loaded major version: the layout differs between CUDA 12 and 13, so the table takes an untyped pointer; CUDA 12 resolves `cudaGetDeviceProperties_v2`.",
    ),
    ("cudaDeviceGetStreamPriorityRange", "Writes the least and greatest stream priorities of the current device."),
    // Memory.
    ("cudaMalloc", "Allocates device memory on the current device."),
    ("cudaFree", "Frees device memory from `cudaMalloc`; null is a no-op."),
    ("cudaHostAlloc", "Allocates page-locked host memory with `cudaHostAlloc*` flags."),
    ("cudaFreeHost", "Frees memory from `cudaHostAlloc`."),
    ("cudaHostRegister", "Page-locks an existing host range with `cudaHostRegister*` flags."),
    ("cudaHostUnregister", "Unregisters a range registered by `cudaHostRegister`, given its start."),
    ("cudaHostGetDevicePointer", "Writes the device pointer of mapped page-locked host memory."),
    ("cudaHostGetFlags", "Writes the flags that page-locked host memory was allocated or registered with."),
    ("cudaPointerGetAttributes", "Fills `cudaPointerAttributes` for a host or device pointer."),
    ("cudaMemcpy", "Copies synchronously (with respect to the host) between host and device."),
    ("cudaMemcpyAsync", "Enqueues a copy on a stream; asynchronous only for page-locked host memory."),
    ("cudaMemset", "Sets device memory to a byte value."),
    ("cudaMemsetAsync", "Enqueues setting device memory to a byte value on a stream."),
    // Streams.
    ("cudaStreamCreate", "Creates a blocking stream on the current device."),
    ("cudaStreamCreateWithFlags", "Creates a stream with `cudaStream*` flags on the current device."),
    ("cudaStreamCreateWithPriority", "Creates a stream with flags and a priority on the current device."),
    ("cudaStreamDestroy", "Destroys a stream once its work is done; returns at once."),
    ("cudaStreamSynchronize", "Blocks until a stream has finished its work."),
    ("cudaStreamQuery", "Returns `cudaSuccess` when a stream is idle, `cudaErrorNotReady` otherwise."),
    ("cudaStreamWaitEvent", "Makes later work on a stream wait for an event's most recent record."),
    ("cudaLaunchHostFunc", "Enqueues a host function on a stream; it must not call CUDA."),
    // Kernels.
    (
        "cudaLaunchKernel",
        "Enqueues a kernel on a stream: `func` is a `cudaKernel_t` from `cudaLibraryGetKernel`, `args` an array of pointers to each parameter's value.",
    ),
    // Events.
    ("cudaEventCreate", "Creates an event with default flags."),
    ("cudaEventCreateWithFlags", "Creates an event with `cudaEvent*` flags."),
    ("cudaEventRecord", "Records an event on a stream."),
    ("cudaEventQuery", "Returns `cudaSuccess` when an event has completed, `cudaErrorNotReady` otherwise."),
    ("cudaEventSynchronize", "Blocks until an event has completed."),
    ("cudaEventElapsedTime", "Writes the milliseconds between two completed timing events."),
    ("cudaEventDestroy", "Destroys an event."),
];

/// Runtime functions that only some supported runtimes export (the loader
/// looks them up one by one): `api.rs` gets a function pointer type for each,
/// `PFN_<name>`, checked to be the same in CUDA 12 and 13.
/// `cudaGetDriverEntryPointByVersion` arrived in 12.5.
/// The library functions (context-independent loading of PTX or cubin, for
/// every device) arrived during CUDA 12.
const OPTIONAL_FUNCTIONS: &[(&str, &str)] = &[
    (
        "cudaGetDriverEntryPointByVersion",
        "Writes the address of a driver function of the given ABI version (`symbol` is its base name, as for `cuGetProcAddress`); a null address and a status when the driver lacks it.",
    ),
    (
        "cudaLibraryLoadData",
        "Loads a library (PTX or cubin image) for every device, independent of contexts; the options may be null with counts 0.",
    ),
    ("cudaLibraryUnload", "Unloads a library from `cudaLibraryLoadData`."),
    ("cudaLibraryGetKernel", "Writes the handle of the kernel `name` (its entry name) of a loaded library."),
];

/// Types bound (recursively, with what they contain).
const TYPES: &[&str] = &[
    "cudaError",
    "cudaError_t",
    "cudaMemcpyKind",
    "cudaDeviceAttr",
    "cudaMemoryType",
    "cudaPointerAttributes",
    "cudaDeviceProp",
    "cudaStream_t",
    "cudaEvent_t",
    "cudaHostFn_t",
    "cudaDriverEntryPointQueryResult",
    "cudaGetDriverEntryPointFlags",
    "cudaLibrary_t",
    "cudaKernel_t",
    "cudaJitOption",
    "cudaLibraryOption",
    "dim3",
];

/// Macro constants bound (regular expressions).
const VARS: &[&str] = &[
    "CUDART_VERSION",
    "cudaHostAlloc(Default|Portable|Mapped|WriteCombined)",
    "cudaHostRegister(Default|Portable|Mapped|IoMemory|ReadOnly)",
    "cudaStream(Default|NonBlocking)",
    "cudaEvent(Default|BlockingSync|DisableTiming|Interprocess)",
];

/// C enums: emitted as newtypes over their integer with associated constants,
/// so that a value from a newer runtime is never undefined behaviour.
const ENUMS: &[&str] = &[
    "cudaError",
    "cudaMemcpyKind",
    "cudaDeviceAttr",
    "cudaMemoryType",
    "cudaDriverEntryPointQueryResult",
    "cudaGetDriverEntryPointFlags",
    "cudaJitOption",
    "cudaLibraryOption",
];

/// Structs whose layout differs between major versions: the table passes
/// pointers to them untyped.
const VERSIONED_STRUCTS: &[&str] = &["cudaDeviceProp"];

/// CUDA 12 entry points whose `_v2` name arrived in a later 12.x, and whose
/// unversioned symbol has the same C signature (and only older semantics): a
/// CUDA 12 runtime without the `_v2` name is bound to the unversioned one.
/// (`cudaGetDeviceProperties` is not here: its unversioned symbol takes the
/// older struct layout.) `cudaEventElapsedTime_v2` arrived in 12.8.
const SAME_ABI_FALLBACK_12: &[&str] = &["cudaEventElapsedTime"];

/// Every driver function the workspace binds, in the table's order:
/// `(versioned symbol, ABI version, doc)`. The field of the table and the
/// symbol `libcuda.so.1` exports are the versioned name (`cuCtxCreate_v2`);
/// the runtime's `cudaGetDriverEntryPointByVersion` is asked for the base name
/// (`cuCtxCreate`) at the version, which selects the same ABI: the type is
/// `PFN_<base>_v<version>` of `cudaTypedefs.h`. (Asked at a later version, the
/// driver would return another ABI: `cuCtxCreate` is `_v3` from 11.4 and `_v4`
/// from 12.5, with other parameters.) The CUDA 12 `cuda.h` must map the base
/// name to the versioned symbol (`#define cuCtxCreate cuCtxCreate_v2`), or have
/// no mapping when they are the same.
const DRIVER_FUNCTIONS: &[(&str, u32, &str)] = &[
    (
        "cuGetErrorName",
        6000,
        "Writes the enum name of a `CUresult` as a static C string (`CUDA_ERROR_INVALID_VALUE` for an unknown code).",
    ),
    (
        "cuGetErrorString",
        6000,
        "Writes the description of a `CUresult` as a static C string (`CUDA_ERROR_INVALID_VALUE` for an unknown code).",
    ),
    ("cuInit", 2000, "Initializes the driver API; flags must be 0. Every other call but the two above needs it first."),
    ("cuDeviceGet", 2000, "Writes the driver's handle of device `ordinal`."),
    (
        "cuCtxCreate_v2",
        3020,
        "Creates a context on a device and pushes it on the calling thread's context stack (it becomes current).",
    ),
    (
        "cuCtxDestroy_v2",
        4000,
        "Destroys a context (and the registrations made in it); pops it if it is current to the calling thread.",
    ),
    ("cuCtxPushCurrent_v2", 4000, "Pushes a context on the calling thread's context stack: it becomes current."),
    (
        "cuCtxPopCurrent_v2",
        4000,
        "Pops the current context off the calling thread's stack and writes it; the one below becomes current.",
    ),
    ("cuCtxGetCurrent", 4000, "Writes the calling thread's current context (null when none)."),
    ("cuCtxSetCurrent", 4000, "Replaces the top of the calling thread's context stack (null: pops it)."),
    (
        "cuMemHostRegister_v2",
        6050,
        "Page-locks an existing host range in the current context with `CU_MEMHOSTREGISTER_*` flags.",
    ),
    ("cuMemHostUnregister", 4000, "Unregisters a range registered in the current context, given its start."),
];

/// Driver types bound (recursively), besides the function pointer types.
const DRIVER_TYPES: &[&str] = &["CUresult", "CUcontext", "CUdevice", "CUctx_flags"];

/// Driver macro constants bound (regular expressions).
const DRIVER_VARS: &[&str] = &["CUDA_VERSION", "CU_MEMHOSTREGISTER_(PORTABLE|DEVICEMAP|IOMEMORY|READ_ONLY)"];

/// Driver C enums, as newtypes (see [`ENUMS`]).
const DRIVER_ENUMS: &[&str] = &["cudaError_enum", "CUctx_flags_enum"];

/// The base name of a versioned driver symbol (`cuCtxCreate_v2` -> `cuCtxCreate`).
fn driver_base(symbol: &str) -> &str {
    match symbol.rfind("_v") {
        Some(i) if symbol[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < symbol.len() => &symbol[..i],
        _ => symbol,
    }
}

struct Args {
    cuda13: PathBuf,
    cuda12: PathBuf,
    out: PathBuf,
    check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut cuda13 = None;
    let mut cuda12 = None;
    let mut out = PathBuf::from("cuda-sys/src/generated");
    let mut check = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cuda13" => cuda13 = it.next().map(PathBuf::from),
            "--cuda12" => cuda12 = it.next().map(PathBuf::from),
            "--out" => out = it.next().map(PathBuf::from).ok_or("--out needs a folder")?,
            "--check" => check = true,
            "-h" | "--help" => {
                return Err("usage: gen-bindings --cuda13 DIR --cuda12 DIR [--out DIR] [--check]".into());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    let found = wirespeed_build::find_cuda_wheel_includes();
    let cuda13 = cuda13
        .or(found.cuda13)
        .ok_or("no CUDA 13 headers: pass --cuda13 DIR (the include folder of the nvidia-cuda-runtime wheel)")?;
    let cuda12 = cuda12
        .or(found.cuda12)
        .ok_or("no CUDA 12 headers: pass --cuda12 DIR (the include folder of the nvidia-cuda-runtime-cu12 wheel)")?;
    Ok(Args { cuda13, cuda12, out, check })
}

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim")
}

fn builder(include: &Path) -> bindgen::Builder {
    bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <cuda_runtime_api.h>\n")
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", shim_dir().display()))
        .clang_arg("-xc")
        .use_core()
        .generate_comments(false)
        .layout_tests(true)
        .merge_extern_blocks(true)
        .formatter(bindgen::Formatter::Prettyplease)
}

fn generate_types(include: &Path) -> Result<String, String> {
    let mut b = builder(include)
        .default_enum_style(bindgen::EnumVariation::NewType { is_bitfield: false, is_global: false })
        .derive_default(true)
        .derive_debug(true)
        .derive_eq(true)
        .derive_hash(true)
        .prepend_enum_name(false)
        .impl_debug(false);
    for t in TYPES {
        b = b.allowlist_type(t);
    }
    for v in VARS {
        b = b.allowlist_var(v);
    }
    for e in ENUMS {
        b = b.newtype_enum(e);
    }
    let out = b.generate().map_err(|e| format!("bindgen (types) in {}: {e}", include.display()))?;
    Ok(out.to_string())
}

fn generate_functions(include: &Path) -> Result<String, String> {
    let mut b = builder(include).allowlist_recursively(false);
    for (f, _) in FUNCTIONS.iter().chain(OPTIONAL_FUNCTIONS) {
        // CUDA 12 renames some entry points with macros (cudaGetDeviceProperties -> _v2).
        b = b.allowlist_function(format!("{f}(_v2)?"));
    }
    let out = b.generate().map_err(|e| format!("bindgen (functions) in {}: {e}", include.display()))?;
    Ok(out.to_string())
}

#[derive(Debug, Clone, PartialEq)]
struct Decl {
    symbol: String,
    params: Vec<(String, String)>,
    ret: String,
}

/// Reads the `pub fn name(params) -> ret;` items of bindgen's extern block.
fn parse_decls(src: &str) -> Result<BTreeMap<String, Decl>, String> {
    let mut out = BTreeMap::new();
    let flat: String = src.split_whitespace().collect::<Vec<_>>().join(" ");
    for piece in flat.split("pub fn ").skip(1) {
        let end = piece.find(';').ok_or("unterminated declaration")?;
        let item = &piece[..end];
        let open = item.find('(').ok_or("declaration without '('")?;
        let symbol = item[..open].trim().to_string();
        let mut depth = 0usize;
        let mut close = None;
        for (i, ch) in item.char_indices().skip(open) {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.ok_or("unbalanced parentheses")?;
        let inner = &item[open + 1..close];
        let mut params = Vec::new();
        let mut depth = 0i32;
        let mut cur = String::new();
        for ch in inner.chars().chain(std::iter::once(',')) {
            match ch {
                '(' | '<' => depth += 1,
                ')' | '>' => depth -= 1,
                _ => {}
            }
            if ch == ',' && depth == 0 {
                let p = cur.trim();
                if !p.is_empty() {
                    let (n, t) = p.split_once(':').ok_or_else(|| format!("parameter {p:?}"))?;
                    params.push((n.trim().to_string(), t.trim().to_string()));
                }
                cur.clear();
            } else {
                cur.push(ch);
            }
        }
        let rest = item[close + 1..].trim();
        let ret = rest.strip_prefix("->").map(|r| r.trim().to_string()).unwrap_or_default();
        let key = symbol.strip_suffix("_v2").unwrap_or(&symbol).to_string();
        out.insert(key, Decl { symbol, params, ret });
    }
    Ok(out)
}

fn header(what: &str) -> String {
    format!(
        "// @generated by build-support's gen-bindings from the CUDA runtime headers: {what}.\n\
         // Do not edit: change the allowlist in build-support/src/bin/gen-bindings.rs and run\n\
         // `cargo run -p wirespeed-build --bin gen-bindings` (CI regenerates and diffs).\n"
    )
}

fn table_type(t: &str) -> String {
    let mut t = t.to_string();
    for s in VERSIONED_STRUCTS {
        t = t.replace(&format!("*mut {s}"), "*mut ::core::ffi::c_void");
    }
    t
}

fn generate_api(v13: &BTreeMap<String, Decl>, v12: &BTreeMap<String, Decl>) -> Result<String, String> {
    let mut s = header("the runtime function table");
    s.push_str(
        "\nuse crate::*;\n\n\
         /// The CUDA runtime entry points this crate binds, resolved from one loaded\n\
         /// library. Every field is a plain C function pointer: calling one is `unsafe`\n\
         /// and follows the CUDA runtime API documentation of the function of that name.\n\
         #[allow(non_snake_case)]\n\
         #[derive(Clone, Copy)]\n\
         pub struct Api {\n",
    );
    let mut rows = Vec::new();
    for (name, doc) in FUNCTIONS {
        let d13 = v13.get(*name).ok_or_else(|| format!("{name} not found in the CUDA 13 headers"))?;
        let d12 = v12.get(*name).ok_or_else(|| format!("{name} not found in the CUDA 12 headers"))?;
        if d13.params.iter().map(|p| &p.1).ne(d12.params.iter().map(|p| &p.1)) || d13.ret != d12.ret {
            return Err(format!("{name}: signature differs between CUDA 12 ({d12:?}) and 13 ({d13:?})"));
        }
        let params: Vec<String> = d13.params.iter().map(|(n, t)| format!("{n}: {}", table_type(t))).collect();
        let ret = if d13.ret.is_empty() { String::new() } else { format!(" -> {}", d13.ret) };
        let ty = format!("unsafe extern \"C\" fn({}){}", params.join(", "), ret);
        writeln!(s, "    /// {doc}\n    pub {name}: {ty},").map_err(|e| e.to_string())?;
        rows.push((name, ty, d13.symbol.clone(), d12.symbol.clone()));
    }
    s.push_str("}\n\n");
    s.push_str(
        "/// The symbol each table entry is resolved from: `(field, CUDA 13 symbol, CUDA 12 symbol)`.\n\
         pub const SYMBOLS: &[(&str, &str, &str)] = &[\n",
    );
    for (name, _, s13, s12) in &rows {
        writeln!(s, "    (\"{name}\", \"{s13}\", \"{s12}\"),").map_err(|e| e.to_string())?;
    }
    s.push_str("];\n\n");
    for (name, doc) in OPTIONAL_FUNCTIONS {
        let d13 = v13.get(*name).ok_or_else(|| format!("{name} not found in the CUDA 13 headers"))?;
        let d12 = v12.get(*name).ok_or_else(|| format!("{name} not found in the CUDA 12 headers"))?;
        if d13.params.iter().map(|p| &p.1).ne(d12.params.iter().map(|p| &p.1)) || d13.ret != d12.ret {
            return Err(format!("{name}: signature differs between CUDA 12 ({d12:?}) and 13 ({d13:?})"));
        }
        let params: Vec<String> = d13.params.iter().map(|(n, t)| format!("{n}: {}", table_type(t))).collect();
        let ret = if d13.ret.is_empty() { String::new() } else { format!(" -> {}", d13.ret) };
        writeln!(
            s,
            "/// {doc}\n/// Not in [`Api`]: only some supported runtimes export `{}`.\npub type PFN_{name} = unsafe extern \"C\" fn({}){ret};\n",
            d13.symbol,
            params.join(", ")
        )
        .map_err(|e| e.to_string())?;
    }
    s.push_str(
        "impl Api {\n\
         \x20   /// Builds the table from a symbol lookup (`dlsym` on the loaded library).\n\
         \x20   /// `major` selects the symbol names (CUDA 12 renamed some entry points).\n\
         \x20   /// Returns the first symbol that could not be found.\n\
         \x20   ///\n\
         \x20   /// # Safety\n\
         \x20   /// Every non-null address `lookup` returns for a symbol must be that CUDA\n\
         \x20   /// runtime function of the given major version, valid for as long as the\n\
         \x20   /// returned table is used.\n\
         \x20   pub unsafe fn resolve(\n\
         \x20       major: i32,\n\
         \x20       mut lookup: impl FnMut(&'static str) -> *mut ::core::ffi::c_void,\n\
         \x20   ) -> Result<Self, &'static str> {\n\
         \x20       let mut sym = |s13: &'static str, s12: &'static str, fallback12: Option<&'static str>| {\n\
         \x20           let name = if major >= 13 { s13 } else { s12 };\n\
         \x20           let mut p = lookup(name);\n\
         \x20           if p.is_null() && major < 13 && let Some(f) = fallback12 {\n\
         \x20               p = lookup(f);\n\
         \x20           }\n\
         \x20           if p.is_null() { Err(name) } else { Ok(p) }\n\
         \x20       };\n\
         \x20       Ok(Self {\n",
    );
    for (name, ty, s13, s12) in &rows {
        let fallback = if SAME_ABI_FALLBACK_12.contains(name) && s12.ends_with("_v2") {
            format!("Some(\"{name}\\0\")")
        } else {
            "None".to_string()
        };
        writeln!(
            s,
            "            // SAFETY: the caller guarantees the address is this function of the loaded runtime,\n\
             \x20           // whose C signature the headers give as this type.\n\
             \x20           {name}: unsafe {{ ::core::mem::transmute::<*mut ::core::ffi::c_void, {ty}>(sym(\"{s13}\\0\", \"{s12}\\0\", {fallback})?) }},"
        )
        .map_err(|e| e.to_string())?;
    }
    s.push_str("        })\n    }\n\n");
    s.push_str(
        "    /// The table of the runtime this crate was linked against (feature `link`),\n\
         \x20   /// bound to the CUDA 13 symbols.\n\
         \x20   #[cfg(feature = \"link\")]\n\
         \x20   pub fn linked() -> Self {\n\
         \x20       Self {\n",
    );
    for (name, ty, _, _) in &rows {
        let erased = v13[**name].params.iter().any(|(_, t)| table_type(t) != *t);
        if erased {
            writeln!(
                s,
                "            // SAFETY: only the pointee type of a versioned struct is erased; the ABI is the same.\n\
                 \x20           {name}: unsafe {{ ::core::mem::transmute::<*const (), {ty}>(crate::cuda13::{name} as *const ()) }},"
            )
            .map_err(|e| e.to_string())?;
        } else {
            writeln!(s, "            {name}: crate::cuda13::{name},").map_err(|e| e.to_string())?;
        }
    }
    s.push_str("        }\n    }\n}\n");
    Ok(s)
}

fn generate_driver_types(include: &Path) -> Result<String, String> {
    let mut b = bindgen::Builder::default()
        .header_contents("driver.h", "#include <cudaTypedefs.h>\n")
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg("-xc")
        .use_core()
        .generate_comments(false)
        .layout_tests(true)
        .formatter(bindgen::Formatter::Prettyplease)
        .default_enum_style(bindgen::EnumVariation::NewType { is_bitfield: false, is_global: false })
        .derive_default(true)
        .derive_debug(true)
        .derive_eq(true)
        .derive_hash(true)
        .prepend_enum_name(false)
        .impl_debug(false);
    for t in DRIVER_TYPES {
        b = b.allowlist_type(t);
    }
    for (symbol, version, _) in DRIVER_FUNCTIONS {
        b = b.allowlist_type(format!("PFN_{}_v{version}", driver_base(symbol)));
    }
    for v in DRIVER_VARS {
        b = b.allowlist_var(v);
    }
    for e in DRIVER_ENUMS {
        b = b.newtype_enum(e);
    }
    let out = b.generate().map_err(|e| format!("bindgen (driver types) in {}: {e}", include.display()))?;
    Ok(out.to_string())
}

/// The function types of bindgen's `pub type PFN_x = Option<unsafe extern "C" fn(..) -> R>;`
/// items, by typedef name, on one line each.
fn parse_pfns(src: &str) -> Result<BTreeMap<String, String>, String> {
    let flat: String = src.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = BTreeMap::new();
    for piece in flat.split("pub type ").skip(1) {
        let Some((name, rest)) = piece.split_once(" = ") else { continue };
        if !name.starts_with("PFN_") {
            continue;
        }
        let inner = rest
            .strip_prefix("::core::option::Option<")
            .ok_or_else(|| format!("{name}: not an optional function pointer: {rest:.80}"))?;
        let end = inner.rfind(">;").ok_or_else(|| format!("{name}: unterminated type"))?;
        let ty =
            inner[..end].trim().trim_end_matches(',').trim().replace("( ", "(").replace(", )", ")").replace(" )", ")");
        out.insert(name.to_string(), ty);
    }
    Ok(out)
}

/// Checks that the CUDA 12 `cuda.h` maps each bound base name to the symbol
/// the table resolves from `libcuda.so.1` (`#define cuCtxCreate cuCtxCreate_v2`).
fn check_driver_symbols(include12: &Path) -> Result<(), String> {
    let path = include12.join("cuda.h");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    for (symbol, _, _) in DRIVER_FUNCTIONS {
        let base = driver_base(symbol);
        let mapped = text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(base)).then(|| w.next().unwrap_or("").to_string())
        });
        let ok = match &mapped {
            Some(m) => m == symbol,
            None => base == *symbol,
        };
        if !ok {
            return Err(format!(
                "{}: {base} maps to {mapped:?}, but the table binds {symbol}: fix DRIVER_FUNCTIONS",
                path.display()
            ));
        }
    }
    Ok(())
}

fn generate_driver_api(v13: &BTreeMap<String, String>, v12: &BTreeMap<String, String>) -> Result<String, String> {
    let mut s = header("the driver function table");
    s.push_str(
        "\nuse crate::driver::*;\n\n\
         /// The CUDA driver entry points this crate binds, each at one fixed ABI\n\
         /// version, resolved at run time (see [`crate::driver()`]). Every field is a\n\
         /// plain C function pointer: calling one is `unsafe` and follows the CUDA\n\
         /// driver API documentation of the function of that name.\n\
         #[allow(non_snake_case)]\n\
         #[derive(Clone, Copy)]\n\
         pub struct DriverApi {\n",
    );
    let mut rows = Vec::new();
    for (symbol, version, doc) in DRIVER_FUNCTIONS {
        let base = driver_base(symbol);
        let pfn = format!("PFN_{base}_v{version}");
        let t13 = v13.get(&pfn).ok_or_else(|| format!("{pfn} not found in the CUDA 13 cudaTypedefs.h"))?;
        let t12 = v12.get(&pfn).ok_or_else(|| format!("{pfn} not found in the CUDA 12 cudaTypedefs.h"))?;
        if t13 != t12 {
            return Err(format!("{pfn}: differs between CUDA 12 ({t12}) and 13 ({t13})"));
        }
        writeln!(s, "    /// {doc} ABI: `{pfn}`.\n    pub {symbol}: {t13},").map_err(|e| e.to_string())?;
        rows.push((*symbol, base, *version, t13.clone()));
    }
    s.push_str("}\n\n");
    s.push_str(
        "/// Each entry of the table: `(field and libcuda.so.1 symbol, base name for\n\
         /// cudaGetDriverEntryPointByVersion, ABI version)`.\n\
         pub const DRIVER_SYMBOLS: &[(&str, &str, u32)] = &[\n",
    );
    for (symbol, base, version, _) in &rows {
        writeln!(s, "    (\"{symbol}\", \"{base}\", {version}),").map_err(|e| e.to_string())?;
    }
    s.push_str("];\n\n");
    s.push_str(
        "impl DriverApi {\n\
         \x20   /// Builds the table from a lookup: `lookup(symbol, base, version)` returns the\n\
         \x20   /// address of driver function `symbol` (e.g. `\"cuCtxCreate_v2\\0\"`), whose\n\
         \x20   /// base name is `base` (`\"cuCtxCreate\\0\"`) at ABI version `version`, or null.\n\
         \x20   /// Both names end with a NUL. Returns the first symbol that was not found.\n\
         \x20   ///\n\
         \x20   /// # Safety\n\
         \x20   /// Every non-null address `lookup` returns must be that driver function with\n\
         \x20   /// the ABI of `PFN_<base>_v<version>` of `cudaTypedefs.h`, valid for as long\n\
         \x20   /// as the returned table is used.\n\
         \x20   pub unsafe fn resolve(\n\
         \x20       mut lookup: impl FnMut(&'static str, &'static str, u32) -> *mut ::core::ffi::c_void,\n\
         \x20   ) -> Result<Self, &'static str> {\n\
         \x20       let mut sym = |symbol: &'static str, base: &'static str, version: u32| {\n\
         \x20           let p = lookup(symbol, base, version);\n\
         \x20           if p.is_null() { Err(symbol.trim_end_matches('\\0')) } else { Ok(p) }\n\
         \x20       };\n\
         \x20       Ok(Self {\n",
    );
    for (symbol, base, version, ty) in &rows {
        writeln!(
            s,
            "            // SAFETY: the caller guarantees the address is this driver function with the\n\
             \x20           // ABI of PFN_{base}_v{version}, whose C signature the headers give as this type.\n\
             \x20           {symbol}: unsafe {{ ::core::mem::transmute::<*mut ::core::ffi::c_void, {ty}>(sym(\"{symbol}\\0\", \"{base}\\0\", {version})?) }},"
        )
        .map_err(|e| e.to_string())?;
    }
    s.push_str("        })\n    }\n}\n");
    Ok(s)
}

fn run() -> Result<bool, String> {
    let args = parse_args()?;
    let mut files: Vec<(String, String)> = Vec::new();
    let mut decls = Vec::new();
    for (tag, dir) in [("cuda13", &args.cuda13), ("cuda12", &args.cuda12)] {
        let types = generate_types(dir)?;
        let fns = generate_functions(dir)?;
        decls.push(parse_decls(&fns)?);
        files.push((format!("{tag}.rs"), format!("{}\n{types}", header(&format!("{tag} types and constants")))));
        files.push((format!("{tag}_fns.rs"), format!("{}\n{fns}", header(&format!("{tag} extern declarations")))));
    }
    files.push(("api.rs".into(), generate_api(&decls[0], &decls[1])?));
    let mut pfns = Vec::new();
    for (tag, dir) in [("cuda13", &args.cuda13), ("cuda12", &args.cuda12)] {
        let types = generate_driver_types(dir)?;
        pfns.push(parse_pfns(&types)?);
        if tag == "cuda13" {
            // One file: the bound types are the same in both versions (the
            // function types are compared below); CUresult is a newtype, so a
            // code only the other version knows is just another value.
            files.push((
                "driver.rs".into(),
                format!("{}\n{types}", header("driver types and constants (cuda.h, cudaTypedefs.h of CUDA 13)")),
            ));
        }
    }
    check_driver_symbols(&args.cuda12)?;
    files.push(("driver_api.rs".into(), generate_driver_api(&pfns[0], &pfns[1])?));
    let mut differs = false;
    for (name, text) in &files {
        let path = args.out.join(name);
        if args.check {
            let old = std::fs::read_to_string(&path).unwrap_or_default();
            if old != *text {
                eprintln!("gen-bindings: {} differs from what the headers generate", path.display());
                differs = true;
            }
        } else {
            std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("gen-bindings: wrote {}", path.display());
        }
    }
    Ok(!differs)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("gen-bindings: run it without --check and commit the result");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gen-bindings: {e}");
            ExitCode::from(2)
        }
    }
}
