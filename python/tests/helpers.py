"""What several test files of the package share: the data they write and how
they read device memory on the emulator."""

import ctypes

KIB, MIB = 1 << 10, 1 << 20


def pattern(n, seed=0):
    """Bytes of period 251 (a prime: a piece in the wrong place shows)."""
    block = bytes((i * 31 + seed) & 0xFF for i in range(251))
    return (block * (n // 251 + 1))[:n]


def raw(arr):
    """The bytes of a device array read straight from its memory, with no
    synchronization at all (the emulator's device memory is host memory):
    what a consumer would see if nothing had waited for them."""
    return ctypes.string_at(arr.ptr, arr.nbytes)
