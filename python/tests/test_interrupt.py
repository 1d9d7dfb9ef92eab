"""Ctrl-C during a long transfer (emulated runtime, every stream operation
slowed down): KeyboardInterrupt comes promptly, the transfer ends in the
background, and after wirespeed.release() nothing is left pinned."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import wirespeed

MIB = 1 << 20
DELAY_US = 400_000  # per stream operation: a whole-file transfer takes seconds
RING_DELAY_US = 50_000  # the ring's transfers are many more operations


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(bytes(range(251)) * (4 * MIB // 251))
    return p


def nothing_pinned():
    c = wirespeed._native._emulator_counters()
    return (wirespeed.pinned_bytes(), c["registrations"], c["pinned_allocs"])


class Alarm:
    """KeyboardInterrupt from a SIGALRM handler, `after` seconds from now, as
    Ctrl-C's handler raises it: in the main thread, at its next signal check."""

    def __init__(self, after):
        self.after = after
        self.fired = None

    def __enter__(self):
        def handler(signum, frame):
            self.fired = time.monotonic()
            raise KeyboardInterrupt

        self.old = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, self.after)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)


@pytest.fixture
def slow():
    wirespeed.release()
    wirespeed._native._emulator_set_delay_us(DELAY_US)
    yield
    wirespeed._native._emulator_reset()
    wirespeed.release()


def test_ctrl_c_during_read_into(data_file, slow):
    dst = wirespeed._DeviceArray(os.path.getsize(data_file))
    t0 = time.monotonic()
    with Alarm(0.3) as alarm:
        with pytest.raises(KeyboardInterrupt):
            wirespeed.read_into(dst, data_file, sync=True)
    caught = time.monotonic()
    assert alarm.fired is not None
    assert caught - alarm.fired < 0.25, "the wait did not notice the signal promptly"
    assert caught - t0 < 2 * DELAY_US / 1e6, "the transfer ended before the interrupt"
    wirespeed._native._emulator_set_delay_us(0)
    assert wirespeed.pinned_bytes() > 0  # the transfer goes on in the background
    wirespeed.release()  # waits for it, then frees the pins
    assert nothing_pinned() == (0, 0, 0)
    # The destination was written in full, and the package works on.
    assert dst.to_bytes() == data_file.read_bytes()
    wirespeed.read_into(dst, data_file, sync=True)


def test_ctrl_c_during_batches(data_file, slow):
    wirespeed._native._emulator_set_delay_us(RING_DELAY_US)
    seen = 0
    with Alarm(0.3) as alarm:
        with pytest.raises(KeyboardInterrupt):
            # A pinned ring (the range is larger than the budget), two spans at once.
            for b in wirespeed.batches(data_file, MIB, span=2 * MIB, budget=2 * MIB, depth=1):
                seen += 1
    assert alarm.fired is not None and time.monotonic() - alarm.fired < 0.25
    assert seen < 4
    wirespeed._native._emulator_set_delay_us(0)
    wirespeed.release()
    assert nothing_pinned() == (0, 0, 0)


CHILD = r"""
import json, sys
import wirespeed
wirespeed._use_emulator()
wirespeed._native._emulator_set_delay_us(int(sys.argv[2]))
n = 0
try:
    for b in wirespeed.batches(sys.argv[1], 1 << 20, span=2 << 20, budget=2 << 20, depth=1):
        if n == 0:
            print("streaming", flush=True)
        n += 1
    print(json.dumps({"finished": n}), flush=True)
except KeyboardInterrupt:
    wirespeed._native._emulator_set_delay_us(0)
    pinned_at_interrupt = wirespeed.pinned_bytes()
    wirespeed.release()
    c = wirespeed._native._emulator_counters()
    print(json.dumps({"interrupted_after": n, "pinned_at_interrupt": pinned_at_interrupt,
                      "pinned_bytes": wirespeed.pinned_bytes(), "registrations": c["registrations"],
                      "pinned_allocs": c["pinned_allocs"]}), flush=True)
"""


def test_sigint_in_a_subprocess(data_file, tmp_path):
    """A real SIGINT (what Ctrl-C sends) to a process in a batch loop."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(data_file), str(RING_DELAY_US)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "streaming"
        time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert "interrupted_after" in result, result
    assert result["pinned_at_interrupt"] > 0
    assert (result["pinned_bytes"], result["registrations"], result["pinned_allocs"]) == (0, 0, 0), result
