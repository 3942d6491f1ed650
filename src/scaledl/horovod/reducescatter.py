"""reducescatter: reduce a tensor over the members, each keeping a slice of the first dimension.

Member ``r`` of ``p`` keeps rows ``[r*q + min(r, e), ...)``, ``q + 1`` of them if ``r < e`` else
``q``, with ``q, e = divmod(rows, p)``: the first ranks take the extra rows, as in Horovod.  When
``p`` divides the rows this is scaledl's reduce-scatter on the tensor itself; otherwise each
member's slice is copied into a block of ``q + 1`` rows padded with zeros, the blocks are reduced
and scattered, and the padding is dropped.  Average (the default), Sum, Min and Max are
accepted; ``prescale_factor`` and ``postscale_factor`` act as in allreduce.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from scaledl.horovod.allreduce import reduction_plan, tensor_problem
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Problem, Request, negotiate
from scaledl.horovod.dispatch import launch_reduce_scatter
from scaledl.horovod.process_sets import ProcessSet, context_of, global_process_set
from scaledl.horovod.reduce_ops import Average, Product, ReduceOperation, resolve_op, scaledl_op
from scaledl.horovod.tensors import check_tensor, scale_, work_dtype

__all__ = ["reducescatter_async", "grouped_reducescatter_async", "start_reducescatter",
           "slice_rows"]


def slice_rows(rows: int, size: int, rank: int) -> tuple[int, int]:
    """``(first row, row count)`` that member ``rank`` of ``size`` keeps."""
    quotient, extra = divmod(rows, size)
    return rank * quotient + min(rank, extra), quotient + (1 if rank < extra else 0)


def reducescatter_async(
    tensor: torch.Tensor, name: str | None = None, op: ReduceOperation | None = Average,
    process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle[torch.Tensor]:
    """Start reducing ``tensor``; the result is this member's slice (input not modified)."""
    return start_reducescatter(tensor, name, op, process_set, prescale_factor, postscale_factor)


def start_reducescatter(
    tensor: torch.Tensor, name: str | None, op: ReduceOperation | None,
    process_set: ProcessSet, prescale_factor: float, postscale_factor: float,
    blocking: bool = False,
) -> Handle[torch.Tensor]:
    """Negotiate, pad and start (or, ``blocking``, run) one reduce-scatter."""
    check_tensor(tensor, "reducescatter")
    reduce_op = resolve_op(op)
    if reduce_op is Product:
        raise ValueError("reducescatter takes hvd.Average, hvd.Sum, hvd.Min or hvd.Max, not "
                         "hvd.Product")
    context = context_of(process_set)
    problem = tensor_problem(tensor)
    if problem is Problem.NONE and tensor.dim() == 0:
        problem = Problem.SCALAR
    negotiate(context, Request(Kind.REDUCE_SCATTER, name, tensor.dtype, tuple(tensor.shape),
                               op=int(reduce_op), problem=problem))
    work = work_dtype(tensor.dtype)
    assert work is not None
    size, rows = context.size, tensor.shape[0]
    row_shape = tuple(tensor.shape[1:])
    row_numel = math.prod(row_shape)
    block = -(-rows // size) * row_numel
    source = torch.zeros(size * block, dtype=work, device=tensor.device)
    blocks = source.view(size, block)
    flat = tensor.detach().reshape(-1)
    for r in range(size):
        first, count = slice_rows(rows, size, r)
        blocks[r, :count * row_numel].copy_(flat[first * row_numel:(first + count) * row_numel])
    scale_(source, prescale_factor)
    output = torch.empty(block, dtype=work, device=tensor.device)
    divide_here, factor = reduction_plan(reduce_op, output, postscale_factor, size)
    name_op = scaledl_op(reduce_op, divide_here)
    assert name_op is not None
    handle = launch_reduce_scatter(context, output, source, name_op, blocking) if block else None
    _, mine = slice_rows(rows, size, context.rank)

    def finish() -> torch.Tensor:
        scale_(output, factor)
        return output[:mine * row_numel].view(mine, *row_shape).to(tensor.dtype)

    return Handle([handle], finish, f"reducescatter {name or ''}".strip())


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor], name: str | None = None,
    op: ReduceOperation | None = Average, process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
) -> Handle[list[torch.Tensor]]:
    """Start reduce-scattering each tensor of ``tensors``."""
    handles = [reducescatter_async(t, None if name is None else f"{name}.{i}", op, process_set,
                                   prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return Handle([], lambda: [h.wait() for h in handles],
                  f"grouped_reducescatter {name or ''}".strip())
