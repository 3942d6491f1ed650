"""broadcast, in and out of place: every member gets the root's tensor.

``root_rank`` is a global rank (also for process sets, as in Horovod).  The data path is
scaledl's broadcast with the algorithm chosen at ``hvd.init``.  :func:`broadcast_tensors_` moves
many tensors (parameters, optimizer state) with one negotiation and one broadcast per dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scaledl.horovod.allreduce import tensor_problem
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Problem, Request, negotiate
from scaledl.horovod.dispatch import launch_broadcast
from scaledl.horovod.process_sets import ProcessSet, SetContext, context_of, global_process_set
from scaledl.horovod.tensors import check_tensor, stage, work_dtype

__all__ = ["broadcast_async", "broadcast_async_", "broadcast_", "broadcast_tensors_",
           "start_broadcast"]


def _root_problem(context: SetContext, root_rank: int) -> Problem:
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        return Problem.ROOT_TYPE
    return Problem.NONE if root_rank in context.ranks else Problem.ROOT


def start_broadcast(
    tensor: torch.Tensor, root_rank: int, in_place: bool, name: str | None,
    process_set: ProcessSet, blocking: bool = False,
) -> Handle[torch.Tensor]:
    """Negotiate, stage and start (or, ``blocking``, run) one broadcast."""
    check_tensor(tensor, "broadcast")
    context = context_of(process_set)
    problem = tensor_problem(tensor)
    if problem is Problem.NONE:
        problem = _root_problem(context, root_rank)
    root = root_rank if isinstance(root_rank, int) else -1
    negotiate(context, Request(Kind.BROADCAST, name, tensor.dtype, tuple(tensor.shape),
                               root=root, problem=problem))
    staged = stage(tensor, in_place)
    work = launch_broadcast(context, staged.buffer, root, blocking)
    return Handle([work], staged.finish, f"broadcast {name or ''}".strip())


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start copying ``root_rank``'s ``tensor`` into a new tensor on every member."""
    return start_broadcast(tensor, root_rank, False, name, process_set)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start copying ``root_rank``'s ``tensor`` into ``tensor`` on every member."""
    return start_broadcast(tensor, root_rank, True, name, process_set)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Copy ``root_rank``'s ``tensor`` into ``tensor`` on every member; return it."""
    return start_broadcast(tensor, root_rank, True, name, process_set, blocking=True).wait()


@torch.no_grad()
def broadcast_tensors_(
    tensors: Sequence[torch.Tensor], root_rank: int, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> None:
    """Copy ``root_rank``'s values of all ``tensors`` in place: one negotiation (which checks
    that every member passes the same shapes and dtypes), one flat broadcast per dtype."""
    context = context_of(process_set)
    problems = [tensor_problem(t) for t in tensors if tensor_problem(t) is not Problem.NONE]
    problem = problems[0] if problems else _root_problem(context, root_rank)
    shapes = "\n".join(f"tensor {i}: {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
                       for i, t in enumerate(tensors))
    root = root_rank if isinstance(root_rank, int) else -1
    negotiate(context, Request(
        Kind.BROADCAST, name, None, (sum(t.numel() for t in tensors),), root=root,
        detail=shapes, problem=problem))
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        work = work_dtype(tensor.dtype)
        assert work is not None
        groups.setdefault(work, []).append(tensor)
    pending = []
    for work, same in groups.items():
        device = same[0].device if all(t.device == same[0].device for t in same) else context.device
        flat = torch.cat([t.detach().reshape(-1).to(device=device, dtype=work) for t in same])
        pending.append((same, flat, launch_broadcast(context, flat, root_rank)))
    for same, flat, handle in pending:
        Handle([handle], lambda: None, f"broadcast {name or ''}".strip()).wait()
        offset = 0
        for tensor in same:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
