"""wirespeed.Loader on the emulated runtime: every record once per epoch, the
order fixed by (seed, epoch), resumption, ranks, several arrays, every way,
bad input, and nothing left behind."""

import gc

import pytest

np = pytest.importorskip("numpy")

import wirespeed  # noqa: E402

SHAPE = (3, 31, 31)  # 2,883-byte records


@pytest.fixture
def data(tmp_path):
    """A memmap of 1,000 (3, 31, 31) uint8 records (each filled from its
    index) and an int64 label per record (its index)."""
    n = 1000
    feats = np.memmap(tmp_path / "feats.u8", dtype=np.uint8, mode="w+", shape=(n,) + SHAPE)
    for i in range(n):
        feats[i] = np.arange(i, i + 2883, dtype=np.uint64).reshape(SHAPE) % 251
    feats.flush()
    labels = np.memmap(tmp_path / "labels.i8", dtype=np.int64, mode="w+", shape=(n,))
    labels[:] = np.arange(n)
    labels.flush()
    return (np.memmap(tmp_path / "feats.u8", dtype=np.uint8, mode="r", shape=(n,) + SHAPE),
            np.memmap(tmp_path / "labels.i8", dtype=np.int64, mode="r", shape=(n,)))


@pytest.fixture(autouse=True)
def clean():
    yield
    gc.collect()
    wirespeed._native._emulator_reset()
    wirespeed.release()


def host(arr, dtype, shape):
    return np.frombuffer(arr.to_bytes(), dtype=dtype).reshape(shape)


def epoch(loader, feats=None):
    """The labels of one pass, batch by batch; checks each record's bytes."""
    out = []
    for b in loader:
        x, y = b
        labels = host(y, np.int64, (-1,))
        if feats is not None:
            xs = host(x, np.uint8, (-1,) + SHAPE)
            for row, i in zip(xs, labels):
                assert np.array_equal(row, feats[i]), f"record {i}"
        out.append(labels.tolist())
    return out


def test_every_record_once_and_the_bytes_are_the_files(data):
    feats, labels = data
    with wirespeed.Loader((feats, labels), batch_size=64, seed=3) as loader:
        assert len(loader) == 16 and loader.way == "resident"
        batches = epoch(loader, feats)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1000))
    assert [len(b) for b in batches] == [64] * 15 + [40]
    assert sum(1 for b in batches for i, j in zip(b, b[1:]) if j == i + 1) < 100  # shuffled


@pytest.mark.parametrize("shuffle,budget", [("pool", 600_000), ("full", None), (True, None)])
def test_each_way_hands_out_every_record(data, shuffle, budget):
    feats, labels = data
    kw = {"device_budget": budget, "block_bytes": 64 * 2883} if budget else {}
    with wirespeed.Loader((feats, labels), batch_size=50, shuffle=shuffle, seed=1, **kw) as loader:
        if shuffle == "pool":
            assert loader.way == "pool"
        flat = sorted(i for b in epoch(loader, feats) for i in b)
    assert flat == list(range(1000))


def test_file_order_without_shuffle(data):
    feats, labels = data
    with wirespeed.Loader((feats, labels), batch_size=100, shuffle=False) as loader:
        assert [i for b in epoch(loader) for i in b] == list(range(1000))


def test_order_is_fixed_by_seed_and_epoch(data):
    feats, labels = data
    a = wirespeed.Loader((feats, labels), batch_size=64, seed=5)
    b = wirespeed.Loader((feats, labels), batch_size=64, seed=5)
    e0, e1 = epoch(a), epoch(a)  # a second pass is the next epoch
    assert e0 != e1
    b.set_epoch(1)
    assert epoch(b) == e1
    b.set_epoch(0)
    assert epoch(b) == e0
    a.close()
    b.close()


def test_resuming_mid_epoch_gives_exactly_the_remaining_batches(data):
    feats, labels = data
    full = epoch(wirespeed.Loader((feats, labels), batch_size=64, seed=9))
    first = wirespeed.Loader((feats, labels), batch_size=64, seed=9)
    it = iter(first)
    got = [host(next(it)[1], np.int64, (-1,)).tolist() for _ in range(5)]
    state = first.state_dict()
    assert state["batch"] == 5
    first.close()
    again = wirespeed.Loader((feats, labels), batch_size=64, seed=9)
    again.load_state_dict(state)
    got += epoch(again)
    assert got == full


def test_ranks_are_disjoint_and_cover_the_epoch(data):
    feats, labels = data
    seen = []
    for rank in range(3):
        # (Without torch.distributed to agree on a budget, the ranks name the way.)
        with wirespeed.Loader((feats, labels), batch_size=64, seed=2, rank=rank, world_size=3, shuffle="full") as loader:
            seen.append([i for b in epoch(loader) for i in b])
    assert all(len(s) == 334 for s in seen)  # 1000 padded to 1002
    everything = [i for s in seen for i in s]
    assert sorted(set(everything)) == list(range(1000))
    assert len(everything) - len(set(everything)) == 2  # the padding repeats two records
    with wirespeed.Loader((feats, labels), batch_size=64, seed=2, rank=1, world_size=3, drop_last=True,
                          device_budget=1 << 30) as loader:
        assert len(loader) == 5 and all(len(b) == 64 for b in epoch(loader))


def test_one_array_yields_tensors_not_tuples(data, tmp_path):
    feats, _ = data
    with wirespeed.Loader(feats, batch_size=100, shuffle=False) as loader:
        first = next(iter(loader))
        assert not isinstance(first, tuple)
        assert np.array_equal(host(first, np.uint8, (-1,) + SHAPE), feats[:100])
    path = tmp_path / "arr.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4))
    with wirespeed.Loader(str(path), batch_size=4, shuffle=False) as loader:
        assert host(next(iter(loader)), np.float32, (-1, 4))[1, 2] == 6.0
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(range(200)))
    with wirespeed.Loader((str(raw), np.uint8, (10,)), batch_size=5, shuffle=False) as loader:
        assert host(next(iter(loader)), np.uint8, (-1, 10))[3, 0] == 30


def test_batches_stay_valid_while_kept(data):
    feats, labels = data
    with wirespeed.Loader((feats, labels), batch_size=64, seed=4) as loader:
        kept = list(loader)
        for x, y in kept:  # read after every later batch was gathered
            for row, i in zip(host(x, np.uint8, (-1,) + SHAPE), host(y, np.int64, (-1,))):
                assert np.array_equal(row, feats[i])


def test_bad_input_is_a_clear_error(data, tmp_path):
    feats, labels = data
    short = np.memmap(tmp_path / "short.i8", dtype=np.int64, mode="w+", shape=(999,))
    cases = [
        (lambda: wirespeed.Loader((feats, short), batch_size=8), "different lengths"),
        (lambda: wirespeed.Loader((str(tmp_path / "labels.i8"), np.float64, (7,)), batch_size=8), "whole number"),
        (lambda: wirespeed.Loader(feats, batch_size=0), "batch_size"),
        (lambda: wirespeed.Loader(feats, batch_size=8, rank=2, world_size=2), "rank"),
        (lambda: wirespeed.Loader(feats, batch_size=8, device="cpu"), "not a CUDA device"),
        (lambda: wirespeed.Loader(feats, batch_size=8, shuffle="sometimes"), "shuffle"),
        (lambda: wirespeed.Loader([1, 2], batch_size=8), "not an array"),
        (lambda: wirespeed.Loader(feats, batch_size=8, shuffle="pool", device_budget=1000), "device budget"),
    ]
    for make, words in cases:
        with pytest.raises(wirespeed.Error, match=words):
            make()
    assert wirespeed.pinned_bytes() == 0
    loader = wirespeed.Loader(feats, batch_size=8)
    loader.close()
    with pytest.raises(wirespeed.Error, match="closed"):
        len(loader)
    with pytest.raises(wirespeed.Error, match="closed"):
        next(iter(loader))


def test_a_loader_dropped_mid_epoch_leaves_nothing(data):
    feats, labels = data
    base = wirespeed._native._emulator_counters()
    for shuffle, kw in [(True, {}), ("pool", {"device_budget": 600_000, "block_bytes": 64 * 2883})]:
        loader = wirespeed.Loader((feats, labels), batch_size=64, shuffle=shuffle, seed=1, **kw)
        it = iter(loader)
        next(it), next(it)
        del it, loader
        gc.collect()
    wirespeed.release()
    c = wirespeed._native._emulator_counters()
    assert wirespeed.pinned_bytes() == 0
    assert (c["pinned_allocs"], c["registrations"]) == (0, 0)
    assert c["device_allocs"] == base["device_allocs"]  # (the gather kernel stays loaded, process-wide)
