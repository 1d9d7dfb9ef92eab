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
//! bindgen's output is parsed with `syn` (module `parse`), and the tables are
//! written from the parsed signatures.
//!
//! With `--check` it writes nothing and exits 1 when a checked-in file differs
//! from what it would write (CI runs it that way).

// The modules live in gen-bindings/ beside this file, which keeps the
// allowlists here, where every generated file's header says they are.
#[path = "gen-bindings/args.rs"]
mod args;
#[path = "gen-bindings/bindgen_runs.rs"]
mod bindgen_runs;
#[path = "gen-bindings/driver_table.rs"]
mod driver_table;
#[path = "gen-bindings/emit.rs"]
mod emit;
#[path = "gen-bindings/lists.rs"]
mod lists;
#[path = "gen-bindings/parse.rs"]
mod parse;
#[path = "gen-bindings/runtime_table.rs"]
mod runtime_table;

use std::process::ExitCode;

use lists::{DriverFn, DriverList, RuntimeFn, RuntimeList};

/// Every runtime function the workspace binds, with the one-line doc the
/// generated table carries. Order is the table's order.
const FUNCTIONS: &[RuntimeFn] = &[
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
const OPTIONAL_FUNCTIONS: &[RuntimeFn] = &[
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
const DRIVER_FUNCTIONS: &[DriverFn] = &[
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

/// The runtime bindings, from the lists above.
const RUNTIME: RuntimeList = RuntimeList {
    functions: FUNCTIONS,
    optional: OPTIONAL_FUNCTIONS,
    types: TYPES,
    vars: VARS,
    enums: ENUMS,
    versioned_structs: VERSIONED_STRUCTS,
    same_abi_fallback_12: SAME_ABI_FALLBACK_12,
};

/// The driver bindings, from the lists above.
const DRIVER: DriverList =
    DriverList { functions: DRIVER_FUNCTIONS, types: DRIVER_TYPES, vars: DRIVER_VARS, enums: DRIVER_ENUMS };

/// The comment every generated file starts with.
fn header(what: &str) -> String {
    format!(
        "// @generated by build-support's gen-bindings from the CUDA runtime headers: {what}.\n\
         // Do not edit: change the allowlist in build-support/src/bin/gen-bindings.rs and run\n\
         // `cargo run -p wirespeed-build --bin gen-bindings` (CI regenerates and diffs).\n"
    )
}

/// A generated file: its name in the output folder and its text.
type File = (String, String);

/// `cudaNN.rs`, `cudaNN_fns.rs` for both versions, then `api.rs`.
fn runtime_files(args: &args::Args) -> Result<Vec<File>, String> {
    let mut files = Vec::new();
    let mut decls = Vec::new();
    for (tag, dir) in [("cuda13", &args.cuda13), ("cuda12", &args.cuda12)] {
        let types = bindgen_runs::runtime_types(dir, &RUNTIME)?;
        let fns = bindgen_runs::runtime_functions(dir, &RUNTIME)?;
        decls.push(parse::parse_decls(&fns, RUNTIME.versioned_structs)?);
        files.push((format!("{tag}.rs"), format!("{}\n{types}", header(&format!("{tag} types and constants")))));
        files.push((format!("{tag}_fns.rs"), format!("{}\n{fns}", header(&format!("{tag} extern declarations")))));
    }
    let api = runtime_table::api_rs(&RUNTIME, &decls[0], &decls[1])?;
    files.push(("api.rs".into(), format!("{}{api}", header("the runtime function table"))));
    Ok(files)
}

/// `driver.rs` (from CUDA 13) and `driver_api.rs`.
fn driver_files(args: &args::Args) -> Result<Vec<File>, String> {
    let mut files = Vec::new();
    let mut pfns = Vec::new();
    for (tag, dir) in [("cuda13", &args.cuda13), ("cuda12", &args.cuda12)] {
        let types = bindgen_runs::driver_types(dir, &DRIVER)?;
        pfns.push(parse::parse_pfns(&types)?);
        if tag == "cuda13" {
            // One file: the bound types are the same in both versions (the
            // function types are compared below); CUresult is a newtype, so a
            // code only the other version knows is just another value.
            let what = "driver types and constants (cuda.h, cudaTypedefs.h of CUDA 13)";
            files.push(("driver.rs".into(), format!("{}\n{types}", header(what))));
        }
    }
    driver_table::check_driver_symbols(&DRIVER, &args.cuda12)?;
    let api = driver_table::driver_api_rs(&DRIVER, &pfns[0], &pfns[1])?;
    files.push(("driver_api.rs".into(), format!("{}{api}", header("the driver function table"))));
    Ok(files)
}

/// Writes the files, or with `--check` says which differ; false when one does.
fn write_or_check(args: &args::Args, files: &[File]) -> Result<bool, String> {
    let mut differs = false;
    for (name, text) in files {
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

fn run() -> Result<bool, String> {
    let args = args::parse_args()?;
    let mut files = runtime_files(&args)?;
    files.extend(driver_files(&args)?);
    write_or_check(&args, &files)
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
