"""The row-by-row experiment, four (five) ways side by side in one run.

1024 rows of 2.5 MiB (float32, a 2.5 GiB CPU tensor) copied to the GPU one row
at a time:

* pin_memory() per row:     rows[i].pin_memory().cuda(non_blocking=True)
* .cuda() per row:          rows[i].cuda()  (pageable: staged by the driver)
* pinned once (torch):      p = rows.pin_memory() first, then p[i].cuda(non_blocking=True)
* wirespeed.pinned:         with wirespeed.pinned(rows): rows[i].cuda(non_blocking=True)
* wirespeed.read_into:      read_into(dst[i], rows[i]) (through the pinned ring, several threads;
                            the ring made first by wirespeed.prepare)

Each line: GB/s, that as a fraction of the line rate (a resident pinned
tensor copied to the device, measured in the same run), and process CPU
seconds per GB (os.times()). Every way's rows are checked against the source.
Exits 0 when every check passed.

    python examples/rows.py [--rows 1024] [--row-mib 2.5] [--device 0] [--threads 8,12]
"""

import argparse
import os
import sys
import time

import torch  # first: wirespeed then uses the CUDA runtime torch loaded

import wirespeed


def cpu_now():
    t = os.times()
    return t.user + t.system


def timed(fn, nbytes):
    torch.cuda.synchronize()
    c0, t0 = cpu_now(), time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    dt, cpu = time.perf_counter() - t0, cpu_now() - c0
    return out, nbytes / dt / 1e9, cpu / (nbytes / 1e9), dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--row-mib", type=float, default=2.5)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--threads", default="", help="read_into's ring threads to try, comma-separated, "
                    "'default' for the package's own choice (the default)")
    args = ap.parse_args()
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    n = int(args.row_mib * (1 << 20)) // 4
    rows = torch.arange(n, dtype=torch.float32).repeat(args.rows, 1)
    rows += torch.arange(args.rows, dtype=torch.float32).unsqueeze(1) * 1e-3
    total = rows.numel() * 4
    reference = rows.to(dev)
    print(f"runtime: {wirespeed.runtime_path()}; {args.rows} rows of {n * 4 / 2**20:.2f} MiB, "
          f"{total / 2**30:.2f} GiB, on {torch.cuda.get_device_name(dev)}")

    # The line rate: a resident pinned tensor copied to the device.
    line_src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    line_dst = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    line_dst.copy_(line_src, non_blocking=True)  # warm-up

    def line():
        for _ in range(8):
            line_dst.copy_(line_src, non_blocking=True)

    _, line_rate, line_cpu, _ = timed(line, 8 * (256 << 20))
    print(f"{'line rate (resident pinned)':32s} {line_rate:7.2f} GB/s  1.00 x line  {line_cpu:.4f} CPU s/GB")

    ok = True

    def report(name, outs, gbps, cpu, extra=""):
        nonlocal ok
        good = torch.equal(torch.stack(outs) if isinstance(outs, list) else outs, reference)
        ok &= good
        print(f"{name:32s} {gbps:7.2f} GB/s  {gbps / line_rate:.2f} x line  {cpu:.4f} CPU s/GB  "
              f"{'verified' if good else 'MISMATCH'}{extra}")

    outs, gbps, cpu, _ = timed(lambda: [rows[i].pin_memory().cuda(non_blocking=True) for i in range(args.rows)], total)
    report("pin_memory() per row", outs, gbps, cpu)
    del outs

    outs, gbps, cpu, _ = timed(lambda: [rows[i].cuda() for i in range(args.rows)], total)
    report(".cuda() per row", outs, gbps, cpu)
    del outs

    c0, t0 = cpu_now(), time.perf_counter()
    pinned_rows = rows.pin_memory()
    pin_s, pin_cpu = time.perf_counter() - t0, cpu_now() - c0
    outs, gbps, cpu, dt = timed(lambda: [pinned_rows[i].cuda(non_blocking=True) for i in range(args.rows)], total)
    whole = total / (dt + pin_s) / 1e9
    report("pinned once (torch)", outs, gbps, cpu,
           f"  (with the pin_memory() of {pin_s:.2f} s: {whole:.2f} GB/s, "
           f"{(cpu + pin_cpu / (total / 1e9)):.4f} CPU s/GB)")
    del outs, pinned_rows

    c0, t0 = cpu_now(), time.perf_counter()
    with wirespeed.pinned(rows):
        reg_s, reg_cpu = time.perf_counter() - t0, cpu_now() - c0
        outs, gbps, cpu, dt = timed(lambda: [rows[i].cuda(non_blocking=True) for i in range(args.rows)], total)
        c1, t1 = cpu_now(), time.perf_counter()
    unreg_s, unreg_cpu = time.perf_counter() - t1, cpu_now() - c1
    whole = total / (dt + reg_s + unreg_s) / 1e9
    report("wirespeed.pinned", outs, gbps, cpu,
           f"  (with register {reg_s:.3f} s + unregister {unreg_s:.3f} s: {whole:.2f} GB/s, "
           f"{cpu + (reg_cpu + unreg_cpu) / (total / 1e9):.4f} CPU s/GB)")
    del outs

    dst = torch.empty_like(reference)

    def via_read_into():
        for i in range(args.rows):
            wirespeed.read_into(dst[i], rows[i])
        return dst

    # The pinned ring and its threads, made once per process: ahead, as the
    # pinned-once rows pin ahead.
    for threads in [None if t == "default" else int(t) for t in args.threads.split(",") if t] or [None]:
        c0, t0 = cpu_now(), time.perf_counter()
        wirespeed.prepare(rows, device=args.device, threads=threads)
        prep_s, prep_cpu = time.perf_counter() - t0, cpu_now() - c0
        dst.zero_()  # what a row leaves unwritten shows
        outs, gbps, cpu, dt = timed(via_read_into, total)
        whole = total / (dt + prep_s) / 1e9
        name = "wirespeed.read_into (pinned ring)" if threads is None else f"read_into, ring of {threads} threads"
        report(name, outs, gbps, cpu,
               f"  (with the prepare() of {prep_s:.3f} s: {whole:.2f} GB/s, "
               f"{cpu + prep_cpu / (total / 1e9):.4f} CPU s/GB)")

    print("ok" if ok else "FAILED: a way's rows differ from the source")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
