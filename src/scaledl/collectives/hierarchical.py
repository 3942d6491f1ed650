"""Hierarchical: intra-node and inter-node phases (S-Caffe's hierarchical reduce, generalised).

Ranks are grouped by host (the topology's innermost axis).  Steps:

- allreduce:
  1. intra-node ring reduce-scatter: each of the ``L`` ranks of a host ends with ``1/L`` of the
     buffer summed over its host;
  2. inter-node allreduce of that shard among the ranks with the same local rank on every host
     (ring by default; ``halving_doubling`` or ``tree`` via ``inter``), ``L`` of them at once;
  3. intra-node ring allgather.
- reduce (S-Caffe HR): a pipelined chain reduce inside each host to its leader (the rank with the
  root's local rank), then a binomial tree reduce among the leaders to the root.
- broadcast: a binomial tree among the leaders from the root, then a chain inside each host.
- reduce_scatter / allgather: the two-stage form (intra, then inter) of the torus algorithm.

Cost for allreduce with ``L`` ranks per host on ``N`` hosts: intra ``2(L-1)(alpha_0 + beta_0 n/L)``
plus the inter algorithm on ``n/L`` bytes: with a ring, ``2(N-1)(alpha_1 + beta_1 n/(L N))``.  Only
``1/L`` of the bytes cross the slow inter-node links.

Each level runs on a path of its own: inside hosts the ring/chain rounds, or one stage on shared
memory (CPU hosts) or on the backend's own collective (NCCL inside a GPU host, S-Caffe's
"NCCL inside, MPI across"); across hosts ring, halving-doubling, tree, or the backend's own.
``auto`` picks each level's path from the cost model; ``hierarchical[shm,ring]`` fixes them.

Source: Awan et al., "S-Caffe: Co-designing MPI runtimes and Caffe for scalable deep learning on
modern GPU clusters", PPoPP 2017 (hierarchical reduce); the reduce-scatter / allreduce / allgather
form is the two-level BlueConnect decomposition (Cho et al., SysML 2019).
"""

from __future__ import annotations

from collections.abc import Sequence

from scaledl.collectives import chain, halving_doubling, ring, torus, tree
from scaledl.collectives.schedule import (
    Collective, Path, Round, Schedule, Stage, join_rounds, split, stage_round,
)
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "INTER_ALGORITHMS"]

SUPPORTS = frozenset(Collective)
NEEDS_TOPOLOGY = True
LEVELS = True
"""Level 0 (inside hosts) and level 1 (across) can each run on their own path."""
INTER_ALGORITHMS = ("ring", "halving_doubling", "tree")


def _inter_members(topology: Topology, local: int) -> tuple[int, ...]:
    """The rank with local rank ``local`` on every host, by host."""
    return tuple(topology.node_ranks(node)[local] for node in range(topology.num_nodes))


def outer_level(topology: Topology) -> int:
    """The link class of the inter-host phase: the outermost axis of size > 1."""
    return max((axis for axis, size in enumerate(topology.axes) if size > 1), default=0)


def _inter_allreduce(
    inter: str, members: tuple[int, ...], rank: int, lo: int, hi: int, level: int,
) -> list[Round | None]:
    if inter in (Path.SHM.value, Path.NATIVE.value):
        return [stage_round(Stage(Collective.ALLREDUCE, members, lo, hi, Path(inter), level))]
    if inter in ("ring", "p2p"):
        blocks = split(lo, hi, len(members))
        return ring.reduce_scatter_rounds(members, rank, blocks, 1) + ring.allgather_rounds(
            members, rank, blocks, 1
        )
    if inter == "halving_doubling":
        return halving_doubling.allreduce_rounds(members, rank, lo, hi, 1)
    if inter == "tree":
        root = members[0]
        return tree.reduce_rounds(members, rank, root, lo, hi, 1) + tree.broadcast_rounds(
            members, rank, root, lo, hi, 1
        )
    raise ValueError(f"unknown inter-node algorithm {inter!r}; use one of {INTER_ALGORITHMS}, "
                     "shm or native")


def _intra(
    collective: Collective, intra: tuple[int, ...], rank: int, lo: int, hi: int,
    path: Path | None,
) -> list[Round | None]:
    blocks = split(lo, hi, len(intra))
    if path is not None:
        return [stage_round(Stage(collective, intra, lo, hi, path, 0))]
    if collective is Collective.REDUCE_SCATTER:
        return ring.reduce_scatter_rounds(intra, rank, blocks, 0)
    return ring.allgather_rounds(intra, rank, blocks, 0)


def _allreduce(
    topology: Topology, rank: int, numel: int, paths: Sequence[str],
) -> tuple[Round, ...]:
    """Per segment: reduce-scatter inside the host, allreduce of the shard across hosts,
    allgather inside the host; segment ``k``'s host stages are placed between segment
    ``k-1``'s inter-host rounds and segment ``k-2``'s allgather, so the executor runs the
    shared-memory work of one segment while the network moves another's."""
    intra = topology.node_ranks(topology.node(rank))
    members = _inter_members(topology, topology.local_rank(rank))
    local_path = torus.level_path(paths, 0)
    inter = paths[1] if len(paths) > 1 else "ring"
    level = outer_level(topology)

    def inner(lo: int, hi: int) -> list[Round | None]:
        return _intra(Collective.REDUCE_SCATTER, intra, rank, lo, hi, local_path)

    def outer(lo: int, hi: int) -> list[Round | None]:
        shard_lo, shard_hi = split(lo, hi, len(intra))[intra.index(rank)]
        return _inter_allreduce(inter, members, rank, shard_lo, shard_hi, level)

    def inner_back(lo: int, hi: int) -> list[Round | None]:
        return _intra(Collective.ALLGATHER, intra, rank, lo, hi, local_path)

    return join_rounds(torus.pipelined(torus.segments(numel, local_path), inner, outer,
                                       inner_back))


def _rooted(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int,
    paths: Sequence[str],
) -> tuple[Round, ...]:
    intra = topology.node_ranks(topology.node(rank))
    leaders = _inter_members(topology, topology.local_rank(root))
    leader = intra[topology.local_rank(root)]
    is_leader = rank == leader
    local_path, across_path = torus.level_path(paths, 0), torus.level_path(paths, 1)
    level = outer_level(topology)
    local: Sequence[Round | None]
    if local_path is not None:
        local = [stage_round(Stage(collective, intra, 0, numel, local_path, 0, leader))]
    elif collective is Collective.REDUCE:
        local = chain.chain_rounds(intra, rank, leader, 0, numel, reduce=True, broadcast=False)
    else:
        local = chain.chain_rounds(intra, rank, leader, 0, numel, reduce=False, broadcast=True)
    across: Sequence[Round | None]
    if not is_leader:
        across = []
    elif across_path is not None:
        across = [stage_round(Stage(collective, leaders, 0, numel, across_path, level, root))]
    elif collective is Collective.REDUCE:
        across = tree.reduce_rounds(leaders, rank, root, 0, numel, 1)
    else:
        across = tree.broadcast_rounds(leaders, rank, root, 0, numel, 1)
    if collective is Collective.REDUCE:
        return join_rounds(local, across)
    return join_rounds(across, local)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
    paths: Sequence[str] = (),
) -> Schedule:
    """Plan a hierarchical collective over ``topology``'s hosts; ``paths`` = (inside hosts,
    across hosts), each ``p2p`` (the default rounds), ``shm`` or ``native``; across hosts also
    ``ring``, ``halving_doubling`` or ``tree`` for allreduce."""
    p = topology.world_size
    name = torus.spec_name("hierarchical", paths)
    if collective is Collective.ALLREDUCE:
        rounds = _allreduce(topology, rank, numel, paths)
        return Schedule(collective, name, rank, p, numel, rounds)
    if collective in (Collective.REDUCE, Collective.BROADCAST):
        rounds = _rooted(collective, topology, rank, numel, root, paths)
        return Schedule(collective, name, rank, p, numel, rounds)

    def stages_of(member: int) -> list[tuple[int, ...]]:
        intra = topology.node_ranks(topology.node(member))
        across = _inter_members(topology, topology.local_rank(member))
        return [group for group in (intra, across) if len(group) > 1]

    intra_size = topology.ranks_per_node
    levels = [0, outer_level(topology)] if intra_size > 1 else [outer_level(topology)]
    chosen = [torus.level_path(paths, 0), torus.level_path(paths, 1)]
    chosen = chosen if intra_size > 1 else chosen[1:]
    return torus.plan_stages(name, collective, stages_of, p, rank, numel, chosen, levels)
