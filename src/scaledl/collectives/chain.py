"""Chain: the pipelined, chunked chain of S-Caffe / OSU-Caffe for large messages.

The members form a line starting at the root (position ``q = 0``).  The message is cut into ``c``
segments that flow down the line one behind another, so every link is busy at once:

1. broadcast: position ``q`` receives segment ``j`` from ``q-1`` at step ``j + q - 1`` and passes
   it to ``q+1`` at step ``j + q``;
2. reduce: the last position starts; position ``q`` receives segment ``j`` from ``q+1`` at step
   ``j + k - 2 - q``, adds it in, and passes the partial sum to ``q-1`` at step ``j + k - 1 - q``;
3. allreduce: a reduce to position 0 whose result flows straight back down as a broadcast:
   position 0 sends segment ``j`` back at step ``k - 1 + j``, right after reducing it.

Cost for ``c`` segments: ``(p - 1 + c - 1)(alpha + n/c beta)``, which tends to ``n beta``
(independent
of ``p``) for large messages; the best ``c`` is about ``sqrt((p-2) n beta / alpha)``.

Source: Awan et al., "S-Caffe", PPoPP 2017 (chain-based hierarchical reduce) and "Optimized
Broadcast for Deep Learning Workloads on Dense-GPU InfiniBand Clusters: MPI or NCCL?",
arXiv 1707.09414 (pipelined chain broadcast).
"""

from __future__ import annotations

from collections.abc import Sequence

from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, Transfer, rounds_from_timed, split,
)
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "chain_rounds", "DEFAULT_SEGMENT_NUMEL"]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE})
NEEDS_TOPOLOGY = False
DEFAULT_SEGMENT_NUMEL = 1 << 18
"""Segment length: 1 MiB of float32, the executor's chunk size."""


def chain_rounds(
    members: Sequence[int], rank: int, root: int, lo: int, hi: int, *,
    reduce: bool, broadcast: bool, segment_numel: int = DEFAULT_SEGMENT_NUMEL, tag: int = 0,
) -> list[Round]:
    """A pipelined chain over ``members`` from ``root``: reduce, broadcast, or both (allreduce)."""
    k = len(members)
    if k == 1 or hi <= lo:
        return []
    segments = split(lo, hi, max(1, -(-(hi - lo) // segment_numel)))
    base = members.index(root)
    q = (members.index(rank) - base) % k
    previous = members[(q - 1 + base) % k]
    following = members[(q + 1 + base) % k]
    start = k - 1 if reduce else 0
    timed: list[tuple[int, Transfer]] = []
    for j, (a, b) in enumerate(segments):
        if reduce and q > 0:
            timed.append((j + k - 1 - q, Transfer(Action.SEND, previous, a, b, tag)))
        if reduce and q < k - 1:
            timed.append((j + k - 2 - q, Transfer(Action.RECV_REDUCE, following, a, b, tag)))
        if broadcast and q > 0:
            timed.append((start + j + q - 1, Transfer(Action.RECV_COPY, previous, a, b, tag)))
        if broadcast and q < k - 1:
            timed.append((start + j + q, Transfer(Action.SEND, following, a, b, tag)))
    return rounds_from_timed(timed)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
    segment_numel: int = DEFAULT_SEGMENT_NUMEL,
) -> Schedule:
    """Plan a pipelined chain collective over all ranks in rank order, starting at ``root``."""
    if collective not in SUPPORTS:
        raise ValueError(f"chain does not implement {collective.value}")
    members = list(range(topology.world_size))
    origin = 0 if collective is Collective.ALLREDUCE else root
    rounds = chain_rounds(
        members, rank, origin, 0, numel, segment_numel=segment_numel,
        reduce=collective is not Collective.BROADCAST,
        broadcast=collective is not Collective.REDUCE,
    )
    return Schedule(collective, "chain", rank, topology.world_size, numel, tuple(rounds))
