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

Source: Awan et al., "S-Caffe: Co-designing MPI runtimes and Caffe for scalable deep learning on
modern GPU clusters", PPoPP 2017 (hierarchical reduce); the reduce-scatter / allreduce / allgather
form is the two-level BlueConnect decomposition (Cho et al., SysML 2019).
"""

from __future__ import annotations

from scaledl.collectives import chain, halving_doubling, ring, torus, tree
from scaledl.collectives.schedule import Collective, Round, Schedule, join_rounds, split
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS", "INTER_ALGORITHMS"]

SUPPORTS = frozenset(Collective)
NEEDS_TOPOLOGY = True
INTER_ALGORITHMS = ("ring", "halving_doubling", "tree")


def _inter_members(topology: Topology, local: int) -> tuple[int, ...]:
    """The rank with local rank ``local`` on every host, by host."""
    return tuple(topology.node_ranks(node)[local] for node in range(topology.num_nodes))


def _inter_allreduce(
    inter: str, members: tuple[int, ...], rank: int, lo: int, hi: int
) -> list[Round | None]:
    if inter == "ring":
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
    raise ValueError(f"unknown inter-node algorithm {inter!r}; use one of {INTER_ALGORITHMS}")


def _allreduce(topology: Topology, rank: int, numel: int, inter: str) -> tuple[Round, ...]:
    intra = topology.node_ranks(topology.node(rank))
    blocks = split(0, numel, len(intra))
    lo, hi = blocks[intra.index(rank)]
    members = _inter_members(topology, topology.local_rank(rank))
    return join_rounds(
        ring.reduce_scatter_rounds(intra, rank, blocks, 0),
        _inter_allreduce(inter, members, rank, lo, hi),
        ring.allgather_rounds(intra, rank, blocks, 0),
    )


def _rooted(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int
) -> tuple[Round, ...]:
    intra = topology.node_ranks(topology.node(rank))
    leaders = _inter_members(topology, topology.local_rank(root))
    leader = intra[topology.local_rank(root)]
    is_leader = rank == leader
    if collective is Collective.REDUCE:
        local = chain.chain_rounds(intra, rank, leader, 0, numel, reduce=True, broadcast=False)
        across = tree.reduce_rounds(leaders, rank, root, 0, numel, 1) if is_leader else []
        return join_rounds(local, across)
    across = tree.broadcast_rounds(leaders, rank, root, 0, numel, 1) if is_leader else []
    local = chain.chain_rounds(intra, rank, leader, 0, numel, reduce=False, broadcast=True)
    return join_rounds(across, local)


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
    inter: str = "ring",
) -> Schedule:
    """Plan a hierarchical collective over ``topology``'s hosts."""
    p = topology.world_size
    if collective is Collective.ALLREDUCE:
        rounds = _allreduce(topology, rank, numel, inter)
        return Schedule(collective, "hierarchical", rank, p, numel, rounds)
    if collective in (Collective.REDUCE, Collective.BROADCAST):
        rounds = _rooted(collective, topology, rank, numel, root)
        return Schedule(collective, "hierarchical", rank, p, numel, rounds)

    def stages_of(member: int) -> list[tuple[int, ...]]:
        intra = topology.node_ranks(topology.node(member))
        across = _inter_members(topology, topology.local_rank(member))
        return [group for group in (intra, across) if len(group) > 1]

    return torus.plan_stages("hierarchical", collective, stages_of, p, rank, numel)
