"""wirespeed.Loader where a training job must trust it (emulated runtime):
ranks that agree on one order whatever their free memory, checkpoints that
resume exactly or say what differs, no silent rank 0 of 1 under torchrun,
the caller's current device kept, and a failed batch whose memory nothing
writes once the call returned.

The distributed tests start real processes, one per rank, each with its
own emulated GPU of a different size; torch is not needed: each child puts a
stand-in ``torch.distributed`` (a process group over files) in
``sys.modules`` before building its Loader, which asks torch.distributed
for its rank, world size and the other ranks' budgets exactly as it does
under torchrun."""

import ctypes
import gc
import json
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")

import wirespeed  # noqa: E402

SHAPE = (3, 31, 31)  # 2,883-byte records
REC = 2883
BLOCK = 16 * REC  # blocks of 16 records


@pytest.fixture(autouse=True)
def clean():
    yield
    gc.collect()
    wirespeed._native._emulator_reset()
    wirespeed.release()


def write_data(folder, n):
    feats = np.memmap(folder / "feats.u8", dtype=np.uint8, mode="w+", shape=(n,) + SHAPE)
    for i in range(n):
        feats[i] = (i * 7 + np.arange(REC, dtype=np.uint64).reshape(SHAPE)) % 251
    feats.flush()
    labels = np.memmap(folder / "labels.i8", dtype=np.int64, mode="w+", shape=(n,))
    labels[:] = np.arange(n)
    labels.flush()
    return folder / "feats.u8", folder / "labels.i8"


def open_data(paths, n):
    return (np.memmap(paths[0], dtype=np.uint8, mode="r", shape=(n,) + SHAPE),
            np.memmap(paths[1], dtype=np.int64, mode="r", shape=(n,)))


def labels_of(batch):
    return np.frombuffer(batch[1].to_bytes(), dtype=np.int64).tolist()


# A stand-in for torch.distributed: a process group whose collectives go
# through files in a shared folder (each rank writes its object, then waits
# for every rank's).
STUB = r'''
import json, os, sys, time, types

class _Dist(types.ModuleType):
    def __init__(self, folder, rank, world):
        super().__init__("torch.distributed")
        self._folder, self._rank, self._world, self._calls = folder, rank, world, 0
    def is_available(self): return True
    def is_initialized(self): return True
    def get_rank(self): return self._rank
    def get_world_size(self): return self._world
    def get_backend(self): return "gloo"
    def all_gather_object(self, out, obj):
        self._calls += 1
        path = os.path.join(self._folder, f"call{self._calls}.rank{self._rank}")
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f)
        os.rename(path + ".tmp", path)
        deadline = time.monotonic() + 120
        for r in range(self._world):
            p = os.path.join(self._folder, f"call{self._calls}.rank{r}")
            while not os.path.exists(p):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank {r} never joined call {self._calls}")
                time.sleep(0.01)
            with open(p) as f:
                out[r] = json.load(f)

def install(folder, rank, world):
    torch = types.ModuleType("torch")
    torch.distributed = _Dist(folder, rank, world)
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: False
    torch.cuda = cuda
    sys.modules["torch"] = torch
    sys.modules["torch.distributed"] = torch.distributed
'''

CHILD = r'''
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stub_dist
stub_dist.install(os.environ["GROUP"], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
import numpy as np
import wirespeed
wirespeed._use_emulator()
args = json.loads(sys.argv[1])
n = args["n"]
feats = np.memmap(args["feats"], dtype=np.uint8, mode="r", shape=(n, 3, 31, 31))
labels = np.memmap(args["labels"], dtype=np.int64, mode="r", shape=(n,))
out = {}
try:
    loader = wirespeed.Loader((feats, labels), batch_size=args["batch"], seed=5, drop_last=args["drop_last"],
                              shuffle=args["shuffle"], budget=args["budget"], block_bytes=args["block"],
                              **args.get("extra", {}))
    epochs = []
    for e in range(2):
        got = []
        for x, y in loader:
            got.extend(np.frombuffer(y.to_bytes(), dtype=np.int64).tolist())
        epochs.append(got)
    out = {"way": loader.way, "slots": loader.blocks_per_batch, "epochs": epochs, "state": loader.state_dict()}
    loader.close()
except wirespeed.Error as e:
    out = {"error": str(e)}
with open(args["out"] + "." + os.environ["RANK"], "w") as f:
    json.dump(out, f)
'''


def run_ranks(tmp_path, mems, **args):
    """One process per rank, rank r's emulated GPU of mems[r] bytes; their
    results, by rank."""
    (tmp_path / "stub_dist.py").write_text(STUB)
    (tmp_path / "child.py").write_text(CHILD)
    group = tmp_path / f"group-{len(list(tmp_path.glob('group-*')))}"
    group.mkdir()
    out = str(group / "out")
    procs = []
    for r, mem in enumerate(mems):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(len(mems)), GROUP=str(group),
                   CUDA_EMU_DEVICE_MEM=str(mem), CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "child.py"), json.dumps(dict(args, out=out))],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return [json.loads(open(out + f".{r}").read()) for r in range(len(mems))]


@pytest.mark.parametrize("shuffle", [True, "pool", "full"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_with_different_free_memory_split_one_order(tmp_path, shuffle, drop_last):
    n, batch = 1001, 24
    feats, labels = write_data(tmp_path, n)
    # Rank 0's half of its free memory holds the 2.9 MB of records (a full
    # shuffle, resident), ranks 1 and 2 hold pools of different shapes: left
    # to themselves they would hand out different orders.
    mems = [64 << 20, 4 << 20, 3 << 20]
    ranks = run_ranks(tmp_path, mems, n=n, batch=batch, drop_last=drop_last, shuffle=shuffle,
                      budget=2 << 20, block=BLOCK, feats=str(feats), labels=str(labels))
    assert all("error" not in r for r in ranks), ranks
    ways = {r["way"] for r in ranks}
    if shuffle == "full":
        assert "pool" not in ways
    else:  # the least budget of the three: a pool, of one shape
        assert ways == {"pool"} and len({r["slots"] for r in ranks}) == 1, [(r["way"], r["slots"]) for r in ranks]
    for e in range(2):
        shares = [r["epochs"][e] for r in ranks]
        seen = [x for s in shares for x in s]
        per_rank = n // 3 if drop_last else -(-n // 3)
        if drop_last:
            per_rank -= per_rank % batch
        assert all(len(s) == per_rank for s in shares), [len(s) for s in shares]
        if drop_last:
            assert len(set(seen)) == len(seen), "a record handed out twice"
        else:
            assert set(seen) == set(range(n)), "a record never handed out"
            assert len(seen) - len(set(seen)) == 3 * per_rank - n  # only the padding repeats
    # Every rank's checkpoint names the same order.
    states = [{k: v for k, v in r["state"].items() if k != "rank"} for r in ranks]
    assert all(s == states[0] for s in states), states


def test_a_world_without_a_process_group_and_the_default_budget_is_refused(tmp_path):
    n = 200
    feats, labels = open_data(write_data(tmp_path, n), n)
    with pytest.raises(wirespeed.Error, match="device_budget"):
        wirespeed.Loader((feats, labels), batch_size=16, rank=1, world_size=2)
    # Named, the budget (or the way) fixes the order: accepted.
    for kw in ({"device_budget": 8 << 20}, {"shuffle": "full"}, {"shuffle": "pool", "pool_slots": 2}):
        with wirespeed.Loader((feats, labels), batch_size=16, rank=1, world_size=2, block_bytes=BLOCK, **kw) as ld:
            assert len(ld) == 7  # 100 records of rank 1: 6 of 16 and one of 4


def test_torchrun_without_init_process_group_is_refused(tmp_path, monkeypatch):
    n = 100
    feats, labels = open_data(write_data(tmp_path, n), n)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(wirespeed.Error, match="init_process_group"):
        wirespeed.Loader((feats, labels), batch_size=16)
    # Saying so is accepted: one process reading the whole dataset.
    with wirespeed.Loader((feats, labels), batch_size=16, rank=0, world_size=1) as ld:
        assert len(ld) == 7


def test_a_checkpoint_resumes_exactly_or_says_what_differs(tmp_path):
    n = 1000
    feats, labels = open_data(write_data(tmp_path, n), n)
    kw = dict(batch_size=32, seed=9, budget=2 << 20, block_bytes=BLOCK)
    with wirespeed.Loader((feats, labels), **kw) as ld:
        first_way = ld.way
        whole = [labels_of(b) for b in ld]
        ld.set_epoch(0)
        it = iter(ld)
        head = [labels_of(next(it)) for _ in range(5)]
        state = ld.state_dict()
    assert head == whole[:5] and state["batch"] == 5 and state["epoch"] == 0
    assert state["order"] == "full" and first_way in ("resident", "registered")
    json.dumps(state)  # a plain dict: saved with the model
    # The same settings after a restart: exactly the batches that were left.
    with wirespeed.Loader((feats, labels), **kw) as ld:
        ld.load_state_dict(state)
        assert [labels_of(b) for b in ld] == whole[5:]
    # Less free memory at the restart: the default budget now chooses the pool,
    # another order. Refused, saying which setting and what to pass.
    hog = wirespeed._native._DeviceArray(wirespeed._native._mem_info(0)[0] - (4 << 20))
    with wirespeed.Loader((feats, labels), **kw) as ld:
        assert ld.way == "pool"
        with pytest.raises(wirespeed.Error, match="order") as e:
            ld.load_state_dict(state)
        assert "full shuffle" in str(e.value)
    # A refused state leaves the loader where it was, batches gathered ahead
    # or not: the pass goes on with exactly the batches it had left.
    with wirespeed.Loader((feats, labels), shuffle="full", **kw) as ld:
        it = iter(ld)
        head = [labels_of(next(it)) for _ in range(5)]
        with pytest.raises(wirespeed.Error, match="seed"):
            ld.load_state_dict(dict(state, seed=10))
        assert head + [labels_of(b) for b in ld] == whole
    # Naming the way resumes it exactly whatever the memory.
    with wirespeed.Loader((feats, labels), shuffle="full", **kw) as ld:
        ld.load_state_dict(state)
        assert [labels_of(b) for b in ld] == whole[5:]
    del hog
    for key, value in (("seed", 10), ("batch_size", 64), ("drop_last", True), ("world_size", 2)):
        with wirespeed.Loader((feats, labels), **kw) as ld:
            with pytest.raises(wirespeed.Error, match=key.replace("_size", "") if key == "world_size" else key):
                ld.load_state_dict(dict(state, **{key: value}))
    # A state saved before these fields existed (epoch, batch, seed, ...) still loads.
    with wirespeed.Loader((feats, labels), **kw) as ld:
        ld.load_state_dict({"epoch": 0, "batch": 5, "seed": 9, "batch_size": 32, "rank": 0, "world_size": 1})
        assert [labels_of(b) for b in ld] == whole[5:]


def test_a_pool_checkpoint_names_its_shape(tmp_path):
    n = 1000
    feats, labels = open_data(write_data(tmp_path, n), n)
    kw = dict(batch_size=32, seed=2, shuffle="pool", block_bytes=BLOCK)
    with wirespeed.Loader((feats, labels), pool_slots=4, **kw) as ld:
        assert ld.way == "pool" and ld.blocks_per_batch == 4
        whole = [labels_of(b) for b in ld]
        ld.set_epoch(0)
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    assert (state["order"], state["pool_slots"], state["block_records"]) == ("pool", 4, 16)
    with wirespeed.Loader((feats, labels), pool_slots=5, **kw) as ld:
        with pytest.raises(wirespeed.Error, match="4 blocks a half"):
            ld.load_state_dict(state)
    with wirespeed.Loader((feats, labels), pool_slots=4, **kw) as ld:
        ld.load_state_dict(state)
        assert [labels_of(b) for b in ld] == whole[3:]


def emulator_lib():
    return ctypes.CDLL(wirespeed._native.runtime_path())


def test_the_callers_current_device_is_kept(tmp_path):
    """Every call leaves the thread's current device as it was (torch keeps
    its own current device), and device=None or "cuda" means the current one."""
    code = r'''
import ctypes, sys
import numpy as np
import wirespeed
wirespeed._use_emulator()
rt = ctypes.CDLL(wirespeed._native.runtime_path())
def current():
    d = ctypes.c_int(-1)
    assert rt.cudaGetDevice(ctypes.byref(d)) == 0
    return d.value
n = 200
feats = np.memmap(sys.argv[1], dtype=np.uint8, mode="r", shape=(n, 3, 31, 31))
labels = np.memmap(sys.argv[2], dtype=np.int64, mode="r", shape=(n,))
assert rt.cudaSetDevice(1) == 0
for shuffle in (True, "pool", "full"):
    ld = wirespeed.Loader((feats, labels), batch_size=16, device="cuda", shuffle=shuffle, block_bytes=16 * 2883)
    assert ld._device == 1 and current() == 1
    ld.close()
    ld = wirespeed.Loader((feats, labels), batch_size=16, device=0, shuffle=shuffle, block_bytes=16 * 2883)
    assert current() == 1, f"{shuffle}: {current()} after the constructor"
    for x, y in ld:
        assert current() == 1, f"{shuffle}: {current()} after a batch"
    ld.set_epoch(3)
    ld.load_state_dict(ld.state_dict())
    assert current() == 1
    ld.close()
    assert current() == 1
print("ok")
'''
    n = 200
    feats, labels = write_data(tmp_path, n)
    env = dict(os.environ, CUDA_EMU_DEVICES="2", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code, str(feats), str(labels)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.mark.parametrize("shuffle", [True, "full"])
def test_a_batch_that_fails_midway_is_not_written_once_the_call_returned(tmp_path, shuffle):
    """The second array's gather fails after the first one's was enqueued
    (slowed down): by the time the error is raised, nothing of the batch is
    still to run, so its memory is free to go; the next pass hands out the
    batch again, whole."""
    n = 300
    feats, labels = open_data(write_data(tmp_path, n), n)
    native = wirespeed._native
    with wirespeed.Loader((feats, labels), batch_size=16, seed=4, shuffle=shuffle, prefetch=0) as ld:
        whole = [labels_of(b) for b in ld]
        ld.set_epoch(0)
        native._emulator_set_delay_us(100_000)
        native._emulator_inject_fault("cudaLaunchKernel", 2, 999)
        it = iter(ld)
        with pytest.raises(wirespeed.Error):
            next(it)
        ran = native._emulator_counters()["ops_executed"]
        native._emulator_set_delay_us(0)
        wirespeed.release()
        gc.collect()
        assert native._emulator_counters()["ops_executed"] == ran, "work of the failed batch ran after the error"
        assert [labels_of(b) for b in ld] == whole


def test_ctrl_c_interrupts_a_wait_for_the_loaders_own_work(tmp_path):
    """The pool's blocks provably cannot land (the emulated streams held):
    next() waits for the loader's thread, and Ctrl-C (a SIGALRM handler
    raising KeyboardInterrupt, once the call is inside the wait) interrupts
    it; once the streams go on, the epoch is handed out whole, the
    interrupted batch included."""
    import signal

    n = 400
    feats, labels = open_data(write_data(tmp_path, n), n)
    native = wirespeed._native
    with wirespeed.Loader((feats, labels), batch_size=16, seed=6, shuffle="pool", pool_slots=4,
                          block_bytes=BLOCK) as ld:
        whole = [labels_of(b) for b in ld]
        ld.set_epoch(0)
        fired = []

        def handler(signum, frame):
            if native._waits() == 0:  # not inside the wait yet: again later
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                return
            fired.append(True)
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, handler)
        native._emulator_hold(True)
        try:
            it = iter(ld)
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                next(it)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            native._emulator_hold(False)
        assert fired
        assert [labels_of(b) for b in ld] == whole
