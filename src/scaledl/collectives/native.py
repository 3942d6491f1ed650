"""Native: torch.distributed's own collective, the baseline every benchmark compares against and
the reference the tests check every other algorithm with.

On Gloo, ``all_reduce`` runs Gloo's ring (chunked) for large messages; ``reduce_scatter`` is
emulated with a full allreduce (slower than the allreduce itself, measured in
docs/benchmarks.md); ``broadcast`` and ``reduce`` are Gloo's trees.  On NCCL these are NCCL's
ring/tree kernels, which scaledl's schedules cannot beat on GPUs.  AVG is computed as a SUM
followed by a division so it behaves the same on every backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective

__all__ = ["run", "SUPPORTS"]

SUPPORTS = frozenset(Collective)
NEEDS_TOPOLOGY = False


def _torch_op(op: ReduceOp) -> dist.ReduceOp:
    return (ReduceOp.SUM if op is ReduceOp.AVG else op).to_torch()


def run(
    collective: Collective, buffer: torch.Tensor, op: ReduceOp, group: dist.ProcessGroup,
    root: int = 0, shard: torch.Tensor | None = None,
) -> None:
    """Run the native collective.  ``buffer`` is the tensor (allreduce, broadcast, reduce) or the
    full ``p * m`` input / output (reduce_scatter / allgather) with ``shard`` the ``m`` part."""
    torch_op = _torch_op(op)
    if collective is Collective.ALLREDUCE:
        dist.all_reduce(buffer, op=torch_op, group=group)
    elif collective is Collective.BROADCAST:
        dist.broadcast(buffer, src=dist.get_global_rank(group, root), group=group)
    elif collective is Collective.REDUCE:
        dist.reduce(buffer, dst=dist.get_global_rank(group, root), op=torch_op, group=group)
    elif collective is Collective.REDUCE_SCATTER:
        assert shard is not None
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        reduce_scatter(shard, buffer, op=torch_op, group=group)
    elif collective is Collective.ALLGATHER:
        assert shard is not None
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(buffer, shard, group=group)
