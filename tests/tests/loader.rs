//! The run-time loader of `cuda-sys`: typed errors for missing and wrong
//! libraries, the emulator loaded by path as CUDA 13 and (in a child process)
//! as CUDA 12, every entry point of the table resolved, the devices of this
//! binary's runtime listed, and the real runtimes of the PyPI wheels when
//! `CUDA_WHEEL_LIBS` names a folder holding `libcudart.so.12` and `.13`.
//!
//! Child processes re-run this test binary on one `#[ignore]`d test with
//! environment variables that must be set before a library loads.

use std::ffi::{CString, c_void};
use wirespeed_cuda_sys::{DevicePropBuffer, LoadError, RUNTIME_PATH_ENV, Runtime, SEARCH_ORDER, SYMBOLS, cudaError_t};
use wirespeed_tests::{child_ran, is_child, run_child, start};

/// `dlopen` of a library this process already loaded (or null).
fn loaded_handle(path: &str) -> *mut c_void {
    let c = CString::new(path).unwrap();
    // SAFETY: a valid C string; RTLD_NOLOAD only looks the library up.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
}

fn has_symbol(handle: *mut c_void, name: &str) -> bool {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a valid C string.
    !unsafe { libc::dlsym(handle, c.as_ptr()) }.is_null()
}

/// The symbols of [`SYMBOLS`] for `major` that `path` (already loaded) lacks.
fn missing_symbols(path: &str, major: i32) -> Vec<&'static str> {
    let h = loaded_handle(path);
    assert!(!h.is_null(), "{path} is not loaded");
    SYMBOLS.iter().map(|&(_, s13, s12)| if major >= 13 { s13 } else { s12 }).filter(|s| !has_symbol(h, s)).collect()
}

// What these tests load: the emulator (this workspace's stand-in for libcudart,
// built with the CUDA 12 and 13 names and version), the PyPI wheel runtimes,
// paths that do not exist, and libc, which lacks cudaRuntimeGetVersion, so the
// loader refuses it before calling anything in it.

fn load(path: &str) -> Result<&'static Runtime, LoadError> {
    // SAFETY: see above.
    unsafe { Runtime::load(path) }
}

fn search(explicit: Option<&str>) -> Result<&'static Runtime, LoadError> {
    // SAFETY: see above; the rest is this machine's CUDA configuration.
    unsafe { Runtime::search(explicit) }
}

fn set_path(path: impl Into<String>) -> Result<(), LoadError> {
    // SAFETY: see above.
    unsafe { wirespeed_cuda_sys::set_runtime_path(path) }
}

fn emulator_path() -> String {
    wirespeed_cuda_sys::emulator::library_path().expect("the emulator is embedded")
}

// ------------------------------------------------------------------ typed load errors

#[test]
fn a_missing_library_is_not_found_and_listed() {
    let p = "/nonexistent/wire-speed/libcudart.so.13";
    let e = load(p).unwrap_err();
    let LoadError::NotFound { tried } = &e else { panic!("{e:?}") };
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].0, p);
    assert!(!tried[0].1.is_empty());
    let s = e.to_string();
    assert!(s.contains(p) && s.contains(RUNTIME_PATH_ENV), "{s}");
    let e = wirespeed_cuda::Error::from(e);
    assert!(e.hint().unwrap().contains(RUNTIME_PATH_ENV));
}

#[test]
fn search_tries_every_candidate_in_order() {
    let missing = "/nonexistent/wire-speed/explicit-libcudart.so";
    match search(Some(missing)) {
        Ok(rt) => {
            // A real runtime is installed: it came from the environment or the search order.
            let env = std::env::var(RUNTIME_PATH_ENV).unwrap_or_default();
            assert!(rt.path() == env || SEARCH_ORDER.contains(&rt.path()), "{rt:?}");
            eprintln!("note: a real runtime loads here: {rt:?}");
        }
        Err(LoadError::NotFound { tried }) => {
            let names: Vec<&str> = tried.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names[0], missing);
            assert!(names.ends_with(SEARCH_ORDER), "{names:?}");
            if let Ok(env) = std::env::var(RUNTIME_PATH_ENV)
                && !env.is_empty()
            {
                assert_eq!(names[1], env);
            }
        }
        Err(e) => panic!("{e:?}"),
    }
}

#[test]
fn a_library_without_the_runtime_symbols_is_refused() {
    let e = load("libc.so.6").unwrap_err();
    assert_eq!(e, LoadError::MissingSymbol { library: "libc.so.6".into(), symbol: "cudaRuntimeGetVersion".into() });
    let s = e.to_string();
    assert!(s.contains("libc.so.6") && s.contains("cudaRuntimeGetVersion"), "{s}");
    // search stops at a candidate that opens but is broken.
    assert!(matches!(search(Some("libc.so.6")), Err(LoadError::MissingSymbol { .. })));
}

#[test]
fn a_path_with_nul_is_refused() {
    let e = load("lib\0cudart.so").unwrap_err();
    assert_eq!(e, LoadError::BadPath("lib\0cudart.so".into()));
    assert!(e.to_string().contains("NUL"));
}

#[test]
fn the_runtime_path_is_fixed_after_first_use() {
    let t = start();
    let rt = wirespeed_cuda_sys::runtime().unwrap();
    assert_eq!(rt.path(), t.env.path);
    let e = set_path("/elsewhere/libcudart.so.13").unwrap_err();
    assert_eq!(e, LoadError::AlreadyLoaded { library: t.env.path.clone() });
    assert!(e.to_string().contains(&t.env.path));
    // The first outcome is kept.
    assert!(std::ptr::eq(wirespeed_cuda_sys::runtime().unwrap(), rt));
    t.assert_clean();
}

// ------------------------------------------------------------------ the emulator by path

#[test]
fn the_emulator_loads_by_path_as_cuda_13() {
    if std::env::var_os("CUDA_EMU_VERSION").is_some() {
        eprintln!("note: CUDA_EMU_VERSION is set in the environment; skipped");
        return;
    }
    let path = emulator_path();
    let rt = load(&path).unwrap();
    assert_eq!((rt.version(), rt.major(), rt.path()), (13000, 13, path.as_str()));
    assert!(format!("{rt:?}").contains("13000"));
    assert_eq!(wirespeed_cuda_sys::emulator::load().unwrap().version(), 13000);
    assert_eq!(rt.error_name(cudaError_t(0)), "cudaSuccess");
    assert_eq!(rt.error_name(cudaError_t(1)), "cudaErrorInvalidValue");
    assert_eq!(rt.error_string(cudaError_t(1)), "invalid argument");
    assert_eq!(rt.error_name(cudaError_t(35)), "cudaErrorInsufficientDriver");
    assert_eq!(rt.error_name(cudaError_t(4242)), "unrecognized error code");
    let mut n = 0;
    // SAFETY: `n` is a valid place for the count.
    assert_eq!(unsafe { (rt.api().cudaGetDeviceCount)(&mut n) }.0, 0);
    assert!(n >= 1);
    let mut props = Box::new(DevicePropBuffer::new());
    // SAFETY: the buffer fits either layout.
    assert_eq!(unsafe { (rt.api().cudaGetDeviceProperties)(props.0.as_mut_ptr().cast(), 0) }.0, 0);
    assert_eq!(props.name(), "Emulated CUDA Device");
    // It exports the names of both major versions.
    assert_eq!(missing_symbols(&path, 13), Vec::<&str>::new());
    assert_eq!(missing_symbols(&path, 12), Vec::<&str>::new());
}

/// Only CUDA 12 and 13 load: the bindings describe no other major version's
/// structures (a CUDA 14 `cudaDeviceProp` could outgrow the buffer).
#[test]
fn other_major_versions_are_refused() {
    for v in ["14000", "11080", "0"] {
        let out = run_child("child_unsupported_version", &[("CUDA_EMU_VERSION", v)]).stdout;
        assert!(out.contains(&format!("refused {v}")), "{out}");
    }
}

#[test]
#[ignore = "runs in a child process started by other_major_versions_are_refused"]
fn child_unsupported_version() {
    if !is_child("child_unsupported_version") {
        return;
    }
    let v: i32 = std::env::var("CUDA_EMU_VERSION").unwrap().parse().unwrap();
    let path = emulator_path();
    let e = load(&path).unwrap_err();
    assert_eq!(e, LoadError::UnsupportedVersion { library: path.clone(), version: v });
    assert!(e.to_string().contains("support 12 and 13"), "{e}");
    println!("refused {v}");
    child_ran("child_unsupported_version");
}

/// CUDA 12.0 to 12.7 lack `cudaEventElapsedTime_v2` (it arrived in 12.8): the
/// table then binds the unversioned symbol, which has the same C signature.
/// Other `_v2` names have no such fallback (`cudaGetDeviceProperties`'s
/// unversioned symbol takes the older struct layout).
#[test]
fn cuda_12_before_12_8_binds_the_unversioned_elapsed_time() {
    let path = emulator_path();
    load(&path).unwrap();
    let h = loaded_handle(&path);
    let dlsym = |name: &str| {
        let c = CString::new(name.trim_end_matches('\0')).unwrap();
        // SAFETY: a live handle (the library stays loaded) and a C string.
        unsafe { libc::dlsym(h, c.as_ptr()) }
    };
    let without = |hidden: &'static str| {
        move |name: &'static str| if name == hidden { std::ptr::null_mut() } else { dlsym(name) }
    };
    // SAFETY: every address comes from the emulator, a CUDA 12/13 stand-in.
    let api = unsafe { wirespeed_cuda_sys::Api::resolve(12, without("cudaEventElapsedTime_v2\0")) }.unwrap();
    assert_eq!(api.cudaEventElapsedTime as *mut c_void, dlsym("cudaEventElapsedTime"));
    // SAFETY: as above.
    let e = unsafe { wirespeed_cuda_sys::Api::resolve(12, without("cudaGetDeviceProperties_v2\0")) }.err();
    assert_eq!(e, Some("cudaGetDeviceProperties_v2\0"));
    // SAFETY: as above. CUDA 13 has no fallback either.
    let e = unsafe { wirespeed_cuda_sys::Api::resolve(13, without("cudaEventElapsedTime\0")) }.err();
    assert_eq!(e, Some("cudaEventElapsedTime\0"));
}

/// Injecting "success" would let a call skip its work and report it done.
#[test]
fn a_fault_of_code_zero_is_refused() {
    let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
    assert!(!ctl.inject_fault("cudaMemcpyAsync", 1, 0, false));
    assert!(ctl.inject_fault("cudaMemcpyAsync", 1000, 1, false));
    ctl.reset();
}

#[test]
fn the_emulator_as_cuda_12_uses_the_cuda_12_symbols() {
    let out = run_child("child_emulator_as_cuda_12", &[("CUDA_EMU_VERSION", "12090")]).stdout;
    assert!(out.contains("version 12090"), "{out}");
}

#[test]
#[ignore = "runs in a child process started by the_emulator_as_cuda_12_uses_the_cuda_12_symbols"]
fn child_emulator_as_cuda_12() {
    if !is_child("child_emulator_as_cuda_12") {
        return;
    }
    let path = emulator_path();
    let rt = load(&path).unwrap();
    assert_eq!((rt.version(), rt.major()), (12090, 12));
    let ctl = wirespeed_cuda_sys::emulator::controls().unwrap();
    let count = |f: &str| ctl.call_count(f).unwrap();
    let (v2, plain) = (count("cudaGetDeviceProperties_v2"), count("cudaGetDeviceProperties"));
    let mut props = Box::new(DevicePropBuffer::new());
    // SAFETY: the buffer fits either layout.
    assert_eq!(unsafe { (rt.api().cudaGetDeviceProperties)(props.0.as_mut_ptr().cast(), 0) }.0, 0);
    assert_eq!(props.name(), "Emulated CUDA Device");
    assert_eq!((count("cudaGetDeviceProperties_v2"), count("cudaGetDeviceProperties")), (v2 + 1, plain));

    // The same through cuda-safe, with this runtime as the process-wide one.
    set_path(path.clone()).unwrap();
    let info = wirespeed_cuda::runtime_info().unwrap();
    assert_eq!(info.runtime_version, 12090);
    let d = wirespeed_cuda::Device::get(0).unwrap();
    assert_eq!(d.name().unwrap(), "Emulated CUDA Device");
    assert_eq!(count("cudaGetDeviceProperties_v2"), v2 + 2);
    let s = wirespeed_cuda::Stream::new(&d).unwrap();
    let timed = wirespeed_cuda::EventOptions::new().timing(true);
    let (a, b) = (wirespeed_cuda::Event::new(&d, timed).unwrap(), wirespeed_cuda::Event::new(&d, timed).unwrap());
    s.record(&a).unwrap();
    s.record(&b).unwrap();
    b.synchronize().unwrap();
    let (e2, e) = (count("cudaEventElapsedTime_v2"), count("cudaEventElapsedTime"));
    assert!(b.elapsed_ms(&a).unwrap() >= 0.0);
    assert_eq!((count("cudaEventElapsedTime_v2"), count("cudaEventElapsedTime")), (e2 + 1, e));
    drop((s, a, b));
    assert!(ctl.counters().is_clean());
    println!("version {}", info.runtime_version);
    child_ran("child_emulator_as_cuda_12");
}

// ------------------------------------------------------------------ this binary's runtime

#[test]
fn every_table_symbol_resolves_in_the_loaded_runtime() {
    let t = start();
    let rt = wirespeed_cuda_sys::runtime().unwrap();
    assert_eq!(missing_symbols(rt.path(), rt.major()), Vec::<&str>::new(), "{rt:?}");
    // The table's field names are unique and each names its CUDA 13 symbol.
    let mut fields: Vec<&str> = SYMBOLS.iter().map(|s| s.0).collect();
    fields.sort_unstable();
    fields.dedup();
    assert_eq!(fields.len(), SYMBOLS.len());
    assert!(SYMBOLS.iter().all(|(f, s13, _)| f == s13));
    t.assert_clean();
}

#[test]
fn devices_of_this_runtime() {
    let t = start();
    let info = wirespeed_cuda::runtime_info().unwrap();
    let devices = wirespeed_cuda::Device::all().unwrap();
    eprintln!(
        "runtime {} from {} (driver {}): {} device(s)",
        info.runtime_version,
        info.path,
        info.driver_version,
        devices.len()
    );
    assert!(!devices.is_empty());
    for d in &devices {
        let name = d.name().unwrap();
        let (free, total) = d.mem_info().unwrap();
        eprintln!("device {}: {name} ({free} of {total} bytes free)", d.ordinal());
        if t.emulated() {
            assert_eq!(name, "Emulated CUDA Device");
        } else {
            assert!(name.starts_with("NVIDIA"), "{name}");
            if std::env::var("CUDA_REQUIRED").is_ok_and(|v| v == "1") {
                // The GPU machine of this project's CI: an H200 unless told otherwise.
                let want = std::env::var("CUDA_EXPECT_DEVICE_NAME").unwrap_or_else(|_| "NVIDIA H200".into());
                assert!(name.contains(&want), "device {name}, expected {want}");
            }
        }
    }
    t.assert_clean();
}

// ------------------------------------------------------------------ the real runtimes of the wheels

const WHEELS: &[(&str, i32)] = &[("libcudart.so.12", 12), ("libcudart.so.13", 13)];

fn wheel_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("CUDA_WHEEL_LIBS") {
        Some(d) if !d.is_empty() => Some(d.into()),
        _ => {
            eprintln!("note: CUDA_WHEEL_LIBS is not set: the real runtimes of the PyPI wheels are not checked");
            None
        }
    }
}

fn driver_present() -> bool {
    // SAFETY: a valid C string; the driver library is only opened (never closed: harmless).
    !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
}

#[test]
fn wheel_runtimes_load_and_resolve_every_symbol() {
    let Some(dir) = wheel_dir() else { return };
    for &(file, major) in WHEELS {
        let path = dir.join(file);
        assert!(path.is_file(), "{} is missing", path.display());
        let path = path.to_str().unwrap();
        let rt = load(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(rt.major(), major, "{rt:?}");
        assert_eq!(missing_symbols(path, major), Vec::<&str>::new(), "{path}");
        let mut n = -1;
        // SAFETY: `n` is a valid place for the count.
        let code = unsafe { (rt.api().cudaGetDeviceCount)(&mut n) };
        eprintln!("{path}: version {}, cudaGetDeviceCount: {} ({n} devices)", rt.version(), rt.error_name(code));
        if driver_present() {
            assert!(code.0 == 0 || code.0 == 100, "{}", rt.error_name(code));
        } else {
            assert_eq!(code.0, 35, "without a driver: {}", rt.error_name(code));
            assert_eq!(rt.error_name(code), "cudaErrorInsufficientDriver");
        }
    }
}

#[test]
fn wheel_runtimes_surface_through_cuda_safe() {
    let Some(dir) = wheel_dir() else { return };
    for &(file, major) in WHEELS {
        let path = dir.join(file).to_str().unwrap().to_string();
        let out =
            run_child("child_wheel_runtime", &[(RUNTIME_PATH_ENV, &path), ("LOADER_EXPECT_MAJOR", &major.to_string())])
                .stdout;
        eprint!("{out}");
    }
}

#[test]
#[ignore = "runs in a child process started by wheel_runtimes_surface_through_cuda_safe"]
fn child_wheel_runtime() {
    if !is_child("child_wheel_runtime") {
        return;
    }
    // No start(): the process-wide runtime comes from CUDA_SYS_RUNTIME.
    let path = std::env::var(RUNTIME_PATH_ENV).unwrap();
    let major: i32 = std::env::var("LOADER_EXPECT_MAJOR").unwrap().parse().unwrap();
    let rt = wirespeed_cuda_sys::runtime().unwrap();
    assert_eq!((rt.path(), rt.major()), (path.as_str(), major));
    let info = wirespeed_cuda::runtime_info().unwrap();
    assert_eq!(info.path, path);
    match wirespeed_cuda::Device::count() {
        Ok(n) => {
            assert!(driver_present() && n >= 1);
            let name = wirespeed_cuda::Device::get(0).unwrap().name().unwrap();
            println!("{path}: {n} device(s), device 0 is {name}");
        }
        Err(e) => {
            println!("{path}: {e}");
            assert!(!driver_present(), "{e}");
            let wirespeed_cuda::Error::Cuda { call, code, name, .. } = &e else { panic!("{e:?}") };
            assert_eq!((*call, *code, name.as_str()), ("cudaGetDeviceCount", 35, "cudaErrorInsufficientDriver"));
            assert!(e.hint().unwrap().contains("driver"));
            assert_eq!(info.driver_version, 0);
        }
    }
    child_ran("child_wheel_runtime");
}
