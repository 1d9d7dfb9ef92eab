"""wirespeed.read_into from host memory on the emulated runtime: through the
pinned ring (auto, ring) and registered in place (whole-file): the data, for
small, large and unaligned sources; nothing left pinned or registered
afterwards; typed errors. Every check that a copy has or has not happened
yet holds the emulated streams (no timing)."""

import array
import gc

import pytest

import wirespeed
from helpers import KIB, MIB, pattern, raw

WAYS = ["auto", "ring", "whole-file"]



def counters():
    return wirespeed._native._emulator_counters()



def nothing_pinned():
    c = counters()
    return (wirespeed.pinned_bytes(), c["registrations"], c["pinned_allocs"])


@pytest.fixture
def clean():
    """Nothing kept before; after the test the emulator's controls are reset
    and what the package kept is released, and nothing is left pinned."""
    wirespeed.release()
    yield
    wirespeed._native._emulator_reset()
    wirespeed.release()
    assert nothing_pinned() == (0, 0, 0)


@pytest.mark.parametrize("strategy", WAYS)
@pytest.mark.parametrize(
    "size, offset",
    [
        (1, 0),
        (100, 3),  # less than a page, not aligned
        (4096, 0),
        (3 * MIB + 12345, 7),  # several pieces, unaligned start and length
        (40 * MIB + 1, 4095),  # more pieces than the ring has slots: slots are reused
    ],
)
def test_data_arrives(clean, strategy, size, offset):
    src = bytearray(pattern(size + offset + 5, seed=size & 0xFF))
    dst = wirespeed._DeviceArray(size)
    r = wirespeed.read_into(dst, src, offset, size, strategy=strategy)
    assert dst.to_bytes() == bytes(src[offset : offset + size])
    assert r.bytes == size and r.done
    assert r.gbps >= 0 and r.cpu_s_per_gb >= 0 and "GB/s" in str(r)
    if strategy == "whole-file":
        assert r.registrations == 1 and "in place" in r.strategy
        assert r.peak_pinned >= size
        # Unregistered once copied: the call returned after that.
        assert counters()["registrations"] == 0
    else:
        assert r.registrations == 0 and "pinned ring" in r.strategy
        assert 0 < r.peak_pinned <= wirespeed.DEFAULT_BUDGET


def test_typed_sources(clean):
    floats = array.array("f", [float(i) / 3 for i in range(10_000)])
    dst = wirespeed._DeviceArray(len(floats) * 4, typestr="<f4", shape=[len(floats)])
    wirespeed.read_into(dst, floats)
    assert dst.to_bytes() == floats.tobytes()
    ro = bytes(pattern(5 * MIB + 3))  # read-only: registered read-only in place
    dst = wirespeed._DeviceArray(len(ro))
    wirespeed.read_into(dst, ro, strategy="whole-file")
    assert dst.to_bytes() == ro


def test_numpy_sources(clean):
    np = pytest.importorskip("numpy")
    a = np.arange(3 * MIB, dtype=np.uint32)
    for strategy in WAYS:
        part = a[1:-1]  # starts 4 bytes into the array: not page-aligned
        dst = wirespeed._DeviceArray(part.nbytes)
        wirespeed.read_into(dst, part, strategy=strategy)
        assert dst.to_bytes() == part.tobytes(), strategy
    with pytest.raises(ValueError, match="C-contiguous"):
        wirespeed.read_into(wirespeed._DeviceArray(a[::2].nbytes), a[::2])


def test_small_budget_gives_a_smaller_ring(clean):
    src = bytearray(pattern(2 * MIB + 99, seed=4))
    dst = wirespeed._DeviceArray(len(src))
    r = wirespeed.read_into(dst, src, budget=256 * KIB)
    assert dst.to_bytes() == bytes(src)
    assert r.peak_pinned <= 256 * KIB
    assert wirespeed.pinned_bytes() <= 256 * KIB


def test_the_source_is_read_before_the_call_returns(clean):
    """Through the ring the call returns once the source is in pinned slots,
    before the copies run (the streams are held: nothing has run), so the
    caller may overwrite it at once."""
    src = bytearray(pattern(200 * KIB, seed=5))
    want = bytes(src)
    dst = wirespeed._DeviceArray(len(src))
    gc.collect()  # nothing left to free while held (freeing waits for the streams)
    wirespeed._native._emulator_hold(True)
    r = wirespeed.read_into(dst, src)
    assert not r.done  # held: no copy has run
    src[:] = bytes(len(src))  # the caller reuses its buffer
    wirespeed._native._emulator_hold(False)
    r.wait()
    assert dst.to_bytes() == want


def test_sync_waits_for_the_copies(clean):
    src = bytearray(pattern(MIB + 1, seed=6))
    dst = wirespeed._DeviceArray(len(src))
    r = wirespeed.read_into(dst, src, sync=True)
    assert r.done
    assert raw(dst) == bytes(src)  # landed, read with no synchronization


def test_nothing_left_pinned_or_registered(clean):
    src = bytearray(pattern(4 * MIB, seed=7))
    dst = wirespeed._DeviceArray(len(src))
    wirespeed.read_into(dst, src, strategy="whole-file")
    assert counters()["registrations"] == 0 and wirespeed.pinned_bytes() == 0
    wirespeed.read_into(dst, src, sync=True)
    kept = wirespeed.pinned_bytes()
    assert kept == counters()["pinned_bytes"] > 0  # the ring, kept for later calls
    wirespeed.read_into(dst, src, sync=True)
    assert wirespeed.pinned_bytes() == kept  # and reused
    wirespeed.release()
    assert nothing_pinned() == (0, 0, 0)
    src.extend(b"x")  # no export of the buffer is left either


def test_errors_are_typed(clean):
    src = bytearray(pattern(MIB))
    dst = wirespeed._DeviceArray(MIB)
    with pytest.raises(wirespeed.Error, match="holds"):
        wirespeed.read_into(wirespeed._DeviceArray(4096), src)
    with pytest.raises(wirespeed.Error, match="outside"):
        wirespeed.read_into(dst, src, MIB + 1)
    with pytest.raises(ValueError, match="reads files only"):
        wirespeed.read_into(dst, src, strategy="windows")
    with pytest.raises(ValueError, match="strategy"):
        wirespeed.read_into(dst, src, strategy="teleport")
    with pytest.raises(wirespeed.Error, match="budget"):
        wirespeed.read_into(dst, src, budget=4096)  # no room for the ring
    with pytest.raises(wirespeed.Error, match="budget"):
        wirespeed.read_into(dst, src, budget=MIB - 1, strategy="whole-file")
    with wirespeed.pinned(src):  # registered already: CUDA refuses a second registration
        with pytest.raises(wirespeed.Error):
            wirespeed.read_into(dst, src, strategy="whole-file")
        wirespeed.read_into(dst, src)  # the ring reads it as any memory
        assert dst.to_bytes() == bytes(src)
    assert counters()["registrations"] == 0
    assert nothing_pinned()[1] == 0


@pytest.mark.parametrize("strategy", WAYS)
def test_a_failed_copy_raises_and_the_package_works_on(clean, strategy):
    src = bytearray(pattern(3 * MIB, seed=8))
    dst = wirespeed._DeviceArray(len(src))
    wirespeed._native._emulator_inject_fault("cudaMemcpyAsync", 1, 999)
    with pytest.raises(wirespeed.Error):
        wirespeed.read_into(dst, src, strategy=strategy, sync=True)
    wirespeed._native._emulator_reset()
    wirespeed.read_into(dst, src, strategy=strategy, sync=True)
    assert dst.to_bytes() == bytes(src)
    assert counters()["registrations"] == 0
    wirespeed.release()
    assert nothing_pinned() == (0, 0, 0)


def test_empty_source(clean):
    dst = wirespeed._DeviceArray(0)
    r = wirespeed.read_into(dst, bytearray(), sync=True)
    assert r.bytes == 0 and r.done
    assert wirespeed.pinned_bytes() == 0  # nothing made for nothing
