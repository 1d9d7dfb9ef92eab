"""wirespeed.prepare on the emulated runtime: what a first read_into would
make is made ahead (the pinned ring for host sources; a file's streamer, its
ring and, for a file within the budget, its registration), the first
read_into then makes nothing, and release() frees it all."""

import doctest

import pytest

import wirespeed
from helpers import MIB, pattern


def counters():
    return wirespeed._native._emulator_counters()


@pytest.fixture
def clean():
    wirespeed.release()
    yield
    wirespeed._native._emulator_reset()
    wirespeed.release()
    c = counters()
    assert (wirespeed.pinned_bytes(), c["registrations"], c["pinned_allocs"]) == (0, 0, 0)


def test_the_host_ring_is_made_ahead(clean):
    wirespeed.prepare()
    pinned, allocs = wirespeed.pinned_bytes(), counters()["pinned_allocs"]
    assert pinned > 0 and allocs > 0
    src = bytearray(pattern(3 * MIB + 17))
    dst = wirespeed._DeviceArray(len(src))
    r = wirespeed.read_into(dst, src, sync=True)
    assert dst.to_bytes() == bytes(src) and "pinned ring" in r.strategy
    # The first call used the ring made ahead: nothing pinned anew.
    assert wirespeed.pinned_bytes() == pinned and counters()["pinned_allocs"] == allocs


def test_a_host_array_prepares_the_same_ring(clean):
    wirespeed.prepare(bytearray(10))
    once = wirespeed.pinned_bytes()
    wirespeed.prepare()  # the same device and budget: kept
    assert wirespeed.pinned_bytes() == once > 0


def test_whole_file_has_nothing_to_make_for_a_host_array(clean):
    wirespeed.prepare(bytearray(10), strategy="whole-file")
    assert wirespeed.pinned_bytes() == 0


def test_a_file_within_the_budget_is_registered_ahead(clean, tmp_path):
    data = pattern(2 * MIB + 5)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    wirespeed.prepare(str(path))
    assert counters()["registrations"] == 1
    dst = wirespeed._DeviceArray(len(data))
    r = wirespeed.read_into(dst, path, sync=True)
    assert dst.to_bytes() == data
    assert counters()["registrations"] == 1  # the first read registered nothing anew
    assert r.registrations == 0


def test_a_file_larger_than_the_budget_gets_its_ring_ahead(clean, tmp_path):
    data = pattern(6 * MIB + 5)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    wirespeed.prepare(path, budget=2 * MIB)
    allocs = counters()["pinned_allocs"]
    assert allocs > 0 and counters()["registrations"] == 0
    dst = wirespeed._DeviceArray(len(data) - MIB)
    wirespeed.read_into(dst, path, MIB, budget=2 * MIB, sync=True)
    assert dst.to_bytes() == data[MIB:]
    assert counters()["pinned_allocs"] == allocs


def test_a_piece_of_a_file_larger_than_the_budget_gets_the_ring_it_streams_through(clean, tmp_path):
    data = pattern(6 * MIB + 5)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    piece = 512 * 1024  # fits the budget; read once, it streams through the file's ring
    wirespeed.prepare(path, MIB, piece, budget=2 * MIB)
    allocs = counters()["pinned_allocs"]
    assert allocs > 0 and counters()["registrations"] == 0
    dst = wirespeed._DeviceArray(piece)
    r = wirespeed.read_into(dst, path, MIB, piece, budget=2 * MIB, sync=True)
    assert dst.to_bytes() == data[MIB:MIB + piece]
    assert "ring" in r.strategy and r.registrations == 0
    assert counters()["pinned_allocs"] == allocs


@pytest.mark.parametrize("threads", [1, 3])
def test_threads_set_the_rings_threads(clean, threads):
    try:
        wirespeed.prepare(threads=threads)
        src = bytearray(pattern(9 * MIB + 3))
        dst = wirespeed._DeviceArray(len(src))
        r = wirespeed.read_into(dst, src, sync=True)
        assert dst.to_bytes() == bytes(src)
        assert f"{threads} threads" in r.strategy
    finally:
        wirespeed.prepare(threads=None)  # back to the default for the other tests
        wirespeed.release()


def test_a_source_of_one_piece_is_copied_by_the_caller(clean):
    wirespeed.prepare()
    src = bytearray(pattern(100))
    dst = wirespeed._DeviceArray(len(src))
    for _ in range(50):
        wirespeed.read_into(dst, src)
    assert dst.to_bytes() == bytes(src)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"threads": 0}, ValueError),
        ({"threads": 65}, ValueError),
        ({"src": "x.bin", "threads": 2}, ValueError),  # a file's streamer plans its own
        ({"strategy": "windows"}, ValueError),  # files only
        ({"strategy": "nonsense"}, ValueError),
        ({"budget": 4096}, wirespeed.Error),  # no room for the ring's two slots
        ({"device": 99}, wirespeed.Error),
    ],
)
def test_bad_arguments(clean, kwargs, error):
    with pytest.raises(error):
        wirespeed.prepare(**kwargs)
    assert wirespeed.pinned_bytes() == 0


@pytest.mark.parametrize("src, error", [(12345, TypeError), (object(), TypeError)])
def test_a_source_that_is_no_host_array(clean, src, error):
    with pytest.raises(error):
        wirespeed.prepare(src)
    assert wirespeed.pinned_bytes() == 0


def test_a_missing_file(clean, tmp_path):
    with pytest.raises((wirespeed.Error, OSError)):
        wirespeed.prepare(tmp_path / "missing.bin")


def test_the_docstring_example_runs(clean):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(wirespeed.prepare, "prepare", globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries >= 3
