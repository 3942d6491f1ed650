"""Tree: binomial-tree reduce and broadcast (and allreduce as reduce + broadcast).

Steps on ``k`` members, root at index ``r``, each member's relative index ``v = (i - r) mod k``:

1. reduce, rounds ``j = 0, 1, ..``: with ``mask = 2^j``, a member whose bit ``j`` of ``v`` is set
   sends its partial result to ``v - mask`` and leaves; otherwise it receives from ``v + mask``
   (when that exists) and adds it in.  After ``ceil(log2 k)`` rounds the root holds the result.
2. broadcast mirrors it: a member receives from ``v - lowbit(v)``, then sends to ``v + m`` for
   ``m = lowbit(v)/2, lowbit(v)/4, .., 1``; the root sends for every power of two below ``k``.

Cost: ``ceil(log2 p) (alpha + n beta)`` for reduce and for broadcast; allreduce twice that.
Latency-optimal, so it wins for small messages; every round moves the whole message, so it
loses to ring and chain for large ones.

Source: the binomial trees of MPICH (Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 19(1), 2005); CaffeGPI reduces gradients with a
binomial tree to its master.
"""

from __future__ import annotations

from collections.abc import Sequence

from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, Transfer, join_rounds, make_round,
)
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "reduce_rounds", "broadcast_rounds"]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE})
NEEDS_TOPOLOGY = False


def _relative(members: Sequence[int], rank: int, root: int) -> tuple[int, int, int]:
    """(member count, root's position, this rank's position relative to the root)."""
    base = members.index(root)
    return len(members), base, (members.index(rank) - base) % len(members)


def reduce_rounds(
    members: Sequence[int], rank: int, root: int, lo: int, hi: int, tag: int = 0
) -> list[Round | None]:
    """Binomial reduce of ``[lo, hi)`` among ``members`` to the member ``root`` (a rank)."""
    k, base, v = _relative(members, rank, root)
    if k == 1 or hi <= lo:
        return []
    rounds: list[Round | None] = []
    mask = 1
    while mask < k:
        if v & mask:
            parent = members[(v - mask + base) % k]
            rounds.append(make_round([Transfer(Action.SEND, parent, lo, hi, tag)]))
            break
        if v + mask < k:
            child = members[(v + mask + base) % k]
            rounds.append(make_round([Transfer(Action.RECV_REDUCE, child, lo, hi, tag)]))
        mask <<= 1
    return rounds


def broadcast_rounds(
    members: Sequence[int], rank: int, root: int, lo: int, hi: int, tag: int = 0
) -> list[Round | None]:
    """Binomial broadcast of ``[lo, hi)`` among ``members`` from the member ``root`` (a rank):
    the reduce's tree walked backwards (receive from the parent, then send to the children,
    largest subtree first)."""
    mirrored = {Action.SEND: Action.RECV_COPY, Action.RECV_REDUCE: Action.SEND}
    return [
        make_round([Transfer(mirrored[t.action], t.peer, t.lo, t.hi, t.tag)
                    for t in round_.transfers])
        for round_ in reversed(reduce_rounds(members, rank, root, lo, hi, tag))
        if round_ is not None
    ]


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0
) -> Schedule:
    """Plan a binomial-tree collective over all ranks."""
    members = list(range(topology.world_size))
    if collective is Collective.REDUCE:
        rounds = join_rounds(reduce_rounds(members, rank, root, 0, numel))
    elif collective is Collective.BROADCAST:
        rounds = join_rounds(broadcast_rounds(members, rank, root, 0, numel))
    elif collective is Collective.ALLREDUCE:
        rounds = join_rounds(
            reduce_rounds(members, rank, 0, 0, numel), broadcast_rounds(members, rank, 0, 0, numel)
        )
    else:
        raise ValueError(f"tree does not implement {collective.value}")
    return Schedule(collective, "tree", rank, topology.world_size, numel, rounds)
