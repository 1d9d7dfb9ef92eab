"""Files, memmaps and host arrays into CUDA tensors at the line rate.

Built on the wire-speed crates: a file range is streamed to the GPU from
memory pinned in place (sliding registered windows, a reused pinned ring, or
both), never through a fresh ``pin_memory()`` copy per batch.

* :func:`read_into` - a file range (or an ``np.memmap``, or a host array) into
  a CUDA tensor you own, ordered on your current stream.
* :func:`read_into_many` - many pieces of one file into CUDA tensors, queued
  together so that they stream as one pass, then ordered on your streams.
* :func:`prepare` - pays a first :func:`read_into`'s setup (its pinned ring,
  registration context or registration) ahead of it.
* :func:`batches` - an iterator of CUDA tensors over a file, streamed in
  long transfers of many batches (spans), the next ones streaming while you
  compute.
* :class:`Loader` - shuffled batches of ``np.memmap`` arrays (or ``.npy`` files)
  as CUDA tensors, gathered on the GPU, with ``set_epoch``, ``state_dict``
  and the ranks of ``torch.distributed``.
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
import mmap
import os
import site
import sys
from typing import Any, List, Optional, Tuple, Union

from . import _native
from ._native import Error, Report, _DeviceArray, _Registration

__all__ = [
    "Error",
    "Report",
    "read_into",
    "read_into_many",
    "prepare",
    "batches",
    "Batches",
    "Loader",
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
    streamers and host rings keep between calls (ending the rings' threads)
    and closes the cached file mappings."""
    _native.release()


def pinned_bytes() -> int:
    """Host bytes wirespeed holds pinned (page-locked) right now: what its
    cached streamers pin (their rings, the windows of transfers in flight,
    the file registrations they keep between calls), the pinned rings of
    :func:`read_into` from host arrays (and a host array registered in place
    for its copy), and the :class:`pinned` blocks open. 0 after
    :func:`release` once no ``pinned`` block is open."""
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
    if cai is None and hasattr(dst, "__dlpack__"):
        # DLPack: through torch, which shares the memory (and orders the
        # producer's work before its current stream), then as a tensor.
        torch = _torch()
        if torch is None:
            raise TypeError(
                f"{type(dst).__name__} is a DLPack array: reading into it goes through torch "
                "(torch.from_dlpack), which is not installed; give a CUDA tensor or an object "
                "with __cuda_array_interface__"
            )
        return _destination(torch.from_dlpack(dst))
    if cai is None:
        raise TypeError(
            f"{type(dst).__name__} is not a CUDA array: give a CUDA tensor, an object "
            "with __cuda_array_interface__, or a DLPack array (with torch installed)"
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
    read_ahead: bool = True,
) -> Report:
    """Reads ``length`` bytes from ``offset`` of ``src`` into the CUDA tensor
    ``dst`` (contiguous; exactly that many bytes): a torch tensor, an object
    with ``__cuda_array_interface__``, or a DLPack array (``__dlpack__``,
    taken through ``torch.from_dlpack``, so with torch installed).

    ``src`` is a path, an ``np.memmap`` (its file range is streamed from the
    file), or a host array (a numpy array, a CPU tensor, any buffer;
    ``offset``/``length`` then select bytes of it). A host array is copied
    through a pinned ring kept per device, several threads filling its slots
    (``strategy`` ``"auto"`` or ``"ring"``): the call returns once the array
    has been read, so you may reuse it at once; or, with
    ``strategy="whole-file"``, registered in place (``cudaHostRegister``,
    within ``budget``), copied without a CPU copy and unregistered once
    copied, the call returning then.

    The copies are ordered on the consumer's stream: after the work enqueued
    on it so far, and before the work enqueued on it after this returns. The
    stream is ``torch.cuda.current_stream()`` for a torch tensor, the
    ``stream`` of ``__cuda_array_interface__`` (v3) otherwise, else the legacy
    default stream. The host does not wait for the copies unless ``sync``;
    the returned :class:`Report` waits when its timings are read.

    ``budget`` (bytes the library may pin) and ``strategy`` (``"auto"``,
    ``"whole-file"``, ``"windows"``, ``"ring"``, ``"hybrid"``, ``"direct"``;
    for a host array ``"auto"``, ``"ring"`` or ``"whole-file"``) pick a
    streamer, kept per (device, budget, strategy) so repeated calls reuse its
    pinned memory (for a host array: the ring, kept per device). The file must not be written or truncated while
    it is read. Ctrl-C raises ``KeyboardInterrupt``; a transfer already
    started still runs to its end in the background, its destination kept
    alive until then.

    A loop of ``read_into`` calls over sequential pieces of a file (each
    starting where the one before ended) streams them as one pass: once a
    piece's bytes are all claimed, the streamer fills some of the ring's slots
    with the bytes that follow and holds them for a few milliseconds, and the
    next call takes them. Those bytes are read before you ask for them, so
    pass ``read_ahead=False`` for a file written between the calls. For many
    pieces known at once, :func:`read_into_many` queues them together.
    """
    _ensure_runtime()
    ptr, nbytes, device, stream = _destination(dst)
    if isinstance(src, (str, os.PathLike)) or _is_memmap(src):
        path, start, length = _file_range(src, offset, length)
        return _native.read_file(
            path, start, length, ptr, nbytes, device, stream, budget, strategy, dst, sync,
            ahead=read_ahead,
        )
    mv = _host_bytes(src)
    if offset < 0 or offset > len(mv):
        raise Error(f"offset {offset} is outside the source's {len(mv)} bytes")
    end = len(mv) if length is None else offset + length
    if length is not None and (length < 0 or end > len(mv)):
        raise Error(f"range {offset}..{end} is outside the source's {len(mv)} bytes")
    return _native.read_host(mv[offset:end], ptr, nbytes, device, stream, budget, strategy, dst, sync)


def prepare(
    src: Union[str, "os.PathLike[str]", Any, None] = None,
    offset: int = 0,
    length: Optional[int] = None,
    *,
    device: int = 0,
    budget: int = DEFAULT_BUDGET,
    strategy: str = "auto",
    threads: Optional[int] = None,
) -> None:
    """Makes ready now what a first :func:`read_into` from ``src`` with the
    same ``device``, ``budget`` and ``strategy`` would make, so that the
    first call runs as later ones do.

    For a path or an ``np.memmap`` (a file range of ``length`` bytes from
    ``offset``, by default the rest of the file): the kept streamer, the
    file's mapping, the streamer's pinned ring and registration context for
    that length, and, where the range is read from the whole file registered
    (it fits ``budget``), that registration. For a host array, or ``None``:
    the device's pinned ring for host sources and its threads (for
    ``strategy="whole-file"`` there is nothing to make: each call registers
    its source). ``threads`` sets how many threads fill that ring, for every
    later host source (default: one per core, up to 12; the calling thread
    fills pieces too); a path or memmap takes no ``threads`` (the streamer
    plans its own). :func:`release` frees what this made.

    >>> import wirespeed
    >>> wirespeed.prepare()  # the pinned ring a CPU tensor is copied through
    >>> wirespeed.pinned_bytes() > 0
    True
    >>> wirespeed.release()
    """
    _ensure_runtime()
    if isinstance(src, (str, os.PathLike)) or _is_memmap(src):
        if threads is not None:
            raise ValueError("threads is for host sources: a file's streamer plans its own threads")
        path, start, total = _file_range(src, offset, length)
        _prepare_file(path, start, total, total, device, budget, strategy)
    else:
        if src is not None:
            _host_bytes(src)  # a host array, or TypeError / ValueError as read_into gives
        _native._prepare_host(device, budget, strategy, threads)


def _prepare_file(path: str, start: int, span: int, total: int, device: int, budget: int, strategy: str) -> None:
    """Makes the kept streamer of (``device``, ``budget``, ``strategy``)
    ready for transfers of ``span`` bytes of ``path`` (its ring and
    registration context); where those run from the whole file registered,
    registers it by a read of one page at ``start`` (of a range of ``total``
    bytes)."""
    if span <= 0:
        return
    whole = _native._prepare(path, span, device, budget, strategy)
    if whole:
        n = min(mmap.PAGESIZE, total)
        page = _DeviceArray(n, device)
        _native.read_file(path, start, n, page.ptr, n, device, None, budget, strategy, page, True, False)
        # Freed now, not while transfers stream (freeing device memory waits
        # for the device, as cudaFree does).
        del page
        _native._reap()


# ----------------------------------------------------------------- batches

DEFAULT_SPAN = 1 << 30
"""The bytes :func:`batches` streams with one transfer, by default (rounded to
whole batches)."""


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


def _plan_spans(total: int, batch_bytes: int, span: int) -> List[Tuple[int, int, int]]:
    """The range's batches grouped into spans of whole batches, each near
    ``span`` bytes (0.75 to 1.5 times it once there are several; one span when
    the range holds less than 1.5 spans): ``(offset in the range, bytes,
    batches)`` each. Spans that get one batch more than the others come
    last, with the partial batch, so that no span is much smaller."""
    n_batches = -(-total // batch_bytes)
    if n_batches == 0:
        return []
    per = max(1, -(-span // batch_bytes))
    n_spans = max(1, min(n_batches, int(n_batches / per + 0.5)))
    q, r = divmod(n_batches, n_spans)
    out, first = [], 0
    for i in range(n_spans):
        k = q + (1 if i >= n_spans - r else 0)
        off = first * batch_bytes
        end = min(total, (first + k) * batch_bytes)
        out.append((off, end - off, k))
        first += k
    return out


class Batches:
    """The iterator :func:`batches` returns: yields the batches, and keeps
    the next spans streaming. ``close()`` (or leaving a ``with`` block, or
    dropping it) stops it: transfers already started run to their end in the
    background, their memory kept until then (:func:`release` waits for them
    and frees what the streamers pinned)."""

    def __init__(
        self,
        src: Any,
        batch: Union[int, Tuple[Any, Tuple[int, ...]]],
        *,
        device: int,
        depth: int,
        budget: int,
        offset: int,
        length: Optional[int],
        strategy: str,
        span: Optional[int],
    ) -> None:
        self._closed = True  # until set up (__del__ of a half-made one)
        _ensure_runtime()
        if depth < 0:
            raise ValueError("depth must be >= 0")
        if span is not None and span <= 0:
            raise ValueError("span must be > 0")
        path, start, total = _file_range(src, offset, length)
        if isinstance(batch, int):
            tdtype, typestr, row_shape, rows, row_bytes = None, "|u1", (), batch, 1
        else:
            dtype, shape = batch
            shape = tuple(int(n) for n in shape)
            if not shape:
                raise ValueError("the batch shape is empty")
            tdtype, itemsize, typestr = _dtype_info(dtype)
            row_shape, rows = shape[1:], shape[0]
            row_bytes = itemsize * math.prod(row_shape)
            if row_bytes <= 0 or total % row_bytes:
                raise ValueError(f"the range's {total} bytes are not a whole number of {row_bytes}-byte rows")
        batch_bytes = rows * row_bytes
        if batch_bytes <= 0:
            raise ValueError("a batch must hold at least one byte")
        torch = _torch()
        if torch is not None and tdtype is None:
            if typestr != "|u1":
                raise TypeError(f"no torch dtype for {typestr!r}")
            tdtype = torch.uint8
        self._torch = torch
        self._path, self._start, self._total = path, start, total
        self._device, self._strategy = device, strategy
        self._tdtype, self._typestr, self._row_shape, self._row_bytes = tdtype, typestr, row_shape, row_bytes
        self._batch_bytes = batch_bytes
        self._spans = _plan_spans(total, batch_bytes, DEFAULT_SPAN if span is None else span)
        # With `auto`, a range larger than the budget is streamed as it would
        # be in one piece (the hybrid of registered windows and the pinned
        # ring, or O_DIRECT reads when cold) only if no span fits the budget:
        # one that fits would be registered whole before its first copy, and
        # given back for the next. So the pins are kept below the smallest span.
        self._budget = budget
        page = mmap.PAGESIZE
        if strategy == "auto" and self._spans and -(-total // page) * page + page > budget:
            self._budget = max(1, min(budget, min(n for _, n, _ in self._spans) - 1))
        self._prepare()
        fewest = min((k for _, _, k in self._spans), default=1)
        self._ahead = 0 if depth == 0 else -(-depth // fewest)
        self._reserved: collections.deque = collections.deque()
        self._reserve()
        self._pending: collections.deque = collections.deque()
        self._reports: List[Report] = []
        self._submitted = 0
        self._index = -1  # the span whose batches are being yielded
        self._slab: Any = None
        self._k = 0
        self._closed = not self._spans

    # ------------------------------------------------------------- public

    @property
    def reports(self) -> List[Report]:
        """The :class:`Report` of each span started so far (one transfer each)."""
        return list(self._reports)

    @property
    def spans(self) -> List[Tuple[int, int]]:
        """(file offset, bytes) of each span: the parts of the range streamed
        by one transfer each, whole batches."""
        return [(self._start + off, n) for off, n, _ in self._spans]

    def close(self) -> None:
        """Stops: yields nothing more, and lets go of the spans not yielded
        (those still streaming are kept, by the package, until they end)."""
        self._closed = True
        self._slab = None
        self._pending.clear()
        self._reserved.clear()
        try:
            _native._reap()
        except Exception:  # the interpreter is shutting down
            pass

    def __iter__(self) -> "Batches":
        return self

    def __enter__(self) -> "Batches":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            if self._slab is None or self._k >= self._spans[self._index][2]:
                self._next_span()
            out = self._batch(self._k)
        except StopIteration:
            raise
        except BaseException:
            self.close()  # an error, or KeyboardInterrupt: nothing more
            raise
        self._k += 1
        return out

    # ------------------------------------------------------------- inside

    def _prepare(self) -> None:
        """Makes ready now what the first pass would make: the streamer, its
        pinned ring and registration context for the spans' plan, and, where
        the spans run from the whole file registered (it fits the budget),
        that registration, by a read of one page. So the first pass runs as
        later ones do."""
        if not self._spans:
            return
        span = max(n for _, n, _ in self._spans)
        _prepare_file(self._path, self._start, span, self._total, self._device, self._budget, self._strategy)

    def _reserve(self) -> None:
        """With torch, allocates now the device memory of the spans alive at
        once in a pass (the one whose batch the caller still holds, the one
        yielded, and those streaming ahead: ``ahead + 2``), each as large as
        the largest span, so that the first pass allocates no device memory:
        torch's caching allocator would otherwise ``cudaMalloc`` them during
        it (and hand them out again in later passes), which takes time there
        and may wait for the device. The first spans stream into these; the
        later ones get them back from the caching allocator once the caller
        has let go of an earlier span's batches. Without torch, each span's
        memory is the library's, allocated as the span starts and freed with
        its last batch, alike in every pass: nothing is reserved."""
        if not self._spans or self._torch is None:
            return
        largest = max(n for _, n, _ in self._spans)
        for _ in range(min(len(self._spans), self._ahead + 2)):
            self._reserved.append(self._alloc(largest))

    def _alloc(self, n: int) -> Tuple[Any, Optional[int]]:
        """``n`` bytes of fresh device memory, and the stream that a transfer
        into it must follow: with torch, its memory (``torch.empty``) and
        the current stream, on which the caching allocator may have handed
        out memory still in use by work enqueued so far; else a
        ``_DeviceArray`` and no stream."""
        torch = self._torch
        if torch is not None:
            dev = torch.device("cuda", self._device)
            slab = torch.empty(n, dtype=torch.uint8, device=dev)
            return slab, int(torch.cuda.current_stream(dev).cuda_stream)
        return _DeviceArray(n, self._device), None

    def _next_span(self) -> None:
        """Starts the spans up to ``ahead`` beyond the next one, then waits
        (interruptibly) for the next one to land, raising its error."""
        i = self._index + 1
        self._slab = None
        if i >= len(self._spans):
            self.close()
            raise StopIteration
        last = min(len(self._spans) - 1, i + self._ahead)
        while self._submitted <= last:
            self._submit(self._submitted)
        # The span has landed once this returns: none of its batches is
        # handed back while it is written. (Its memory is not held here
        # meanwhile: after an interrupt, only the package keeps it, until
        # the transfer has ended.)
        self._pending[0][2].wait()
        j, slab, _ = self._pending.popleft()
        self._index, self._slab, self._k = j, slab, 0

    def _submit(self, i: int) -> None:
        """Starts span ``i``'s transfer into memory reserved when the
        iterator was made (``_reserve``), or else fresh device memory."""
        off, n, _ = self._spans[i]
        slab, stream = self._reserved.popleft() if self._reserved else self._alloc(n)
        if self._torch is not None:
            slab = slab[:n]  # a reserved one is as large as the largest span
            ptr = slab.data_ptr()
        else:
            ptr = slab.ptr
        # Ordered after the work so far on the stream it was allocated on (which
        # may have used this memory before the caching allocator handed it out
        # again).
        # Nothing waits here for its copies to be enqueued (not synced, not
        # ordered: the span is handed out only once it has landed, see
        # `_next_span`), so the next spans are queued at once, and the
        # streamer's running pass takes them up as it goes, with no pause
        # between spans.
        report = _native.read_file(
            self._path, self._start + off, n, ptr, n, self._device, stream,
            self._budget, self._strategy, slab, False, False,
        )
        self._pending.append((i, slab, report))
        self._reports.append(report)
        self._submitted += 1

    def _batch(self, k: int) -> Any:
        """Batch ``k`` of the current span: a view of its memory."""
        n_span = self._spans[self._index][1]
        a = k * self._batch_bytes
        n = min(self._batch_bytes, n_span - a)
        rows = n // self._row_bytes
        if self._torch is not None:
            t = self._slab[a : a + n]
            if self._tdtype != self._torch.uint8:
                t = t.view(self._tdtype)
            return t.view((rows,) + self._row_shape)
        return self._slab._view(a, n, self._typestr, [rows] + list(self._row_shape))


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
    span: Optional[int] = None,
) -> Batches:
    """Yields the file range of ``src`` (a path or ``np.memmap``) as CUDA
    tensors of ``batch`` bytes (``uint8``), or of ``(dtype, shape)`` (the last
    batch keeps ``shape[1:]`` and has fewer rows), while the next batches
    already stream.

    The range is streamed in *spans* of whole batches, about ``span`` bytes
    each (default :data:`DEFAULT_SPAN`, 1 GiB), one transfer per span into
    fresh device memory (``torch.empty`` on ``cuda:device`` when torch is
    imported, else a ``wirespeed._DeviceArray``): one long transfer is planned
    as :func:`read_into` plans it (with ``auto``, pinning less than a span, so
    that a span is never registered whole before it is copied). Each batch is
    a view of its span's memory, which the caller owns: nothing writes it
    again, and it stays allocated while any batch of the span is alive
    (``.clone()`` a batch to keep it alone).

    ``depth`` is how many batches beyond the one yielded are streaming at
    least: the spans that hold them are started (at least the next span, when
    ``depth`` > 0) before the iterator waits for a span. Device memory in use:
    about ``2 + ceil(depth / batches per span)`` spans. ``depth=0`` streams
    one span at a time.

    Before the first batch of a span is yielded, the iterator waits (on the
    host, interruptibly, the next spans streaming meanwhile) until the span
    has landed: no batch is handed back while it is written, and a failed
    transfer raises :class:`Error` here, ending the iteration. Work you
    enqueue on any stream afterwards sees the data. Breaking out of the loop
    lets go of the spans not yielded; those still streaming end in the
    background (:func:`release` waits for them and frees the pinned memory).

    The iterator pays its setup when it is made, not in the first pass: the
    streamer (kept per device, budget and strategy, as :func:`read_into`
    keeps it), its pinned ring and registration context for the spans' plan,
    and, where the spans run from the whole file registered (it fits the
    budget), that registration; with torch, also the device memory of the
    spans alive at once (``2 + ceil(depth / batches per span)`` of them, each
    of the largest span's size, held from then on), which the first spans
    stream into and later ones get back from torch's caching allocator, so
    that the first pass allocates no device memory. A first pass then runs
    as later ones do.

    Returns a :class:`Batches` iterator (also a context manager), whose
    ``reports`` hold each span's :class:`Report`.
    """
    return Batches(
        src, batch, device=device, depth=depth, budget=budget, offset=offset,
        length=length, strategy=strategy, span=span,
    )


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


from .loader import DEFAULT_BLOCK, DEFAULT_LOADER_BUDGET, Loader  # noqa: E402
from .pieces import read_into_many  # noqa: E402
