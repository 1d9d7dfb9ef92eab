//! Loads a CUDA runtime and reports what it sees: version, devices, names, and
//! whether every bound symbol resolves.
//!
//! ```text
//! cargo run -p wirespeed-cuda-sys --example probe                 # the default search order
//! cargo run -p wirespeed-cuda-sys --example probe -- /path/libcudart.so.12 ...
//! ```
use std::process::ExitCode;

fn probe(rt: &'static wirespeed_cuda_sys::Runtime) -> bool {
    let api = rt.api();
    println!("loaded {} (runtime {}, major {})", rt.path(), rt.version(), rt.major());
    // Every symbol of the table resolved when the runtime loaded; say which names.
    let names: Vec<&str> =
        wirespeed_cuda_sys::SYMBOLS.iter().map(|(_, s13, s12)| if rt.major() >= 13 { *s13 } else { *s12 }).collect();
    println!("  {} of {} bound symbols resolved ({})", names.len(), wirespeed_cuda_sys::SYMBOLS.len(), names.join(" "));
    let mut driver = 0;
    // SAFETY: valid place for the version.
    unsafe { (api.cudaDriverGetVersion)(&mut driver) };
    let mut n = 0;
    // SAFETY: valid place for the count.
    let code = unsafe { (api.cudaGetDeviceCount)(&mut n) };
    println!("  driver supports {driver}; cudaGetDeviceCount -> {} ({}), count {n}", rt.error_name(code), code.0);
    if code.0 != 0 {
        println!("  {}", rt.error_string(code));
        return false;
    }
    for d in 0..n {
        let mut p = Box::new(wirespeed_cuda_sys::DevicePropBuffer::new());
        // SAFETY: the buffer fits either version's cudaDeviceProp.
        let c = unsafe { (api.cudaGetDeviceProperties)(p.0.as_mut_ptr().cast(), d) };
        let mut ro = 0;
        // SAFETY: valid place for the value.
        unsafe {
            (api.cudaDeviceGetAttribute)(
                &mut ro,
                wirespeed_cuda_sys::cudaDeviceAttr::cudaDevAttrHostRegisterReadOnlySupported,
                d,
            )
        };
        println!("  device {d}: {:?} ({}), read-only host register supported: {ro}", p.name(), rt.error_name(c));
    }
    true
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut ok = true;
    if args.is_empty() {
        match wirespeed_cuda_sys::runtime() {
            Ok(rt) => ok &= probe(rt),
            Err(e) => {
                println!("{e}");
                ok = false;
            }
        }
    }
    for path in &args {
        // SAFETY: the user names a CUDA runtime to probe (that is what this
        // program is for); it is version-checked, and its symbols looked up.
        match unsafe { wirespeed_cuda_sys::Runtime::load(path) } {
            Ok(rt) => ok &= probe(rt),
            Err(e) => {
                println!("{path}: {e}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
