"""allreduce and grouped_allreduce, in and out of place, synchronous and asynchronous.

Each call negotiates once (see :mod:`scaledl.horovod.negotiation`), stages its working buffer
(``prescale_factor`` applied there), starts a scaledl allreduce on the process set's group and
returns a handle whose finish applies ``postscale_factor``.  Average divides by the size of the
process set, ranks inside ``hvd.join()`` included, as Horovod does.  For floating tensors
without a post-scale factor the division is scaledl's own ``avg``; otherwise the sum is scaled
once by ``postscale_factor / size`` (integers truncate toward zero).

grouped_allreduce fuses its tensors into one flat buffer per dtype, so a group costs one
collective (per dtype) and one negotiation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scaledl.collectives import CollectiveHandle
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Problem, Request, negotiate
from scaledl.horovod.dispatch import launch_allreduce
from scaledl.horovod.process_sets import ProcessSet, SetContext, context_of, global_process_set
from scaledl.horovod.reduce_ops import Average, ReduceOperation, resolve_op
from scaledl.horovod.tensors import Staged, check_tensor, scale_, stage, work_dtype

__all__ = ["allreduce_async", "allreduce_async_", "allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "grouped_allreduce_", "start_allreduce", "start_grouped",
           "reduction_plan", "tensor_problem"]


def tensor_problem(tensor: torch.Tensor) -> Problem:
    """The problem code of a tensor no collective can take (``Problem.NONE`` if fine)."""
    if tensor.layout != torch.strided:
        return Problem.SPARSE
    return Problem.DTYPE if work_dtype(tensor.dtype) is None else Problem.NONE


def reduction_plan(
    op: ReduceOperation, buffer: torch.Tensor, postscale: float, size: int
) -> tuple[bool, float]:
    """Whether the caller divides (Average) and the factor applied after the collective."""
    if op is not Average:
        return False, postscale
    if buffer.is_floating_point() and postscale == 1.0:
        return False, 1.0
    return True, postscale / size


def start_allreduce(
    tensor: torch.Tensor, in_place: bool, name: str | None, op: ReduceOperation,
    prescale: float, postscale: float, process_set: ProcessSet, blocking: bool = False,
) -> Handle[torch.Tensor]:
    """Negotiate, stage and start (or, ``blocking``, run) one allreduce."""
    check_tensor(tensor, "allreduce")
    context = context_of(process_set)
    negotiate(context, Request(Kind.ALLREDUCE, name, tensor.dtype, tuple(tensor.shape),
                               op=int(op), problem=tensor_problem(tensor)))
    staged = stage(tensor, in_place, prescale)
    divide_here, factor = reduction_plan(op, staged.buffer, postscale, context.size)
    work = launch_allreduce(context, staged.buffer, op, divide_here, blocking)
    return Handle([work], lambda: staged.finish(factor), f"allreduce {name or ''}".strip())


def allreduce_async(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start reducing ``tensor`` over the process set into a new tensor (Average by default)."""
    return start_allreduce(tensor, False, name, resolve_op(op, average), prescale_factor,
                           postscale_factor, process_set)


def allreduce_async_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start reducing ``tensor`` over the process set in place."""
    return start_allreduce(tensor, True, name, resolve_op(op, average), prescale_factor,
                           postscale_factor, process_set)


def allreduce_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the process set in place and return it."""
    return start_allreduce(tensor, True, name, resolve_op(op, average), prescale_factor,
                           postscale_factor, process_set, blocking=True).wait()


# -- grouped ------------------------------------------------------------------------------------
def _group_request(
    tensors: Sequence[torch.Tensor], name: str | None, op: ReduceOperation
) -> Request:
    dtypes = {t.dtype for t in tensors}
    shapes = "\n".join(f"tensor {i}: {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
                       for i, t in enumerate(tensors))
    problems = [tensor_problem(t) for t in tensors if tensor_problem(t) is not Problem.NONE]
    return Request(
        Kind.GROUPED_ALLREDUCE, name, dtypes.pop() if len(dtypes) == 1 else None,
        (sum(t.numel() for t in tensors),), op=int(op), detail=shapes,
        problem=problems[0] if problems else Problem.NONE)


def _fuse(tensors: Sequence[torch.Tensor], prescale: float) -> list[tuple[list[int], torch.Tensor]]:
    """One flat working buffer per working dtype: ``(indices of its tensors, buffer)``."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        work = work_dtype(tensor.dtype)
        assert work is not None
        by_dtype.setdefault(work, []).append(index)
    fused = []
    for work, indices in by_dtype.items():
        parts = [tensors[i].detach().reshape(-1).to(work) for i in indices]
        buffer = torch.cat(parts)
        scale_(buffer, prescale)
        fused.append((indices, buffer))
    return fused


def launch_grouped(
    context: SetContext, fused: list[tuple[list[int], torch.Tensor]], op: ReduceOperation,
    postscale: float, blocking: bool = False,
) -> tuple[list[CollectiveHandle | None], list[float]]:
    """Start one allreduce per fused buffer; the handles and the factors to apply after."""
    works: list[CollectiveHandle | None] = []
    factors = []
    for _, buffer in fused:
        divide_here, factor = reduction_plan(op, buffer, postscale, context.size)
        works.append(launch_allreduce(context, buffer, op, divide_here, blocking))
        factors.append(factor)
    return works, factors


def start_grouped(
    tensors: Sequence[torch.Tensor], in_place: bool, name: str | None, op: ReduceOperation,
    prescale: float, postscale: float, process_set: ProcessSet, blocking: bool = False,
) -> Handle[list[torch.Tensor]]:
    """Negotiate once, fuse per dtype and start (or run) the group's allreduces."""
    tensors = [check_tensor(t, "grouped_allreduce") for t in tensors]
    context = context_of(process_set)
    negotiate(context, _group_request(tensors, name, op))
    fused = _fuse(tensors, prescale)
    outputs = list(tensors) if in_place else [
        torch.empty_like(t.detach(), memory_format=torch.contiguous_format) for t in tensors]
    works, factors = launch_grouped(context, fused, op, postscale, blocking)

    def finish() -> list[torch.Tensor]:
        for (indices, buffer), factor in zip(fused, factors):
            scale_(buffer, factor)
            offset = 0
            for i in indices:
                out = outputs[i]
                Staged(out, buffer[offset:offset + out.numel()]).finish()
                offset += out.numel()
        return outputs

    return Handle(works, finish, f"grouped_allreduce {name or ''}".strip())


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> Handle[list[torch.Tensor]]:
    """Start reducing every tensor of ``tensors`` (one fused collective per dtype)."""
    return start_grouped(tensors, False, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, process_set)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> Handle[list[torch.Tensor]]:
    """Start reducing every tensor of ``tensors`` in place."""
    return start_grouped(tensors, True, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, process_set)


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: ReduceOperation | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place; return them."""
    return start_grouped(tensors, True, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, process_set, blocking=True).wait()
