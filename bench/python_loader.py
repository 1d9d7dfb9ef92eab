#!/usr/bin/env python3
"""wirespeed.Loader from Python on a file of fixed-size records, for the
`shuffle` bench: one JSON line per way (name, GB/s, M records/s, CPU s/GB),
the median of --reps epochs after a first one, every batch a fresh CUDA
tensor kept until the epoch ends (or dropped at once with --drop)."""

import argparse
import json
import resource
import time

import numpy as np
import torch

import wirespeed


def cpu_seconds():
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--record", type=int, default=2883)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--way", default="pool")
    ap.add_argument("--budget", type=int, default=4 << 30)
    ap.add_argument("--device-budget", type=int, default=None)
    ap.add_argument("--block", type=int, default=256 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--line", type=float, default=0.0)
    a = ap.parse_args()
    n = np.memmap(a.path, dtype=np.uint8, mode="r").size // a.record
    arr = np.memmap(a.path, dtype=np.uint8, mode="r", shape=(n, a.record))
    shuffle = {"pool": "pool", "full": "full"}.get(a.way, True)
    torch.cuda.init()
    loader = wirespeed.Loader(arr, batch_size=a.batch, shuffle=shuffle, seed=7, budget=a.budget,
                              device_budget=a.device_budget, block_bytes=a.block)
    rates, cpus = [], []
    for e in range(a.reps + 1):
        torch.cuda.synchronize()
        t, c, records = time.monotonic(), cpu_seconds(), 0
        for x in loader:
            records += x.shape[0]
        torch.cuda.synchronize()
        dt, dc = time.monotonic() - t, cpu_seconds() - c
        if e > 0:
            rates.append(records * a.record / dt / 1e9)
            cpus.append(dc / (records * a.record / 1e9))
    rates.sort()
    cpus.sort()
    g = rates[len(rates) // 2]
    print(json.dumps({"name": f"python-loader-{loader.way}", "gbps": g, "x_line": g / a.line if a.line else 0.0,
                      "mrec_per_s": g * 1e9 / a.record / 1e6, "cpu_s_per_gb": cpus[len(cpus) // 2],
                      "min_gbps": rates[0], "max_gbps": rates[-1]}), flush=True)
    loader.close()


if __name__ == "__main__":
    main()
