//! Choosing the runtime and the device, and saying clearly why when there is none.

use crate::args::Options;
use crate::util::{Fatal, Result};
use wirespeed_cuda::Device;
use wirespeed_cuda::sys::{LoadError, RUNTIME_PATH_ENV, SEARCH_ORDER};

/// The device the bench measures, and what it runs on.
pub struct Gpu {
    pub device: Device,
    pub name: String,
    /// True on the emulated runtime: no number is a GPU measurement.
    pub emulated: bool,
    pub runtime_version: i32,
    pub driver_version: i32,
    pub runtime_path: String,
    pub free: u64,
    pub total: u64,
    /// The host's CPU, cache and memory ([`crate::util::host`]).
    pub host: String,
}

impl Gpu {
    pub fn describe(&self) -> String {
        let v = |v: i32| format!("{}.{}", v / 1000, v % 1000 / 10);
        format!(
            "GPU 0: {}{}, {} of {} GiB free; CUDA runtime {} from {}, driver supports {}",
            self.name,
            if self.emulated { " (EMULATED)" } else { "" },
            self.free >> 30,
            self.total >> 30,
            v(self.runtime_version),
            self.runtime_path,
            v(self.driver_version)
        )
    }
}

const EMULATOR_REBUILD: &str = "cargo run --release -p wirespeed-bench --features emulator -- --emulated --quick";

fn emulator_hint() -> String {
    if cfg!(feature = "emulator") {
        "  - or try the whole pipeline without a GPU on the emulated runtime (numbers are then not GPU\n    \
         measurements): add --emulated (e.g. `bench --emulated --quick`)"
            .to_string()
    } else {
        format!(
            "  - or try the whole pipeline without a GPU on the emulated runtime (numbers are then not GPU\n    \
             measurements); this build lacks it, rebuild with:\n    {EMULATOR_REBUILD}"
        )
    }
}

fn looked_for() -> String {
    let env = match std::env::var(RUNTIME_PATH_ENV) {
        Ok(v) if !v.is_empty() => format!("${RUNTIME_PATH_ENV} = {v}"),
        _ => format!("${RUNTIME_PATH_ENV} (not set)"),
    };
    format!(
        "Looked for: the CUDA runtime library, in this order: {env}, then {} (through the dynamic\n\
         loader: LD_LIBRARY_PATH, the ldconfig cache), then a CUDA device through it.",
        SEARCH_ORDER.join(", ")
    )
}

fn load_error(e: &LoadError) -> String {
    match e {
        LoadError::NotFound { tried } => {
            let mut s = String::from("no CUDA runtime library could be loaded:");
            for (name, why) in tried {
                s.push_str(&format!("\n  - {name}: {why}"));
            }
            s
        }
        other => other.to_string(),
    }
}

fn no_gpu(found: String) -> Fatal {
    Fatal::NoGpu(format!(
        "bench: no usable CUDA GPU, so there is nothing to measure.\n\n{}\nFound: {found}\n\n\
         To fix it:\n  \
         - install the NVIDIA driver (`nvidia-smi` must list the GPU) and a CUDA runtime 12 or 13\n    \
         (the CUDA toolkit, or `pip install nvidia-cuda-runtime`);\n  \
         - or point {RUNTIME_PATH_ENV} at a libcudart.so, e.g.\n    \
         {RUNTIME_PATH_ENV}=/usr/local/cuda/lib64/libcudart.so.13 bench;\n  \
         - check CUDA_VISIBLE_DEVICES if it is set;\n{}",
        looked_for(),
        emulator_hint()
    ))
}

/// Loads the runtime (the emulated one with `--emulated`) and picks device 0.
pub fn select(opts: &Options) -> Result<Gpu> {
    let wanted = if opts.emulated {
        Some(
            wirespeed_bench::emulator::select(EMULATOR_REBUILD)
                .map_err(|e| if cfg!(feature = "emulator") { Fatal::NoGpu(e) } else { Fatal::Usage(e) })?,
        )
    } else {
        None
    };
    let rt = wirespeed_cuda::sys::runtime().map_err(|e| no_gpu(load_error(&e)))?;
    if let Some(w) = &wanted
        && rt.path() != w
    {
        return Err(Fatal::NoGpu(format!(
            "--emulated: the runtime was loaded from {} instead of the emulator {w}",
            rt.path()
        )));
    }
    let ver = rt.version();
    let loaded = format!("{} (CUDA {}.{})", rt.path(), ver / 1000, ver % 1000 / 10);
    match Device::count() {
        Err(e) => return Err(no_gpu(format!("{loaded}, but cudaGetDeviceCount failed: {e}"))),
        Ok(0) => return Err(no_gpu(format!("{loaded}, but it sees no device"))),
        Ok(_) => {}
    }
    let device = Device::get(0)?;
    let name = device.name()?;
    let info = wirespeed_cuda::runtime_info()?;
    let (free, total) = device.mem_info()?;
    let emulated = wanted.is_some() || name.contains("Emulated");
    Ok(Gpu {
        device,
        name,
        emulated,
        runtime_version: info.runtime_version,
        driver_version: info.driver_version,
        runtime_path: info.path,
        free: free as u64,
        total: total as u64,
        host: crate::util::host(),
    })
}
