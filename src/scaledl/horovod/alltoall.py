"""alltoall: member ``i`` sends ``splits[j]`` rows of its tensor to member ``j``.

scaledl has no alltoall algorithm, so this is the simplest correct composition: as one job of the
process set's communicator (so it stays in order with the other collectives), exchange the split
sizes with torch.distributed's ``all_to_all_single``, then the rows themselves with a second
``all_to_all_single`` using those sizes.  Without ``splits`` the first dimension is divided
equally, and must divide by the set's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from scaledl.horovod.allreduce import tensor_problem
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Problem, Request, negotiate
from scaledl.horovod.dispatch import submit_native
from scaledl.horovod.process_sets import ProcessSet, context_of, global_process_set
from scaledl.horovod.tensors import check_tensor, work_dtype

__all__ = ["alltoall_async", "start_alltoall"]

Splits = Sequence[int] | torch.Tensor | None


def _splits(tensor: torch.Tensor, splits: Splits, size: int) -> tuple[list[int], Problem]:
    if tensor.dim() == 0:
        return [], Problem.SCALAR
    rows = tensor.shape[0]
    if splits is None:
        if rows % size:
            return [], Problem.NOT_DIVISIBLE
        return [rows // size] * size, Problem.NONE
    values = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(values) != size:
        return [], Problem.SPLITS_LENGTH
    if min(values) < 0 or sum(values) != rows:
        return [], Problem.SPLITS_SUM
    return values, Problem.NONE


def alltoall_async(
    tensor: torch.Tensor, splits: Splits = None, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
    """Start the exchange; the result is ``(output, received_splits)``."""
    return start_alltoall(tensor, splits, name, process_set)


def start_alltoall(
    tensor: torch.Tensor, splits: Splits, name: str | None, process_set: ProcessSet,
    blocking: bool = False,
) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
    """Negotiate and start (or, ``blocking``, run) one alltoall."""
    check_tensor(tensor, "alltoall")
    context = context_of(process_set)
    send, problem = _splits(tensor, splits, context.size)
    problem = tensor_problem(tensor) if tensor_problem(tensor) is not Problem.NONE else problem
    negotiate(context, Request(Kind.ALLTOALL, name, tensor.dtype, tuple(tensor.shape),
                               problem=problem))
    work = work_dtype(tensor.dtype)
    assert work is not None
    row_shape = tuple(tensor.shape[1:])
    row_numel = math.prod(row_shape)
    device = context.device if context.device.type == "cuda" else torch.device("cpu")
    source = tensor.detach().to(device=device, dtype=work).contiguous().view(-1)
    result: list[tuple[torch.Tensor, torch.Tensor]] = []
    group = context.group

    def exchange() -> None:
        counts_out = torch.tensor(send, dtype=torch.int64, device=device)
        counts_in = torch.empty(len(send), dtype=torch.int64, device=device)
        dist.all_to_all_single(counts_in, counts_out, group=group)
        received = [int(n) for n in counts_in.tolist()]
        output = torch.empty(sum(received) * row_numel, dtype=work, device=device)
        dist.all_to_all_single(output, source, [n * row_numel for n in received],
                               [n * row_numel for n in send], group=group)
        shaped = output.view(sum(received), *row_shape)
        result.append((shaped.to(device=tensor.device, dtype=tensor.dtype),
                       torch.tensor(received, dtype=torch.int32)))

    handle = submit_native(context, exchange, blocking)
    return Handle([handle], lambda: result[0], f"alltoall {name or ''}".strip())
