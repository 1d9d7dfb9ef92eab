"""``wirespeed.Loader``: shuffled batches of memmaps straight to CUDA tensors."""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

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


def _distributed() -> Tuple[int, int]:
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device_index(device: Any) -> int:
    torch = sys.modules.get("torch")
    if device is None:
        return torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
    if isinstance(device, int):
        return device
    if torch is not None and isinstance(device, torch.device):
        if device.type != "cuda":
            raise Error(f"device {device} is not a CUDA device")
        return device.index if device.index is not None else torch.cuda.current_device()
    if isinstance(device, str):
        if not device.startswith("cuda"):
            raise Error(f"device {device!r} is not a CUDA device")
        return int(device.split(":")[1]) if ":" in device else 0
    raise Error(f"device {device!r} is not a CUDA device")


def _raw_stream_getter(torch: Any) -> Any:
    """A function from a device index to the handle of torch's current stream
    on it: torch's own raw lookup where it has one (one C call), else the
    public ``torch.cuda.current_stream``."""
    if torch is None:
        return lambda index: None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda index: int(raw(index))
    return lambda index: int(torch.cuda.current_stream(index).cuda_stream)


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
    batches. Every record is handed out once per epoch over all ranks.
    ``rank`` and ``world_size`` default to ``torch.distributed``'s when it is
    initialized, so the ranks' batches are disjoint and cover the epoch.

    ``shuffle``: ``True`` (the default: a full shuffle when the arrays fit
    device memory or the pin budget, else the pool's quasi-random order),
    ``False`` (file order), ``"full"`` (a full shuffle whatever it costs:
    device memory, the arrays registered in place, or CPU threads gathering
    through pinned memory) or ``"pool"`` (blocks of the files streamed in a
    random order through a pool in device memory, each batch drawn from the
    blocks resident: for files larger than device memory).

    Each batch is a fresh tensor from torch's allocator, gathered on the
    loader's stream and ready on your current stream when it is yielded (no
    host synchronization); it stays valid for as long as you keep it. With
    several arrays each batch is a tuple, in the arrays' order, of the same
    records. The work runs in Rust with the GIL released: a step costs one
    call, whatever the batch size.

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
    ) -> None:
        from . import _ensure_runtime

        self._native = None
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
        drank, dworld = _distributed()
        rank = drank if rank is None else int(rank)
        world_size = dworld if world_size is None else int(world_size)
        if world_size <= 0 or not 0 <= rank < world_size:
            raise Error(f"rank {rank} of a world of {world_size}: the rank must be in 0..{world_size - 1}")
        self._device = _device_index(device)
        self._seed, self._batch_size, self._rank, self._world = int(seed), int(batch_size), rank, world_size
        self._native = _native._Loader(
            [a.native() for a in self._arrays], self._batch_size, do_shuffle, way, self._seed, bool(drop_last),
            rank, world_size, self._device, int(budget), device_budget, int(block_bytes),
        )
        torch = sys.modules.get("torch")
        self._torch = torch if torch is not None and torch.cuda.is_available() else None
        self._tdtypes = [self._torch_dtype(a.dtype) for a in self._arrays] if self._torch is not None else None
        self._tdevice = self._torch.device("cuda", self._device) if self._torch is not None else None
        self._raw_stream = _raw_stream_getter(self._torch)

    def _torch_dtype(self, dtype: Any) -> Any:
        np = _numpy()
        return self._torch.from_numpy(np.empty(0, dtype=dtype)).dtype

    # ------------------------------------------------------------- public

    @property
    def way(self) -> str:
        """Where batches are gathered from: ``"resident"`` (device memory),
        ``"registered"`` (host memory pinned in place), ``"pool"`` or ``"ring"``."""
        return self._live().way()

    def __len__(self) -> int:
        return len(self._live())

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass epoch ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        self._live().load_state(int(epoch), 0)

    def state_dict(self) -> Dict[str, int]:
        """Where the loader is: give it to :meth:`load_state_dict` (of a loader
        of the same arrays, batch size, seed and ranks) to go on from here."""
        epoch, batch = self._live().state()
        return {"epoch": epoch, "batch": batch, "seed": self._seed, "batch_size": self._batch_size,
                "rank": self._rank, "world_size": self._world}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes where :meth:`state_dict` was taken: the next pass hands out
        exactly the batches the interrupted one had not."""
        for k in ("seed", "batch_size", "world_size"):
            if k in state and state[k] != getattr(self, "_" + {"world_size": "world"}.get(k, k)):
                raise Error(f"the state was saved with {k}={state[k]}, this loader has a different one")
        self._live().load_state(int(state["epoch"]), int(state["batch"]))

    def batch_indices(self, batch: int) -> list:
        """The records (indices into the arrays) of batch ``batch`` of the current epoch."""
        return self._live().batch_records(int(batch))

    def close(self) -> None:
        """Waits for the work in flight and frees what the loader holds
        (device memory, pins). Using it afterwards raises :class:`Error`."""
        if self._native is not None:
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
        epoch, batch = native.state()
        if batch >= len(native) > 0:
            native.load_state(epoch + 1, 0)  # the last pass ended: the next epoch
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

    def _next(self, native: Any) -> Any:
        n = native.next_size()
        if n is None:
            return None
        outs, ptrs, stream = [], [], None
        if self._torch is not None:
            empty, dev = self._torch.empty, self._tdevice
            for a, dt in zip(self._arrays, self._tdtypes):
                t = empty((n,) + a.shape, dtype=dt, device=dev)
                outs.append(t)
                ptrs.append(t.data_ptr())
            stream = self._raw_stream(self._device)
        else:
            for a in self._arrays:
                arr = _native._DeviceArray(n * a.record_bytes, self._device, a.dtype.str, [n] + list(a.shape))
                outs.append(arr)
                ptrs.append(arr.ptr)
        native.next_into(ptrs, n, stream)
        return outs[0] if self._single else tuple(outs)
