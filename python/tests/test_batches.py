"""wirespeed.batches on the emulated runtime: spans, ordering, the last
partial batch, errors mid-iteration, leaving early, and what stays pinned."""

import gc
import sys
import threading
import time
import types
import weakref

import pytest

import wirespeed
from helpers import MIB, pattern, raw




@pytest.fixture
def emulator():
    """The emulator's controls, reset (faults, delay) and the package's
    caches released after the test."""
    yield wirespeed._native
    wirespeed._native._emulator_reset()
    wirespeed.release()


def counters():
    return wirespeed._native._emulator_counters()



@pytest.fixture
def big_file(tmp_path):
    data = pattern(16 * MIB + 12345, seed=1)
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    return p, data


def test_spans_are_few_transfers_of_whole_batches(big_file, emulator):
    path, data = big_file
    it = wirespeed.batches(path, MIB, span=4 * MIB, budget=2 * MIB, depth=2)
    spans = it.spans
    assert [n for _, n in spans][:-1] == [4 * MIB] * (len(spans) - 1)
    assert sum(n for _, n in spans) == len(data)
    assert spans[-1][1] == 4 * MIB + 12345  # the partial batch is in the last span
    got = [b.to_bytes() for b in it]
    assert len(got) == 17
    assert b"".join(got) == data
    # One transfer per span, not one per batch; with the range larger than
    # the budget, no span was registered whole before its copies.
    assert len(it.reports) == len(spans) == 4
    for r in it.reports:
        assert r.bytes in (4 * MIB, 4 * MIB + 12345)
        assert r.strategy != "whole-file"
        assert r.peak_pinned <= 2 * MIB
    # The first span begins a pass; a later one ran in the pass before it
    # when it was queued in time (it usually is, but nothing here waits).
    assert not it.reports[0].chained
    assert all(isinstance(r.chained, bool) for r in it.reports)
    assert next(it, None) is None  # ended, and stays so


# What a streamer sets up once and keeps: registration contexts, pinned
# memory (its ring), streams, and registrations it keeps (a file registered
# whole). Events are left out: the ring's slots make theirs as they are
# first used, and a pass makes a number of its own that depends on how its
# spans chained.
SETUP = ["cuCtxCreate_v2", "cudaHostAlloc", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority"]
KEPT_REGISTRATIONS = ["cudaHostRegister", "cuMemHostRegister_v2"]


@pytest.mark.parametrize(
    "strategy, budget, what",
    [
        ("auto", 2 * MIB, "ring"),  # the range larger than the budget: a pinned ring
        ("auto", 64 * MIB, "whole-file"),  # the file fits: registered whole, kept
        ("hybrid", wirespeed.DEFAULT_BUDGET, "hybrid"),  # a ring and a registration context
    ],
)
def test_first_pass_does_no_setup_later_passes_skip(big_file, emulator, strategy, budget, what):
    """Making the iterator sets up what its first pass would (by the
    emulator's call counts, not by time): the passes that follow, the first
    included, make no context, pinned allocation, stream or kept
    registration, and the first pass calls the runtime for them exactly as
    the second does."""
    path, data = big_file
    watched = SETUP + (KEPT_REGISTRATIONS if what == "whole-file" else [])

    def calls():
        return counters_of(watched)

    def one_pass():
        before = calls()
        it = wirespeed.batches(path, MIB, span=4 * MIB, budget=budget, strategy=strategy)
        made = calls()  # the iterator is made; no batch asked for yet
        live = counters()
        assert b"".join(raw(b) for b in it) == data  # (to_bytes would allocate)
        assert {r.strategy.split()[0] for r in it.reports} == {what}
        return diff(made, before), diff(calls(), made), live

    wirespeed.release()
    setup, first, live = one_pass()
    _, second, _ = one_pass()
    assert first == second == {f: 0 for f in watched}, (setup, first, second)
    if what in ("ring", "hybrid"):
        assert setup["cudaHostAlloc"] > 0 and live["pinned_allocs"] > 0  # the ring, before the first batch
    if what in ("whole-file", "hybrid"):
        assert live["contexts"] >= 1  # the registration context, before the first batch
    if what == "whole-file":
        assert live["registrations"] == 1  # the file, registered before the first batch


def counters_of(functions):
    return wirespeed._native._emulator_counters(functions)["calls"]


def diff(after, before):
    return {f: after[f] - before[f] for f in after}


def test_span_planning():
    plan = wirespeed._plan_spans
    assert plan(0, 10, 100) == []
    assert plan(95, 10, 100) == [(0, 95, 10)]  # less than 1.5 spans: one
    assert plan(1000, 10, 100) == [(i * 100, 100, 10) for i in range(10)]
    # 23 batches of spans of 10: 2 spans, the one with the extra batch last
    assert plan(225, 10, 100) == [(0, 110, 11), (110, 115, 12)]
    assert plan(5, 10, 1) == [(0, 5, 1)]
    assert plan(30, 10, 1) == [(0, 10, 1), (10, 10, 1), (20, 10, 1)]


def test_last_partial_batch_of_typed_rows(tmp_path, emulator):
    row = 5 * 4  # 5 float32 values
    data = pattern(row * 1001, seed=2)
    p = tmp_path / "rows.bin"
    p.write_bytes(data)
    shapes, seen = [], 0
    for b in wirespeed.batches(p, ("<f4", (100, 5)), span=300 * row, depth=1):
        cai = b.__cuda_array_interface__
        assert cai["typestr"] == "<f4"
        shapes.append(cai["shape"])
        assert b.to_bytes() == data[seen * row : (seen + cai["shape"][0]) * row]
        seen += cai["shape"][0]
    assert seen == 1001
    assert shapes == [(100, 5)] * 10 + [(1, 5)]


def test_no_batch_is_yielded_while_written(big_file, emulator):
    """With the emulated streams held, the first batch is not handed back:
    the iterator has started the first span and the next one (depth 4: the
    next span's batches) and waits, both provably streaming. Once they go
    on, each batch's memory, read with no synchronization the moment it is
    yielded, already holds the file's bytes; and before the iterator waits
    for a span, the spans `depth` batches ahead have been started."""
    path, data = big_file
    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=4)  # spans of 4, 4, 4 and 5 batches
    # Nothing left to free while held: freeing device memory waits for the
    # streams (as cudaFree does).
    gc.collect()
    emulator._emulator_hold(True)
    got = []
    t = threading.Thread(target=lambda: got.append(next(it)))
    t.start()
    until(lambda: len(it.reports) == 2 and wirespeed._native._waits() > 0)
    assert not any(r.done for r in it.reports)  # held: neither span has landed
    assert not got  # and the thread waits: nothing was handed back
    emulator._emulator_hold(False)
    t.join()
    assert raw(got[0]) == data[:MIB]
    off = got[0].nbytes
    spans = it.spans
    for b in it:
        assert raw(b) == data[off : off + b.nbytes], f"batch at {off} yielded before it landed"
        current = next(i for i, (o, n) in enumerate(spans) if o <= off < o + n)
        assert len(it.reports) == min(current + 2, len(spans))  # this span and the next one started
        off += b.nbytes
    assert off == len(data)


def until(condition):
    """Waits until `condition()` holds (polling; only a guard against a hang
    bounds it, never a measure of speed)."""
    end = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.001)


def test_depth_zero_streams_one_span_at_a_time(big_file, emulator):
    path, data = big_file
    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=0)
    for k, b in enumerate(it):
        assert len(it.reports) == min(k // 4, 3) + 1  # the last span has the partial 17th
        assert raw(b) == data[k * MIB : k * MIB + b.nbytes]


def test_error_mid_iteration_raises_and_ends(big_file, emulator):
    path, data = big_file
    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=0, strategy="whole-file")
    got = [next(it) for _ in range(4)]  # the first span: one copy
    # The next copy (the second span's) fails.
    emulator._emulator_inject_fault("cudaMemcpyAsync", 1, 999)
    with pytest.raises(wirespeed.Error) as e:
        next(it)
    assert str(e.value)  # the library's message
    assert next(it, None) is None  # the iteration has ended
    assert b"".join(raw(b) for b in got) == data[: 4 * MIB]
    # The streamer recovers: a fresh iteration reads everything.
    emulator._emulator_reset()
    assert b"".join(b.to_bytes() for b in wirespeed.batches(path, MIB, span=4 * MIB)) == data


def test_error_in_a_later_span_is_not_handed_back(big_file, emulator):
    path, data = big_file
    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=8, strategy="whole-file")
    # The third copy from now fails: the third span's, started while the
    # first span's batches are yielded (depth 8: two spans ahead). (Making
    # the iterator registered the file, by a copy of its own.)
    emulator._emulator_inject_fault("cudaMemcpyAsync", 3, 999)
    seen = 0
    with pytest.raises(wirespeed.Error):
        for b in it:
            assert raw(b) == data[seen : seen + b.nbytes]
            seen += b.nbytes
    assert seen == 8 * MIB  # two spans, then the error instead of the third


def test_break_leaves_nothing_pinned(big_file, emulator):
    path, data = big_file
    wirespeed.release()
    gc.collect()
    base = counters()
    assert wirespeed.pinned_bytes() == 0
    # Slowed down, so that the spans started ahead are likely still streaming
    # at the break (nothing here depends on it: the test of Ctrl-C during
    # batches, in test_interrupt.py, holds the streams to make it certain).
    emulator._emulator_set_delay_us(10_000)
    it = wirespeed.batches(path, MIB, span=4 * MIB, budget=2 * MIB, depth=8)
    for b in it:
        assert wirespeed.pinned_bytes() > 0  # the ring of the streamer, at least
        assert len(it.reports) == 3  # the first span and two ahead were started
        break
    del it, b
    emulator._emulator_set_delay_us(0)
    wirespeed.release()  # waits for the spans still streaming, frees the pins
    gc.collect()
    assert wirespeed.pinned_bytes() == 0
    c = counters()
    assert c["registrations"] == 0 and c["registered_bytes"] == 0
    assert c["pinned_allocs"] == 0 and c["pinned_bytes"] == 0
    assert c["device_allocs"] == base["device_allocs"]  # the spans' memory is freed
    assert c["unregister_violations"] == base["unregister_violations"]


def test_close_and_with_block(big_file, emulator):
    path, data = big_file
    with wirespeed.batches(path, MIB, span=4 * MIB) as it:
        first = next(it)
    assert next(it, None) is None  # closed by the block
    assert first.to_bytes() == data[:MIB]
    it = wirespeed.batches(path, MIB, span=4 * MIB)
    it.close()
    assert list(it) == []


def test_bad_arguments(big_file):
    path, _ = big_file
    with pytest.raises(ValueError, match="depth"):
        wirespeed.batches(path, MIB, depth=-1)
    with pytest.raises(ValueError, match="span"):
        wirespeed.batches(path, MIB, span=0)
    with pytest.raises(ValueError, match="at least one byte"):
        wirespeed.batches(path, 0)
    with pytest.raises(wirespeed.Error, match="outside"):
        wirespeed.batches(path, MIB, offset=1 << 40)
    assert list(wirespeed.batches(path, MIB, offset=0, length=0)) == []


class Storage:
    """One allocation of `FakeTorch`, shared by the tensors that view it."""


class FakeTensor:
    """As much of a torch CUDA tensor as `batches` uses: slices and views
    of one allocation of `FakeTorch`, device memory of the emulator."""

    def __init__(self, arr, storage):
        self._arr, self._storage = arr, storage

    def __getitem__(self, s):
        start, stop, step = s.indices(self._arr.nbytes)
        assert step == 1
        return FakeTensor(self._arr._view(start, stop - start), self._storage)

    def view(self, shape):
        assert shape == (self._arr.nbytes,)  # batches of bytes: no change
        return self

    def data_ptr(self):
        return self._arr.ptr

    ptr = property(data_ptr)
    nbytes = property(lambda self: self._arr.nbytes)


class FakeTorch(types.ModuleType):
    """A stand-in for torch, as much of it as `batches` uses, whose `empty`
    is a caching allocator as torch's is on one stream: a block is handed
    out again once no tensor uses it, the smallest free one large enough;
    a new one (`cudaMalloc`) only when none is free. It records the sizes
    asked for."""

    uint8 = "uint8"
    Tensor = FakeTensor

    def __init__(self):
        super().__init__("torch")
        self.free, self.asked = [], []
        stream = types.SimpleNamespace(cuda_stream=0)  # the legacy default stream
        self.cuda = types.SimpleNamespace(current_stream=lambda device=None: stream)

    def device(self, kind, index):
        return (kind, index)

    def empty(self, n, dtype=None, device=None):
        self.asked.append(n)
        fits = sorted((a for a in self.free if a.nbytes >= n), key=lambda a: a.nbytes)
        if fits:
            block = fits[0]
            self.free.remove(block)
        else:
            block = wirespeed._DeviceArray(n, device[1])
        storage = Storage()
        weakref.finalize(storage, self.free.append, block)
        return FakeTensor(block._view(0, n), storage)


@pytest.mark.parametrize("budget", [2 * MIB, wirespeed.DEFAULT_BUDGET])
def test_with_torch_the_first_pass_allocates_no_device_memory(big_file, emulator, monkeypatch, budget):
    """With torch, making the iterator allocates the spans alive at once in
    a pass (depth 2, spans of 4 batches: the next span ahead, so 3), each of
    the largest span's size; the first spans stream into them, and the last
    one into memory the caching allocator hands out again once the caller
    has let go of the first span's batches: the first pass makes no device
    allocation (counted by the emulator)."""
    path, data = big_file
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)

    def mallocs():
        return counters_of(["cudaMalloc"])["cudaMalloc"]

    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=2, budget=budget)
    largest = max(n for _, n in it.spans)
    assert largest == 4 * MIB + 12345  # the last span: 5 batches, the partial one included
    assert torch.asked == [largest] * 3  # made with the iterator
    made, got = mallocs(), []
    for b in it:
        got.append(raw(b))
    assert b"".join(got) == data
    assert mallocs() == made, "the first pass allocated device memory"
    assert torch.asked == [largest] * 3 + [largest]  # the fourth span's, handed out again
    # Closing lets go of what is reserved and not yet streamed into.
    it = wirespeed.batches(path, MIB, span=4 * MIB, depth=2, budget=budget)
    free = len(torch.free)
    it.close()
    gc.collect()
    assert len(torch.free) == free + 3
