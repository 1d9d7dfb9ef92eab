"""What the package holds pinned (wirespeed.pinned_bytes, checked against the
emulated runtime's own counts), and views of the library's device arrays."""

import pytest

import wirespeed

MIB = 1 << 20


def counters():
    return wirespeed._native._emulator_counters()


@pytest.fixture
def data_file(tmp_path):
    data = (bytes(range(251)) * (8 * MIB // 251 + 1))[: 8 * MIB + 123]
    p = tmp_path / "data.bin"
    p.write_bytes(data)
    return p, data


@pytest.fixture
def released():
    wirespeed.release()
    yield
    wirespeed.release()


def test_pinned_bytes_counts_what_the_package_pins(released):
    assert wirespeed.pinned_bytes() == 0
    buf = bytearray(3 * 4096 + 1)
    with wirespeed.pinned(buf):
        assert wirespeed.pinned_bytes() >= len(buf)
        assert counters()["registrations"] == 1
    assert wirespeed.pinned_bytes() == 0
    dst = wirespeed._DeviceArray(4096)
    wirespeed.read_into(dst, bytearray(4096))  # a host array: through the pinned ring
    assert wirespeed.pinned_bytes() == counters()["pinned_bytes"] > 0
    wirespeed.release()
    assert wirespeed.pinned_bytes() == 0 and counters()["pinned_bytes"] == 0


def test_a_kept_report_does_not_keep_the_pins(data_file, released):
    path, data = data_file
    dst = wirespeed._DeviceArray(len(data))
    ring = wirespeed.read_into(dst, path, budget=2 * MIB)  # a pinned ring
    part = wirespeed._DeviceArray(MIB)
    whole = wirespeed.read_into(part, path, 0, MIB)  # the file registered whole
    assert whole.registrations == 1 and whole.peak_pinned >= len(data)
    assert ring.registrations == 0 and 0 < ring.peak_pinned <= 2 * MIB
    assert wirespeed.pinned_bytes() > 0
    wirespeed.release()  # the reports are still alive: they must not keep the pins
    c = counters()
    assert wirespeed.pinned_bytes() == 0
    assert c["pinned_allocs"] == 0 and c["registrations"] == 0
    assert dst.to_bytes() == data and part.to_bytes() == data[:MIB]
    assert str(ring) and str(whole)


def test_device_array_views():
    a = wirespeed._DeviceArray(4096)
    v = a._view(1024, 2048, "<f4", [2, 256])
    assert v.ptr == a.ptr + 1024 and v.nbytes == 2048 and len(v) == 2
    assert v.__cuda_array_interface__["shape"] == (2, 256)
    w = v._view(1024, 1024)
    assert w.ptr == a.ptr + 2048
    with pytest.raises(ValueError):
        v._view(1024, 1025)
    with pytest.raises(ValueError):
        a._view(0, 12, "<f4", [2])
    del a, v
    assert len(w.to_bytes()) == 1024  # the views keep the memory
