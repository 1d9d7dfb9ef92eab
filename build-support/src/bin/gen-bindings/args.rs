//! The command line: where the headers are, where the files go, and `--check`.

use std::path::PathBuf;

/// What one run does.
pub struct Args {
    /// The CUDA 13 include folder.
    pub cuda13: PathBuf,
    /// The CUDA 12 include folder.
    pub cuda12: PathBuf,
    /// Where the generated files go.
    pub out: PathBuf,
    /// Compare with the files in `out` rather than write them.
    pub check: bool,
}

/// Reads the arguments; the include folders default to those of the CUDA
/// runtime wheels `wirespeed_build` finds.
pub fn parse_args() -> Result<Args, String> {
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
