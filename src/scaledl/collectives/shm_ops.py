"""The shared-memory collectives, piece by piece through the windows of a :class:`ShmGroup`.

Every function acts in place on a slice of the flat working buffer, among ``members`` (local
indices of the host's ranks, in block order), with the same meaning as a schedule's stage
(:class:`~scaledl.collectives.schedule.Stage`).  A slice larger than a window streams through
it in pieces (an allreduce larger than :func:`direct_limit`, in pieces of
:func:`stream_piece`); the two windows of each rank alternate, so a rank copies its next piece
in while its peers still read the previous one.

Data moves with NumPy (``numpy.copyto``, ``numpy.add`` and friends), which runs on the calling
thread only: with torch's default intra-op threads a copy or a sum of a large tensor spreads
over every core, and two ranks sharing a host then fight each other for them (measured:
docs/benchmarks.md).  Sums go through :meth:`ReduceOp.combine`, which runs on one thread too.

A small allreduce (one piece of at most :func:`direct_limit`, in a dtype NumPy adds natively)
takes the direct path, :func:`allreduce_direct`: NumPy views of the buffer and the windows
throughout, one copy in, one sum in member order into the buffer, no tensor made on the way.
At 4 KiB the tensor views, the per-peer ``combine`` and its error-state context cost more than
the data (benchmarks/peers/small_message.py; docs/benchmarks.md, "Against the peers").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import torch

from scaledl.collectives.ops import ReduceOp, quiet_floats
from scaledl.collectives.schedule import split
from scaledl.transport.shm import ARRIVED, REDUCED, RELEASED, ShmGroup, SmallPiece

__all__ = [
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "arrive", "reduce_part",
    "collect", "copy", "combine", "allreduce_direct", "fold_piece", "split_piece", "DIRECT_BYTES",
    "direct_limit", "tail_limit", "STREAM_BYTES", "stream_piece", "AllreducePieces",
    "allreduce_pieces",
    "NUMPY_DTYPES", "UFUNCS",
]

DIRECT_BYTES = 1 << 20
"""Messages up to this size (and a window, :func:`direct_limit`) are summed whole by every
rank: two waits instead of three.  Measured with ``benchmarks/paths/mid_size.py`` (2 and
4 ranks on this project's 2-core machine, shared): summing whole took 0.65-0.94x the split
protocol's time from 64 KiB to 2 MiB on 2 ranks and 0.26-0.59x at 64 KiB-1 MiB on 4; the split
protocol reads ``(L - 1) n`` fewer bytes per rank, which wins once a piece no longer fits the
caches (benchmarks/paths/raw/mid-size-2026-11-28.txt)."""


STREAM_BYTES = 2 << 20
"""An allreduce larger than :func:`direct_limit` streams through the windows in pieces of this
size, or of a window when windows are smaller (with the default 4 MiB windows a piece fills
half of each window in turn).  ``benchmarks/peers/stream_piece.py`` on a quiet machine, 2 ranks,
2026-11-28 16:00-16:17 UTC
(benchmarks/peers/raw-stream-2026-11-28-pm/): pieces of 2 MiB took 0.65-0.90x the time of 4 MiB
ones from 4 to 256 MiB in two runs, with one thread per rank and with two (3 MiB: 0.86-0.88x;
at 2 MiB, where both run the same single piece, 1.11-1.16x: the runs' resolution), 1 MiB
pieces 0.61-0.86x;
``piece_size.py`` in the same hour, windows of 2 MiB against 4 MiB: 0.70-1.02x from 4 to 256
MiB (1 MiB windows 0.74-1.14x).  On 4 ranks sharing 2 cores one run to the next differs by up
to 2x, and no piece size won throughout (2 MiB: 0.89-1.23x).  An earlier quiet run had found
no gain on 2 ranks (0.96-1.13x); the three runs since all found one, and the peer sweep after
the change (benchmarks/peers/raw-stream2m-2026-11-28/) moved scaledl against Open MPI on 2
ranks from 0.86-0.93x to 1.05-1.21x at 4 MiB and from 2.16-2.32x to 3.13-3.36x at 256 MiB.
Why is not measured: on 2 ranks a 2 MiB piece and its copies in both ranks' buffers and windows
take 8 MiB of the 32 MiB L3, a 4 MiB one 16 MiB."""


def stream_piece(window: int) -> int:
    """Bytes per piece of an allreduce that streams through windows of ``window`` bytes."""
    return min(window, STREAM_BYTES)


def direct_limit(window: int) -> int:
    """The largest allreduce summed whole, in one piece, for windows of ``window`` bytes:
    :data:`DIRECT_BYTES`, or a window when windows are smaller."""
    return min(DIRECT_BYTES, window)


def tail_limit(piece_bytes: int) -> int:
    """The largest last piece of a streamed allreduce (pieces of ``piece_bytes``) that is summed
    whole, as a message of its size would be: half a piece (1 MiB of the default 2 MiB pieces),
    and never a whole piece, so that with windows smaller than :data:`DIRECT_BYTES` (as tests
    make them) full pieces are still split into parts."""
    return min(DIRECT_BYTES, piece_bytes // 2)


class AllreducePieces(NamedTuple):
    """How an allreduce of a message goes through the windows, in elements: pieces of ``step``
    over ``[0, split)``, each split into one part per member (reduced by its owner, then
    copied out by all), and ``[split, numel)`` as one piece summed whole by every rank (empty
    when ``split`` is the whole message).  :func:`allreduce_pieces` is the one rule; the
    protocol runs it and the cost model prices it."""

    step: int
    split: int


def allreduce_pieces(numel: int, itemsize: int, window: int) -> AllreducePieces:
    """The pieces of an allreduce of ``numel`` elements of ``itemsize`` bytes through windows
    of ``window`` bytes: the whole message summed whole up to :func:`direct_limit`; beyond
    it, pieces of :func:`stream_piece` split into parts, but for a last piece of at most
    :func:`tail_limit`, which is summed whole as a message of its size would be."""
    if numel * itemsize <= direct_limit(window):
        return AllreducePieces(max(1, numel), 0)
    piece_bytes = stream_piece(window)
    step = max(1, piece_bytes // itemsize)
    last = numel - (numel - 1) // step * step  # the last piece's elements (1..step)
    if last * itemsize <= tail_limit(piece_bytes):
        return AllreducePieces(step, numel - last)
    return AllreducePieces(step, numel)


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (bfloat16 as int16, for copies)."""
    if tensor.dtype is torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


def copy(into: torch.Tensor, source: torch.Tensor) -> None:
    """``into[:] = source`` on this thread only."""
    np.copyto(_array(into), _array(source))


def combine(op: ReduceOp, into: torch.Tensor, other: torch.Tensor) -> None:
    """Fold ``other`` into ``into`` with ``op`` (AVG sums; the caller divides) on this thread."""
    op.combine(into, other)


def _pieces(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    return [(a, min(hi, a + step)) for a in range(lo, hi, step)]


def _elements(group: ShmGroup, buffer: torch.Tensor, parts: int = 1) -> int:
    return max(1, group.window // (buffer.element_size() * parts))


NUMPY_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
    torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
}
"""Dtypes the direct path sums with NumPy (half precision goes through torch, in ``combine``)."""
UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum}


def allreduce(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int, op: ReduceOp
) -> None:
    """Reduce ``buffer[lo:hi]`` over ``members`` in place on each.

    Per piece: copy in; then either every rank sums the whole piece in member order (small
    pieces: identical bits everywhere), or each rank reduces its part, and everyone copies the
    reduced parts out (a reduce-scatter and an allgather through memory).  For the latter a
    rank copies in only the parts its peers reduce, and reduces its own part from its buffer
    and the peers' windows straight into its window (where the peers read it): its own part
    is never copied in.
    """
    if len(members) < 2:
        return  # nothing to combine: the buffer holds the result
    dtype = NUMPY_DTYPES.get(buffer.dtype)
    if dtype is not None:
        _allreduce_array(group, members, buffer.numpy()[lo:hi], UFUNCS[op])
        return
    me = group.index
    position = members.index(me)
    step, split_end = allreduce_pieces(hi - lo, buffer.element_size(), group.window)
    for a, b in _pieces(lo, lo + split_end, step):
        piece = buffer[a:b]
        parts = split(0, b - a, len(members))
        own_lo, own_hi = parts[position]
        counts, windows = arrive(group, members, piece, skip=(own_lo, own_hi))
        into = windows[me][own_lo:own_hi]
        peers = [peer for peer in members if peer != me]
        _combine_into(op, into, piece[own_lo:own_hi], windows[peers[0]][own_lo:own_hi])
        for peer in peers[1:]:
            combine(op, into, windows[peer][own_lo:own_hi])
        group.publish(REDUCED, counts)
        collect(group, members, windows, counts, parts, piece)
        group.publish(RELEASED, counts)
    if lo + split_end < hi:  # summed whole: the message, or its small last piece
        piece = buffer[lo + split_end:hi]
        counts, windows = arrive(group, members, piece)
        copy(piece, windows[members[0]])
        for peer in members[1:]:
            combine(op, piece, windows[peer])
        group.publish(RELEASED, counts)


def _allreduce_array(
    group: ShmGroup, members: Sequence[int], data: np.ndarray, ufunc: np.ufunc
) -> None:
    """:func:`allreduce` of a NumPy view: NumPy views of the windows throughout, prepared once
    per piece size (:meth:`ShmGroup.small_piece`), no tensor made; the same protocol and the
    same order of the sums as the tensor version, which half precision takes."""
    step, split_end = allreduce_pieces(data.size, data.itemsize, group.window)
    for start in range(0, split_end, step):
        piece = data[start:min(split_end, start + step)]
        split_piece(group, group.small_piece(members, piece.dtype, piece.size), piece, ufunc)
    if split_end < data.size:  # summed whole: the message, or its small last piece
        piece = data[split_end:]
        fold_piece(group, group.small_piece(members, piece.dtype, piece.size), piece, ufunc)


def split_piece(group: ShmGroup, prepared: SmallPiece, data: np.ndarray, ufunc: np.ufunc) -> None:
    """One large piece: copy in all but one's own part, reduce one's own part from ``data`` and
    the peers' windows (in member order) straight into one's window, announce it, copy every
    member's reduced part out of its window into ``data``."""
    members = prepared.members
    parts = _parts(data.size, len(members))
    position = members.index(group.index)
    own_lo, own_hi = parts[position]
    windows, counts = group.small_arrive(prepared, data, skip=(own_lo, own_hi))
    into = windows[position][own_lo:own_hi]
    source = data[own_lo:own_hi]
    with quiet_floats():
        for index, window in enumerate(windows):
            if index != position:
                ufunc(source, window[own_lo:own_hi], out=into)
                source = into
    group.small_publish(REDUCED, counts, prepared)
    for peer, count in counts:
        group.reached(peer, REDUCED, count, "reduce its part")
    for window, (part_lo, part_hi) in zip(windows, parts):
        np.copyto(data[part_lo:part_hi], window[part_lo:part_hi])
    group.small_publish(RELEASED, counts, prepared)


@lru_cache(maxsize=256)
def _parts(numel: int, count: int) -> tuple[tuple[int, int], ...]:
    return tuple(split(0, numel, count))


def _combine_into(op: ReduceOp, into: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``into = a op b`` in one pass where NumPy has the type, on this thread."""
    ufunc = UFUNCS[op]
    if a.dtype in NUMPY_DTYPES:
        with quiet_floats():
            ufunc(a.numpy(), b.numpy(), out=into.numpy())
    else:
        copy(into, a)
        combine(op, into, b)


def allreduce_direct(
    group: ShmGroup, members: Sequence[int], out: np.ndarray, op: ReduceOp
) -> None:
    """Allreduce of one small piece, ``out`` (a NumPy view of the caller's buffer, at most a
    window), over ``members``, in place: copy it into a window, announce it, wait for every
    peer's, sum all windows in member order straight into ``out`` (identical bits on every
    rank), release.  Two waits (the window's previous readers, the peers' data), one copy and
    ``L - 1`` adds, the first of which reads two windows and writes ``out``."""
    fold_piece(group, group.small_piece(members, out.dtype, out.size), out, UFUNCS[op])


def fold_piece(
    group: ShmGroup, piece: SmallPiece, out: np.ndarray, ufunc: np.ufunc,
    word: int | None = None, describe: Callable[[int], str] | None = None,
) -> None:
    """:func:`allreduce_direct` of a prepared ``piece``, folding with ``ufunc`` (the op's, from
    :data:`UFUNCS`); with ``word``, the call is announced
    first (:meth:`ShmGroup.announce`: the direct call path,
    :mod:`scaledl.collectives.shm_direct`, has no stage to do it)."""
    windows, counts = group.small_arrive(piece, out, word, describe)
    first_is_out = piece.members[0] == group.index
    if out.dtype.kind == "f":
        with quiet_floats():
            _fold(ufunc, out, windows, first_is_out)
    else:
        _fold(ufunc, out, windows, first_is_out)
    group.small_publish(RELEASED, counts, piece)


def _fold(ufunc: np.ufunc, out: np.ndarray, windows: list[np.ndarray], first_is_out: bool) -> None:
    """``out = windows[0] op windows[1] op ...`` from the left, the first step reading both
    windows straight into ``out`` (no copy of ``windows[0]`` first); ``out`` already holds
    ``windows[0]`` when ``first_is_out`` (this rank's own data, copied in unchanged)."""
    if len(windows) < 2:
        return
    ufunc(out if first_is_out else windows[0], windows[1], out=out)
    for window in windows[2:]:
        ufunc(out, window, out=out)


def arrive(
    group: ShmGroup, members: Sequence[int], piece: torch.Tensor,
    skip: tuple[int, int] = (0, 0),
) -> tuple[dict[int, int], dict[int, torch.Tensor]]:
    """Copy ``piece`` (but for the stretch ``skip``, which no peer reads) into a window and
    announce it; return the pair counts and every member's window of this piece (once it has
    arrived)."""
    slot, counts = group.begin(members)
    numel, dtype = piece.numel(), piece.dtype
    mine = group.window_of(group.index, slot, dtype, numel)
    skip_lo, skip_hi = skip
    if skip_hi > skip_lo:
        copy(mine[:skip_lo], piece[:skip_lo])
        copy(mine[skip_hi:], piece[skip_hi:])
    else:
        copy(mine, piece)
    group.publish(ARRIVED, counts, slot)
    windows = {peer: group.window_of(peer, group.arrived(peer, count), dtype, numel)
               for peer, count in counts.items()}
    windows[group.index] = mine
    return counts, windows


def reduce_part(
    group: ShmGroup, members: Sequence[int], windows: dict[int, torch.Tensor],
    counts: dict[int, int], op: ReduceOp, numel: int,
) -> list[tuple[int, int]]:
    """Reduce this rank's part of every window into its own window and announce it; return
    every member's part."""
    me = group.index
    parts = split(0, numel, len(members))
    part_lo, part_hi = parts[members.index(me)]
    for peer in members:
        if peer != me:
            combine(op, windows[me][part_lo:part_hi], windows[peer][part_lo:part_hi])
    group.publish(REDUCED, counts)
    return parts


def collect(
    group: ShmGroup, members: Sequence[int], windows: dict[int, torch.Tensor],
    counts: dict[int, int], parts: list[tuple[int, int]], out: torch.Tensor,
) -> None:
    """Copy every member's reduced part out of its window into ``out`` (a part already in
    place, when ``out`` is this rank's own window, stays)."""
    for peer, count in counts.items():
        group.reached(peer, REDUCED, count, "reduce its part")
    for peer, (part_lo, part_hi) in zip(members, parts):
        if windows[peer].data_ptr() != out.data_ptr():
            copy(out[part_lo:part_hi], windows[peer][part_lo:part_hi])


def reduce_scatter(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int,
    op: ReduceOp, target: torch.Tensor | None = None,
) -> None:
    """Member ``k`` ends with part ``k`` of ``buffer[lo:hi]`` reduced over ``members``: in place,
    or in ``target`` (as long as the part) when given.

    Pieces run across the parts: piece ``t`` holds the ``t``-th stretch of every part, so each
    rank reduces an equal share of every piece straight into its result.
    """
    me, count_of = group.index, len(members)
    parts = split(lo, hi, count_of)
    longest = parts[0][1] - parts[0][0]
    step = _elements(group, buffer, count_of)
    position = members.index(me)
    own_lo = parts[position][0]
    result = buffer[own_lo:parts[position][1]] if target is None else target
    for offset in range(0, longest, step):
        slot, counts = group.begin(members)
        stretch = min(step, longest - offset)
        mine = group.window_of(me, slot, buffer.dtype, step * count_of)
        spans = [(p_lo + offset, min(p_hi, p_lo + offset + stretch)) for p_lo, p_hi in parts]
        for index, (s_lo, s_hi) in enumerate(spans):
            if s_hi > s_lo:
                copy(mine[index * step:index * step + s_hi - s_lo], buffer[s_lo:s_hi])
        group.publish(ARRIVED, counts, slot)
        s_lo, s_hi = spans[position]
        out = result[s_lo - own_lo:max(s_lo, s_hi) - own_lo]
        start = position * step
        if target is not None:
            copy(out, mine[start:start + out.numel()])
        for peer, count in counts.items():
            window = group.window_of(peer, group.arrived(peer, count), buffer.dtype,
                                     step * count_of)
            combine(op, out, window[start:start + out.numel()])
        group.publish(RELEASED, counts)


def allgather(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int,
    shard: torch.Tensor | None = None,
) -> None:
    """Member ``k`` contributes part ``k`` of ``buffer[lo:hi]`` (or ``shard``, when given);
    every member ends with all parts in ``buffer``."""
    me = group.index
    parts = split(lo, hi, len(members))
    longest = parts[0][1] - parts[0][0]
    step = _elements(group, buffer)
    own_lo, own_hi = parts[members.index(me)]
    source = buffer[own_lo:own_hi] if shard is None else shard
    if shard is not None:
        copy(buffer[own_lo:own_hi], shard)
    for offset in range(0, longest, step):
        slot, counts = group.begin(members)
        stretch = min(step, longest - offset)
        mine = group.window_of(me, slot, buffer.dtype, step)
        length = max(0, min(own_hi, own_lo + offset + stretch) - (own_lo + offset))
        copy(mine[:length], source[offset:offset + length])
        group.publish(ARRIVED, counts, slot)
        for peer, (p_lo, p_hi) in zip(members, parts):
            if peer == me:
                continue
            s_lo, s_hi = p_lo + offset, min(p_hi, p_lo + offset + stretch)
            window = group.window_of(peer, group.arrived(peer, counts[peer]), buffer.dtype, step)
            if s_hi > s_lo:
                copy(buffer[s_lo:s_hi], window[:s_hi - s_lo])
        group.publish(RELEASED, counts)


def broadcast(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int, root: int
) -> None:
    """Copy the root member's ``buffer[lo:hi]`` to every member (``root`` is a local index)."""
    me = group.index
    if me == root:  # it reads no one's data: make sure the others broadcast from it too
        for peer in members:
            if peer != me:
                group.agreed(peer)
    for a, b in _pieces(lo, hi, _elements(group, buffer)):
        slot, counts = group.begin(members)
        if me == root:
            copy(group.window_of(me, slot, buffer.dtype, b - a), buffer[a:b])
            group.publish(ARRIVED, counts, slot)
        else:
            window = group.arrived(root, counts[root])
            copy(buffer[a:b], group.window_of(root, window, buffer.dtype, b - a))
        group.publish(RELEASED, counts)


def reduce(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int,
    op: ReduceOp, root: int,
) -> None:
    """Reduce ``buffer[lo:hi]`` over ``members`` into the root member's (a local index).

    Per piece every rank copies in; each reduces its part in its own window; the root copies
    the reduced parts out.  Other members' buffers are left as they were.
    """
    for a, b in _pieces(lo, hi, _elements(group, buffer)):
        counts, windows = arrive(group, members, buffer[a:b])
        parts = reduce_part(group, members, windows, counts, op, b - a)
        if group.index == root:
            collect(group, members, windows, counts, parts, buffer[a:b])
        group.publish(RELEASED, counts)
