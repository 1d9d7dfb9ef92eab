"""Files, memmaps and host arrays into CUDA tensors at the line rate.

Built on the wire-speed crates: a file range is streamed to the GPU from
memory pinned in place (sliding registered windows, a reused pinned ring, or
both), never through a fresh ``pin_memory()`` copy per batch.

* :func:`read_into` - a file range (or an ``np.memmap``, or a host array) into
  a CUDA tensor you own, ordered on your current stream.
* :func:`batches` - an iterator of CUDA tensors over a file, the next
  ``depth`` batches streaming while you compute.
* :func:`pinned` - ``with wirespeed.pinned(array):`` registers host memory in
  place, so ``t[i].cuda(non_blocking=True)`` copies from it with no staging.

Errors of the library and of CUDA are raised as :class:`Error` (a
``RuntimeError``). See README.md for how the CUDA runtime is found.
"""

from __future__ import annotations

import atexit
import collections
import importlib.util
import math
import os
import site
import sys
from typing import Any, Iterator, Optional, Tuple, Union

from . import _native
from ._native import Error, Report, _DeviceArray, _Registration

__all__ = [
    "Error",
    "Report",
    "read_into",
    "batches",
    "pinned",
    "pinned_bytes",
    "release",
    "runtime_path",
    "device_count",
]

DEFAULT_BUDGET = 512 << 20
"""The default pin budget: bytes the library may keep pinned per streamer."""

_runtime_configured = False


def _use_emulator() -> None:
    """Use the emulated CUDA runtime (builds with the cargo feature ``emulator``
    only; for tests without a GPU). Call it before anything else."""
    global _runtime_configured
    _native._use_emulator()
    _runtime_configured = True


def _runtime_candidates() -> list:
    """libcudart copies next to torch and in NVIDIA's runtime wheels."""
    dirs = []
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            dirs.append(os.path.join(loc, "lib"))
    roots = list(sys.path)
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # virtualenv's old site module
        pass
    for root in roots:
        if root and os.path.isdir(os.path.join(root, "nvidia")):
            dirs.append(os.path.join(root, "nvidia", "cu13", "lib"))
            dirs.append(os.path.join(root, "nvidia", "cuda_runtime", "lib"))
    out = []
    for d in dirs:
        for name in ("libcudart.so.13", "libcudart.so.12"):
            p = os.path.join(d, name)
            if p not in out:
                out.append(p)
    return out


def _ensure_runtime() -> None:
    global _runtime_configured
    if not _runtime_configured:
        _runtime_configured = True
        _native._configure_runtime(_runtime_candidates())


def runtime_path() -> str:
    """The path of the CUDA runtime (libcudart) in use, loading it if needed."""
    _ensure_runtime()
    return _native.runtime_path()


def device_count() -> int:
    """The number of CUDA devices."""
    _ensure_runtime()
    return _native.device_count()


def release() -> None:
    """Waits for transfers in flight, then frees the pinned memory the cached
    streamers keep between calls and closes the cached file mappings."""
    _native.release()


def pinned_bytes() -> int:
    """Host bytes wirespeed holds pinned (page-locked) right now: what its
    cached streamers pin (their rings, the windows of transfers in flight,
    the file registrations they keep between calls), the bounce buffers of
    :func:`read_into` from host arrays, and the :class:`pinned` blocks open.
    0 after :func:`release` once no ``pinned`` block is open."""
    return _native.pinned_bytes()


atexit.register(_native.drain)

# ----------------------------------------------------------------- helpers


def _torch():
    return sys.modules.get("torch")


def _is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _cai_stream(value: Any) -> Optional[int]:
    """A ``__cuda_array_interface__`` v3 ``stream`` as a raw handle."""
    if value is None:
        return None
    value = int(value)
    if value == 0:
        raise ValueError("__cuda_array_interface__: stream 0 is not allowed (v3)")
    if value == 1:  # the legacy default stream
        return 0
    return value  # 2 is cudaStreamPerThread, the rest are handles


def _itemsize(typestr: str) -> int:
    try:
        return int(typestr[2:])
    except ValueError:
        raise ValueError(f"unknown typestr {typestr!r}") from None


def _destination(dst: Any) -> Tuple[int, int, Optional[int], Optional[int]]:
    """(pointer, bytes, device or None, consumer stream handle or None)."""
    if _is_torch_tensor(dst):
        torch = _torch()
        if not dst.is_cuda:
            raise ValueError("the destination tensor is not on a CUDA device")
        if not dst.is_contiguous():
            raise ValueError("the destination tensor is not contiguous")
        stream = torch.cuda.current_stream(dst.device).cuda_stream
        return dst.data_ptr(), dst.numel() * dst.element_size(), dst.device.index, int(stream)
    cai = getattr(dst, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(
            f"{type(dst).__name__} is not a CUDA array: give a CUDA tensor or an "
            "object with __cuda_array_interface__"
        )
    ptr, readonly = cai["data"]
    if readonly:
        raise ValueError("the destination is read-only")
    shape = tuple(cai["shape"])
    itemsize = _itemsize(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for n in reversed(shape):
            expected.append(step)
            step *= n
        if tuple(s for s, n in zip(strides, shape) if n > 1) != tuple(
            s for s, n in zip(reversed(expected), shape) if n > 1
        ):
            raise ValueError("the destination is not C-contiguous")
    return int(ptr), math.prod(shape) * itemsize, None, _cai_stream(cai.get("stream"))


def _memmap_range(mm: Any) -> Tuple[str, int, int]:
    """(path, file offset of the first byte, bytes) of an ``np.memmap``."""
    import mmap as _mmap

    import numpy as np

    if not mm.flags.c_contiguous:
        raise ValueError("the memmap is not C-contiguous")
    raw = mm._mmap
    base_ptr = np.frombuffer(raw, dtype=np.uint8).__array_interface__["data"][0]
    first = mm.__array_interface__["data"][0]
    base_off = mm.offset - mm.offset % _mmap.ALLOCATIONGRANULARITY
    return os.fspath(mm.filename), base_off + (first - base_ptr), mm.nbytes


def _is_memmap(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return (
        np is not None
        and isinstance(x, np.memmap)
        and getattr(x, "_mmap", None) is not None
        and getattr(x, "filename", None) is not None
    )


def _file_range(src: Any, offset: int, length: Optional[int]) -> Tuple[str, int, int]:
    """(path, start, length) of a path or memmap, range checked."""
    if _is_memmap(src):
        path, start, size = _memmap_range(src)
    else:
        path = os.fspath(src)
        start, size = 0, os.path.getsize(path)
    if offset < 0 or offset > size:
        raise Error(f"offset {offset} is outside the source's {size} bytes")
    if length is None:
        length = size - offset
    if length < 0 or offset + length > size:
        raise Error(f"range {offset}..{offset + length} is outside the source's {size} bytes")
    return path, start + offset, length


def _host_bytes(src: Any) -> memoryview:
    """A byte view of a host array (buffer protocol, or a CPU tensor)."""
    if _is_torch_tensor(src):
        if src.is_cuda:
            raise ValueError("the source is a CUDA tensor: copy it with torch instead")
        src = src.detach().numpy()
    mv = memoryview(src)
    if not mv.c_contiguous:
        raise ValueError("the source is not C-contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


# ----------------------------------------------------------------- read_into


def read_into(
    dst: Any,
    src: Union[str, "os.PathLike[str]", Any],
    offset: int = 0,
    length: Optional[int] = None,
    *,
    budget: int = DEFAULT_BUDGET,
    strategy: str = "auto",
    sync: bool = False,
) -> Report:
    """Reads ``length`` bytes from ``offset`` of ``src`` into the CUDA tensor
    ``dst`` (contiguous; exactly that many bytes).

    ``src`` is a path, an ``np.memmap`` (its file range is streamed from the
    file), or a host array (a numpy array, a CPU tensor, any buffer: copied
    through the CPU; ``offset``/``length`` then select bytes of it).

    The copies are ordered on the consumer's stream: after the work enqueued
    on it so far, and before the work enqueued on it after this returns. The
    stream is ``torch.cuda.current_stream()`` for a torch tensor, the
    ``stream`` of ``__cuda_array_interface__`` (v3) otherwise, else the legacy
    default stream. The host does not wait for the copies unless ``sync``;
    the returned :class:`Report` waits when its timings are read.

    ``budget`` (bytes the library may pin) and ``strategy`` (``"auto"``,
    ``"whole-file"``, ``"windows"``, ``"ring"``, ``"hybrid"``, ``"direct"``)
    pick a streamer, kept per (device, budget, strategy) so repeated calls
    reuse its pinned memory. The file must not be written or truncated while
    it is read. Ctrl-C raises ``KeyboardInterrupt``; a transfer already
    started still runs to its end in the background, its destination kept
    alive until then.
    """
    _ensure_runtime()
    ptr, nbytes, device, stream = _destination(dst)
    if isinstance(src, (str, os.PathLike)) or _is_memmap(src):
        path, start, length = _file_range(src, offset, length)
        return _native.read_file(
            path, start, length, ptr, nbytes, device, stream, budget, strategy, dst, sync
        )
    mv = _host_bytes(src)
    if offset < 0 or offset > len(mv):
        raise Error(f"offset {offset} is outside the source's {len(mv)} bytes")
    end = len(mv) if length is None else offset + length
    if length is not None and (length < 0 or end > len(mv)):
        raise Error(f"range {offset}..{end} is outside the source's {len(mv)} bytes")
    return _native.read_host(mv[offset:end], ptr, nbytes, device, stream)


# ----------------------------------------------------------------- batches


def _dtype_info(dtype: Any) -> Tuple[Any, int, str]:
    """(torch dtype or None, item size, typestr) of ``dtype``."""
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        size = torch.empty((), dtype=dtype).element_size()
        return dtype, size, "|u%d" % size
    np = sys.modules.get("numpy")
    if np is None:
        try:
            import numpy as np  # noqa: F811
        except ImportError:
            np = None
    if np is not None:
        d = np.dtype(dtype)
        tdt = None
        if torch is not None:
            tdt = torch.from_numpy(np.empty(0, dtype=d)).dtype
        return tdt, d.itemsize, d.str
    if isinstance(dtype, str) and len(dtype) >= 3 and dtype[0] in "<>|=":
        return None, _itemsize(dtype), dtype
    raise TypeError(f"cannot tell the size of dtype {dtype!r} without numpy or torch")


def batches(
    src: Union[str, "os.PathLike[str]", Any],
    batch: Union[int, Tuple[Any, Tuple[int, ...]]],
    *,
    device: int = 0,
    depth: int = 2,
    budget: int = DEFAULT_BUDGET,
    offset: int = 0,
    length: Optional[int] = None,
    strategy: str = "auto",
) -> Iterator[Any]:
    """Yields the file range of ``src`` (a path or ``np.memmap``) as CUDA
    tensors of ``batch`` bytes (``uint8``), or of ``(dtype, shape)`` (the last
    batch keeps ``shape[1:]`` and has fewer rows), while the next ``depth``
    batches already stream.

    Each batch is a fresh tensor (``torch.empty`` on ``cuda:device`` when
    torch is imported, else a ``wirespeed._DeviceArray`` with
    ``__cuda_array_interface__``) that the caller owns. Before a batch is
    yielded, the current stream (torch's, or the legacy default stream) is
    made to wait for its copies: work enqueued on it afterwards sees the
    data, without a host wait. The last batch may be shorter.
    """
    _ensure_runtime()
    if depth < 0:
        raise ValueError("depth must be >= 0")
    path, start, total = _file_range(src, offset, length)
    if isinstance(batch, int):
        tdtype, itemsize, typestr, row_shape, rows = None, 1, "|u1", (), batch
        row_bytes = 1
    else:
        dtype, shape = batch
        shape = tuple(int(n) for n in shape)
        if not shape:
            raise ValueError("the batch shape is empty")
        tdtype, itemsize, typestr = _dtype_info(dtype)
        row_shape, rows = shape[1:], shape[0]
        row_bytes = itemsize * math.prod(row_shape)
        if total % row_bytes:
            raise ValueError(f"the range's {total} bytes are not a whole number of {row_bytes}-byte rows")
    batch_bytes = rows * row_bytes
    if batch_bytes <= 0:
        raise ValueError("a batch must hold at least one byte")
    torch = _torch()

    def alloc(nbytes: int) -> Tuple[Any, Optional[int]]:
        n_rows = nbytes // row_bytes
        if torch is not None:
            dev = torch.device("cuda", device)
            if tdtype is None and typestr == "|u1":
                t = torch.empty((n_rows,) + row_shape, dtype=torch.uint8, device=dev)
            elif tdtype is not None:
                t = torch.empty((n_rows,) + row_shape, dtype=tdtype, device=dev)
            else:
                raise TypeError(f"no torch dtype for {typestr!r}")
            return t, int(torch.cuda.current_stream(dev).cuda_stream)
        return _DeviceArray(nbytes, device, typestr, [n_rows] + list(row_shape)), None

    pending: collections.deque = collections.deque()
    next_off = 0

    def start_next() -> None:
        nonlocal next_off
        n = min(batch_bytes, total - next_off)
        out, stream = alloc(n)
        ptr, nbytes, _, _ = _destination(out)
        report = _native.read_file(
            path, start + next_off, n, ptr, nbytes, device, stream, budget, strategy, out, False, False
        )
        pending.append((out, stream, report))
        next_off += n

    try:
        while next_off < total or pending:
            while next_off < total and len(pending) < depth + 1:
                start_next()
            out, stream, report = pending.popleft()
            report._then_on(stream)
            yield out
    finally:
        # Let go of the batches whose copies have ended; those still in
        # flight (an abandoned iterator's) are kept until they end.
        pending.clear()
        _native._reap()


# ----------------------------------------------------------------- pinned


class pinned:
    """``with wirespeed.pinned(array):`` registers the memory of a host array
    in place (``cudaHostRegister``, portable to every device), so that copies
    from it (``t[i].cuda(non_blocking=True)``) run from pinned memory at the
    line rate, with no staging copy; unregistered when the block ends.

    ``array`` is a numpy array (an ``np.memmap`` too), a CPU tensor, or any
    C-contiguous object with the buffer protocol (``bytearray``,
    ``array.array``). ``read_only`` (default: whether the buffer is read-only)
    registers memory the device only reads, as read-only mappings need.

    The registration keeps the object alive, but you must not free or move
    its memory inside the block (``resize_()`` a tensor, close a memmap), nor
    register overlapping memory twice. Leaving the block waits for all work
    on the devices (copies issued by torch from the memory are not tracked
    here) before unregistering.
    """

    def __init__(self, array: Any, read_only: Optional[bool] = None) -> None:
        self.array = array
        self._read_only = read_only
        self._reg: Optional[_Registration] = None

    def __enter__(self) -> Any:
        _ensure_runtime()
        mv = _host_bytes(self.array)
        ro = mv.readonly if self._read_only is None else bool(self._read_only)
        self._reg = _Registration(mv, ro)
        return self.array

    def __exit__(self, *exc: Any) -> None:
        reg, self._reg = self._reg, None
        if reg is not None:
            reg.close()

    @property
    def registered(self) -> bool:
        """True inside the block."""
        return self._reg is not None and self._reg.registered
