"""The synchronous out-of-place calls, differentiable as in Horovod.

``hvd.allreduce(t)``, ``allgather``, ``broadcast``, ``alltoall`` and ``reducescatter`` return new
tensors and, when the input requires a gradient, pass gradients back with Horovod's rules:

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over the members and each keeps its own rows;
* broadcast: the gradient is averaged over the members and kept by the root only;
* alltoall: the gradient goes back with the received splits;
* reducescatter: the gradient (times the size for Sum, times the scale factors) is allgathered.

The grouped calls follow the same rules tensor by tensor (one autograd node for the group, whose
backward runs one grouped collective for the gradients of all its outputs).

``compression`` (``hvd.Compression.fp16``) compresses before the collective and restores the
dtype after, for allreduce and reducescatter, as Horovod does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from scaledl.horovod import runtime
from scaledl.horovod.allgather import grouped_allgather_async, start_allgather
from scaledl.horovod.allreduce import start_allreduce, start_grouped
from scaledl.horovod.alltoall import Splits, start_alltoall
from scaledl.horovod.broadcast import start_broadcast
from scaledl.horovod.compression import Compression, Compressor
from scaledl.horovod.handles import Handle
from scaledl.horovod.process_sets import ProcessSet, global_process_set
from scaledl.horovod.reduce_ops import Average, ReduceOperation, Sum, resolve_op
from scaledl.horovod.reducescatter import grouped_reducescatter_async, start_reducescatter
from scaledl.horovod.tensors import check_tensor

__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
           "alltoall", "reducescatter", "grouped_reducescatter"]


def _tracks(tensor: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and tensor.requires_grad


def _compressed(
    tensor: torch.Tensor, compression: type[Compressor],
    tracked: Callable[[torch.Tensor], torch.Tensor],
    untracked: Callable[[torch.Tensor], Handle[torch.Tensor]],
) -> torch.Tensor:
    """Compress ``tensor``, run the collective (through autograd, ``tracked``, only when the
    compressed tensor tracks gradients; else ``untracked`` waited for) and decompress."""
    compressed, context = compression.compress(tensor)
    result = tracked(compressed) if _tracks(compressed) else untracked(compressed).wait()
    return compression.decompress(result, context)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOperation, pre: float, post: float,
                process_set: ProcessSet, name: str | None) -> torch.Tensor:
        ctx.saved = (op, pre, post, process_set)
        return start_allreduce(tensor, False, name, op, pre, post, process_set, True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, pre, post, process_set = ctx.saved
        reduced = start_allreduce(grad, False, None, op, pre, post, process_set, True).wait()
        return (reduced, None, None, None, None, None)


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: ReduceOperation | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the process set into a new tensor (Average by default)."""
    check_tensor(tensor, "allreduce")
    reduce_op = resolve_op(op, average)
    return _compressed(
        tensor, compression,
        lambda compressed: _Allreduce.apply(  # type: ignore[no-untyped-call]
            compressed, reduce_op, prescale_factor, postscale_factor, process_set, name),
        lambda compressed: start_allreduce(compressed, False, name, reduce_op, prescale_factor,
                                           postscale_factor, process_set, True))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: ReduceOperation, pre: float, post: float, process_set: ProcessSet,
                name: str | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.saved = (op, pre, post, process_set)
        return tuple(start_grouped(list(tensors), False, name, op, pre, post, process_set,
                                   True).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, pre, post, process_set = ctx.saved
        reduced = start_grouped(list(grads), False, None, op, pre, post, process_set, True).wait()
        return (None, None, None, None, None, *reduced)


def _any_tracks(tensors: Sequence[torch.Tensor]) -> bool:
    return any(isinstance(t, torch.Tensor) and _tracks(t) for t in tensors)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: ReduceOperation | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` into new tensors (one negotiation, fused per dtype)."""
    reduce_op = resolve_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _any_tracks(compressed):
        reduced = list(_GroupedAllreduce.apply(  # type: ignore[no-untyped-call]
            reduce_op, prescale_factor, postscale_factor, process_set, name, *compressed))
    else:
        reduced = start_grouped(compressed, False, name, reduce_op, prescale_factor,
                                postscale_factor, process_set, True).wait()
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.saved = (tensor.shape[0], process_set)
        return start_allgather(tensor, name, process_set, True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, process_set = ctx.saved
        reduced = start_allreduce(grad, False, None, Average, 1.0, 1.0, process_set, True).wait()
        counts = start_allgather(torch.tensor([rows]), None, process_set, True).wait().tolist()
        first = sum(counts[:process_set.rank() or 0])
        return (reduced.narrow(0, first, rows), None, None)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every member's ``tensor`` along dimension 0 (first dimensions may differ)."""
    check_tensor(tensor, "allgather")
    if _tracks(tensor):
        gathered: torch.Tensor = _Allgather.apply(  # type: ignore[no-untyped-call]
            tensor, name, process_set)
        return gathered
    return start_allgather(tensor, name, process_set, True).wait()


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.saved = ([t.shape[0] for t in tensors], process_set)
        return tuple(grouped_allgather_async(list(tensors), name, process_set).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, process_set = ctx.saved
        reduced = start_grouped(list(grads), False, None, Average, 1.0, 1.0, process_set,
                                True).wait()
        # every member's first dimensions, one row per member, to find this rank's rows
        counts = start_allgather(torch.tensor([rows]), None, process_set, True).wait()
        before = counts[:process_set.rank() or 0].sum(dim=0).tolist()
        return (None, None, *(r.narrow(0, int(first), n)
                              for r, first, n in zip(reduced, before, rows)))


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allgather each tensor of ``tensors``."""
    if _any_tracks(tensors):
        return list(_GroupedAllgather.apply(  # type: ignore[no-untyped-call]
            name, process_set, *tensors))
    return grouped_allgather_async(tensors, name, process_set).wait()


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.saved = (root_rank, process_set)
        return start_broadcast(tensor, root_rank, False, name, process_set, True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        root_rank, process_set = ctx.saved
        reduced = start_allreduce(grad, False, None, Average, 1.0, 1.0, process_set, True).wait()
        if runtime.current().rank != root_rank:
            reduced.zero_()
        return (reduced, None, None, None)


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """A new tensor holding ``root_rank``'s ``tensor`` on every member."""
    check_tensor(tensor, "broadcast")
    if _tracks(tensor):
        copied: torch.Tensor = _Broadcast.apply(  # type: ignore[no-untyped-call]
            tensor, root_rank, name, process_set)
        return copied
    return start_broadcast(tensor, root_rank, False, name, process_set, True).wait()


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Splits, name: str | None,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = start_alltoall(tensor, splits, name, process_set, True).wait()
        ctx.saved = (received, process_set)
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> tuple[torch.Tensor | None, ...]:
        received, process_set = ctx.saved
        back, _ = start_alltoall(grad, received, None, process_set, True).wait()
        return (back, None, None, None)


def alltoall(
    tensor: torch.Tensor, splits: Splits = None, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scatter rows to every member and gather theirs; with ``splits`` also return the
    received splits."""
    if _tracks(tensor):
        output, received = _Alltoall.apply(  # type: ignore[no-untyped-call]
            tensor, splits, name, process_set)
    else:
        output, received = start_alltoall(tensor, splits, name, process_set, True).wait()
    return output if splits is None else (output, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOperation,
                process_set: ProcessSet, pre: float, post: float) -> torch.Tensor:
        ctx.saved = (op, process_set, pre, post)
        return start_reducescatter(tensor, name, op, process_set, pre, post, True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, process_set, pre, post = ctx.saved
        factor = (process_set.size() or 1) if op is Sum else 1
        scaled = grad * (factor * pre * post)
        gathered = start_allgather(scaled, None, process_set, True).wait()
        return (gathered, None, None, None, None, None)


def reducescatter(
    tensor: torch.Tensor, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: ReduceOperation | None = Average,
    process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over the members; each keeps its slice of the first dimension."""
    check_tensor(tensor, "reducescatter")
    reduce_op = resolve_op(op)
    return _compressed(
        tensor, compression,
        lambda compressed: _Reducescatter.apply(  # type: ignore[no-untyped-call]
            compressed, name, reduce_op, process_set, prescale_factor, postscale_factor),
        lambda compressed: start_reducescatter(compressed, name, reduce_op, process_set,
                                               prescale_factor, postscale_factor, True))


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor], name: str | None = None,
    compression: type[Compressor] = Compression.none, op: ReduceOperation | None = Average,
    process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reduce-scatter each tensor of ``tensors``."""
    reduce_op = resolve_op(op)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _any_tracks(compressed):
        reduced = list(_GroupedReducescatter.apply(  # type: ignore[no-untyped-call]
            name, reduce_op, process_set, prescale_factor, postscale_factor, *compressed))
    else:
        reduced = grouped_reducescatter_async(compressed, name, reduce_op, process_set,
                                              prescale_factor, postscale_factor).wait()
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOperation, process_set: ProcessSet,
                pre: float, post: float, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.saved = (op, process_set, pre, post)
        return tuple(grouped_reducescatter_async(list(tensors), name, op, process_set, pre,
                                                 post).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, process_set, pre, post = ctx.saved
        factor = (process_set.size() or 1) if op is Sum else 1
        scaled = [grad * (factor * pre * post) for grad in grads]
        return (None, None, None, None, None,
                *grouped_allgather_async(scaled, None, process_set).wait())
