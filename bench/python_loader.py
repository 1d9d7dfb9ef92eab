#!/usr/bin/env python3
"""wirespeed.Loader from Python on a file of fixed-size records, for the
`shuffle` bench: one JSON line per way (name, GB/s, M records/s, CPU s/GB),
the median of --reps epochs after a first one.

--way: one or more of pool, resident, registered, ring, full (comma-separated;
full: shuffle="full" with the budgets given, the first full shuffle that fits).
Each way is asked for through the Loader's public arguments: pool with
shuffle="pool" (--budget pinned, --device-budget for the pool); resident with
shuffle="full" and a device budget that holds the file; registered with
shuffle="full", a device budget of one byte and a pin budget that holds the
file; ring with shuffle="full", a device budget of one byte and --budget
(smaller than the file).

--busy MS: calibrated caller work per batch instead of the rates. A loop of
square matmuls (--busy-size, fp16) on torch's current stream is timed with CUDA
events so that it takes MS milliseconds per batch. Then for each way, after a
warm-up epoch, over --busy-batches batches (default: an epoch): (a) the loader
alone, (b) the work alone for as many batches, (c) both: `next(it)` timed on
the host (time.perf_counter around the call only), then the work consuming the
batch enqueued (one small op reading it, and the matmuls). The host does not
synchronize per batch: it runs ahead of the GPU until --busy-ahead batches of
work are queued (default: 250 ms of work, and one more), then waits for the
oldest (outside the timed call); p99 and max are of the batches from the one
where the host was first that far ahead (of all, if it never was). The GPU
work queued at each next() is estimated from CUDA events (batches whose work
has not ended, times the work per batch). One JSON line per way:
python-loader-busy-<way>, with the goals' PASS/MISS: next() p99 <= 0.5 ms and
max <= 2 ms with 200+ ms of work queued; wall <= 1.05x max(loader alone, work
alone).

--prefetch N is passed to wirespeed.Loader as prefetch=N only when given.

Where `import torch`, numpy or wirespeed fails, or torch sees no GPU, it says
so on one line and exits 0 (so does --emulated, after the imports).
"""

import argparse
import json
import math
import os
import resource
import sys
import time

WAYS = ("pool", "resident", "registered", "ring", "full")


def skip(why):
    print(f"python_loader.py: skipped: {why}", flush=True)
    sys.exit(0)


def imports(emulated):
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        skip(f"`import torch` failed ({e.__class__.__name__}: {e})")
    try:
        import numpy as np
    except Exception as e:
        skip(f"`import numpy` failed ({e.__class__.__name__}: {e})")
    try:
        import wirespeed
    except Exception as e:
        skip(f"`import wirespeed` failed ({e.__class__.__name__}: {e})")
    if emulated:
        skip("an emulated run (wirespeed.Loader from Python runs on a GPU only)")
    if not torch.cuda.is_available():
        skip(f"torch {torch.__version__} sees no CUDA GPU")
    return torch, np, wirespeed


def cpu_seconds():
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def loader_args(a, way, size):
    """shuffle=, budget= and device_budget= that ask for `way` on a file of `size` bytes."""
    if way == "pool":
        return {"shuffle": "pool", "budget": a.budget, "device_budget": a.device_budget}
    if way == "resident":
        return {"shuffle": "full", "budget": a.budget, "device_budget": size + (64 << 20)}
    if way == "registered":
        return {"shuffle": "full", "budget": size + (64 << 20), "device_budget": 1}
    if way == "ring":
        return {"shuffle": "full", "budget": a.budget, "device_budget": 1}
    return {"shuffle": "full", "budget": a.budget, "device_budget": a.device_budget}  # full


def make_loader(wirespeed, arr, a, way, size):
    kw = loader_args(a, way, size)
    if a.prefetch is not None:
        kw["prefetch"] = a.prefetch
    loader = wirespeed.Loader(arr, batch_size=a.batch, seed=7, block_bytes=a.block, **kw)
    if way != "full" and loader.way != way:
        print(f"python_loader.py: asked for {way}, the Loader chose {loader.way}", file=sys.stderr, flush=True)
    return loader


def rates(torch, loader, a):
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
    return {"name": f"python-loader-{loader.way}", "gbps": g, "x_line": g / a.line if a.line else 0.0,
            "mrec_per_s": g * 1e9 / a.record / 1e6, "cpu_s_per_gb": cpus[len(cpus) // 2],
            "min_gbps": rates[0], "max_gbps": rates[-1]}


class Work:
    """k square matmuls on the current stream: the caller's work per batch."""

    def __init__(self, torch, size):
        self.torch = torch
        g = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=g) / size ** 0.5
        self.b = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=g) / size ** 0.5
        self.c = torch.empty_like(self.a)
        self.k = 1

    def run(self, k=None):
        mm, a, b, c = self.torch.matmul, self.a, self.b, self.c
        for _ in range(self.k if k is None else k):
            mm(a, b, out=c)

    def time_ms(self, k, reps=3):
        """Milliseconds of k matmuls on the GPU (CUDA events), the median of reps."""
        torch = self.torch
        out = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            self.run(k)
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e))
        out.sort()
        return out[len(out) // 2]

    def calibrate(self, ms):
        """Sets k so that k matmuls take about ms milliseconds; returns their measured time."""
        self.time_ms(4, reps=2)  # warm-up: cuBLAS's handle, the clocks
        one = self.time_ms(16) / 16
        self.k = max(1, round(ms / one))
        got = self.time_ms(self.k)
        self.k = max(1, round(self.k * ms / got))
        return self.time_ms(self.k)


def pct(v, q):
    s = sorted(v)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else 0.0


def busy(torch, loader, work, work_ms, a):
    """Phases (a), (b), (c) over the same number of batches; returns the row."""
    n = len(loader) if a.busy_batches is None else min(a.busy_batches, len(loader))
    loader.set_epoch(0)
    for _ in loader:  # warm-up epoch (the resident way loads here)
        pass
    torch.cuda.synchronize()

    # (a) the loader alone
    loader.set_epoch(1)
    it = iter(loader)
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    torch.cuda.synchronize()
    loader_alone = time.perf_counter() - t
    del it

    # (b) the work alone
    t = time.perf_counter()
    for _ in range(n):
        work.run()
    torch.cuda.synchronize()
    work_alone = time.perf_counter() - t

    # (c) both, the host running ahead of the GPU by up to --busy-ahead batches
    loader.set_epoch(2)
    it = iter(loader)
    acc = torch.zeros((), device="cuda", dtype=torch.float32)
    ends = []  # CUDA events at the end of each batch's work not yet seen to end, oldest first
    nexts, queued = [], []
    clock = time.perf_counter
    t = clock()
    for i in range(n):
        while ends and ends[0].query():
            ends.pop(0)
        while len(ends) >= a.busy_ahead:
            ends.pop(0).synchronize()
            while ends and ends[0].query():
                ends.pop(0)
        queued.append(len(ends) * work_ms)
        t0 = clock()
        x = next(it)
        nexts.append((clock() - t0) * 1e3)
        acc += x[:, :1].float().sum()
        del x
        work.run()
        e = torch.cuda.Event()
        e.record()
        ends.append(e)
    torch.cuda.synchronize()
    wall = clock() - t
    del it
    float(acc)

    # The batches after the host first got --busy-ahead - 1 batches ahead: the
    # steady state (the first ones start with an idle GPU).
    steady = next((i for i, q in enumerate(queued) if q >= (a.busy_ahead - 1) * work_ms), len(queued))
    nx, qd = nexts[steady:] or nexts, queued[steady:] or queued
    p99, mx, q50 = pct(nx, 0.99), max(nx), pct(qd, 0.5)
    bound = max(loader_alone, work_alone)
    ratio = wall / bound
    ok = lambda c: "PASS" if c else "MISS"  # noqa: E731
    return {
        "name": f"python-loader-busy-{loader.way}", "busy_ms": work_ms, "busy_asked_ms": a.busy,
        "matmuls": work.k, "matmul_size": a.busy_size, "batches": n, "steady_batches": len(nx),
        "next_ms_median": pct(nx, 0.5), "next_ms_p99": p99, "next_ms_max": mx,
        "next_ms_max_all": max(nexts), "queued_ms": q50, "queued_ms_min": min(qd),
        "wall_s": wall, "loader_alone_s": loader_alone, "work_alone_s": work_alone, "ratio": ratio,
        "next_p99_goal": ok(p99 <= 0.5), "next_max_goal": ok(mx <= 2.0), "queued_200ms": ok(q50 >= 200.0),
        "ratio_goal": ok(ratio <= 1.05), "ahead": a.busy_ahead, "prefetch": a.prefetch,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--record", type=int, default=2883)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--way", default="pool", help="comma-separated: " + ", ".join(WAYS))
    ap.add_argument("--budget", type=int, default=4 << 30)
    ap.add_argument("--device-budget", type=int, default=None)
    ap.add_argument("--block", type=int, default=256 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--line", type=float, default=0.0)
    ap.add_argument("--prefetch", type=int, default=None, help="passed to wirespeed.Loader only when given")
    ap.add_argument("--busy", type=float, default=None, metavar="MS", help="caller work per batch (ms)")
    ap.add_argument("--busy-size", type=int, default=8192, help="side of the square fp16 matmuls of the work")
    ap.add_argument("--busy-batches", type=int, default=None, help="batches per phase (default: an epoch)")
    ap.add_argument("--busy-ahead", type=int, default=None,
                    help="batches of work the host may queue ahead (default: 250 ms of work, and one more)")
    ap.add_argument("--emulated", action="store_true", help="check the imports, then skip (an emulated run)")
    a = ap.parse_args()
    ways = [w for w in a.way.split(",") if w]
    for w in ways:
        if w not in WAYS:
            ap.error(f"--way: unknown way {w!r} ({', '.join(WAYS)})")
    if a.busy_ahead is not None and a.busy_ahead < 2:
        ap.error("--busy-ahead must be at least 2")
    torch, np, wirespeed = imports(a.emulated)
    size = os.path.getsize(a.path) // a.record * a.record
    n = size // a.record
    arr = np.memmap(a.path, dtype=np.uint8, mode="r", shape=(n, a.record))
    torch.cuda.init()
    work, work_ms = None, 0.0
    if a.busy is not None:
        work = Work(torch, a.busy_size)
        work_ms = work.calibrate(a.busy)
        print(f"python_loader.py: {work.k} matmuls of {a.busy_size}^2 fp16 take {work_ms:.2f} ms "
              f"(asked {a.busy} ms)", file=sys.stderr, flush=True)
        if a.busy_ahead is None:
            a.busy_ahead = max(2, math.ceil(250 / work_ms) + 1)
    failed = False
    for way in ways:
        loader = None
        try:
            loader = make_loader(wirespeed, arr, a, way, size)
            row = rates(torch, loader, a) if work is None else busy(torch, loader, work, work_ms, a)
            print(json.dumps(row), flush=True)
        except Exception as e:  # one way failing does not lose the others' rows
            print(f"python_loader.py: {way}: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
            failed = True
        finally:
            if loader is not None:
                loader.close()
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
