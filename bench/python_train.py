#!/usr/bin/env python3
"""A training loop's bound: the small conv net of python/examples/train_memmap.py
trained on batches of wirespeed.Loader for each way of --ways, beside the same
loop fed one fixed batch already on the GPU (the compute bound). One JSON line
per way: train-<way>, steps/s, the bound's steps/s, ratio = ours / bound, and
PASS/MISS for the goal ratio >= 0.98.

    python3 bench/python_train.py --records 2000000 --ways resident,registered,pool

The data: --feats and --labels (raw files of (3, 31, 31) uint8 records and
int64 labels), or a generated pair in --folder (feats.u8 and labels.i8, as
train_memmap.py writes them, reused when their size fits --records).

Each loop runs --warmup steps, then --steps timed steps (host clock, the
device synchronized before and after; no synchronization in between: the
loss stays on the GPU). The bound is measured before the ways and after them;
the higher is used. Ways are asked for through the Loader's public
arguments: resident with shuffle="full" and a device budget that holds the
arrays; registered with shuffle="full", a device budget of one byte and a pin
budget that holds them; pool with shuffle="pool", --budget pinned and --pool
bytes of device memory in --block blocks; ring with shuffle="full", a device
budget of one byte and --budget (smaller than the arrays).

--prefetch N is passed to wirespeed.Loader as prefetch=N only when given.
Where `import torch`, numpy or wirespeed fails, or torch sees no GPU, it says
so on one line and exits 0.
"""

import argparse
import json
import os
import sys
import time

SHAPE = (3, 31, 31)
RECORD = 3 * 31 * 31
WAYS = ("resident", "registered", "pool", "ring")


def skip(why):
    print(f"python_train.py: skipped: {why}", flush=True)
    sys.exit(0)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
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


def make_data(folder, n):
    """train_memmap.py's data: channel 0 brighter for label 1."""
    feats_path, labels_path = os.path.join(folder, "feats.u8"), os.path.join(folder, "labels.i8")
    if not (os.path.exists(feats_path) and os.path.getsize(feats_path) == n * RECORD
            and os.path.exists(labels_path) and os.path.getsize(labels_path) == n * 8):
        rng = np.random.default_rng(0)
        feats = np.memmap(feats_path, dtype=np.uint8, mode="w+", shape=(n,) + SHAPE)
        labels = np.memmap(labels_path, dtype=np.int64, mode="w+", shape=(n,))
        step = 1 << 16
        for i in range(0, n, step):
            chunk = rng.integers(0, 256, size=(min(step, n - i),) + SHAPE, dtype=np.uint8)
            lab = rng.integers(0, 2, size=len(chunk))
            chunk[:, 0] = chunk[:, 0] // 2 + (100 * lab)[:, None, None]
            feats[i : i + len(chunk)] = chunk
            labels[i : i + len(chunk)] = lab
        feats.flush()
        labels.flush()
        del feats, labels
    return feats_path, labels_path


class Net(nn.Module):
    """train_memmap.py's net."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64, 2)

    def forward(self, x):
        x = F.relu(self.c1(x.float() / 255.0))
        x = F.relu(self.c2(F.max_pool2d(x, 2)))
        return self.fc(x.mean((2, 3)))


def train(next_batch, warmup, steps):
    """Steps/s of `steps` training steps after `warmup`, and the last loss."""
    torch.manual_seed(0)
    net = Net().cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss = None
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t = time.perf_counter()
        x, y = next_batch()
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t), float(loss)


def bound(feats, labels, batch, warmup, steps):
    """The loop fed one fixed batch already on the GPU."""
    x = torch.from_numpy(np.array(feats[:batch])).cuda()
    y = torch.from_numpy(np.array(labels[:batch])).cuda()
    return train(lambda: (x, y), warmup, steps)[0]


def loader_args(a, way, total):
    if way == "resident":
        return {"shuffle": "full", "budget": a.budget, "device_budget": total + (64 << 20)}
    if way == "registered":
        return {"shuffle": "full", "budget": total + (64 << 20), "device_budget": 1}
    if way == "pool":
        return {"shuffle": "pool", "budget": a.budget, "device_budget": a.pool, "block_bytes": a.block}
    return {"shuffle": "full", "budget": a.budget, "device_budget": 1}  # ring


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ways", default="resident,registered,pool", help="comma-separated: " + ", ".join(WAYS))
    ap.add_argument("--records", type=int, default=2_000_000, help="records of the generated data")
    ap.add_argument("--folder", default=os.environ.get("TMPDIR", "/tmp"), help="where the generated data goes")
    ap.add_argument("--feats", default=None, help="a raw file of (3, 31, 31) uint8 records (with --labels)")
    ap.add_argument("--labels", default=None, help="a raw file of int64 labels, one per record")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--budget", type=int, default=1 << 30, help="pin budget (pool, ring; resident's loading)")
    ap.add_argument("--pool", type=int, default=2 << 30, help="device memory of the pool")
    ap.add_argument("--block", type=int, default=64 << 20, help="bytes of a pool block")
    ap.add_argument("--prefetch", type=int, default=None, help="passed to wirespeed.Loader only when given")
    a = ap.parse_args()
    ways = [w for w in a.ways.split(",") if w]
    for w in ways:
        if w not in WAYS:
            ap.error(f"--ways: unknown way {w!r} ({', '.join(WAYS)})")
    if (a.feats is None) != (a.labels is None):
        ap.error("--feats and --labels go together")
    if not torch.cuda.is_available():
        skip(f"torch {torch.__version__} sees no CUDA GPU")
    torch.backends.cudnn.benchmark = True
    if a.feats is None:
        fp, lp = make_data(a.folder, a.records)
    else:
        fp, lp = a.feats, a.labels
    n = os.path.getsize(fp) // RECORD
    if os.path.getsize(lp) // 8 != n:
        sys.exit(f"python_train.py: {fp} holds {n} records, {lp} {os.path.getsize(lp) // 8} labels")
    feats = np.memmap(fp, dtype=np.uint8, mode="r", shape=(n,) + SHAPE)
    labels = np.memmap(lp, dtype=np.int64, mode="r", shape=(n,))
    total = n * (RECORD + 8)
    print(f"python_train.py: {n} records ({total / 2**30:.2f} GiB with labels), batches of {a.batch}, "
          f"{a.warmup} + {a.steps} steps; {torch.cuda.get_device_name()}", file=sys.stderr, flush=True)
    before = bound(feats, labels, a.batch, a.warmup, a.steps)
    rows, failed = [], False
    for way in ways:
        kw = loader_args(a, way, total)
        if a.prefetch is not None:
            kw["prefetch"] = a.prefetch
        loader = None
        try:
            loader = wirespeed.Loader((feats, labels), batch_size=a.batch, seed=0, drop_last=True, **kw)
            if loader.way != way:
                print(f"python_train.py: asked for {way}, the Loader chose {loader.way}", file=sys.stderr, flush=True)
            if len(loader) < a.warmup + a.steps:
                print(f"python_train.py: {way}: {len(loader)} batches an epoch: the loop runs into later epochs",
                      file=sys.stderr, flush=True)
            state = {"it": iter(loader)}

            def next_batch():
                try:
                    return next(state["it"])
                except StopIteration:
                    state["it"] = iter(loader)  # the next epoch
                    return next(state["it"])

            t = time.perf_counter()
            first = next_batch()  # the first batch: loading (resident), registering (registered)
            torch.cuda.synchronize()
            setup = time.perf_counter() - t
            pending = [first]
            ours, loss = train(lambda: pending.pop() if pending else next_batch(), a.warmup, a.steps)
            rows.append((way, loader.way, ours, loss, setup))
        except Exception as e:  # one way failing does not lose the others' rows
            print(f"python_train.py: {way}: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
            failed = True
        finally:
            if loader is not None:
                loader.close()
            torch.cuda.empty_cache()
    after = bound(feats, labels, a.batch, a.warmup, a.steps)
    best = max(before, after)
    for way, got, ours, loss, setup in rows:
        ratio = ours / best
        print(json.dumps({"name": f"train-{got}", "asked": way, "steps_per_s": ours, "bound_steps_per_s": best,
                          "bound_before": before, "bound_after": after, "ratio": ratio,
                          "goal": "PASS" if ratio >= 0.98 else "MISS", "records_per_s": ours * a.batch,
                          "batch": a.batch, "steps": a.steps, "first_batch_s": setup, "last_loss": loss,
                          "prefetch": a.prefetch}), flush=True)
        print(f"train-{got}: {ours:.1f} steps/s, bound {best:.1f} steps/s: {ratio:.3f} of the bound "
              f"(goal 0.98: {'PASS' if ratio >= 0.98 else 'MISS'}); loss {loss:.3f}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
