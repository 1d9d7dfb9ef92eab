#!/usr/bin/env python3
"""Builds the workspace's kernels to PTX, and checks the checked-in PTX.

    scripts/gen-ptx.py [--check] [--wheels DIR]

Each kernel source (`pinned-mem/kernels/*.cu`) is compiled by NVRTC of CUDA
12.0 for `compute_70` into the `.ptx` beside it. PTX of that version (ISA 8.0)
and target loads on every driver of CUDA 12.0 and later, which compile it for
their GPU when the library is loaded; a newer NVRTC would write an ISA that
older drivers refuse. The PTX is then assembled by ptxas of the same release
for sm_70 and sm_90, so an invalid file fails here rather than at load time.

NVRTC and ptxas come from PyPI wheels (`nvidia-cuda-nvrtc-cu12==12.0.76`,
`nvidia-cuda-nvcc-cu12==12.0.76`), downloaded into `--wheels` (default
`.cuda/nvrtc12.0`) on first use. With `--check` nothing is written: it exits 1
when a checked-in PTX differs from what it would write (CI runs it that way).
"""

import argparse
import ctypes
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = sorted((ROOT / "pinned-mem" / "kernels").glob("*.cu"))
VERSION = "12.0.76"
WHEELS = [f"nvidia-cuda-nvrtc-cu12=={VERSION}", f"nvidia-cuda-nvcc-cu12=={VERSION}"]
OPTIONS = [b"--gpu-architecture=compute_70", b"--std=c++17"]
TARGETS = ["sm_70", "sm_90"]


def fetch(dest: pathlib.Path) -> pathlib.Path:
    site = dest / "site"
    if not (site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12").exists():
        dl = dest / "dl"
        dl.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--platform", "manylinux2014_x86_64", "-d", str(dl), *WHEELS],
            check=True,
        )
        for w in dl.glob("*.whl"):
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
        ptxas = site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
        ptxas.chmod(0o755)
    return site


def check_nvrtc(lib, rc, what, prog=None):
    if rc == 0:
        return
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    msg = lib.nvrtcGetErrorString(rc).decode()
    log = ""
    if prog is not None:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = "\n" + buf.value.decode(errors="replace")
    sys.exit(f"gen-ptx: {what}: {msg}{log}")


def compile_ptx(lib, source: pathlib.Path) -> bytes:
    prog = ctypes.c_void_p()
    check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.read_bytes(), source.name.encode(), 0, None, None),
                f"nvrtcCreateProgram({source.name})")
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    check_nvrtc(lib, lib.nvrtcCompileProgram(prog, len(OPTIONS), opts), f"compiling {source.name}", prog)
    n = ctypes.c_size_t()
    check_nvrtc(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(n)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(n.value)
    check_nvrtc(lib, lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value  # without the terminating NUL


def assemble(ptxas: pathlib.Path, ptx: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d) / name
        src.write_bytes(ptx)
        for arch in TARGETS:
            r = subprocess.run([str(ptxas), f"-arch={arch}", str(src), "-o", str(pathlib.Path(d) / "out.cubin")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"gen-ptx: ptxas -arch={arch} {name} failed:\n{r.stderr}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a checked-in PTX differs")
    ap.add_argument("--wheels", type=pathlib.Path, default=ROOT / ".cuda" / "nvrtc12.0")
    args = ap.parse_args()
    site = fetch(args.wheels)
    lib = ctypes.CDLL(str(site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"))
    ptxas = site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    stale = []
    for source in KERNELS:
        ptx = compile_ptx(lib, source)
        out = source.with_suffix(".ptx")
        assemble(ptxas, ptx, out.name)
        if args.check:
            if not out.exists() or out.read_bytes() != ptx:
                stale.append(out.relative_to(ROOT))
        else:
            out.write_bytes(ptx)
            print(f"gen-ptx: wrote {out.relative_to(ROOT)} ({len(ptx)} bytes; ptxas {', '.join(TARGETS)}: ok)")
    if stale:
        print("gen-ptx: out of date (run scripts/gen-ptx.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    if args.check:
        print(f"gen-ptx: {len(KERNELS)} PTX file(s) up to date; ptxas {', '.join(TARGETS)}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
