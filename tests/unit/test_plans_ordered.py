"""NCCL's matching rule on thread-ranks: tags ignored, messages between two ranks matched in
posting order.  Every scheduled algorithm must give exact results under it (the executor posts
each peer's operations in one schedule order); without that, multiring's rings swap chunks.

Inputs encode the element index, so a chunk that lands at the wrong offset changes the result.
"""

from __future__ import annotations

import pytest
import torch

from scaledl.collectives import registry
from scaledl.collectives.dataflow import compile_schedule, run_ops
from scaledl.collectives.executor import (
    Workspace, execute, execute_allgather, execute_reduce_scatter,
)
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.registry import ALGORITHMS
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology
from scaledl.transport.loopback import LoopbackTransport, run_threads
from tests.helpers_loopback import topologies

SCHEDULED = [name for name, algo in ALGORITHMS.items() if algo.scheduled and not algo.needs_shm]


def indexed(rank: int, numel: int) -> torch.Tensor:
    """``i + 1000 r``: every element of every rank distinct."""
    return torch.arange(numel, dtype=torch.float64) + 1000.0 * rank


def layouts(name: str, p: int) -> list[Topology]:
    return topologies(p) if ALGORITHMS[name].needs_topology else [Topology.flat(p)]


def run_ordered(
    collective: Collective, name: str, topology: Topology, numel: int, root: int = 0,
) -> list[torch.Tensor]:
    p = topology.world_size

    def body(transport: LoopbackTransport) -> torch.Tensor:
        rank = transport.rank
        schedule = registry.plan(name, collective, topology, rank, numel, root)
        workspace = Workspace()
        if collective is Collective.REDUCE_SCATTER:
            out = torch.zeros(numel, dtype=torch.float64)
            execute_reduce_scatter(schedule, indexed(rank, numel * p), out, transport,
                                   ReduceOp.SUM, 7, workspace)
            return out
        if collective is Collective.ALLGATHER:
            out = torch.zeros(numel * p, dtype=torch.float64)
            execute_allgather(schedule, indexed(rank, numel), out, transport, 7, workspace)
            return out
        buffer = indexed(rank, numel)
        if collective is Collective.BROADCAST and rank != root:
            buffer.zero_()
        execute(schedule, buffer, transport, ReduceOp.SUM, 7, workspace)
        return buffer

    return run_threads(p, body, timeout=20.0, ordered=True)


def want(collective: Collective, p: int, numel: int, rank: int, root: int) -> torch.Tensor | None:
    total = sum(indexed(r, numel * (p if collective is Collective.REDUCE_SCATTER else 1))
                for r in range(p))
    assert isinstance(total, torch.Tensor)
    if collective is Collective.ALLREDUCE:
        return total
    if collective is Collective.REDUCE:
        return total if rank == root else None
    if collective is Collective.BROADCAST:
        return indexed(root, numel)
    if collective is Collective.REDUCE_SCATTER:
        return total[rank * numel:(rank + 1) * numel]
    return torch.cat([indexed(r, numel) for r in range(p)])


CASES = [
    (collective, name, p)
    for collective in Collective for name in SCHEDULED
    if collective in ALGORITHMS[name].supports for p in (2, 3, 4, 6)
]


@pytest.mark.parametrize(("collective", "name", "p"), CASES)
def test_exact_when_tags_are_ignored(collective: Collective, name: str, p: int) -> None:
    for topology in layouts(name, p):
        for numel in (1, p + 1, 200):
            root = p - 1 if collective in (Collective.BROADCAST, Collective.REDUCE) else 0
            results = run_ordered(collective, name, topology, numel, root)
            for rank, result in enumerate(results):
                expected = want(collective, p, numel, rank, root)
                if expected is not None:
                    torch.testing.assert_close(
                        result, expected, rtol=0, atol=0,
                        msg=f"{name} {collective.value} {topology.spec} numel {numel} rank {rank}",
                    )


def test_multiring_mixes_chunks_without_per_peer_order() -> None:
    """The defect this guards against: queues kept per tag on a tag-less transport."""
    topology = Topology.flat(2)
    numel = 224  # every chunk 7 elements: a misrouted chunk fits and corrupts silently

    def body(transport: LoopbackTransport) -> torch.Tensor:
        schedule = registry.plan("multiring", Collective.ALLREDUCE, topology, transport.rank,
                                 numel)
        program = compile_schedule(schedule, 7, by_peer=False)
        buffer = indexed(transport.rank, numel)
        scratch = torch.empty(32 * program.slot_numel, dtype=torch.float64)
        run_ops(program, buffer, transport, ReduceOp.SUM, scratch, 32)
        return buffer

    results = run_threads(2, body, timeout=20.0, ordered=True)
    assert not torch.equal(results[0], indexed(0, numel) + indexed(1, numel))
