"""Multiring: several rings over different rank orders, each carrying a share of the buffer.

Steps with ``k`` rings (default 2):

1. cut the buffer into ``k`` segments; ring ``t`` owns segment ``t``;
2. ring 0 visits the ranks in order ``0, 1, .., p-1``; ring 1 in the reverse order, so it uses
   every link in the other direction; further rings step through the ranks with a stride coprime
   to ``p`` (``0, s, 2s, ..``), using other links where the network has them;
3. every ring runs the ring allreduce (reduce-scatter + allgather) on its segment; step ``s`` of
   all rings is posted as one round, so the rings run concurrently, each with its own tag.

Cost: the ring's ``2(p-1)`` rounds, each moving ``n / (k p)`` bytes per ring; with full-duplex
links and ``k = 2`` each rank's outgoing and incoming bandwidth to both neighbours is used, so on
such a network the bandwidth term halves: ``2(p-1) alpha + (p-1)/p n beta``.

Source: PowerAI DDL (Cho et al., arXiv 1708.02188): "a communication ring implemented on a tree
topology that uses all links in both directions concurrently"; NCCL likewise runs several rings
("channels") over different orders.
"""

from __future__ import annotations

import math

from scaledl.collectives import ring
from scaledl.collectives.schedule import Collective, Round, Schedule, make_round, split
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "ring_orders"]

SUPPORTS = frozenset({Collective.ALLREDUCE})
NEEDS_TOPOLOGY = False
DEFAULT_RINGS = 2


def ring_orders(world_size: int, rings: int) -> list[list[int]]:
    """Rank orders of ``rings`` rings: forward, reverse, then coprime strides.

    A stride ``s`` and ``p - s`` visit the same links in opposite directions, so only strides
    up to ``p / 2`` (other than 1) give new links; when they run out, orders repeat.
    """
    if rings < 1:
        raise ValueError(f"multiring needs at least one ring, got {rings}")
    forward = list(range(world_size))
    distinct = [forward, forward[::-1]]
    for stride in range(2, world_size // 2 + 1):
        if math.gcd(stride, world_size) == 1 and 2 * stride != world_size:
            order = [(i * stride) % world_size for i in range(world_size)]
            distinct += [order, order[:1] + order[:0:-1]]
    return [distinct[i % len(distinct)] for i in range(rings)]


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
    rings: int = DEFAULT_RINGS,
) -> Schedule:
    """Plan a multiring allreduce over all ranks."""
    if collective is not Collective.ALLREDUCE:
        raise ValueError(f"multiring does not implement {collective.value}")
    p = topology.world_size
    per_ring: list[list[Round | None]] = []
    for tag, (order, (lo, hi)) in enumerate(zip(ring_orders(p, rings), split(0, numel, rings))):
        # Member i of this ring (the rank order[i]) ends the reduce-scatter owning blocks[i].
        blocks = split(lo, hi, p)
        per_ring.append(
            ring.reduce_scatter_rounds(order, rank, blocks, tag)
            + ring.allgather_rounds(order, rank, blocks, tag)
        )
    rounds = []
    for step in range(max(len(r) for r in per_ring)):
        present = [r[step] for r in per_ring if step < len(r)]
        round_ = make_round(t for part in present if part is not None for t in part.transfers)
        if round_ is not None:
            rounds.append(round_)
    return Schedule(collective, "multiring", rank, p, numel, tuple(rounds))
