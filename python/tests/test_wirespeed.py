"""wirespeed on the emulated runtime: no GPU, torch or numpy needed."""

import array
import os

import pytest

import wirespeed


def pattern(n, seed=0):
    return bytes((i * 31 + seed + i // 251) & 0xFF for i in range(n))


@pytest.fixture
def data_file(tmp_path):
    data = pattern((3 << 20) + 12345)
    p = tmp_path / "data.bin"
    p.write_bytes(data)
    return p, data


def test_read_into_file_range(data_file):
    path, data = data_file
    dst = wirespeed._DeviceArray(1 << 20)
    report = wirespeed.read_into(dst, path, 4096 + 7, 1 << 20)
    assert dst.to_bytes() == data[4096 + 7 : 4096 + 7 + (1 << 20)]
    assert report.bytes == 1 << 20
    assert report.seconds >= 0 and report.gbps >= 0 and report.cpu_s_per_gb >= 0
    assert isinstance(report.strategy, str) and report.strategy
    assert "GB/s" in str(report)
    assert report.done


def test_read_into_whole_file_sync_and_strategies(data_file):
    path, data = data_file
    for strategy in ("auto", "whole-file", "ring"):
        dst = wirespeed._DeviceArray(len(data))
        r = wirespeed.read_into(dst, str(path), strategy=strategy, sync=True)
        assert r.done
        assert dst.to_bytes() == data, strategy
        # Every byte counted once, in place or through the ring.
        b = r.breakdown
        assert b["in_place_bytes"] + b["ring_bytes"] == len(data), (strategy, b)
        assert b["reserve_threads"] in (0, 1), b  # only auto's hybrid has a reserve
        assert b["setup_seconds"] >= 0, b
        if strategy == "ring":
            assert b["in_place_bytes"] == 0 and b["fill_seconds"] > 0, b


def test_read_into_with_stream_field(data_file):
    path, data = data_file

    class WithStream:
        def __init__(self, arr):
            self.arr = arr

        @property
        def __cuda_array_interface__(self):
            cai = dict(self.arr.__cuda_array_interface__)
            cai["stream"] = 1  # the legacy default stream (CAI v3)
            return cai

    arr = wirespeed._DeviceArray(8192)
    wirespeed.read_into(WithStream(arr), path, 100, 8192)
    assert arr.to_bytes() == data[100:8292]


def test_read_into_host_buffer():
    src = bytearray(pattern(5 << 20, seed=3))
    dst = wirespeed._DeviceArray(1 << 20)
    r = wirespeed.read_into(dst, src, 12345, 1 << 20)
    assert dst.to_bytes() == bytes(src[12345 : 12345 + (1 << 20)])
    assert r.bytes == 1 << 20 and r.done
    assert r.breakdown == {}  # the host ring: no streamer agents
    floats = array.array("f", [1.5] * 1024)
    dst = wirespeed._DeviceArray(4096, typestr="<f4", shape=[1024])
    wirespeed.read_into(dst, floats)
    assert dst.to_bytes() == floats.tobytes()


@pytest.mark.parametrize("depth", [0, 2])
def test_batches_over_file(data_file, depth):
    path, data = data_file
    batch = 1 << 20
    got = []
    for b in wirespeed.batches(path, batch, depth=depth, budget=64 << 20):
        cai = b.__cuda_array_interface__
        assert cai["typestr"] == "|u1"
        got.append(b.to_bytes())
    assert [len(g) for g in got] == [batch] * 3 + [12345]  # the last one partial
    for i, g in enumerate(got):
        assert g == data[i * batch : (i + 1) * batch], f"batch {i}"


def test_batches_typed_rows_and_range(tmp_path):
    row = 3 * 4  # 3 float32 values
    data = pattern(row * 1000, seed=5)
    p = tmp_path / "rows.bin"
    p.write_bytes(b"HDR!" + data)
    seen = 0
    for b in wirespeed.batches(p, ("<f4", (64, 3)), offset=4, depth=2):
        shape = b.__cuda_array_interface__["shape"]
        assert shape[1:] == (3,)
        assert b.to_bytes() == data[seen * row : (seen + shape[0]) * row]
        seen += shape[0]
    assert seen == 1000
    with pytest.raises(ValueError):
        list(wirespeed.batches(p, ("<f4", (64, 3))))  # 4 + 12000 bytes: not whole rows


def test_pinned_bytearray_and_array():
    buf = bytearray(pattern(1 << 20))
    with wirespeed.pinned(buf) as same:
        assert same is buf
        dst = wirespeed._DeviceArray(len(buf))
        wirespeed.read_into(dst, buf)  # copies from the registered memory
        assert dst.to_bytes() == bytes(buf)
    # released: registering it again works, and the buffer can resize again
    p = wirespeed.pinned(array.array("d", range(4096)))
    with p:
        assert p.registered
    assert not p.registered
    buf.extend(b"x")


def test_pinned_read_only():
    data = bytes(pattern(1 << 16))  # bytes: a read-only buffer
    p = wirespeed.pinned(data)
    with p:
        assert p._reg.read_only
    with pytest.raises(ValueError):
        with wirespeed.pinned(data, read_only=False):
            pass


def test_pinned_same_memory_twice_fails():
    buf = bytearray(1 << 16)
    with wirespeed.pinned(buf):
        with pytest.raises(wirespeed.Error):
            with wirespeed.pinned(buf):
                pass


def test_errors(data_file):
    path, data = data_file
    dst = wirespeed._DeviceArray(4096)
    with pytest.raises(wirespeed.Error, match="outside"):
        wirespeed.read_into(dst, path, len(data) - 100, 4096)
    with pytest.raises(wirespeed.Error, match="outside"):
        wirespeed.read_into(dst, path, len(data) + 1, 0)
    with pytest.raises(wirespeed.Error, match="holds 4096 bytes"):
        wirespeed.read_into(dst, path, 0, 8192)  # destination too small
    with pytest.raises(wirespeed.Error):
        wirespeed.read_into(dst, path, 0, 100)  # destination too large
    with pytest.raises(wirespeed.Error):
        wirespeed.read_into(dst, bytearray(100))
    with pytest.raises(TypeError):
        wirespeed.read_into(bytearray(10), path, 0, 10)
    with pytest.raises(FileNotFoundError):
        wirespeed.read_into(dst, path.parent / "missing.bin", 0, 4096)
    with pytest.raises(ValueError, match="strategy"):
        wirespeed.read_into(dst, path, 0, 4096, strategy="teleport")
    assert issubclass(wirespeed.Error, RuntimeError)


def test_budget_too_small_is_an_error(data_file):
    path, data = data_file
    dst = wirespeed._DeviceArray(len(data))
    with pytest.raises(wirespeed.Error):
        wirespeed.read_into(dst, path, budget=4096, strategy="whole-file", sync=True)


def test_numpy_memmap(tmp_path):
    np = pytest.importorskip("numpy")
    data = pattern(1 << 20, seed=9)
    p = tmp_path / "mm.bin"
    p.write_bytes(data)
    mm = np.memmap(p, dtype=np.uint8, mode="r", offset=8192)
    part = mm[4096:]  # a view: its file offset is 8192 + 4096
    dst = wirespeed._DeviceArray(len(part))
    wirespeed.read_into(dst, part)
    assert dst.to_bytes() == data[8192 + 4096 :]
    with wirespeed.pinned(mm):  # read-only mapping: registered read-only
        pass
    arr = np.arange(1000, dtype=np.float32)
    dst = wirespeed._DeviceArray(arr.nbytes)
    wirespeed.read_into(dst, arr)
    assert dst.to_bytes() == arr.tobytes()


def test_runtime_is_the_emulator():
    assert "cudart_emu" in wirespeed.runtime_path()
    assert wirespeed.device_count() >= 1


def test_release(data_file):
    path, data = data_file
    dst = wirespeed._DeviceArray(4096)
    wirespeed.read_into(dst, path, 0, 4096)
    wirespeed.release()
    wirespeed.read_into(dst, os.fspath(path), 4096, 4096, sync=True)
    assert dst.to_bytes() == data[4096:8192]


def test_dlpack_destination_without_torch_is_a_clear_error(data_file):
    """A DLPack array is read into through torch.from_dlpack; without torch
    the error says so (and names the ways that work)."""
    if wirespeed._torch() is not None:
        pytest.skip("torch is installed: DLPack goes through it")

    class OnlyDLPack:
        def __dlpack__(self, stream=None):
            raise AssertionError("not consumed without torch")

        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA, device 0

    path, _ = data_file
    with pytest.raises(TypeError, match="DLPack.*torch"):
        wirespeed.read_into(OnlyDLPack(), path, 0, 16)
