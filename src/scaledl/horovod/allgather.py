"""allgather: concatenate every member's tensor along the first dimension, in set-rank order.

The first dimensions may differ between ranks; the other dimensions, the dtype and the name must
not.  The negotiation round already carries every member's shape, so no extra exchange of sizes
is needed.  Equal first dimensions run scaledl's allgather directly into the output; unequal ones
run it on blocks padded to the longest (zeros, discarded afterwards), which costs
``(max - own)`` rows of extra traffic per rank but keeps scaledl's algorithms on the data path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from scaledl.horovod.allreduce import tensor_problem
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Problem, Request, negotiate
from scaledl.horovod.dispatch import launch_allgather
from scaledl.horovod.process_sets import ProcessSet, context_of, global_process_set
from scaledl.horovod.tensors import check_tensor, work_dtype

__all__ = ["allgather_async", "grouped_allgather_async", "start_allgather"]


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle[torch.Tensor]:
    """Start gathering ``tensor`` from every member (the input is not modified)."""
    return start_allgather(tensor, name, process_set)


def start_allgather(
    tensor: torch.Tensor, name: str | None, process_set: ProcessSet, blocking: bool = False
) -> Handle[torch.Tensor]:
    """Negotiate and start (or, ``blocking``, run) one allgather."""
    check_tensor(tensor, "allgather")
    context = context_of(process_set)
    problem = tensor_problem(tensor)
    if problem is Problem.NONE and tensor.dim() == 0:
        problem = Problem.SCALAR
    agreement = negotiate(context, Request(Kind.ALLGATHER, name, tensor.dtype,
                                           tuple(tensor.shape), problem=problem))
    firsts = [row.dims[0] for row in agreement.rows]
    row_shape = tuple(tensor.shape[1:])
    row_numel = math.prod(row_shape)
    longest = max(firsts)
    work = work_dtype(tensor.dtype)
    assert work is not None
    shard = torch.zeros(longest * row_numel, dtype=work, device=tensor.device)
    shard[:tensor.numel()].view(tensor.shape).copy_(tensor.detach())
    gathered = torch.empty(context.size * shard.numel(), dtype=work, device=tensor.device)
    handle = launch_allgather(context, gathered, shard, blocking) if shard.numel() else None
    what = f"allgather {name or ''}".strip()

    def finish() -> torch.Tensor:
        blocks = gathered.view(context.size, -1)
        rows = [blocks[r, :firsts[r] * row_numel] for r in range(context.size)]
        flat = torch.cat(rows) if longest != min(firsts) else gathered
        return flat.view(sum(firsts), *row_shape).to(tensor.dtype)

    return Handle([handle], finish, what)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[list[torch.Tensor]]:
    """Start gathering each tensor of ``tensors`` from every member."""
    handles = [allgather_async(t, None if name is None else f"{name}.{i}", process_set)
               for i, t in enumerate(tensors)]
    return Handle([], lambda: [h.wait() for h in handles],
                  f"grouped_allgather {name or ''}".strip())
