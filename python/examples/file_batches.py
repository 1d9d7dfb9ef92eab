"""A page-cached file through wirespeed.batches and wirespeed.read_into.

Reads PATH (created when missing: 8 x the budget, 4 GiB by default, then read
once so the page cache holds it) with `wirespeed.batches` (64 MiB batches,
depth 2, a 512 MiB pin budget, spans of the package's default, or of each
--span-mib given), then whole into one tensor with `wirespeed.read_into`.
Prints GB/s and process CPU s/GB (os.times()) of each pass; for batches,
what the spans' transfers did (how many, their strategy, registrations), the
time making the iterator took and the rate after it, and the device segments
torch's caching allocator allocated while the iterator was made and during
the pass (the iterator reserves its spans' memory when it is made, so a
first pass should allocate none); for read_into, its report's breakdown (the
share copied in place, time registering and filling the ring). It checks the
data: the byte sum of the whole file, and a sample of 4 KiB pieces against
the file. The last line compares the best batches pass with the best
read_into pass (one transfer of the whole file: what `bench`'s auto row
measures). Exits 0 when every check passed.

    python examples/file_batches.py PATH [--batch-mib 64] [--depth 2] [--budget-mib 512]
                                         [--span-mib 512,1024,2048] [--passes 3]
"""

import argparse
import os
import sys
import time

import numpy as np
import torch  # first: wirespeed then uses the CUDA runtime torch loaded

import wirespeed


def cpu_now():
    t = os.times()
    return t.user + t.system


def make_file(path, size):
    block = (np.arange(64 << 20, dtype=np.uint64) * 0x9E3779B97F4A7C15 >> np.uint64(56)).astype(np.uint8)
    with open(path, "wb") as f:
        left, k = size, 0
        while left:
            n = min(left, block.size)
            f.write(((block[:n].astype(np.uint16) + k) & 0xFF).astype(np.uint8).tobytes())
            left -= n
            k += 1


def file_sum(path):
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    total = 0
    for i in range(0, mm.size, 256 << 20):
        total += int(mm[i : i + (256 << 20)].sum(dtype=np.uint64))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--batch-mib", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--budget-mib", type=int, default=512)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--span-mib", default="", help="comma-separated spans to try (default: the package's)")
    ap.add_argument("--passes", type=int, default=3, help="passes of each (the first also sets up)")
    args = ap.parse_args()
    budget, batch = args.budget_mib << 20, args.batch_mib << 20
    spans = [int(x) << 20 for x in args.span_mib.split(",") if x.strip()] or [None]
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    if not os.path.exists(args.path):
        make_file(args.path, 8 * budget)
    size = os.path.getsize(args.path)
    expected_sum = file_sum(args.path)  # also brings the file into the page cache
    print(f"runtime: {wirespeed.runtime_path()}; {args.path}: {size / 2**30:.2f} GiB, "
          f"budget {args.budget_mib} MiB, batches of {args.batch_mib} MiB, depth {args.depth}")
    sample_every = 7
    ok = True

    def check(name, got_sum, samples):
        nonlocal ok
        good = got_sum == expected_sum
        with open(args.path, "rb") as f:
            for off, piece in samples:
                f.seek(off)
                good &= bytes(piece.cpu().numpy().tobytes()) == f.read(piece.numel())
        ok &= good
        return "verified" if good else "MISMATCH"

    # torch loads a kernel's module on its first call: the checks' kernels (a sum, an
    # add, a copy) are called once here, so that the first pass times the streaming,
    # not torch's first use of them.
    warm = torch.ones(4096, dtype=torch.uint8, device=dev)
    (torch.zeros((), dtype=torch.int64, device=dev) + warm.sum(dtype=torch.int64)).item()
    warm[:16].clone()
    torch.cuda.synchronize()
    del warm

    best = {}
    for span in spans:
        span_mib = (span or wirespeed.DEFAULT_SPAN) >> 20
        for rep in range(args.passes):  # the first pass also registers; the next reuse the streamer
            torch.cuda.synchronize()
            c0, t0 = cpu_now(), time.perf_counter()
            acc = torch.zeros((), dtype=torch.int64, device=dev)
            samples, off, b = [], 0, None
            segments0 = torch.cuda.memory_stats(dev).get("segment.all.allocated", 0)
            it = wirespeed.batches(args.path, batch, device=args.device, depth=args.depth, budget=budget, span=span)
            made = time.perf_counter() - t0
            segments_made = torch.cuda.memory_stats(dev).get("segment.all.allocated", 0)
            for k, b in enumerate(it):
                acc += b.sum(dtype=torch.int64)
                if k % sample_every == 0:
                    samples.append((off + b.numel() // 2, b[b.numel() // 2 : b.numel() // 2 + 4096].clone()))
                off += b.numel()
            del b
            torch.cuda.synchronize()
            dt, cpu = time.perf_counter() - t0, cpu_now() - c0
            segments = torch.cuda.memory_stats(dev).get("segment.all.allocated", 0) - segments_made
            segments_made -= segments0
            verdict = check("batches", int(acc.item()), samples)
            reports = it.reports
            strategies = sorted({r.strategy for r in reports})
            gbps = size / dt / 1e9
            print(f"batches span {span_mib} MiB pass {rep + 1}: {gbps:7.2f} GB/s  {cpu / (size / 1e9):.4f} CPU s/GB  "
                  f"{verdict if off == size else 'SHORT'}  [{len(reports)} transfers of "
                  f"{'/'.join(str(n >> 20) for n in sorted({n for _, n in it.spans}))} MiB, "
                  f"{sum(r.registrations for r in reports)} registrations, "
                  f"{sum(r.chained for r in reports)} chained to the one before, {'; '.join(strategies)}; "
                  f"making the iterator {made * 1e3:.1f} ms, then {size / (dt - made) / 1e9:.2f} GB/s; "
                  f"torch's segment allocations: {segments_made} making the iterator, {segments} in the pass]")
            ok &= off == size
            if rep > 0 or args.passes == 1:
                best[span_mib] = max(best.get(span_mib, 0.0), gbps)
            del it, reports, samples

    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    whole = 0.0
    for rep in range(args.passes):
        torch.cuda.synchronize()
        c0, t0 = cpu_now(), time.perf_counter()
        report = wirespeed.read_into(dst, args.path, budget=budget)
        torch.cuda.synchronize()
        dt, cpu = time.perf_counter() - t0, cpu_now() - c0
        samples = [(o, dst[o : o + 4096]) for o in range(0, size - 4096, max(4096, size // 37))]
        verdict = check("read_into", int(dst.sum(dtype=torch.int64).item()), samples)
        b = report.breakdown
        in_place = b["in_place_bytes"] / max(1, b["in_place_bytes"] + b["ring_bytes"])
        print(f"read_into pass {rep + 1}: {size / dt / 1e9:7.2f} GB/s  {cpu / (size / 1e9):.4f} CPU s/GB  "
              f"{verdict}  [{report}; in place {in_place:.0%}, registering "
              f"{(b['register_seconds'] + b['unregister_seconds']) * 1e3:.1f} ms, ring filling "
              f"{b['fill_seconds'] * 1e3:.1f} ms]")
        if rep > 0 or args.passes == 1:
            whole = max(whole, size / dt / 1e9)
    for span_mib, gbps in best.items():
        print(f"best batches pass, span {span_mib} MiB: {gbps:.2f} GB/s = {gbps / whole:.3f} x the best "
              f"read_into pass of the whole file ({whole:.2f} GB/s)")

    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
