#!/usr/bin/env python3
"""PyTorch's DataLoader reading shuffled fixed-size records of a file, for the
`shuffle` bench: one JSON line per row (name, GB/s, M records/s, CPU s/GB).

Rows: one record per __getitem__ with 8 and 16 workers and pin_memory=True,
each batch moved with .cuda(non_blocking=True); and a batch sampler whose
__getitems__ reads a batch's records with one sorted fancy index (0 workers).
Each row runs for about --seconds (after one warm-up batch).

Where `import torch` or numpy fails, or torch sees no GPU, it says so on one
line and exits 0 (so does --emulated, after the imports)."""

import argparse
import json
import resource
import sys
import time

try:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler
except Exception as e:  # ImportError, or a broken install
    print(f"torch_shuffle.py: skipped: `import torch` failed ({e.__class__.__name__}: {e})", flush=True)
    sys.exit(0)
try:
    import numpy as np
except Exception as e:
    print(f"torch_shuffle.py: skipped: `import numpy` failed ({e.__class__.__name__}: {e})", flush=True)
    sys.exit(0)


class Records(Dataset):
    def __init__(self, path, record):
        self.path, self.record = path, record
        self.n = np.memmap(path, dtype=np.uint8, mode="r").size // record
        self.mm = None

    def _map(self):
        if self.mm is None:
            self.mm = np.memmap(self.path, dtype=np.uint8, mode="r")[: self.n * self.record].reshape(self.n, self.record)
        return self.mm

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self._map()[i]))


class Batched(Records):
    """The same records, read a batch at a time with one sorted fancy index
    (what a DataLoader calls when a dataset has __getitems__)."""

    def __getitems__(self, idx):
        idx = np.sort(np.asarray(idx))
        return torch.from_numpy(self._map()[idx])


def cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run(name, loader, record, seconds, line):
    it = iter(loader)
    first = next(it).cuda(non_blocking=True)
    torch.cuda.synchronize()
    t, c, batches, records = time.monotonic(), cpu_seconds(), 0, 0
    for b in it:
        x = b.cuda(non_blocking=True)
        batches += 1
        records += x.shape[0]
        if time.monotonic() - t > seconds:
            break
    torch.cuda.synchronize()
    dt = time.monotonic() - t
    del it  # a DataLoader's iterator joins its workers, so that their CPU time is counted
    dc = cpu_seconds() - c
    gb = records * record / 1e9
    del first
    print(json.dumps({"name": name, "gbps": gb / dt, "x_line": gb / dt / line, "mrec_per_s": records / dt / 1e6,
                      "cpu_s_per_gb": dc / gb if gb else 0.0, "batches": batches}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--record", type=int, default=2883)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--line", type=float, default=0.0)
    ap.add_argument("--emulated", action="store_true", help="check the imports, then skip (an emulated run)")
    a = ap.parse_args()
    if a.emulated:
        print("torch_shuffle.py: skipped: an emulated run (the DataLoader rows need a GPU)", flush=True)
        return
    if not torch.cuda.is_available():
        print(f"torch_shuffle.py: skipped: torch {torch.__version__} sees no CUDA GPU", flush=True)
        return
    ds = Records(a.path, a.record)
    for workers in (8, 16):
        dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=workers, pin_memory=True,
                        persistent_workers=False, prefetch_factor=4)
        run(f"dataloader-per-sample-{workers}w-pinned", dl, a.record, a.seconds, a.line)
    # What a DataLoader with 0 workers and a batch sampler does with
    # __getitems__: one sorted fancy index per batch, in this process.
    bds = Batched(a.path, a.record)
    sampler = BatchSampler(RandomSampler(bds), batch_size=a.batch, drop_last=False)
    run("dataloader-getitems-sorted-0w", (bds.__getitems__(idx) for idx in sampler), a.record, a.seconds, a.line)


if __name__ == "__main__":
    main()
