"""Start every rank from the same model: check that the models agree, then copy rank 0's state.

The check compares, across ranks, the list of (name, shape, dtype) of every parameter and
buffer, as the detail of a :class:`~scaledl.signature.Signature` (one digest travels, the lines
only when they differ).  When they differ, every rank raises the same one-line ``ValueError``
naming the first difference, instead of a later hang or a size mismatch deep inside a
collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from scaledl import collectives
from scaledl.collectives.ops import SUPPORTED_DTYPES
from scaledl.signature import Kind, Signature, agree, over_group

__all__ = ["check_same_model", "broadcast_state", "broadcast_tensors", "model_signature"]


def model_signature(module: nn.Module) -> list[str]:
    """One line per parameter and buffer: ``kind name shape dtype`` (and ``frozen`` for a
    parameter that needs no gradient: a rank that froze another layer reduces other buckets)."""
    lines = [
        f"parameter {name} {tuple(p.shape)} {str(p.dtype).removeprefix('torch.')}"
        + ("" if p.requires_grad else " frozen")
        for name, p in module.named_parameters()
    ]
    lines += [
        f"buffer {name} {tuple(b.shape)} {str(b.dtype).removeprefix('torch.')}"
        for name, b in module.named_buffers()
    ]
    return lines


def check_same_model(
    module: nn.Module, group: dist.ProcessGroup | None = None, settings: Sequence[str] = (),
    problem: BaseException | None = None,
) -> None:
    """Raise ``ValueError`` on every rank if the ranks wrapped different models, or with
    different ``settings`` (lines such as ``"setting algorithm ring"``: a rank reducing with
    another algorithm or other buckets would meet the others' collectives mismatched), or if
    a rank found a ``problem`` with its own arguments (raised on every rank, in its words)."""
    if dist.get_world_size(group) == 1:
        if problem is not None:
            raise problem
        return
    lines = model_signature(module) if problem is None else []
    mine = Signature(Kind.WRAP_MODEL, detail="\n".join(lines + list(settings)),
                     problem=None if problem is None else f"passed an argument it refused: "
                                                          f"{problem}")
    agree(mine, over_group(group), ranks=dist.get_process_group_ranks(group or dist.group.WORLD),
          fix="build the same model and pass the same settings on every rank")


def _flat_groups(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return groups


def _carrier(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` itself, or a tensor of a dtype the collectives move that holds it exactly.

    Wider dtypes travel as their bytes (int32 words: complex numbers keep their imaginary
    part, which a cast would drop); narrower ones (bool, int8, int16, float8) as float64,
    which holds every value they have.
    """
    if flat.dtype in SUPPORTED_DTYPES:
        return flat
    if flat.element_size() % 4 == 0:
        return flat.view(torch.int32)
    return flat.to(torch.float64)


@torch.no_grad()
def broadcast_tensors(
    tensors: list[torch.Tensor], src: int = 0, algorithm: str = "auto",
    group: dist.ProcessGroup | None = None,
) -> None:
    """Copy ``src``'s values of ``tensors`` into every rank's, one flat broadcast per dtype."""
    for dtype, same in _flat_groups(tensors).items():
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        work = _carrier(flat)
        collectives.broadcast(work, src=src, algorithm=algorithm, group=group)
        if work.data_ptr() != flat.data_ptr():
            flat.copy_(work.to(dtype))
        offset = 0
        for tensor in same:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


def broadcast_state(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Give every rank rank 0's parameters and buffers."""
    if dist.get_world_size(group) == 1:
        return
    tensors = [p for p in module.parameters()] + [b for b in module.buffers()]
    broadcast_tensors(tensors, group=group)
