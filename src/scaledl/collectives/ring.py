"""Ring: reduce-scatter then allgather around one ring of ranks.

Steps, for ``k`` members ``m_0 .. m_{k-1}`` and a buffer cut into ``k`` blocks (member ``i``
ends up owning block ``i``):

1. reduce-scatter, steps ``s = 0 .. k-2``: member ``i`` sends block ``(i-s-1) mod k`` to its right
   neighbour ``m_{i+1}`` and receives block ``(i-s-2) mod k`` from its left neighbour, adding it
   into its own copy.  After ``k-1`` steps block ``i`` holds the sum of every member's block ``i``.
2. allgather, steps ``s = 0 .. k-2``: member ``i`` sends block ``(i-s) mod k`` to the right and
   receives block ``(i-s-1) mod k`` from the left, overwriting it.

Cost on ``p`` ranks and ``n`` bytes (alpha = per-message latency, beta = seconds per byte):
allreduce ``2(p-1) alpha + 2 (p-1)/p n beta`` (bandwidth-optimal), reduce-scatter and allgather
each half of that.  Every rank sends to one neighbour and receives from the other, so on a
full-duplex network each link carries traffic one way.

Source: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 69(2), 2009; popularised for deep learning by Baidu's ring allreduce (2017).

The functions ``reduce_scatter_rounds`` and ``allgather_rounds`` are building blocks: torus,
hierarchical and multiring run them on sub-rings and sub-ranges of the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, Transfer, flat_plan, make_round, split,
)
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "reduce_scatter_rounds", "allgather_rounds"]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER})
NEEDS_TOPOLOGY = False


def _ring_rounds(
    members: Sequence[int], rank: int, blocks: Sequence[tuple[int, int]], tag: int,
    shift: int, action: Action,
) -> list[Round | None]:
    """Step ``s`` sends block ``i-s-shift`` right and receives block ``i-s-shift-1`` from the
    left (``i`` = this rank's position in ``members``), ``k-1`` steps."""
    k = len(members)
    if k == 1:
        return []
    i = members.index(rank)
    right, left = members[(i + 1) % k], members[(i - 1) % k]
    rounds = []
    for step in range(k - 1):
        lo_s, hi_s = blocks[(i - step - shift) % k]
        lo_r, hi_r = blocks[(i - step - shift - 1) % k]
        rounds.append(make_round([
            Transfer(Action.SEND, right, lo_s, hi_s, tag),
            Transfer(action, left, lo_r, hi_r, tag),
        ]))
    return rounds


def reduce_scatter_rounds(
    members: Sequence[int], rank: int, blocks: Sequence[tuple[int, int]], tag: int = 0
) -> list[Round | None]:
    """Ring reduce-scatter among ``members``; member ``i`` ends owning ``blocks[i]``."""
    return _ring_rounds(members, rank, blocks, tag, 1, Action.RECV_REDUCE)


def allgather_rounds(
    members: Sequence[int], rank: int, blocks: Sequence[tuple[int, int]], tag: int = 0
) -> list[Round | None]:
    """Ring allgather among ``members``; member ``i`` starts owning ``blocks[i]``."""
    return _ring_rounds(members, rank, blocks, tag, 0, Action.RECV_COPY)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0
) -> Schedule:
    """Plan a ring collective over all ranks in rank order."""
    p = topology.world_size
    return flat_plan("ring", collective, p, rank, numel, {
        Collective.ALLREDUCE: lambda members, me, n: (
            reduce_scatter_rounds(members, me, split(0, n, p))
            + allgather_rounds(members, me, split(0, n, p))),
        Collective.REDUCE_SCATTER: lambda members, me, n: reduce_scatter_rounds(
            members, me, split(0, n * p, p)),
        Collective.ALLGATHER: lambda members, me, n: allgather_rounds(
            members, me, split(0, n * p, p)),
    })
