"""A page-cached file read into device memory in pieces queued back to back.

Three ways, each into one device tensor of the file's size: the whole file in
one `wirespeed.read_into` call; PIECE-byte pieces, one `read_into` call per
piece (each call orders the consumer's stream after its piece before it
returns, so the next piece is queued only once that one's copies are all
enqueued); and the same pieces in one `wirespeed.read_into_many` call (all
queued on the streamer first, the stream ordered after them only then, so
that they run as one chained pass). Each line: GB/s, that as a fraction of
the line rate (a resident pinned tensor copied to the device, measured in the
same run), process CPU seconds per GB, a check of sampled bytes against the
file, and the transfers: how many, how many ran chained to the one before
(`Report.chained`), their registrations and strategies. Exits 0 when every
check passed.

    python bench/python_pieces.py PATH [--piece-mib 64] [--budget-mib 4096] [--passes 5]
                                       [--piece-strategy auto|whole-file] [--read-ahead on|off]

The loop's lines also give the share of the ring's bytes that were read ahead
(filled after the piece before, before the call for theirs came).
"""

import argparse
import os
import sys
import time

import torch  # first: wirespeed then uses the CUDA runtime torch loaded

import wirespeed
from line_rate import line_rate  # beside this script


def cpu_now():
    t = os.times()
    return t.user + t.system


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--piece-mib", type=int, default=64)
    ap.add_argument("--budget-mib", type=int, default=4096)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--piece-strategy", default="auto",
                    help="the strategy of the one-call-per-piece loop (auto, or whole-file: each piece registered)")
    ap.add_argument("--read-ahead", choices=("on", "off"), default="on",
                    help="the loop's read_ahead (on: the streamer fills the next piece's first slots early)")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    size = os.path.getsize(args.path)
    piece, budget = args.piece_mib << 20, args.budget_mib << 20
    dst = torch.empty(size, dtype=torch.uint8, device=dev)

    line = line_rate(torch, dev)
    print(f"{args.path}: {size / 2**30:.2f} GiB, pieces of {args.piece_mib} MiB, budget {args.budget_mib} MiB; "
          f"line rate {line:.2f} GB/s")

    ok = True

    def check(name):
        nonlocal ok
        good = True
        with open(args.path, "rb") as f:
            for off in range(0, size - 4096, max(4096, size // 37)):
                f.seek(off)
                good &= bytes(dst[off:off + 4096].cpu().numpy().tobytes()) == f.read(4096)
        ok &= good
        return "verified" if good else "MISMATCH"

    def timed(name, fn):
        rates = []
        for p in range(args.passes):
            dst.zero_()
            torch.cuda.synchronize()
            c0, t0 = cpu_now(), time.perf_counter()
            reports = fn()
            torch.cuda.synchronize()
            dt, cpu = time.perf_counter() - t0, cpu_now() - c0
            rates.append(size / dt / 1e9)
            verdict = check(name)
            chained = sum(r.chained for r in reports)
            strategies = sorted({r.strategy for r in reports})
            ring = sum(r.breakdown.get("ring_bytes", 0) for r in reports)
            early = sum(r.breakdown.get("read_ahead_bytes", 0) for r in reports)
            ahead = f", {early / ring:.0%} of the ring's bytes read ahead" if early and ring else ""
            print(f"{name} pass {p + 1}: {rates[-1]:7.2f} GB/s  {rates[-1] / line:.2f} x line  "
                  f"{cpu / (size / 1e9):.4f} CPU s/GB  {verdict}  [{len(reports)} transfers, {chained} chained, "
                  f"{sum(r.registrations for r in reports)} registrations{ahead}; {'; '.join(strategies)}]")
        rates.sort()
        med = rates[len(rates) // 2]
        print(f"{name}: median {med:.2f} GB/s = {med / line:.2f} x line")
        return med

    def pieces():
        return [wirespeed.read_into(dst[o:o + min(piece, size - o)], args.path, o, min(piece, size - o),
                                    budget=budget, strategy=args.piece_strategy, read_ahead=args.read_ahead == "on")
                for o in range(0, size, piece)]

    def many():
        return wirespeed.read_into_many(
            args.path, [(dst[o:o + min(piece, size - o)], o) for o in range(0, size, piece)], budget=budget)

    def whole():
        return [wirespeed.read_into(dst, args.path, budget=budget)]

    w = timed("read_into, one call", whole)
    p = timed(f"read_into, {args.piece_mib} MiB pieces queued ({args.piece_strategy}, read-ahead {args.read_ahead})",
              pieces)
    m = timed(f"read_into_many, {args.piece_mib} MiB pieces", many)
    for name, rate in (("pieces, read_into each", p), ("pieces, read_into_many", m)):
        print(f"{name}: {rate / line:.2f} x line (goal 0.80: {'PASS' if rate / line >= 0.80 else 'MISS'}), "
              f"{rate / w:.2f} of one call")
    print("ok" if ok else "FAILED: bytes differ from the file")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
