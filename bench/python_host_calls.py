"""What one wirespeed.read_into call from host memory costs, by size: the
microseconds per call of back-to-back calls (a loop over rows), the part the
Python layer takes before the native call, the native call alone, and the
same with the ring's threads set to 1 (the caller then fills most pieces).

    python bench/python_host_calls.py [--device 0] [--calls 400]

Each line: the source size, microseconds per call, GB/s and x line (a
resident pinned buffer copied in the same run). The destinations are checked
against the sources at the end. Without torch or a GPU it says so and exits 2.
"""

import argparse
import sys
import time

try:
    import torch
except ImportError:
    torch = None

import wirespeed
from line_rate import line_rate  # beside this script
from wirespeed import _native

SIZES = [4 << 10, 512 << 10, 2560 << 10, 16 << 20]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    if torch is None or not torch.cuda.is_available():
        print("python_host_calls: needs torch with a CUDA GPU")
        return 2
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    line = line_rate(torch, dev)
    print(f"line rate {line:.2f} GB/s; {args.calls} calls per row")

    ok = True
    for threads in (None, 1):
        wirespeed.prepare(device=args.device, threads=threads)
        label = "default threads" if threads is None else f"{threads} thread"
        for n in SIZES:
            calls = max(20, min(args.calls, (2 << 30) // n))
            src = torch.randint(0, 256, (calls, n), dtype=torch.uint8)
            dst = torch.zeros((calls, n), dtype=torch.uint8, device=dev)
            wirespeed.read_into(dst[0], src[0], sync=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(calls):
                wirespeed.read_into(dst[i], src[i])
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t) / calls
            good = torch.equal(dst.cpu(), src)
            ok &= good
            # The Python layer alone: what read_into does before the native call.
            t = time.perf_counter()
            for i in range(calls):
                wirespeed._destination(dst[i])
                wirespeed._host_bytes(src[i])
            py = (time.perf_counter() - t) / calls
            # The native call alone, its arguments made ahead.
            argv = [(memoryview(src[i].numpy()), *wirespeed._destination(dst[i]), dst[i]) for i in range(calls)]
            torch.cuda.synchronize()
            t = time.perf_counter()
            for mv, ptr, nbytes, device, stream, keep in argv:
                _native.read_host(mv, ptr, nbytes, device, stream, wirespeed.DEFAULT_BUDGET, "auto", keep, False)
            torch.cuda.synchronize()
            native = (time.perf_counter() - t) / calls
            print(f"{label:16s} {n / 1024:8.0f} KiB: {dt * 1e6:8.1f} us a call, {n / dt / 1e9:6.2f} GB/s = "
                  f"{n / dt / 1e9 / line:.2f} x line; the Python layer {py * 1e6:.1f} us, the native call "
                  f"{native * 1e6:.1f} us; {'verified' if good else 'MISMATCH'}")
    wirespeed.prepare(device=args.device)
    print("ok" if ok else "FAILED: a destination differs from its source")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
