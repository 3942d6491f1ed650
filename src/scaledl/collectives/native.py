"""Native: the backend's own collective (Gloo's, NCCL's), the baseline every benchmark compares
against and the reference the tests check every other algorithm with.  It runs on scaledl's
channel of the group, so it is ordered with scaledl's other calls, not with the user's.

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
from scaledl.transport.channel import Channel

__all__ = ["run", "SUPPORTS"]

SUPPORTS = frozenset(Collective)
NEEDS_TOPOLOGY = False


def _torch_op(op: ReduceOp) -> dist.ReduceOp:
    return (ReduceOp.SUM if op is ReduceOp.AVG else op).to_torch()


def run(
    collective: Collective, buffer: torch.Tensor, op: ReduceOp, channel: Channel,
    root: int = 0, shard: torch.Tensor | None = None,
) -> None:
    """Run the backend's collective on scaledl's ``channel``.  ``buffer`` is the tensor
    (allreduce, broadcast, reduce) or the full ``p * m`` input / output (reduce_scatter /
    allgather) with ``shard`` the ``m`` part."""
    torch_op = _torch_op(op)
    if collective is Collective.ALLREDUCE:
        channel.allreduce(buffer, torch_op)
    elif collective is Collective.BROADCAST:
        channel.broadcast(buffer, root)
    elif collective is Collective.REDUCE:
        channel.reduce(buffer, root, torch_op)
    elif collective is Collective.REDUCE_SCATTER:
        assert shard is not None
        channel.reduce_scatter(shard, buffer, torch_op)
    elif collective is Collective.ALLGATHER:
        assert shard is not None
        channel.allgather(buffer, shard)
