"""The line rate for the Python bench scripts beside this file: GB/s of a
resident 256 MiB pinned tensor copied to the device 8 times (after one
untimed copy), the figure every row's "x line" divides by."""

import time


def line_rate(torch, dev):
    """GB/s from pinned host memory to ``dev`` (a ``torch.device``), with
    ``torch`` the module the caller imported."""
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(8):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 8 * (256 << 20) / (time.perf_counter() - t) / 1e9
