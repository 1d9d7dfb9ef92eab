"""``wirespeed.Loader``: shuffled batches of memmaps straight to CUDA tensors."""

from __future__ import annotations

import math
import os
import sys
from collections import deque
from typing import Any, Deque, Dict, Iterator, Optional, Sequence, Tuple, Union

from . import _native
from ._native import Error

DEFAULT_LOADER_BUDGET = 4 << 30
"""The default pin budget of a :class:`Loader`: bytes it may keep pinned."""

DEFAULT_BLOCK = 256 << 20
"""Bytes of a block of the pool (:class:`Loader` with ``shuffle="pool"``)."""

_NPY_MAGIC = b"\x93NUMPY"


def _numpy():
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is how arrays are described
        raise Error("wirespeed.Loader needs numpy to describe its arrays") from None
    return np


class _Array:
    """One array of a loader: the file, its header, its records' dtype and shape."""

    def __init__(self, spec: Any) -> None:
        np = _numpy()
        self.count: Optional[int] = None
        if isinstance(spec, np.memmap):
            from . import _memmap_range

            if not spec.flags.c_contiguous or spec.ndim == 0:
                raise Error("the memmap is not a C-contiguous array of records")
            path, offset, _ = _memmap_range(spec)
            self.path, self.header = path, offset
            self.dtype, self.shape, self.count = spec.dtype, tuple(spec.shape[1:]), int(spec.shape[0])
        elif isinstance(spec, (str, os.PathLike)):
            self.path = os.fspath(spec)
            with open(self.path, "rb") as f:
                head = f.read(6)
            if head != _NPY_MAGIC:
                raise Error(f"{self.path} is not a .npy file: give (path, dtype, record_shape) for a raw file")
            mm = np.load(self.path, mmap_mode="r")
            if mm.ndim == 0 or not mm.flags.c_contiguous:
                raise Error(f"{self.path}: not a C-ordered array of records")
            self.header = int(mm.offset)
            self.dtype, self.shape, self.count = mm.dtype, tuple(mm.shape[1:]), int(mm.shape[0])
            del mm
        elif _is_raw_spec(spec):
            path, dtype, shape = spec
            self.path, self.header = os.fspath(path), 0
            self.dtype = np.dtype(dtype)
            self.shape = (int(shape),) if isinstance(shape, int) else tuple(int(n) for n in shape)
        else:
            raise Error(
                f"{type(spec).__name__} is not an array of records: give an np.memmap, a .npy path, "
                "or (path, dtype, record_shape)"
            )
        if self.dtype.hasobject or self.dtype.fields is not None:
            raise Error(f"{self.path}: dtype {self.dtype} is not a plain number type")
        self.record_bytes = int(self.dtype.itemsize * math.prod(self.shape))
        if self.record_bytes <= 0:
            raise Error(f"{self.path}: records of shape {self.shape} hold no bytes")
        if self.count is None:
            size = os.path.getsize(self.path) - self.header
            if size % self.record_bytes:
                raise Error(
                    f"{self.path}: {size} bytes are not a whole number of {self.record_bytes}-byte records "
                    f"of dtype {self.dtype} and shape {self.shape}"
                )

    def native(self) -> Tuple[str, int, int, Optional[int]]:
        return (self.path, self.header, self.record_bytes, self.count)


def _is_raw_spec(x: Any) -> bool:
    """``(path, dtype, record_shape)``: a raw file, not a tuple of arrays."""
    return (
        isinstance(x, tuple) and len(x) == 3 and isinstance(x[0], (str, os.PathLike))
        and (isinstance(x[2], int) or (isinstance(x[2], tuple) and all(isinstance(n, int) for n in x[2])))
    )


def _dist() -> Any:
    """``torch.distributed`` where torch is imported and it is initialized, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _ranks(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The rank and world size: as given, else ``torch.distributed``'s. A
    process that torchrun (or another launcher) started as one of several
    ranks, with no process group yet, is refused rather than taken for rank 0
    of 1 (every rank would read the whole dataset in the same order)."""
    dist = _dist()
    if dist is not None:
        drank, dworld = dist.get_rank(), dist.get_world_size()
    else:
        drank, dworld = 0, 1
        env_world = os.environ.get("WORLD_SIZE")
        if (rank is None or world_size is None) and env_world not in (None, "", "1", "0"):
            raise Error(
                f"WORLD_SIZE={env_world} and RANK={os.environ.get('RANK')} are set (a torchrun launch?) but "
                "torch.distributed is not initialized: call torch.distributed.init_process_group() before building "
                "the Loader, or pass rank= and world_size= (rank=0, world_size=1 to read the whole dataset in "
                "every process)"
            )
    rank = drank if rank is None else int(rank)
    world_size = dworld if world_size is None else int(world_size)
    if world_size <= 0 or not 0 <= rank < world_size:
        raise Error(f"rank {rank} of a world of {world_size}: the rank must be in 0..{world_size - 1}")
    return rank, world_size


def _agreed_device_budget(device: int, world_size: int) -> int:
    """Half of the device's free memory, the least over every rank (through
    ``torch.distributed``): the way and the pool's shape follow from it, so
    every rank must resolve them from the same number."""
    free, _ = _native._mem_info(device)
    mine = free // 2
    dist = _dist()
    if dist is None or dist.get_world_size() != world_size:
        raise Error(
            f"a world of {world_size} ranks without torch.distributed initialized: the default device budget (half "
            "of this GPU's free memory) would differ between ranks, and with it the order; pass device_budget= "
            "(the same on every rank), or shuffle='full', or shuffle='pool' with pool_slots="
        )
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    return int(min(every))


def _device_index(device: Any) -> int:
    """The CUDA device's index; ``None``, ``"cuda"`` and ``torch.device("cuda")``
    mean torch's current device (the runtime's where torch has no CUDA), as
    ``torch.empty(..., device="cuda")`` means."""
    torch = sys.modules.get("torch")

    def current() -> int:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
        return _native._current_device()

    if device is None:
        return current()
    if isinstance(device, bool):
        raise Error(f"device {device!r} is not a CUDA device")
    if isinstance(device, int):
        return device
    if torch is not None and isinstance(device, torch.device):
        if device.type != "cuda":
            raise Error(f"device {device} is not a CUDA device")
        return device.index if device.index is not None else current()
    if isinstance(device, str):
        if device == "cuda":
            return current()
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
        raise Error(f"device {device!r} is not a CUDA device")
    raise Error(f"device {device!r} is not a CUDA device")


class Loader:
    """Shuffled batches of one or more arrays of records (``np.memmap`` arrays,
    ``.npy`` paths, or ``(path, dtype, record_shape)`` for raw files), as CUDA
    tensors of shape ``(batch, *record_shape)``, gathered on the GPU.

    It is shaped like ``torch.utils.data.DataLoader`` with a
    ``DistributedSampler``: ``len()`` batches per epoch; each pass over it
    (``for batch in loader``) goes on with the current epoch, and a pass that
    finds the epoch finished starts the next one (epoch 0, 1, ..., each in an
    order of its own), unless :meth:`set_epoch` named one; :meth:`state_dict` and
    :meth:`load_state_dict` resume mid-epoch with exactly the remaining
    batches. ``rank`` and ``world_size`` default to ``torch.distributed``'s when
    it is initialized (and a process that torchrun started, before
    ``init_process_group``, is refused rather than taken for rank 0 of 1).

    Each epoch's records, shuffled, are padded (the first ones repeated) to a
    multiple of the world size, or cut (``drop_last``); each rank takes a
    contiguous part of that order (``DistributedSampler`` strides it instead:
    the shares differ, and are as disjoint). So every record is handed out
    once per epoch over all ranks, apart from that padding, or, with
    ``drop_last``, the few records cut (other ones each epoch) and a short
    last batch.

    The order depends only on the arguments. Where the defaults would make it
    follow the GPU's free memory (``shuffle=True`` chooses between a full
    shuffle and the pool's order, and the pool's shape, from
    ``device_budget``, by default half the free memory), the ranks agree on
    the least budget of any of them through ``torch.distributed``.

    ``shuffle``: ``True`` (the default: a full shuffle when the arrays fit
    device memory or the pin budget, else the pool's quasi-random order),
    ``False`` (file order), ``"full"`` (a full shuffle whatever it costs:
    device memory, the arrays registered in place, or CPU threads gathering
    through pinned memory) or ``"pool"`` (blocks of the files streamed in a
    random order through a pool in device memory, each batch drawn from the
    blocks resident: for files larger than device memory). ``pool_slots``:
    blocks in each half of the pool, so each batch draws from about that many
    blocks (default: as many as ``device_budget`` holds).

    ``device``: an index, ``"cuda:N"``, a ``torch.device``; ``None`` or
    ``"cuda"`` is torch's current device.

    Each batch is a fresh tensor from torch's allocator, allocated on the
    loader's stream and gathered there ``prefetch`` batches ahead of the one
    you take (default 2), without ever waiting for the work you queued: when
    a batch is yielded, your current stream is made to wait for its gather on
    the device (no host synchronization), and the tensor is marked as used by
    your stream (``record_stream``), so it stays valid for as long as you keep
    it. The host waits only where the loader itself is behind (the pool's
    next blocks still streaming, the ring's threads still gathering). With
    several arrays each batch is a tuple, in the arrays' order, of the same
    records. The work runs in Rust with the GIL released: a step costs one
    call, whatever the batch size. Every call leaves the current CUDA device
    as it found it.

    >>> loader = wirespeed.Loader((features, labels), batch_size=4096, seed=0)  # doctest: +SKIP
    >>> for epoch in range(10):                                                # doctest: +SKIP
    ...     for x, y in loader:
    ...         loss = step(x, y)
    """

    def __init__(
        self,
        arrays: Union[Any, Sequence[Any]],
        batch_size: int,
        shuffle: Union[bool, str] = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Any = None,
        budget: int = DEFAULT_LOADER_BUDGET,
        device_budget: Optional[int] = None,
        block_bytes: int = DEFAULT_BLOCK,
        pool_slots: Optional[int] = None,
        prefetch: int = 2,
    ) -> None:
        from . import _ensure_runtime

        self._native = None
        # Batches submitted to the loader's thread and not handed out yet:
        # (tensors, event), oldest first; _pos is the next to hand out.
        self._ahead: Deque[Any] = deque()
        self._pos = (0, 0)
        _ensure_runtime()
        single = not isinstance(arrays, (list, tuple)) or _is_raw_spec(arrays)
        specs = [arrays] if single else list(arrays)
        if not specs:
            raise Error("no arrays")
        self._arrays = [_Array(s) for s in specs]
        self._single = single
        if int(batch_size) <= 0:
            raise Error(f"batch_size must be 1 or more, not {batch_size}")
        if shuffle is True:
            do_shuffle, way = True, "auto"
        elif shuffle is False:
            do_shuffle, way = False, "auto"
        elif shuffle in ("full", "pool"):
            do_shuffle, way = True, shuffle
        else:
            raise Error(f"shuffle must be True, False, 'full' or 'pool', not {shuffle!r}")
        if int(prefetch) < 0:
            raise Error(f"prefetch must be 0 or more batches, not {prefetch}")
        if pool_slots is not None and int(pool_slots) <= 0:
            raise Error(f"pool_slots must be 1 or more blocks, not {pool_slots}")
        rank, world_size = _ranks(rank, world_size)
        self._device = _device_index(device)
        if world_size > 1 and device_budget is None and (way == "auto" or (way == "pool" and pool_slots is None)):
            device_budget = _agreed_device_budget(self._device, world_size)
        self._seed, self._batch_size, self._rank, self._world = int(seed), int(batch_size), rank, world_size
        self._depth = int(prefetch)
        native = self._native = _native._Loader(
            [a.native() for a in self._arrays], self._batch_size, do_shuffle, way, self._seed, bool(drop_last),
            rank, world_size, self._device, int(budget), device_budget, int(block_bytes),
            None if pool_slots is None else int(pool_slots), self._depth,
        )
        # Asked once: the native loader's lock is held by its thread while it
        # gathers, and next() must not wait for that to learn a batch's size.
        self._len = len(native)
        self._last_len = native.batch_len(self._len - 1) if self._len else 0
        torch = sys.modules.get("torch")
        self._torch = torch if torch is not None and torch.cuda.is_available() else None
        self._tdtypes = [self._torch_dtype(a.dtype) for a in self._arrays] if self._torch is not None else None
        if self._torch is not None:
            self._tdevice = self._torch.device("cuda", self._device)
            self._stream = self._torch.cuda.ExternalStream(self._native.stream(), device=self._tdevice)
            self._stream_ctx = self._torch.cuda.stream
            self._current = self._torch.cuda.current_stream
            self._empty = self._torch.empty

    def _torch_dtype(self, dtype: Any) -> Any:
        np = _numpy()
        return self._torch.from_numpy(np.empty(0, dtype=dtype)).dtype

    # ------------------------------------------------------------- public

    @property
    def way(self) -> str:
        """Where batches are gathered from: ``"resident"`` (device memory),
        ``"registered"`` (host memory pinned in place), ``"pool"`` or ``"ring"``."""
        return self._live().way()

    @property
    def blocks_per_batch(self) -> Optional[int]:
        """With the pool: the blocks each half of the pool holds, which each
        batch draws its records from (``pool_slots``); ``None`` for a full
        shuffle."""
        shape = self._live().pool_shape()
        return None if shape is None else shape[1]

    def __len__(self) -> int:
        self._live()
        return self._len

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass epoch ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        native = self._live()
        self._drain()
        native.load_state(int(epoch), 0)
        self._pos = (int(epoch), 0)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is, and everything its order depends on: give it
        to :meth:`load_state_dict` to go on from here. Any rank's state
        resumes every rank (they are at the same batch)."""
        _, _, records, batch_size, shuffle, seed, drop_last, world, pool = self._live().checkpoint()
        epoch, batch = self._pos
        return {"epoch": epoch, "batch": batch, "seed": seed, "batch_size": batch_size, "rank": self._rank,
                "world_size": world, "records": records, "shuffle": shuffle, "drop_last": drop_last,
                "order": "full" if pool is None else "pool",
                "block_records": None if pool is None else pool[0],
                "pool_slots": None if pool is None else pool[1]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes where :meth:`state_dict` was taken: the next pass hands out
        exactly the batches the interrupted one had not. A state saved under
        another order (another seed, batch size, world size, ``drop_last``,
        ``shuffle``, or the pool's order or shape against a full shuffle) is
        refused, and the error names what differs."""
        native = self._live()
        pool_known = "order" in state
        pool = None
        if state.get("order") == "pool":
            pool = (int(state["block_records"]), int(state["pool_slots"]))

        def opt(key: str, kind: Any) -> Any:
            return kind(state[key]) if state.get(key) is not None else None

        self._drain()
        try:
            native.resume(int(state["epoch"]), int(state["batch"]), records=opt("records", int),
                          batch_size=opt("batch_size", int), shuffle=opt("shuffle", bool), seed=opt("seed", int),
                          drop_last=opt("drop_last", bool), world=opt("world_size", int), pool=pool,
                          pool_known=pool_known)
        except Error:
            # Refused: the batches gathered ahead were dropped, so go back to
            # the next batch to hand out, and on from there as if never asked.
            native.load_state(*self._pos)
            raise
        self._pos = (int(state["epoch"]), int(state["batch"]))

    def batch_indices(self, batch: int) -> list:
        """The records (indices into the arrays) of batch ``batch`` of the current epoch."""
        return self._live().batch_records(int(batch))

    def close(self) -> None:
        """Waits for the work in flight and frees what the loader holds
        (device memory, pins). Using it afterwards raises :class:`Error`."""
        if self._native is not None:
            self._drain()
            n, self._native = self._native, None
            n.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # the interpreter is shutting down
            pass

    def __iter__(self) -> Iterator[Any]:
        native = self._live()
        epoch, batch = self._pos
        if batch >= self._len > 0:
            self.set_epoch(epoch + 1)  # the last pass ended: the next epoch
        while True:
            out = self._next(native)
            if out is None:
                return
            yield out

    # ------------------------------------------------------------- inside

    def _live(self) -> Any:
        if self._native is None:
            raise Error("the loader is closed")
        return self._native

    def _drain(self) -> None:
        """Collects every gather submitted (their errors dropped: the batches
        are not handed out), so that their memory may go: torch's tensors at
        once (the allocator orders their next use on the loader's stream after
        the gather), the package's own arrays once their gathers ran (freeing
        device memory that queued work still writes is an error)."""
        native = self._native
        while self._ahead:
            _, mark = self._ahead[0]
            try:
                if native.collect() is not None and self._torch is None:
                    native.wait(mark)
            except Error:
                pass
            self._ahead.popleft()

    def _next(self, native: Any) -> Any:
        epoch, b = self._pos
        ahead, count = self._ahead, self._len
        # Keep `prefetch` batches submitted beyond the one handed out now.
        while len(ahead) <= self._depth and b + len(ahead) < count:
            n = self._batch_size if b + len(ahead) < count - 1 else self._last_len
            outs, ptrs = self._alloc(n)
            ahead.append((outs, native.submit(ptrs, n)))
        if not ahead:
            return None
        outs, mark = ahead[0]
        try:
            native.collect()
        except Error:
            # The batch failed (nothing writes its memory now): the next call
            # hands it out again, from a fresh start of the epoch's order.
            ahead.popleft()
            self._drain()
            native.load_state(epoch, b)
            raise
        ahead.popleft()
        self._pos = (epoch, b + 1)
        if self._torch is not None:
            consumer = self._current(self._tdevice)
            native.ready(mark, consumer.cuda_stream)
            for t in outs:
                t.record_stream(consumer)
        else:
            native.wait(mark)  # the package's own arrays: no stream orders their users
        return outs[0] if self._single else tuple(outs)

    def _alloc(self, n: int) -> Tuple[list, list]:
        """A batch's tensors (allocated on the loader's stream), or without
        torch the package's device arrays; and their addresses."""
        if self._torch is not None:
            with self._stream_ctx(self._stream):
                outs = [self._empty((n,) + a.shape, dtype=dt, device=self._tdevice)
                        for a, dt in zip(self._arrays, self._tdtypes)]
            return outs, [t.data_ptr() for t in outs]
        outs = [_native._DeviceArray(n * a.record_bytes, self._device, a.dtype.str, [n] + list(a.shape))
                for a in self._arrays]
        return outs, [arr.ptr for arr in outs]
