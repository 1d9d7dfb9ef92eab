"""wirespeed.Loader with torch on a real GPU (WIRESPEED_REAL_GPU=1, the
package built without the emulator, pytest --noconftest): for every way, a
whole epoch is handed out while the caller's stream is still busy with work
queued before it (torch.cuda._sleep), every batch the file's records once
that work ran; the caller's stream, not the loader's, is what the tensors
are used on. Skipped elsewhere (the suite's emulated runtime has no torch)."""

import os

import pytest

if os.environ.get("WIRESPEED_REAL_GPU") != "1":
    pytest.skip("needs WIRESPEED_REAL_GPU=1 and a GPU", allow_module_level=True)

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no GPU", allow_module_level=True)

import wirespeed  # noqa: E402

SHAPE = (3, 31, 31)
N = 20_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loader-torch")
    feats = np.memmap(folder / "feats.u8", dtype=np.uint8, mode="w+", shape=(N,) + SHAPE)
    rng = np.random.default_rng(3)
    feats[:] = rng.integers(0, 256, size=feats.shape, dtype=np.uint8)
    feats.flush()
    labels = np.memmap(folder / "labels.i8", dtype=np.int64, mode="w+", shape=(N,))
    labels[:] = np.arange(N)
    labels.flush()
    return (np.memmap(folder / "feats.u8", dtype=np.uint8, mode="r", shape=(N,) + SHAPE),
            np.memmap(folder / "labels.i8", dtype=np.int64, mode="r", shape=(N,)))


WAYS = {
    "resident": {},
    "registered": {"shuffle": "full", "device_budget": 1},
    "pool": {"shuffle": "pool", "device_budget": 16 << 20, "block_bytes": 1 << 20},
    "ring": {"shuffle": "full", "device_budget": 1, "budget": 16 << 20},
}


@pytest.mark.parametrize("way", list(WAYS))
def test_an_epoch_is_handed_out_while_the_callers_stream_is_busy(data, way):
    feats, labels = data
    with wirespeed.Loader((feats, labels), batch_size=512, seed=1, device="cuda", **WAYS[way]) as loader:
        assert loader.way == way
        # torch's own kernels load at their first launch, which waits for the
        # device's queued work: launch the test's own work once first.
        torch.zeros(8, dtype=torch.int64, device="cuda").float().sum().item()
        torch.cuda._sleep(1)
        torch.cuda.synchronize()
        busy = torch.cuda.Event()
        # Seconds of work on the caller's stream, queued before the epoch.
        torch.cuda._sleep(int(torch.cuda.get_device_properties(0).clock_rate * 1000 * 5))  # about 5 s
        busy.record()
        kept, order = [], []
        for b, (x, y) in enumerate(loader):
            order.append(loader.batch_indices(b))
            kept.append((x, y, y.float().sum()))  # work on the caller's stream reading the batch
        assert not busy.query(), f"{way}: the epoch waited for the caller's queued work"
        assert torch.cuda.current_device() == 0
        torch.cuda.synchronize()
        seen = []
        for (x, y, total), idx in zip(kept, order):
            assert y.cpu().tolist() == idx
            assert total.item() == float(sum(idx))
            assert np.array_equal(x.cpu().numpy(), feats[np.array(idx)])
            seen.extend(idx)
        assert sorted(seen) == list(range(N))
