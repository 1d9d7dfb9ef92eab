#!/usr/bin/env python3
"""What registering host memory with CUDA costs, and what changes it.

Registers and unregisters a 4 GiB page-cached file mapping (PROT_READ,
MAP_SHARED, flags READ_ONLY | PORTABLE, the streamer's windows) window by window
through the driver API (libcuda.so.1 with ctypes; no toolkit, no build), and
prints the milliseconds of each pass:

  pages       by how the memory is backed: the file as written (its page cache,
              large folios on ext4/xfs of recent kernels), after MADV_POPULATE_READ,
              MADV_HUGEPAGE, the page cache dropped and read back, anonymous memory
              in 4 KiB pages and in transparent huge pages; /proc/self/smaps says
              how the mapping is mapped (FilePmdMapped: 2 MiB entries)
  contexts    by flags, window size, context (primary or created), and threads
              registering side by side, each in a context of its own or not
  contention  one thread registering beside 4 threads that memcpy, that copy a
              pinned buffer to the device, or that do both (a ring)

    python3 bench/probes/register_cost.py [--dir /tmp] [--what pages,contexts,contention]

Run it with nothing else on the GPU. The folder must have 8 GiB free (the
files are removed at the end); put it on the file system whose files you
stream (a tmpfs without huge pages registers more slowly).
"""

import argparse
import ctypes
import os
import threading
import time

GIB, MIB = 1 << 30, 1 << 20
SIZE, WIN = 4 * GIB, 128 * MIB
PROT_READ, MAP_SHARED, MAP_PRIVATE, MAP_ANON, MAP_POPULATE = 1, 1, 2, 0x20, 0x8000
MADV_HUGEPAGE, MADV_POPULATE_READ = 14, 22
RO, PORTABLE, MAPPED = 0x08, 0x01, 0x02

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def load_driver():
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cu.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    cu.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    return cu


cu = None


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what} failed: CUresult {r}")


def new_context(dev):
    c = ctypes.c_void_p()
    create = getattr(cu, "cuCtxCreate_v4", None)
    if create is not None:
        check(create(ctypes.byref(c), None, 0, dev), "cuCtxCreate_v4")
    else:
        check(cu.cuCtxCreate_v2(ctypes.byref(c), 0, dev), "cuCtxCreate_v2")
    return c


def smaps(addr):
    """Rss and huge-page mapped MiB of the mapping at `addr`."""
    out, cur = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                cur = int(head.split("-")[0], 16) == addr
            elif cur and head in ("Rss:", "FilePmdMapped:", "ShmemPmdMapped:", "AnonHugePages:"):
                out[head[:-1]] = int(line.split()[1]) // 1024
    return " ".join(f"{k} {v} MiB" for k, v in out.items())


def write_file(path):
    chunk = bytearray(os.urandom(MIB)) * 64
    with open(path, "wb") as f:
        for i in range(SIZE // len(chunk)):
            chunk[:8] = i.to_bytes(8, "little")
            f.write(chunk)


def map_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        a = libc.mmap(None, SIZE, PROT_READ, MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if a in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    return a


def advise(addr, advice, name):
    t0 = time.perf_counter()
    r = libc.madvise(addr, SIZE, advice)
    print(f"    madvise({name}): {'ok' if r == 0 else 'errno %d' % ctypes.get_errno()} in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms; {smaps(addr)}", flush=True)


def one_pass(ctx, addr, lo, hi, flags, win):
    """Registers and unregisters [lo, hi) of the mapping window by window; seconds spent in each."""
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    reg = unreg = 0.0
    for off in range(lo, hi, win):
        t0 = time.perf_counter()
        check(cu.cuMemHostRegister_v2(addr + off, min(win, hi - off), flags), "cuMemHostRegister")
        t1 = time.perf_counter()
        check(cu.cuMemHostUnregister(addr + off), "cuMemHostUnregister")
        reg, unreg = reg + t1 - t0, unreg + time.perf_counter() - t1
    return reg, unreg


def passes(label, ctxs, addr, flags=RO | PORTABLE, win=WIN, reps=3):
    """`reps` passes over the 4 GiB, split between len(ctxs) threads (one per entry)."""
    for rep in range(reps):
        out, share = [], SIZE // len(ctxs)
        threads = [threading.Thread(target=lambda i=i: out.append(
            one_pass(ctxs[i], addr, i * share, (i + 1) * share, flags, win))) for i in range(len(ctxs))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        reg, unreg = max(o[0] for o in out), max(o[1] for o in out)
        print(f"  {label:46s} pass {rep + 1}: {wall * 1e3:6.1f} ms = {SIZE / wall / 1e9:5.1f} GB/s "
              f"(register {reg * 1e3:6.1f} ms, unregister {unreg * 1e3:5.1f} ms per thread)", flush=True)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pages(ctx, path):
    print("pages: how the memory is backed (one thread, a created context, 128 MiB windows)")
    for label, advices, drop in [
        ("the file as written", [], False),
        ("after MADV_POPULATE_READ", [(MADV_POPULATE_READ, "POPULATE_READ")], False),
        ("MADV_HUGEPAGE + POPULATE_READ", [(MADV_HUGEPAGE, "HUGEPAGE"), (MADV_POPULATE_READ, "POPULATE_READ")], False),
        ("cache dropped, HUGEPAGE + POPULATE_READ", [(MADV_HUGEPAGE, "HUGEPAGE"), (MADV_POPULATE_READ, "POPULATE_READ")], True),
        ("cache dropped, POPULATE_READ", [(MADV_POPULATE_READ, "POPULATE_READ")], True),
    ]:
        if drop:
            os.sync()
            drop_cache(path)
        a = map_file(path)
        print(f"  {label}:")
        for adv, name in advices:
            advise(a, adv, name)
        passes(label, [ctx], a, reps=2)
        print(f"    {smaps(a)}")
        libc.munmap(a, SIZE)
    for label, huge in [("anonymous, 4 KiB pages", False), ("anonymous, transparent huge pages", True)]:
        raw = libc.mmap(None, SIZE + 2 * MIB, 3, MAP_PRIVATE | MAP_ANON, -1, 0)
        a = (raw + 2 * MIB - 1) & ~(2 * MIB - 1)
        libc.madvise(a, SIZE, MADV_HUGEPAGE if huge else 15)  # 15: MADV_NOHUGEPAGE
        ctypes.memset(a, 1, SIZE)
        passes(label, [ctx], a, flags=PORTABLE, reps=2)
        print(f"    {smaps(a)}")
        libc.munmap(raw, SIZE + 2 * MIB)


def contexts(primary, ctxs, addr):
    print("contexts: flags, window sizes, contexts, threads (the file as written)")
    passes("1 thread, created context, READ_ONLY|PORTABLE", ctxs[:1], addr)
    passes("1 thread, created context, READ_ONLY", ctxs[:1], addr, flags=RO)
    passes("1 thread, created context, +DEVICEMAP", ctxs[:1], addr, flags=RO | PORTABLE | MAPPED)
    passes("1 thread, primary context", [primary], addr)
    passes("1 thread, 2 MiB windows", ctxs[:1], addr, win=2 * MIB)
    passes("1 thread, 512 MiB windows", ctxs[:1], addr, win=512 * MIB)
    passes("2 threads, one context", [ctxs[0]] * 2, addr)
    passes("2 threads, a context each", ctxs[:2], addr)
    passes("4 threads, a context each", ctxs[:4], addr)


def contention(primary, ctx, addr):
    print("contention: one thread registering beside other work (the file as written)")
    stop = threading.Event()
    pinned, dptr = ctypes.c_void_p(), ctypes.c_uint64()
    check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
    check(cu.cuMemHostAlloc(ctypes.byref(pinned), 64 * MIB, 0), "cuMemHostAlloc")
    check(cu.cuMemAlloc_v2(ctypes.byref(dptr), 64 * MIB), "cuMemAlloc")

    def memcpy_only(k, moved):
        dst, n, off = ctypes.create_string_buffer(4 * MIB), 0, k * 512 * MIB
        while not stop.is_set():
            ctypes.memmove(dst, addr + off, 4 * MIB)
            off, n = (off + 4 * MIB) % SIZE, n + 4 * MIB
        moved.append(n)

    def copies(k, moved, fill):
        check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
        s = ctypes.c_void_p()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        n, i, off, slot = 0, 0, k * 512 * MIB, pinned.value + k * 8 * MIB
        while not stop.is_set():
            if fill:
                ctypes.memmove(slot, addr + off, 4 * MIB)
                off = (off + 4 * MIB) % SIZE
            check(cu.cuMemcpyHtoDAsync_v2(dptr.value + k * 8 * MIB, slot, 4 * MIB, s), "cuMemcpyHtoDAsync")
            n, i = n + 4 * MIB, i + 1
            if fill or i % 4 == 0:
                check(cu.cuStreamSynchronize(s), "cuStreamSynchronize")
        check(cu.cuStreamSynchronize(s), "cuStreamSynchronize")
        moved.append(n)

    passes("alone", [ctx], addr)
    for label, work in [("beside 4 threads of memcpy", memcpy_only),
                        ("beside 4 threads copying pinned memory", lambda k, m: copies(k, m, False)),
                        ("beside a 4-thread ring (memcpy, copy)", lambda k, m: copies(k, m, True))]:
        moved = []
        stop.clear()
        workers = [threading.Thread(target=work, args=(k, moved)) for k in range(4)]
        for w in workers:
            w.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        passes(label, [ctx], addr)
        wall = time.perf_counter() - t0
        stop.set()
        for w in workers:
            w.join()
        print(f"    the 4 threads beside it moved {sum(moved) / wall / 1e9:.1f} GB/s", flush=True)
    passes("alone again", [ctx], addr)


def main():
    global cu
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp", help="where the 4 GiB file goes (default /tmp)")
    ap.add_argument("--what", default="pages,contexts,contention")
    args = ap.parse_args()
    what = set(args.what.split(","))
    try:
        cu = load_driver()
        check(cu.cuInit(0), "cuInit")
    except (OSError, RuntimeError) as e:
        print(f"register_cost: no CUDA driver here ({e}); nothing measured")
        return 0
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    primary = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "cuDevicePrimaryCtxRetain")
    ctxs = [new_context(dev) for _ in range(4)]
    path = os.path.join(args.dir, f"register-cost-{os.getpid()}.bin")
    try:
        t0 = time.perf_counter()
        write_file(path)
        print(f"wrote a 4 GiB file in {args.dir} in {time.perf_counter() - t0:.1f} s", flush=True)
        if "pages" in what:
            pages(ctxs[0], path)
        a = map_file(path)
        libc.madvise(a, SIZE, MADV_POPULATE_READ)
        if "contexts" in what:
            contexts(primary, ctxs, a)
        if "contention" in what:
            contention(primary, ctxs[0], a)
        libc.munmap(a, SIZE)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
