#!/usr/bin/env python3
"""KvikIO reading a file into a torch CUDA tensor, beside `bench`.

    f = kvikio.CuFile(path, "r"); f.pread(tensor, size, file_offset, task_size).get()

KvikIO runs in compatibility mode (KVIKIO_COMPAT_MODE=ON: POSIX reads into its
pinned bounce buffers, then copies to the device; no GPUDirect Storage). A small
sweep of its settings (num_threads x task_size, one bounce buffer size) is read
hot (the file in the page cache, after one untimed read) and cold (the file's
page cache dropped before each read: kvikio.drop_file_page_cache where it
exists, else posix_fadvise(DONTNEED)), --reps times each. Prints a table (GB/s,
CPU s/GB: os.times, user + system of every thread of this process, around each
read) and, with --json, writes every sample, each setting's median and the best
setting of each kind. A few 4 KiB blocks of the tensor are compared with
os.pread of the file after each setting's reads.

Runs only where `import kvikio, torch` works and torch sees a GPU; otherwise it
says why on one line and exits 0 (with --json, the JSON says "skipped").

    python3 bench/kvikio_read.py --file data.bin [--reps 3] [--threads 8,16]
        [--task-sizes 4M,16M] [--bounce 4M] [--no-hot] [--no-cold] [--json out.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

CHECK_BLOCK = 4096
CHECK_BLOCKS = 8


def size_arg(v):
    """4M, 16MiB, 4194304 -> bytes (K, M, G are powers of 1024)."""
    s = v.strip().lower().removesuffix("ib").removesuffix("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    if mult > 1:
        s = s[:-1]
    return int(float(s) * mult)


def sizes_arg(v):
    return [size_arg(x) for x in v.split(",") if x.strip()]


def ints_arg(v):
    return [int(x) for x in v.split(",") if x.strip()]


def mib(n):
    return f"{n / (1 << 20):g} MiB"


def cpu_seconds():
    t = os.times()
    return t.user + t.system


def write_json(path, doc):
    if path:
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=2)


def skip(args, why):
    print(f"kvikio_read.py: skipped: {why}")
    write_json(args.json, {"tool": "kvikio_read.py", "skipped": why})
    return 0


class Settings:
    """Applies num_threads, task_size and bounce_buffer_size with whichever API
    this KvikIO has: kvikio.defaults.set({...}) (25.x and later) or the older
    kvikio.defaults.*_reset functions. `api` says which."""

    def __init__(self, kvikio):
        d = kvikio.defaults
        self.d = d
        if callable(getattr(d, "set", None)) and callable(getattr(d, "get", None)):
            self.api = "kvikio.defaults.set({num_threads, task_size, bounce_buffer_size})"
        elif callable(getattr(d, "num_threads_reset", None)):
            self.api = "kvikio.defaults.num_threads_reset / task_size_reset / bounce_buffer_size_reset"
        else:
            raise RuntimeError("this KvikIO has neither kvikio.defaults.set nor kvikio.defaults.num_threads_reset")

    def apply(self, threads, task, bounce):
        d = self.d
        if self.api.startswith("kvikio.defaults.set"):
            d.set({"num_threads": threads, "task_size": task, "bounce_buffer_size": bounce})
        else:
            d.num_threads_reset(threads)
            d.task_size_reset(task)
            if callable(getattr(d, "bounce_buffer_size_reset", None)):
                d.bounce_buffer_size_reset(bounce)

    def current(self):
        d = self.d
        try:
            if self.api.startswith("kvikio.defaults.set"):
                out = {k: d.get(k) for k in ("num_threads", "task_size", "bounce_buffer_size")}
                try:
                    out["auto_direct_io_read"] = d.get("auto_direct_io_read")
                except Exception:
                    pass  # older releases lack it
                return out
            return {
                "num_threads": d.get_num_threads(),
                "task_size": d.task_size(),
                "bounce_buffer_size": d.bounce_buffer_size() if hasattr(d, "bounce_buffer_size") else None,
            }
        except Exception as e:  # only for the report
            return {"error": f"{e.__class__.__name__}: {e}"}

    def compat_mode(self):
        d = self.d
        try:
            if self.api.startswith("kvikio.defaults.set"):
                return str(d.get("compat_mode"))
            return str(d.compat_mode())
        except Exception as e:
            return f"? ({e.__class__.__name__}: {e})"


def dropper(kvikio, path):
    """Returns (how, drop, resident): drop() empties the file's page cache,
    resident() gives the fraction of its pages cached (None where unknown)."""
    resident = lambda: None  # noqa: E731
    info = getattr(kvikio, "get_page_cache_info", None)
    if callable(info):
        def resident():
            try:
                cached, total = info(path)
                return cached / total if total else 0.0
            except Exception:
                return None
    drop = getattr(kvikio, "drop_file_page_cache", None)
    if callable(drop):
        return "kvikio.drop_file_page_cache(path)", lambda: drop(path), resident

    def fadvise():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    return "os.posix_fadvise(POSIX_FADV_DONTNEED)", fadvise, resident


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True, help="the file to read")
    ap.add_argument("--size", type=int, default=0, help="bytes to read from its start (default: all of it)")
    ap.add_argument("--reps", type=int, default=3, help="timed reads per setting (default 3)")
    ap.add_argument("--threads", type=ints_arg, default=[8, 16], help="num_threads values (default 8,16)")
    ap.add_argument("--task-sizes", type=sizes_arg, default=[4 << 20, 16 << 20], help="task_size values (default 4M,16M)")
    ap.add_argument("--bounce", type=size_arg, default=4 << 20, help="bounce_buffer_size (default 4M)")
    ap.add_argument("--no-hot", action="store_true", help="skip the page-cached reads")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold reads")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args()
    if args.reps < 1 or not args.threads or not args.task_sizes:
        ap.error("--reps, --threads and --task-sizes need at least one value")

    # Before the import: KvikIO reads its settings from the environment once.
    os.environ["KVIKIO_COMPAT_MODE"] = "ON"
    try:
        import torch
        import kvikio
        import kvikio.defaults
    except Exception as e:  # ImportError, or a broken install
        return skip(args, f"`import kvikio, torch` failed ({e.__class__.__name__}: {e})")
    if not torch.cuda.is_available():
        return skip(args, f"torch {torch.__version__} sees no CUDA GPU")
    try:
        settings = Settings(kvikio)
    except RuntimeError as e:
        return skip(args, str(e))

    path = args.file
    size = args.size or os.path.getsize(path)
    dev = torch.device("cuda", 0)
    free, _ = torch.cuda.mem_get_info(dev)
    # The bench holds its own copy of the file on the GPU meanwhile: read in
    # pieces of at most half the free memory into one tensor, wrapping around.
    cap = min(size, max(free // 2, 64 << 20))
    if cap < size:
        cap -= cap % CHECK_BLOCK
    t = torch.empty(cap, dtype=torch.uint8, device=dev)
    how, drop, resident = dropper(kvikio, path)
    print(f"KvikIO {getattr(kvikio, '__version__', '?')} (compat mode: {settings.compat_mode()}), torch "
          f"{torch.__version__}, {torch.cuda.get_device_name(dev)}; settings through {settings.api}; "
          f"cold: {how}", file=sys.stderr)

    def read_all(f, task):
        torch.cuda.synchronize()
        c0, t0 = cpu_seconds(), time.perf_counter()
        done = 0
        while done < size:
            n = min(cap, size - done)
            got = f.pread(t, n, done, task_size=task).get()
            if got != n:
                raise RuntimeError(f"pread returned {got} bytes of {n} at offset {done}")
            done += n
        torch.cuda.synchronize()
        return {"seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0}

    def check(fd):
        """Compares blocks of what the last read left in the tensor with the file."""
        last = (size - 1) // cap * cap  # the last piece read starts here
        span = size - last
        offsets = sorted({last + (span - 1) * i // (CHECK_BLOCKS - 1) // CHECK_BLOCK * CHECK_BLOCK
                          for i in range(CHECK_BLOCKS)})
        bad = []
        for off in offsets:
            n = min(CHECK_BLOCK, size - off)
            want = os.pread(fd, n, off)
            got = bytes(t[off - last:off - last + n].cpu().tolist())
            if got != want:
                bad.append(off)
        return {"blocks": len(offsets), "block_bytes": CHECK_BLOCK, "mismatched_offsets": bad}

    modes = [m for m, off in (("hot", args.no_hot), ("cold", args.no_cold)) if not off]
    combos = [(th, ts) for th in args.threads for ts in args.task_sizes]
    results = {m: [] for m in modes}
    fd = os.open(path, os.O_RDONLY)
    try:
        with kvikio.CuFile(path, "r") as f:
            for mode in modes:
                for th, ts in combos:
                    settings.apply(th, ts, args.bounce)
                    if mode == "hot":
                        read_all(f, ts)  # untimed: the page cache, the thread pool, the bounce buffers
                    samples, cached = [], []
                    for _ in range(args.reps):
                        if mode == "cold":
                            drop()
                            cached.append(resident())
                        samples.append(read_all(f, ts))
                    ok = check(fd)
                    gbps = [size / s["seconds"] / 1e9 for s in samples]
                    cpu = [s["cpu_seconds"] / (size / 1e9) for s in samples]
                    r = {
                        "mode": mode,
                        "num_threads": th,
                        "task_size": ts,
                        "bounce_buffer_size": args.bounce,
                        "applied": settings.current(),
                        "samples": samples,
                        "gbps_median": statistics.median(gbps),
                        "gbps_min": min(gbps),
                        "gbps_max": max(gbps),
                        "cpu_s_per_gb_median": statistics.median(cpu),
                        "check": ok,
                        "intact": not ok["mismatched_offsets"],
                    }
                    if mode == "cold":
                        r["cached_fraction_after_drop"] = cached
                    results[mode].append(r)
                    print(f"  kvikio {mode:<4} threads {th:>2} task {mib(ts):>8}: {r['gbps_median']:6.2f} GB/s "
                          f"({r['gbps_min']:.2f}-{r['gbps_max']:.2f}), {r['cpu_s_per_gb_median']:.3f} CPU s/GB, "
                          f"intact: {'yes' if r['intact'] else 'NO'}", file=sys.stderr)
    finally:
        os.close(fd)

    best = {m: max(rs, key=lambda r: r["gbps_median"]) for m, rs in results.items() if rs}
    print(f"{'mode':<5} {'threads':>7} {'task':>9} {'bounce':>8} {'GB/s':>7} {'min-max':>13} {'CPU s/GB':>9} {'intact':>7}")
    for m, rs in results.items():
        for r in rs:
            star = " *" if r is best.get(m) else ""
            print(f"{m:<5} {r['num_threads']:>7} {mib(r['task_size']):>9} {mib(r['bounce_buffer_size']):>8} "
                  f"{r['gbps_median']:>7.2f} {r['gbps_min']:>6.2f}-{r['gbps_max']:<6.2f} "
                  f"{r['cpu_s_per_gb_median']:>9.3f} {'yes' if r['intact'] else 'NO':>7}{star}")
    print(f"(* the best of each mode; {args.reps} read(s) per setting, median shown; CPU = os.times of the "
          f"whole process; settings through {settings.api}; cold: {how})")
    write_json(args.json, {
        "tool": "kvikio_read.py",
        "kvikio": getattr(kvikio, "__version__", None),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev),
        "compat_mode": settings.compat_mode(),
        "settings_api": settings.api,
        "drop_cache": how,
        "file": path,
        "bytes": size,
        "tensor_bytes": cap,
        "reps": args.reps,
        "results": results,
        "best": best,
    })
    return 0 if all(r["intact"] for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
