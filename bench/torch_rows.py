#!/usr/bin/env python3
"""PyTorch's row-by-row copy to the GPU, beside `bench --pytorch-rows`.

    a = torch.rand(1024, 655360)            # 1024 rows of 2.5 MiB: 2.68 GB of float32
    for i in a: i.pin_memory().cuda(non_blocking=True)
    for i in a: i.pin_memory().cuda()
    for i in a: i.cuda(non_blocking=True)
    for i in a: i.cuda()
    p = a.pin_memory(); for i in p: i.cuda(non_blocking=True)   # pinned once

and, where `import wirespeed` works (the Python package of this project), its
two ways to the same rows:

    with wirespeed.pinned(a): for i in a: i.cuda(non_blocking=True)   # registered in place once
    for i in wirespeed.batches(file, (torch.float32, (1, 655360))): ...  # the rows saved to a file

(otherwise it prints why they were skipped). Prints wall ms, CPU ms (time.process_time: every thread of the process), GB/s
and the fraction of the line rate (a resident pinned tensor copied again and
again, measured here), the median of --reps runs after one warm-up run, in the
same table format as `bench --pytorch-rows`. Checks once per variant that the rows
arrived intact.

Runs only where `import torch` works and torch sees a GPU; otherwise it says
why and exits 0, so it can sit in any script. Optional: --json PATH.

    python3 bench/torch_rows.py [--rows 1024] [--reps 3] [--json out.json]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

COLS = 655360


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024, help="rows of 655360 float32, 2.5 MiB each (default 1024)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per variant; the median is shown (default 3)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args()
    if args.rows < 1 or args.reps < 1:
        ap.error("--rows and --reps must be at least 1")

    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        print(f"torch_rows.py: skipped: `import torch` failed ({e.__class__.__name__}: {e})")
        return 0
    if not torch.cuda.is_available():
        print(f"torch_rows.py: skipped: torch {torch.__version__} sees no CUDA GPU "
              f"(torch.version.cuda = {torch.version.cuda}, torch.cuda.device_count() = {torch.cuda.device_count()})")
        return 0

    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(dev)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {name}")

    line = line_rate(torch, dev, args.reps)
    print(f"line rate: {line:.2f} GB/s (a resident 256 MiB pinned tensor copied 16 times with non_blocking=True)")

    a = torch.rand(args.rows, COLS)
    nbytes = a.numel() * a.element_size()
    print(f"\nRow-by-row copy in PyTorch: a = torch.rand({args.rows}, {COLS}) ({nbytes / 1e9:.2f} GB of float32), "
          f"row by row; median of {args.reps} run(s) after a warm-up")

    def pin_nb():
        for i in a:
            i.pin_memory().cuda(non_blocking=True)

    def pin():
        for i in a:
            i.pin_memory().cuda()

    def cuda_nb():
        for i in a:
            i.cuda(non_blocking=True)

    def cuda():
        for i in a:
            i.cuda()

    variants = [
        ("torch-pin-nb", "i.pin_memory().cuda(non_blocking=True)", pin_nb,
         lambda: [i.pin_memory().cuda(non_blocking=True) for i in a]),
        ("torch-pin", "i.pin_memory().cuda()", pin, lambda: [i.pin_memory().cuda() for i in a]),
        ("torch-cuda-nb", "i.cuda(non_blocking=True)", cuda_nb, lambda: [i.cuda(non_blocking=True) for i in a]),
        ("torch-cuda", "i.cuda()", cuda, lambda: [i.cuda() for i in a]),
    ]
    results = []
    for key, code, f, keep in variants:
        results.append(measure(torch, key, code, f, keep, a, nbytes, args.reps, line))

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    p = a.pin_memory()
    pin_ms = (time.perf_counter() - t0) * 1e3

    def pinned_once():
        for i in p:
            i.cuda(non_blocking=True)

    r = measure(torch, "torch-pinned-once", "p = a.pin_memory() once; i.cuda(non_blocking=True)", pinned_once,
                lambda: [i.cuda(non_blocking=True) for i in p], a, nbytes, args.reps, line)
    r["note"] = f"a.pin_memory() of the whole tensor took {pin_ms:.1f} ms (not in wall)"
    results.append(r)
    del p

    ws_results, ws_notes, ws_about = wirespeed_rows(torch, a, nbytes, args.reps, line)
    results += ws_results

    print(f"{'variant':<18} {'code':<50} {'wall ms':>9} {'CPU ms':>9} {'GB/s':>7} {'x line':>7} {'intact':>7}")
    for r in results:
        print(f"{r['name']:<18} {r['code']:<50} {r['wall_ms']:>9.1f} {r['cpu_ms']:>9.1f} {r['gbps']:>7.2f} "
              f"{r['fraction_of_line_rate']:>7.2f} {'yes' if r['intact'] else 'NO':>7}")
    for r in results:
        if "note" in r:
            print(f"  {r['name']}: {r['note']}")
    for n in ws_notes:
        print(n)
    print("CPU ms is time.process_time(): all threads of the process (PyTorch copies pinned rows with many threads).")

    if args.json:
        doc = {
            "tool": "torch_rows.py",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": name,
            "rows": args.rows,
            "cols": COLS,
            "bytes": nbytes,
            "reps": args.reps,
            "line_rate_gbps": line,
            "wirespeed": ws_about,
            "results": results,
        }
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(r["intact"] for r in results) else 1


def wirespeed_rows(torch, a, nbytes, reps, line):
    """The rows through the package `wirespeed`, when it imports: `a` registered
    in place once (wirespeed.pinned), and the rows saved to a file and read
    back as one-row batches (wirespeed.batches). Answers (results, lines to
    print, what to put in the JSON)."""
    try:
        import wirespeed
    except Exception as e:  # ImportError, or a broken install
        why = f"`import wirespeed` failed ({e.__class__.__name__}: {e})"
        return [], [f"wirespeed rows: skipped: {why}"], {"skipped": why}
    results, notes = [], []
    about = {"runtime": None, "version": getattr(wirespeed, "__version__", None)}
    try:
        about["runtime"] = wirespeed.runtime_path()
    except Exception as e:
        why = f"wirespeed cannot load the CUDA runtime ({e.__class__.__name__}: {e})"
        return [], [f"wirespeed rows: skipped: {why}"], {"skipped": why}
    notes.append(f"wirespeed rows: the package from {os.path.dirname(wirespeed.__file__)}, CUDA runtime {about['runtime']}")

    def cuda_rows():
        for i in a:
            i.cuda(non_blocking=True)

    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with wirespeed.pinned(a):
            reg_ms = (time.perf_counter() - t0) * 1e3
            r = measure(torch, "wirespeed-pinned", "wirespeed.pinned(a); i.cuda(non_blocking=True)", cuda_rows,
                        lambda: [i.cuda(non_blocking=True) for i in a], a, nbytes, reps, line)
        r["note"] = (f"wirespeed.pinned(a) registered the tensor in place in {reg_ms:.1f} ms (not in wall); "
                     "no copy of it is made")
        results.append(r)
    except Exception as e:
        notes.append(f"wirespeed-pinned: failed ({e.__class__.__name__}: {e})")

    fd, path = tempfile.mkstemp(prefix="wirespeed-rows-", suffix=".bin")
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            a.numpy().tofile(f)
            f.flush()
            os.fsync(f.fileno())  # page-cached and clean, as the bench's own file
        write_ms = (time.perf_counter() - t0) * 1e3
        one_row = (torch.float32, (1, a.shape[1]))
        spans = []

        def batch_rows():
            it = wirespeed.batches(path, one_row)
            for i in it:
                pass
            spans[:] = it.reports

        r = measure(torch, "wirespeed-batches", f"wirespeed.batches(file, (float32, (1, {a.shape[1]})))", batch_rows,
                    lambda: [b[0] for b in wirespeed.batches(path, one_row)], a, nbytes, reps, line)
        what = "; ".join(sorted({s.strategy for s in spans}))
        r["note"] = (f"the rows saved to a file first ({write_ms:.0f} ms with fsync, not in wall), then one-row batches "
                     f"from the page cache in {len(spans)} transfers ({what}), default budget and span")
        results.append(r)
    except Exception as e:
        notes.append(f"wirespeed-batches: failed ({e.__class__.__name__}: {e})")
    finally:
        os.unlink(path)
        try:
            wirespeed.release()
        except Exception:
            pass
    return results, notes, about


def line_rate(torch, dev, reps):
    n = 256 << 20
    h = torch.empty(n, dtype=torch.uint8).pin_memory()
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    k = 16
    rates = []
    for _ in range(max(reps, 3)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(k):
            d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(n * k / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def measure(torch, key, code, f, keep, a, nbytes, reps, line):
    torch.cuda.synchronize()
    f()  # warm-up: PyTorch's caching allocators fill here, as in any loop that runs more than once
    torch.cuda.synchronize()
    walls, cpus = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    # Intact: one more (untimed) run keeping what reached the device.
    out = keep()
    torch.cuda.synchronize()
    intact = bool(torch.equal(torch.stack(out).cpu(), a))
    del out
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    gbps = nbytes / wall / 1e9
    print(f"  {key:<18} {wall * 1e3:8.1f} ms wall {cpu * 1e3:8.1f} ms CPU {gbps:7.2f} GB/s  intact: {'yes' if intact else 'NO'}",
          file=sys.stderr)
    return {
        "name": key,
        "code": code,
        "wall_ms": wall * 1e3,
        "cpu_ms": cpu * 1e3,
        "wall_ms_min": min(walls) * 1e3,
        "wall_ms_max": max(walls) * 1e3,
        "gbps": gbps,
        "fraction_of_line_rate": gbps / line,
        "intact": intact,
    }


if __name__ == "__main__":
    sys.exit(main())
