"""Torus: PowerAI DDL / BlueConnect multi-dimensional reduce-scatter and allgather.

The ranks form a grid ``n_1 x n_2 x .. x n_D`` following the network, innermost (fastest) axis
first, e.g. ``4x8x2`` = GPUs per host x hosts per rack x racks.  Steps:

1. reduce-scatter along axis 1: each group of ``n_1`` ranks differing only in coordinate 1 runs a
   ring reduce-scatter on the whole buffer; every rank keeps ``1/n_1`` of it, partially reduced;
2. reduce-scatter along axis 2 on that shard, and so on: after axis ``d`` a rank holds
   ``1/(n_1..n_d)`` of the buffer, reduced over the ranks that agree with it beyond axis ``d``;
   after axis ``D`` it holds ``1/p`` of the buffer, fully reduced;
3. allgather along axis ``D``, then ``D-1``, .., then 1, each on the same ranges as step 2.

All ``p / n_d`` groups of one axis run at once.  Cost:
``sum_d 2 (n_d - 1) (alpha_d + beta_d n / (n_1 .. n_d))``, against the flat ring's
``2 (p-1) (alpha + beta n / p)``: the outer (slow) axes carry only a ``1/(n_1..n_d)`` share and the
number of latency steps drops from ``2(p-1)`` to ``2 sum_d (n_d - 1)`` (42 instead of 510 for
4x16x4).  An axis order that puts a slow link innermost loses: it moves the most bytes there.

Source: Cho et al., "PowerAI DDL", arXiv 1708.02188 (2017); Cho et al., "BlueConnect:
Decomposing all-reduce for deep learning on heterogeneous network hierarchy", SysML 2019.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scaledl.collectives import ring
from scaledl.collectives.schedule import Collective, Round, Schedule, join_rounds, split
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "stage_members", "staged_rounds", "stage_layout", "plan_stages"]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER})
NEEDS_TOPOLOGY = True


def stage_members(topology: Topology, rank: int) -> list[tuple[int, ...]]:
    """The group of ``rank`` along each axis of size > 1, innermost first."""
    return [
        topology.axis_group(rank, axis)
        for axis, size in enumerate(topology.axes) if size > 1
    ]


def staged_rounds(
    stages: Sequence[Sequence[int]], rank: int, lo: int, hi: int, *,
    reduce_scatter: bool = True, allgather: bool = True,
) -> list[Round | None]:
    """Ring reduce-scatter through ``stages`` in order, then allgather back in reverse."""
    plans = []
    region = (lo, hi)
    for tag, members in enumerate(stages):
        blocks = split(region[0], region[1], len(members))
        plans.append((members, blocks, tag))
        region = blocks[list(members).index(rank)]
    rounds: list[Round | None] = []
    if reduce_scatter:
        for members, blocks, tag in plans:
            rounds += ring.reduce_scatter_rounds(members, rank, blocks, tag)
    if allgather:
        for members, blocks, tag in reversed(plans):
            rounds += ring.allgather_rounds(members, rank, blocks, tag)
    return rounds


def stage_layout(
    stages_of: Callable[[int], Sequence[Sequence[int]]], world_size: int
) -> tuple[int, ...]:
    """Block index each rank owns after the staged reduce-scatter of ``p`` equal blocks.

    ``stages_of(r)`` gives rank ``r``'s stage groups.
    """
    layout = []
    for rank in range(world_size):
        lo, hi = 0, world_size
        for members in stages_of(rank):
            lo, hi = split(lo, hi, len(members))[list(members).index(rank)]
        layout.append(lo)
    return tuple(layout)


def plan_stages(
    name: str, collective: Collective, stages_of: Callable[[int], Sequence[Sequence[int]]],
    world_size: int, rank: int, numel: int,
) -> Schedule:
    """A staged collective (torus, hierarchical) from every rank's stage groups."""
    p = world_size
    stages = stages_of(rank)
    if collective is Collective.ALLREDUCE:
        rounds = join_rounds(staged_rounds(stages, rank, 0, numel))
        return Schedule(collective, name, rank, p, numel, rounds)
    if collective is Collective.REDUCE_SCATTER:
        rounds = join_rounds(staged_rounds(stages, rank, 0, numel * p, allgather=False))
    elif collective is Collective.ALLGATHER:
        rounds = join_rounds(staged_rounds(stages, rank, 0, numel * p, reduce_scatter=False))
    else:
        raise ValueError(f"{name} does not implement {collective.value}")
    layout = stage_layout(stages_of, p)
    identity = layout == tuple(range(p))
    return Schedule(collective, name, rank, p, numel * p, rounds, None if identity else layout)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0
) -> Schedule:
    """Plan a torus collective over ``topology``'s axes."""
    def stages_of(member: int) -> list[tuple[int, ...]]:
        return stage_members(topology, member)

    return plan_stages("torus", collective, stages_of, topology.world_size, rank, numel)
