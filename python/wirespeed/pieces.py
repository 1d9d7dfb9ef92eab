"""``read_into_many``: many pieces of one file into CUDA tensors, queued
back to back so that the streamer runs them as one pass."""

from __future__ import annotations

import operator
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import (
    DEFAULT_BUDGET,
    _destination,
    _ensure_runtime,
    _is_memmap,
    _memmap_range,
    _native,
)
from ._native import Error, Report


def _source(src: Any) -> Tuple[str, int, int]:
    """(path, file offset of the source's first byte, bytes) of a path or
    an ``np.memmap``."""
    if _is_memmap(src):
        return _memmap_range(src)
    if isinstance(src, (str, bytes, os.PathLike)):
        path = os.fsdecode(src)
        return path, 0, os.path.getsize(path)
    raise TypeError(
        f"read_into_many reads a file: give a path or an np.memmap, not {type(src).__name__} "
        "(for a host array, call read_into once per piece)"
    )


def _piece(i: int, piece: Any) -> Tuple[Any, int, Optional[int]]:
    """(dst, offset, length or None) of piece ``i``, as given."""
    if isinstance(piece, (str, bytes)) or not hasattr(piece, "__len__") or len(piece) not in (2, 3):
        raise TypeError(f"piece {i}: expected (dst, offset) or (dst, offset, length), got {piece!r}")
    dst, offset = piece[0], piece[1]
    length = piece[2] if len(piece) == 3 else None
    try:
        offset = operator.index(offset)
        length = None if length is None else operator.index(length)
    except TypeError:
        raise TypeError(f"piece {i}: the offset and length must be integers, got {piece[1:]!r}") from None
    return dst, offset, length


def read_into_many(
    src: Union[str, "os.PathLike[str]", Any],
    pieces: Sequence[Union[Tuple[Any, int], Tuple[Any, int, int]]],
    *,
    budget: int = DEFAULT_BUDGET,
    strategy: str = "auto",
    sync: bool = False,
) -> List[Report]:
    """Reads many pieces of one file into CUDA tensors, as :func:`read_into`
    reads one, but all queued on the streamer first and ordered on your
    streams only then, so that the streamer runs them as one pass. Use it
    instead of a loop of :func:`read_into` calls over pieces of a file: each
    of those orders your stream after its piece before the next piece is
    queued, so every piece runs alone.

    ``src`` is a path or an ``np.memmap`` (offsets count from its first byte,
    as for :func:`read_into`). ``pieces`` is a sequence of ``(dst, offset)``
    or ``(dst, offset, length)``: piece ``i`` reads ``length`` bytes from
    ``offset`` of ``src`` into ``dst``, a contiguous CUDA tensor, an object
    with ``__cuda_array_interface__`` or a DLPack array (as for
    :func:`read_into`) of exactly ``length`` bytes; ``length`` defaults to
    ``dst``'s size. Offsets may come in any order, leave gaps and overlap;
    destinations must not overlap. The pieces are queued in ascending order
    of offset (ties in the given order), so that the file is read front to
    back in one pass.

    Every piece is checked before any is started: a bad piece (outside the
    source, a destination of another size or overlapping another's, not a
    CUDA array) raises, naming it, and starts nothing. Then every piece is
    started, and then each consumer stream is ordered after its pieces'
    copies: on return, as after :func:`read_into`, each piece's copies run
    after the work enqueued on its consumer stream before the call, and work
    enqueued on it afterwards runs after them. The consumer stream is
    ``torch.cuda.current_stream()`` for a torch tensor, the ``stream`` of
    ``__cuda_array_interface__`` (v3) otherwise, else the legacy default
    stream. Ordering waits on the host, interruptibly, until the last
    piece's copies are enqueued (not until they land, unless ``sync``):
    pieces in one pass are enqueued as it goes; pieces that each run alone
    (with ``strategy="auto"``, a file within the budget, registered whole)
    are enqueued one after the other, each once the one before it has
    ended. ``budget`` and ``strategy`` pick the streamer as for
    :func:`read_into` (kept per device, budget and strategy).

    If a piece's transfer fails while the call orders the streams (before
    its copies are all enqueued), or at all with ``sync``, its error is
    raised once every piece of the call has ended: nothing of the call is
    left in flight. A failure found later is raised, as for
    :func:`read_into`, when that piece's report is read. Ctrl-C raises
    ``KeyboardInterrupt`` as in :func:`read_into`: transfers already started
    run to their end in the background, their destinations kept alive until
    then, and the ordering of your streams may not have happened.

    Returns one :class:`Report` per piece, in the order of ``pieces``
    (``Report.chained``: the piece ran in the same pass as the one queued
    before it, the one of the next lower offset); ``[]`` for no pieces.

    Example: a file's 4 KiB blocks in an order of your own, into the rows of
    one tensor::

        import torch, wirespeed
        out = torch.empty(4, 4096, dtype=torch.uint8, device="cuda")
        offsets = [8192, 0, 12288, 4096]
        reports = wirespeed.read_into_many("train.bin", [(out[k], o) for k, o in enumerate(offsets)])
        print(out.sum())                      # runs after every copy
        print(sum(r.chained for r in reports), "pieces joined the pass of the one before")
    """
    _ensure_runtime()
    path, base, size = _source(src)
    args, spans = [], []
    for i, piece in enumerate(pieces):
        dst, offset, length = _piece(i, piece)
        try:
            ptr, nbytes, device, stream = _destination(dst)
        except (TypeError, ValueError) as e:
            raise type(e)(f"piece {i}: {e}") from None
        if length is None:
            length = nbytes
        if offset < 0 or length < 0 or offset + length > size:
            raise Error(f"piece {i}: range {offset}..{offset + length} is outside the source's {size} bytes")
        if length != nbytes:
            raise Error(f"piece {i}: the destination holds {nbytes} bytes, the range {length}")
        args.append((i, base + offset, length, ptr, nbytes, device, stream, dst))
        if nbytes:
            spans.append((ptr, ptr + nbytes, i))
    spans.sort()
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise ValueError(f"pieces {min(a, b)} and {max(a, b)} overlap in device memory")
    if not args:
        return []
    queued = sorted(args, key=lambda a: a[1])  # stable: ties keep their order
    started = _native.read_file_many(path, queued, budget, strategy)
    failed: Optional[BaseException] = None
    for report, a in zip(started, queued):
        try:
            report._then_on(a[6])
        except Error as e:  # that transfer failed: every piece is waited for below
            failed = e
            break
    if failed is not None or sync:
        for report in started:
            try:
                report.wait()
            except Error as e:
                failed = failed or e
    if failed is not None:
        raise failed
    reports: List[Report] = [None] * len(args)  # type: ignore[list-item]
    for report, a in zip(started, queued):
        reports[a[0]] = report
    return reports
