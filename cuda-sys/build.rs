//! Links libcudart under the `link` feature; builds the emulated runtime under `emulator`.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let emulator = std::env::var_os("CARGO_FEATURE_EMULATOR").is_some();
    if wirespeed_build::is_docs_rs() {
        // Documentation builds (docs.rs, or DOCS_RS=1 anywhere) compile no C and
        // link nothing. The emulator module still needs a library to embed: an
        // empty placeholder, which `emulator::library_path` reports as absent.
        if emulator {
            let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
            let stub = out.join("libcudart_emu.docs-only");
            if let Err(e) = std::fs::write(&stub, b"") {
                panic!("writing {}: {e}", stub.display());
            }
            println!("cargo:rustc-env=CUDA_SYS_EMULATOR_PATH={}", stub.display());
        }
        return;
    }
    if emulator {
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let src = PathBuf::from("emu/cudart_emu.c");
        println!("cargo:rerun-if-changed=emu/cudart_emu.h");
        match wirespeed_build::build_shared_library("cudart_emu", &[src], &out) {
            Ok(path) => println!("cargo:rustc-env=CUDA_SYS_EMULATOR_PATH={}", path.display()),
            Err(e) => panic!("building the emulated CUDA runtime: {e}"),
        }
    }
    if std::env::var_os("CARGO_FEATURE_LINK").is_some() {
        match wirespeed_build::find_cuda() {
            Some(cuda) => wirespeed_build::emit_link(&cuda),
            None => panic!(
                "feature `link`: no CUDA found; set CUDA_PATH (or CUDA_HOME, CUDA_ROOT, CUDA_TOOLKIT_ROOT_DIR), \
                 install the nvidia-cuda-runtime wheel, or build without `link` to load libcudart at run time"
            ),
        }
    }
}
