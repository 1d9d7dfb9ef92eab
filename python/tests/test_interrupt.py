"""Ctrl-C during a long transfer (emulated runtime, its streams held so that
the transfer provably cannot finish): the signal comes once the call is
provably inside one of the package's waits (`_native._waits()`), the
KeyboardInterrupt comes from that wait, the transfer ends in the background
once the streams go on, and after wirespeed.release() nothing is left
pinned. No assertion depends on the machine's speed."""

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import wirespeed

MIB = 1 << 20


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(bytes(range(251)) * (4 * MIB // 251))
    return p


def nothing_pinned():
    c = wirespeed._native._emulator_counters()
    return (wirespeed.pinned_bytes(), c["registrations"], c["pinned_allocs"])


def waiting():
    """Some thread is inside one of the package's interruptible waits."""
    return wirespeed._native._waits() > 0


class Alarm:
    """KeyboardInterrupt from a SIGALRM handler, as Ctrl-C's handler raises it:
    in the main thread, at its next signal check, the first time the handler
    runs (`after` seconds from now, then again every `after` seconds) while
    `when()` holds: by default, while a thread (the main one: no other calls
    the package here) is inside one of the package's waits. Python runs the
    handler only in the main thread, and inside a native call only where
    that call checks for signals, in its waits: so the interrupt provably
    comes from the wait, however slow the machine is."""

    def __init__(self, after, when=waiting):
        self.after = after
        self.when = when
        self.fired = None

    def __enter__(self):
        def handler(signum, frame):
            if not self.when():  # still on its way to the wait: again later
                signal.setitimer(signal.ITIMER_REAL, self.after)
                return
            self.fired = time.monotonic()
            raise KeyboardInterrupt

        self.old = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, self.after)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)


@pytest.fixture
def held():
    """The emulated streams start no operation until the test lets them go
    (`_emulator_hold(False)`); reset afterwards whatever happened."""
    wirespeed.release()
    gc.collect()  # nothing left to free while held (freeing waits for the streams)
    wirespeed._native._emulator_hold(True)
    yield
    wirespeed._native._emulator_reset()
    wirespeed.release()


# Bounds on how long the interrupt may take to arrive: only a guard against a
# hang (the held transfer never ends by itself), never a measure of speed.
HANG_S = 30


def test_ctrl_c_during_read_into(data_file, held):
    dst = wirespeed._DeviceArray(os.path.getsize(data_file))
    # Once the streamer's thread has pinned what the transfer needs (the file
    # registered whole), which it does while the main thread waits.
    with Alarm(0.3, when=lambda: waiting() and wirespeed.pinned_bytes() > 0) as alarm:
        with pytest.raises(KeyboardInterrupt):
            wirespeed.read_into(dst, data_file, sync=True)
    caught = time.monotonic()
    assert alarm.fired is not None
    assert caught - alarm.fired < HANG_S, "the wait did not notice the signal"
    # The streams are still held: the transfer cannot have ended, and holds its pins.
    assert wirespeed.pinned_bytes() > 0
    wirespeed._native._emulator_hold(False)
    wirespeed.release()  # waits for the transfer, then frees the pins
    assert nothing_pinned() == (0, 0, 0)
    # The destination was written in full, and the package works on.
    assert dst.to_bytes() == data_file.read_bytes()
    wirespeed.read_into(dst, data_file, sync=True)


def test_ctrl_c_during_read_into_many(data_file, held):
    """Interrupted while it orders the stream (the pieces all started, the
    first one's copies held): the pieces run to their end once the streams
    go on, their destinations kept until then."""
    data = data_file.read_bytes()
    n = len(data) // 4
    dsts = [wirespeed._DeviceArray(n) for _ in range(4)]
    pieces = [(d, k * n) for k, d in enumerate(dsts)][::-1]
    with Alarm(0.3) as alarm:
        with pytest.raises(KeyboardInterrupt):
            # Through the pinned ring (the range is larger than the budget).
            wirespeed.read_into_many(data_file, pieces, budget=2 * MIB)
    assert alarm.fired is not None and time.monotonic() - alarm.fired < HANG_S
    assert wirespeed.pinned_bytes() > 0
    wirespeed._native._emulator_hold(False)
    wirespeed.release()  # waits for the pieces, then frees the pins
    assert nothing_pinned() == (0, 0, 0)
    assert b"".join(d.to_bytes() for d in dsts) == data[: 4 * n]


def test_ctrl_c_during_batches(data_file, held):
    seen = 0
    # A pinned ring (the range is larger than the budget), two spans at once.
    # The iterator outlives the interrupt: dropping it frees its spans' device
    # memory, which (as cudaFree does) waits for the held streams.
    it = wirespeed.batches(data_file, MIB, span=2 * MIB, budget=2 * MIB, depth=1)
    with Alarm(0.3) as alarm:
        with pytest.raises(KeyboardInterrupt):
            for b in it:
                seen += 1
    assert alarm.fired is not None and time.monotonic() - alarm.fired < HANG_S
    assert seen == 0  # the first span never landed: the streams were held throughout
    assert wirespeed.pinned_bytes() > 0
    wirespeed._native._emulator_hold(False)
    del it
    wirespeed.release()
    assert nothing_pinned() == (0, 0, 0)


@pytest.mark.parametrize("strategy", ["auto", "whole-file"])
def test_ctrl_c_during_read_into_from_host(held, strategy):
    """Through the ring, a source larger than the ring cannot be read in full
    while no copy runs (its slots never come free); registered in place, the
    call waits for its copy: either way the call is provably waiting when the
    signal comes. The copies enqueued end once the streams go on, and then
    nothing is left pinned or registered."""
    src = bytearray(bytes(range(251)) * (64 * MIB // 251))
    dst = wirespeed._DeviceArray(len(src))
    with Alarm(0.3) as alarm:
        with pytest.raises(KeyboardInterrupt):
            wirespeed.read_into(dst, src, strategy=strategy, budget=len(src) + MIB)
    assert alarm.fired is not None and time.monotonic() - alarm.fired < HANG_S
    assert wirespeed.pinned_bytes() > 0  # the ring, or the source registered in place
    wirespeed._native._emulator_hold(False)
    wirespeed.release()  # waits for the copies enqueued, unregisters, frees the ring
    assert nothing_pinned() == (0, 0, 0)
    wirespeed.read_into(dst, src, strategy=strategy, sync=True)  # and works on
    assert dst.to_bytes() == bytes(src)
    wirespeed.release()


# The child makes an iterator over 8 spans, then holds the emulated streams:
# no copy can run, so no span can land and the loop cannot end until it is
# interrupted (nor can a span's device memory be freed meanwhile, which, as
# cudaFree does, would wait for the streams). A thread of the child says
# "waiting" once the main thread is inside the iterator's wait, where it
# stays: the parent's SIGINT comes then, whenever that is.
CHILD = r"""
import json, signal, sys, threading, time
# Python leaves SIGINT ignored where it started so (a child of a job started in
# the background by a shell without job control, as CI may be): Ctrl-C's own
# handler, whatever the parent's.
signal.signal(signal.SIGINT, signal.default_int_handler)
import wirespeed
wirespeed._use_emulator()
n, kept = 0, []
it = wirespeed.batches(sys.argv[1], 1 << 20, span=2 << 20, budget=2 << 20, depth=1)
wirespeed._native._emulator_hold(True)


def tell():
    while wirespeed._native._waits() == 0:
        time.sleep(0.001)
    print("waiting", flush=True)


threading.Thread(target=tell, daemon=True).start()
try:
    for b in it:
        kept.append(b)
        n += 1
    print(json.dumps({"finished": n}), flush=True)
except KeyboardInterrupt:
    pinned_at_interrupt = wirespeed.pinned_bytes()
    wirespeed._native._emulator_hold(False)
    del it, kept
    wirespeed.release()
    c = wirespeed._native._emulator_counters()
    print(json.dumps({"interrupted_after": n, "pinned_at_interrupt": pinned_at_interrupt,
                      "pinned_bytes": wirespeed.pinned_bytes(), "registrations": c["registrations"],
                      "pinned_allocs": c["pinned_allocs"]}), flush=True)
"""


def test_sigint_in_a_subprocess(tmp_path):
    """A real SIGINT (what Ctrl-C sends) to a process in a batch loop."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(251)) * (16 * MIB // 251))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "waiting"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert "interrupted_after" in result, result
    assert result["interrupted_after"] == 0, result  # held throughout: no span landed
    assert result["pinned_at_interrupt"] > 0
    assert (result["pinned_bytes"], result["registrations"], result["pinned_allocs"]) == (0, 0, 0), result
