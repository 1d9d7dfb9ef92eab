"""wirespeed.read_into_many on the emulated runtime: many pieces of one file,
in any order and with gaps, chained into one pass when queued in order;
bad input starts nothing; a failed piece raises once nothing is in flight.
No assertion depends on the machine's speed."""

import gc
import sys
import threading
import time

import pytest

import wirespeed
from helpers import KIB, MIB, pattern, raw




@pytest.fixture
def emulator():
    """The emulator's controls, with nothing of earlier tests in flight;
    reset (faults, delay, hold) and the package's caches released after the
    test."""
    wirespeed.release()  # waits for what earlier tests left streaming
    yield wirespeed._native
    wirespeed._native._emulator_reset()
    wirespeed.release()


@pytest.fixture
def big_file(tmp_path):
    data = pattern(16 * MIB + 12345, seed=4)
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    return p, data



def until(condition):
    """Waits until `condition()` holds (polling; only a guard against a hang
    bounds it, never a measure of speed)."""
    end = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.001)


@pytest.mark.parametrize("strategy, budget", [("auto", 2 * MIB), ("auto", 64 * MIB), ("ring", 64 * MIB)])
def test_pieces_in_any_order_with_gaps(big_file, emulator, strategy, budget):
    path, data = big_file
    # Descending, ascending, gaps, one piece of the last partial bytes, and
    # pieces of odd sizes and offsets; every length given or taken from dst.
    layout = [(9 * MIB, MIB), (0, MIB), (MIB + 7, 3 * MIB), (5 * MIB, 123), (16 * MIB, 12345),
              (12 * MIB - 1, 2 * MIB), (8 * MIB, 4096)]
    dsts = [wirespeed._DeviceArray(n) for _, n in layout]
    pieces = [(d, o) if k % 2 else (d, o, n) for k, (d, (o, n)) in enumerate(zip(dsts, layout))]
    reports = wirespeed.read_into_many(path, pieces, budget=budget, strategy=strategy)
    assert [r.bytes for r in reports] == [n for _, n in layout]
    for d, (o, n) in zip(dsts, layout):
        assert d.to_bytes() == data[o : o + n], f"piece at {o}"
    for r in reports:
        r.wait()
    assert all(r.done for r in reports)
    assert all(isinstance(r.chained, bool) for r in reports)


def test_pieces_of_one_tensor_and_sync(big_file, emulator):
    """Views of one device array as the destinations, as rows of one tensor
    would be; `sync` returns once every piece has landed."""
    path, data = big_file
    n, k = 256 * KIB, 20
    whole = wirespeed._DeviceArray(n * k)
    offsets = [((i * 7) % k) * n + i for i in range(k)]  # a permutation, shifted
    pieces = [(whole._view(i * n, n), o) for i, o in enumerate(offsets)]
    reports = wirespeed.read_into_many(path, pieces, budget=2 * MIB, sync=True)
    assert all(r.done for r in reports)
    got = raw(whole)
    for i, o in enumerate(offsets):
        assert got[i * n : (i + 1) * n] == data[o : o + n]


@pytest.mark.parametrize("given", ["ascending", "descending"])
def test_pieces_queued_together_chain_into_one_pass(big_file, emulator, given):
    """With the emulated streams held, the first piece's pass (through the
    pinned ring, smaller than a piece) cannot get past its first piece, so
    every piece is queued before the pass looks for the next: each piece
    after the first joins it (`chained`), none registered on its own. The
    pieces are queued by offset, whatever order they are given in; the
    reports come back in the order given."""
    path, data = big_file
    offsets = [k * 4 * MIB for k in range(4)]
    if given == "descending":
        offsets.reverse()
    dsts = [wirespeed._DeviceArray(4 * MIB) for _ in offsets]
    gc.collect()  # nothing left to free while held (freeing waits for the streams)
    emulator._emulator_hold(True)
    out = []
    t = threading.Thread(
        target=lambda: out.append(wirespeed.read_into_many(path, list(zip(dsts, offsets)), budget=2 * MIB))
    )
    t.start()
    # Ordering the consumer's stream (a wait) begins once every piece is started.
    until(lambda: wirespeed._native._waits() > 0)
    emulator._emulator_hold(False)
    t.join()
    reports = out[0]
    assert [r.chained for r in reports] == [o != 0 for o in offsets]
    assert sum(r.registrations for r in reports) == 0  # the ring: nothing registered
    for d, o in zip(dsts, offsets):
        assert d.to_bytes() == data[o : o + 4 * MIB]


def test_memmap_source(tmp_path, emulator):
    np = pytest.importorskip("numpy")
    data = pattern(MIB, seed=6)
    p = tmp_path / "mm.bin"
    p.write_bytes(data)
    mm = np.memmap(p, dtype=np.uint8, mode="r", offset=8192)[4096:]  # file offset 12288
    dsts = [wirespeed._DeviceArray(1000) for _ in range(3)]
    wirespeed.read_into_many(mm, [(dsts[0], 5000), (dsts[1], 0), (dsts[2], len(mm) - 1000)])
    base = 8192 + 4096
    assert dsts[0].to_bytes() == data[base + 5000 : base + 6000]
    assert dsts[1].to_bytes() == data[base : base + 1000]
    assert dsts[2].to_bytes() == data[-1000:]
    with pytest.raises(wirespeed.Error, match="outside"):
        wirespeed.read_into_many(mm, [(dsts[0], len(mm) - 999)])


def test_empty_list(big_file, emulator):
    path, _ = big_file
    assert wirespeed.read_into_many(path, []) == []
    assert wirespeed.read_into_many(path, iter(())) == []


def test_bad_input_starts_nothing(big_file, emulator):
    """Each mistake raises a typed error naming the piece, and no piece of
    the call is started: the good pieces before the bad one stay unwritten."""
    path, data = big_file
    good = wirespeed._DeviceArray(4096)
    before = raw(good)
    copied = wirespeed._native._emulator_counters()["bytes_copied"]
    other = wirespeed._DeviceArray(8192)
    cases = [
        (wirespeed.Error, "piece 1: range .* outside", [(good, 0), (other, len(data) - 100)]),
        (wirespeed.Error, "piece 1: range .* outside", [(good, 0), (other, -1)]),
        (wirespeed.Error, "piece 1: the destination holds 8192 bytes, the range 4096", [(good, 0), (other, 0, 4096)]),
        (ValueError, "pieces 1 and 2 overlap", [(good, 0), (other, 0), (other._view(4096, 4096), 0)]),
        (TypeError, "piece 1: expected", [(good, 0), (other,)]),
        (TypeError, "piece 1: expected", [(good, 0), "not a piece"]),
        (TypeError, "piece 1: the offset", [(good, 0), (other, 1.5)]),
        (TypeError, "not a CUDA array", [(good, 0), (bytearray(16), 0)]),
        (ValueError, "strategy", [(good, 0)]),
    ]
    for exc, match, pieces in cases:
        kw = {"strategy": "teleport"} if match == "strategy" else {}
        with pytest.raises(exc, match=match):
            wirespeed.read_into_many(path, pieces, **kw)
    assert wirespeed._native._emulator_counters()["bytes_copied"] == copied
    assert raw(good) == before  # nothing was started
    with pytest.raises(TypeError, match="path or an np.memmap"):
        wirespeed.read_into_many(bytearray(100), [(good, 0)])
    with pytest.raises(FileNotFoundError):
        wirespeed.read_into_many(path.parent / "missing.bin", [(good, 0)])


def test_a_failed_piece_raises_once_nothing_is_in_flight(big_file, emulator):
    """The file registered whole, each piece is one copy; the second copy
    fails. The call raises the error, and only once every piece has ended:
    the package holds none of the destinations any more."""
    path, data = big_file
    wirespeed.read_into(wirespeed._DeviceArray(4096), path, 0, 4096, budget=64 * MIB, sync=True)  # registers it
    dsts = [wirespeed._DeviceArray(MIB) for _ in range(4)]
    refs = [sys.getrefcount(d) for d in dsts]
    emulator._emulator_inject_fault("cudaMemcpyAsync", 2, 999)
    with pytest.raises(wirespeed.Error):
        wirespeed.read_into_many(path, [(d, k * MIB) for k, d in enumerate(dsts)], budget=64 * MIB,
                                 strategy="whole-file")
    gc.collect()  # the traceback's frames, which held the pieces
    wirespeed._native._reap()  # forgets only transfers that have ended
    assert [sys.getrefcount(d) for d in dsts] == refs, "a destination is still held by a transfer"
    assert dsts[0].to_bytes() == data[:MIB]
    # The package works on.
    emulator._emulator_reset()
    wirespeed.read_into_many(path, [(d, k * MIB) for k, d in enumerate(dsts)], budget=64 * MIB)
    assert b"".join(d.to_bytes() for d in dsts) == data[: 4 * MIB]


@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_loop_of_read_into_over_sequential_pieces(emulator, big_file, read_ahead):
    """One call a piece, each piece where the last one ended (the streamer
    may fill the next piece's first slots before its call comes): every
    piece gets its own bytes, and release() ends a pass still reading ahead
    at once."""
    path, data = big_file
    piece = 512 * KIB + 40  # fits the 2 MiB budget; the file does not
    dsts = [wirespeed._DeviceArray(piece) for _ in range(12)]
    reports = []
    for i, dst in enumerate(dsts):
        reports.append(wirespeed.read_into(dst, path, i * piece, piece, budget=2 * MIB, read_ahead=read_ahead))
    for i, (dst, r) in enumerate(zip(dsts, reports)):
        assert dst.to_bytes() == data[i * piece:(i + 1) * piece], f"piece {i}"
        assert "ring" in r.strategy and r.registrations == 0
        assert r.breakdown["read_ahead_bytes"] >= 0
    wirespeed.release()
