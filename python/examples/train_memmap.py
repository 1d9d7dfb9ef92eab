#!/usr/bin/env python3
"""Trains a small conv net on an np.memmap of (3, 31, 31) uint8 records with
int64 labels, first with wirespeed.Loader, then with PyTorch's DataLoader
(num_workers=8, pin_memory=True), and prints for each: records/s, the share
of each step's time the GPU waited for data, and the loss at the start and
the end.

    python3 python/examples/train_memmap.py --records 2000000 --steps 300
    torchrun --nproc_per_node=2 python/examples/train_memmap.py --records 2000000 --steps 300

The GPU's wait is measured with CUDA events: from the end of one step's work
on the current stream to the moment the next batch is ready on it (for the
Loader, its gather; for the DataLoader, the copy after the worker's batch),
over the time from one step's end to the next's.

A record's label says whether its channel 0 was brightened, so the loss
falls when the data arrive as they should.
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import wirespeed

SHAPE = (3, 31, 31)


def make_data(folder, n):
    feats_path, labels_path = os.path.join(folder, "feats.u8"), os.path.join(folder, "labels.i8")
    want = n * 2883
    if not (os.path.exists(feats_path) and os.path.getsize(feats_path) == want):
        rng = np.random.default_rng(0)
        feats = np.memmap(feats_path, dtype=np.uint8, mode="w+", shape=(n,) + SHAPE)
        labels = np.memmap(labels_path, dtype=np.int64, mode="w+", shape=(n,))
        step = 1 << 16
        for i in range(0, n, step):
            chunk = rng.integers(0, 256, size=(min(step, n - i),) + SHAPE, dtype=np.uint8)
            lab = rng.integers(0, 2, size=len(chunk))
            chunk[:, 0] = chunk[:, 0] // 2 + (100 * lab)[:, None, None]  # class 1: channel 0 brighter
            feats[i : i + len(chunk)] = chunk
            labels[i : i + len(chunk)] = lab
        feats.flush()
        labels.flush()
        del feats, labels
    return (np.memmap(feats_path, dtype=np.uint8, mode="r", shape=(n,) + SHAPE),
            np.memmap(labels_path, dtype=np.int64, mode="r", shape=(n,)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64, 2)

    def forward(self, x):
        x = F.relu(self.c1(x.float() / 255.0))
        x = F.relu(self.c2(F.max_pool2d(x, 2)))
        return self.fc(x.mean((2, 3)))


class Records(Dataset):
    def __init__(self, feats, labels):
        self.feats, self.labels = feats, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.feats[i])), int(self.labels[i])


def train(name, batches, steps, device):
    torch.manual_seed(0)
    net = Net().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    stream = torch.cuda.current_stream(device)
    losses, waits, totals, records = [], [], [], 0
    it = iter(batches)
    prev_end = torch.cuda.Event(enable_timing=True)
    prev_end.record(stream)
    t0 = None
    for step in range(steps):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(batches)
            x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ready = torch.cuda.Event(enable_timing=True)
        ready.record(stream)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        if step == 5:  # warm-up done: start the clock
            torch.cuda.synchronize(device)
            t0, records = time.monotonic(), 0
        elif step > 5:
            waits.append((prev_end, ready))
            totals.append((prev_end, end))
            records += x.shape[0]
        losses.append(loss.detach())
        prev_end = end
    torch.cuda.synchronize(device)
    dt = time.monotonic() - t0
    wait = sum(a.elapsed_time(b) for a, b in waits)
    total = sum(a.elapsed_time(b) for a, b in totals)
    first, last = [float(v) for v in (torch.stack(losses[:10]).mean(), torch.stack(losses[-10:]).mean())]
    print(f"{name}: {records / dt:,.0f} records/s; the GPU waited for data {100 * wait / total:.1f} % of step time; "
          f"loss {first:.3f} -> {last:.3f}", flush=True)
    return records / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--folder", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--no-dataloader", action="store_true")
    a = ap.parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        torch.distributed.init_process_group("nccl" if torch.cuda.device_count() > 1 else "gloo")
        local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
    device = torch.device("cuda", torch.cuda.current_device())
    rank = torch.distributed.get_rank() if distributed else 0
    if rank == 0:
        make_data(a.folder, a.records)
    if distributed:
        torch.distributed.barrier()
    feats, labels = make_data(a.folder, a.records)
    loader = wirespeed.Loader((feats, labels), batch_size=a.batch, seed=0, drop_last=True)
    ours = train(f"rank {rank} wirespeed.Loader ({loader.way})", loader, a.steps, device)
    loader.close()
    if not a.no_dataloader:
        sampler = torch.utils.data.distributed.DistributedSampler(Records(feats, labels)) if distributed else None
        dl = DataLoader(Records(feats, labels), batch_size=a.batch, shuffle=sampler is None, sampler=sampler,
                        num_workers=a.workers, pin_memory=True, drop_last=True, persistent_workers=True)
        theirs = train(f"rank {rank} DataLoader(num_workers={a.workers}, pin_memory=True)", dl, a.steps, device)
        print(f"rank {rank}: wirespeed.Loader {ours / theirs:.1f}x the DataLoader's records/s", flush=True)
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
