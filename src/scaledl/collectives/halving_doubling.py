"""Halving-doubling: Rabenseifner's allreduce (recursive halving, then recursive doubling).

Steps on ``p`` ranks, with ``m`` the largest power of two ``<= p`` and ``e = p - m``:

1. fold: among ranks ``0 .. 2e-1``, each even rank sends its whole buffer to the odd rank above
   it, which adds it in; the ``m`` remaining ranks get virtual ids ``v`` (``r // 2`` for odd
   ``r < 2e``, ``r - e`` above).  The buffer is cut into ``m`` parts, part ``v`` for virtual ``v``.
2. reduce-scatter by recursive halving, for ``d = m/2, m/4, .., 1``: partners ``v`` and ``v xor d``
   split the range of parts they hold; each sends the half it gives up and adds in the half it
   keeps.  Virtual ``v`` ends holding part ``v`` fully reduced.
3. allgather by recursive doubling: the same exchanges in reverse order, copying instead of adding.
4. unfold: each odd rank ``< 2e`` sends the result back to the even rank below it.

Cost (power-of-two ``p``): ``2 log2 p alpha + 2 (p-1)/p n beta``: the ring's bandwidth with a
logarithmic number of messages.  A non-power-of-two ``p`` adds two full-buffer steps for the
folded ranks.  reduce_scatter and allgather are steps 2 and 3 alone (with fold/unfold of blocks).

Source: Rabenseifner, "Optimization of collective reduction operations", ICCS 2004; Thakur,
Rabenseifner, Gropp, IJHPCA 19(1), 2005.  Gloo ships it as ``allreduce_halving_doubling``.
"""

from __future__ import annotations

from collections.abc import Sequence

from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, Transfer, flat_plan, make_round, split,
)
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "allreduce_rounds"]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER})
NEEDS_TOPOLOGY = False


class _Fold:
    """Virtual ids of a non-power-of-two member list folded onto ``m = 2^floor(log2 k)``."""

    def __init__(self, members: Sequence[int], rank: int) -> None:
        k = len(members)
        self.members = members
        self.m = 1 << (k.bit_length() - 1)
        self.e = k - self.m
        self.index = members.index(rank)

    @property
    def folded_out(self) -> bool:
        return self.index < 2 * self.e and self.index % 2 == 0

    @property
    def is_host(self) -> bool:
        return self.index < 2 * self.e and self.index % 2 == 1

    @property
    def virtual(self) -> int:
        return self.index // 2 if self.index < 2 * self.e else self.index - self.e

    def member_of(self, virtual: int) -> int:
        return self.members[2 * virtual + 1 if virtual < self.e else virtual + self.e]

    @property
    def partner(self) -> int:
        return self.members[self.index + 1 if self.folded_out else self.index - 1]


def _exchanges(fold: _Fold) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """(partner, kept part range, given part range) for each halving step."""
    v, a, b = fold.virtual, 0, fold.m
    steps = []
    d = fold.m >> 1
    while d >= 1:
        mid = a + (b - a) // 2
        keep, give = ((a, mid), (mid, b)) if v & d == 0 else ((mid, b), (a, mid))
        steps.append((fold.member_of(v ^ d), keep, give))
        a, b = keep
        d >>= 1
    return steps


def _span(parts: Sequence[tuple[int, int]], part_range: tuple[int, int]) -> tuple[int, int]:
    return parts[part_range[0]][0], parts[part_range[1] - 1][1]


def _halving(fold: _Fold, parts: Sequence[tuple[int, int]], tag: int) -> list[Round | None]:
    rounds = []
    for partner, keep, give in _exchanges(fold):
        (ks, ke), (gs, ge) = _span(parts, keep), _span(parts, give)
        rounds.append(make_round([
            Transfer(Action.SEND, partner, gs, ge, tag),
            Transfer(Action.RECV_REDUCE, partner, ks, ke, tag),
        ]))
    return rounds


def _doubling(fold: _Fold, parts: Sequence[tuple[int, int]], tag: int) -> list[Round | None]:
    rounds = []
    for partner, keep, give in reversed(_exchanges(fold)):
        (ks, ke), (gs, ge) = _span(parts, keep), _span(parts, give)
        rounds.append(make_round([
            Transfer(Action.SEND, partner, ks, ke, tag),
            Transfer(Action.RECV_COPY, partner, gs, ge, tag),
        ]))
    return rounds


def allreduce_rounds(
    members: Sequence[int], rank: int, lo: int, hi: int, tag: int = 0
) -> list[Round | None]:
    """Rabenseifner allreduce of ``[lo, hi)`` among ``members``."""
    if len(members) == 1 or hi <= lo:
        return []
    fold = _Fold(members, rank)
    if fold.folded_out:
        return [
            make_round([Transfer(Action.SEND, fold.partner, lo, hi, tag)]),
            make_round([Transfer(Action.RECV_COPY, fold.partner, lo, hi, tag)]),
        ]
    parts = split(lo, hi, fold.m)
    rounds: list[Round | None] = []
    if fold.is_host:
        rounds.append(make_round([Transfer(Action.RECV_REDUCE, fold.partner, lo, hi, tag)]))
    rounds += _halving(fold, parts, tag) + _doubling(fold, parts, tag)
    if fold.is_host:
        rounds.append(make_round([Transfer(Action.SEND, fold.partner, lo, hi, tag)]))
    return rounds


def _virtual_parts(fold: _Fold, block: int) -> list[tuple[int, int]]:
    """Part of each virtual id when member ``i`` owns block ``[i*block, (i+1)*block)``."""
    parts = []
    for v in range(fold.m):
        first = 2 * v if v < fold.e else v + fold.e
        count = 2 if v < fold.e else 1
        parts.append((first * block, (first + count) * block))
    return parts


def _reduce_scatter(members: Sequence[int], rank: int, block: int) -> list[Round | None]:
    fold = _Fold(members, rank)
    total = len(members) * block
    if fold.folded_out:
        i = fold.index
        return [
            make_round([Transfer(Action.SEND, fold.partner, 0, total)]),
            make_round([Transfer(Action.RECV_COPY, fold.partner, i * block, (i + 1) * block)]),
        ]
    rounds: list[Round | None] = []
    if fold.is_host:
        rounds.append(make_round([Transfer(Action.RECV_REDUCE, fold.partner, 0, total)]))
    rounds += _halving(fold, _virtual_parts(fold, block), 0)
    if fold.is_host:
        j = fold.index - 1
        rounds.append(make_round([Transfer(Action.SEND, fold.partner, j * block, (j + 1) * block)]))
    return rounds


def _allgather(members: Sequence[int], rank: int, block: int) -> list[Round | None]:
    fold = _Fold(members, rank)
    total = len(members) * block
    i = fold.index
    if fold.folded_out:
        return [
            make_round([Transfer(Action.SEND, fold.partner, i * block, (i + 1) * block)]),
            make_round([Transfer(Action.RECV_COPY, fold.partner, 0, total)]),
        ]
    rounds: list[Round | None] = []
    if fold.is_host:
        j = i - 1
        rounds.append(make_round([Transfer(Action.RECV_COPY, fold.partner, j * block, i * block)]))
    rounds += _doubling(fold, _virtual_parts(fold, block), 0)
    if fold.is_host:
        rounds.append(make_round([Transfer(Action.SEND, fold.partner, 0, total)]))
    return rounds


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0
) -> Schedule:
    """Plan a halving-doubling collective over all ranks."""
    p = topology.world_size
    return flat_plan("halving_doubling", collective, p, rank, numel, {
        Collective.ALLREDUCE: lambda members, me, n: allreduce_rounds(members, me, 0, n),
        Collective.REDUCE_SCATTER: lambda members, me, n: (
            _reduce_scatter(members, me, n) if p > 1 and n else []),
        Collective.ALLGATHER: lambda members, me, n: (
            _allgather(members, me, n) if p > 1 and n else []),
    })
