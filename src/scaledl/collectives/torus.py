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

Each axis runs on a path of its own (BlueConnect's point): ring rounds over the transport, or one
stage per direction on shared memory (an axis inside a CPU host) or on the backend's own
reduce-scatter / allgather (NCCL inside a GPU host); ``auto`` picks per axis from the cost model.
When the innermost axis runs as stages, a large allreduce is pipelined in segments (up to 8 of
at least 8 MiB of float32): one segment's stages overlap another's network transfers.

Source: Cho et al., "PowerAI DDL", arXiv 1708.02188 (2017); Cho et al., "BlueConnect:
Decomposing all-reduce for deep learning on heterogeneous network hierarchy", SysML 2019.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scaledl.collectives import ring
from scaledl.collectives.schedule import (
    Collective, Path, Round, Schedule, Stage, join_rounds, split, stage_round,
)
from scaledl.topology import Topology

__all__ = [
    "plan", "SUPPORTS", "stage_members", "stage_axes", "staged_rounds", "stage_layout",
    "plan_stages", "level_path", "spec_name", "LEVELS", "segments", "pipelined",
]

SUPPORTS = frozenset({Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER})
NEEDS_TOPOLOGY = True
LEVELS = True
"""Each axis can run on its own path (``torus[shm,ring]``)."""


def stage_members(topology: Topology, rank: int) -> list[tuple[int, ...]]:
    """The group of ``rank`` along each axis of size > 1, innermost first."""
    return [
        topology.axis_group(rank, axis)
        for axis, size in enumerate(topology.axes) if size > 1
    ]


def stage_axes(topology: Topology) -> list[int]:
    """The axes :func:`stage_members` returns groups of, innermost first."""
    return [axis for axis, size in enumerate(topology.axes) if size > 1]


def level_path(paths: Sequence[str], level: int) -> Path | None:
    """The stage path asked for at ``level`` (None: the level's point-to-point rounds)."""
    name = paths[level] if level < len(paths) else "p2p"
    return Path(name) if name in (Path.SHM.value, Path.NATIVE.value) else None


SEGMENT_NUMEL = 1 << 21
"""Elements per segment of a pipelined allreduce (8 MiB of float32)."""
MAX_SEGMENTS = 8

Phase = Callable[[int, int], list[Round | None]]


def segments(numel: int, inner: Path | None) -> list[tuple[int, int]]:
    """The slices an allreduce pipelines: one, unless the innermost level runs as stages
    (shared memory, the backend's own) and the buffer holds at least two segments."""
    if inner is None or numel < 2 * SEGMENT_NUMEL:
        return [(0, numel)]
    return split(0, numel, min(MAX_SEGMENTS, numel // SEGMENT_NUMEL))


def pipelined(
    pieces: Sequence[tuple[int, int]], inner: Phase, outer: Phase, inner_back: Phase,
) -> list[Round | None]:
    """Segment ``k``'s inner reduce-scatter, segment ``k-1``'s outer levels and segment
    ``k-2``'s inner allgather, step after step: the executor posts a segment's network transfers
    before it runs the next segment's stage, so the shared-memory work of one segment overlaps
    the network time of another."""
    rounds: list[Round | None] = []
    count = len(pieces)
    for step in range(count + 2):
        if step < count:
            rounds += inner(*pieces[step])
        if 0 <= step - 1 < count:
            rounds += outer(*pieces[step - 1])
        if 0 <= step - 2 < count:
            rounds += inner_back(*pieces[step - 2])
    return rounds


def staged_rounds(
    stages: Sequence[Sequence[int]], rank: int, lo: int, hi: int, *,
    reduce_scatter: bool = True, allgather: bool = True,
    paths: Sequence[Path | None] = (), levels: Sequence[int] = (), first_tag: int = 0,
) -> list[Round | None]:
    """Reduce-scatter through ``stages`` in order, then allgather back in reverse: ring rounds,
    or for a stage whose entry in ``paths`` is a path, one :class:`Stage` on it (priced at the
    link class ``levels[i]``).  Stage ``i`` uses tag ``first_tag + i``."""
    plans = []
    region = (lo, hi)
    for tag, members in enumerate(stages, first_tag):
        blocks = split(region[0], region[1], len(members))
        plans.append((tuple(members), blocks, tag, region))
        region = blocks[list(members).index(rank)]
    rounds: list[Round | None] = []
    order = list(range(len(plans)))
    steps = ([(Collective.REDUCE_SCATTER, i) for i in order] if reduce_scatter else []) + (
        [(Collective.ALLGATHER, i) for i in reversed(order)] if allgather else [])
    for collective, index in steps:
        members, blocks, tag, (r_lo, r_hi) = plans[index]
        path = paths[index] if index < len(paths) else None
        if path is not None:
            level = levels[index] if index < len(levels) else index
            rounds.append(stage_round(Stage(collective, members, r_lo, r_hi, path, level)))
        elif collective is Collective.REDUCE_SCATTER:
            rounds += ring.reduce_scatter_rounds(members, rank, blocks, tag)
        else:
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
    world_size: int, rank: int, numel: int, paths: Sequence[Path | None] = (),
    levels: Sequence[int] = (),
) -> Schedule:
    """A staged collective (torus, hierarchical) from every rank's stage groups; ``paths`` and
    ``levels`` give, per stage, its path (None: ring rounds) and link class."""
    p = world_size
    stages = stages_of(rank)
    if collective is Collective.ALLREDUCE:
        rounds = join_rounds(_allreduce(stages, rank, numel, paths, levels))
        return Schedule(collective, name, rank, p, numel, rounds)
    if collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER):
        scatter = collective is Collective.REDUCE_SCATTER
        rounds = join_rounds(staged_rounds(
            stages, rank, 0, numel * p, reduce_scatter=scatter, allgather=not scatter,
            paths=paths, levels=levels,
        ))
    else:
        raise ValueError(f"{name} does not implement {collective.value}")
    layout = stage_layout(stages_of, p)
    identity = layout == tuple(range(p))
    return Schedule(collective, name, rank, p, numel * p, rounds, None if identity else layout)


def _allreduce(
    stages: Sequence[Sequence[int]], rank: int, numel: int, paths: Sequence[Path | None],
    levels: Sequence[int],
) -> list[Round | None]:
    inner = paths[0] if paths else None
    pieces = segments(numel, inner) if len(stages) > 1 else [(0, numel)]
    if len(pieces) == 1:
        return staged_rounds(stages, rank, 0, numel, paths=paths, levels=levels)
    first = list(stages[0])

    def inner_rs(lo: int, hi: int) -> list[Round | None]:
        return staged_rounds(stages[:1], rank, lo, hi, allgather=False, paths=paths[:1],
                             levels=levels[:1])

    def outer(lo: int, hi: int) -> list[Round | None]:
        shard = split(lo, hi, len(first))[first.index(rank)]
        return staged_rounds(stages[1:], rank, *shard, paths=paths[1:], levels=levels[1:],
                             first_tag=1)

    def inner_ag(lo: int, hi: int) -> list[Round | None]:
        return staged_rounds(stages[:1], rank, lo, hi, reduce_scatter=False, paths=paths[:1],
                             levels=levels[:1])

    return pipelined(pieces, inner_rs, outer, inner_ag)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
    paths: Sequence[str] = (),
) -> Schedule:
    """Plan a torus collective over ``topology``'s axes; ``paths[d]`` is axis ``d``'s path
    (``p2p``/``ring``: ring rounds; ``shm`` or ``native``: one stage per direction)."""
    def stages_of(member: int) -> list[tuple[int, ...]]:
        return stage_members(topology, member)

    axes = stage_axes(topology)
    chosen = [level_path(paths, axis) for axis in axes]
    name = spec_name("torus", paths)
    return plan_stages(name, collective, stages_of, topology.world_size, rank, numel, chosen,
                       axes)


def spec_name(name: str, paths: Sequence[str]) -> str:
    """``torus[shm,ring]``: the algorithm's name with its level paths, when any is given."""
    return f"{name}[{','.join(paths)}]" if paths else name
