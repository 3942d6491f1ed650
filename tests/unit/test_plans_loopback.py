"""Every collective x algorithm x world size x awkward numel on thread-ranks, against closed
forms."""

from __future__ import annotations

import pytest
import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.registry import ALGORITHMS
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology
from tests.helpers_loopback import expected, rank_input, run_loopback, topologies

SCHEDULED = [name for name, algo in ALGORITHMS.items() if algo.scheduled]
WORLD_SIZES = range(1, 10)


def numels(p: int) -> list[int]:
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 1000, 10007})


def layouts_for(name: str, p: int) -> list[Topology]:
    if ALGORITHMS[name].needs_topology:
        return topologies(p)
    return [Topology.flat(p)]


def cases(collective: Collective) -> list[tuple[str, int]]:
    return [
        (name, p) for name in SCHEDULED if collective in ALGORITHMS[name].supports
        for p in WORLD_SIZES
    ]


def check_reduced(results: list[torch.Tensor], want: torch.Tensor, ranks: list[int]) -> None:
    for rank in ranks:
        torch.testing.assert_close(results[rank], want, rtol=0, atol=0, msg=f"rank {rank}")


@pytest.mark.parametrize(("name", "p"), cases(Collective.ALLREDUCE))
def test_allreduce(name: str, p: int) -> None:
    for topology in layouts_for(name, p):
        for numel in numels(p):
            results = run_loopback(Collective.ALLREDUCE, name, topology, numel)
            check_reduced(results, expected(ReduceOp.SUM, p, numel, torch.float64), list(range(p)))


@pytest.mark.parametrize(("name", "p"), cases(Collective.REDUCE_SCATTER))
def test_reduce_scatter(name: str, p: int) -> None:
    for topology in layouts_for(name, p):
        for numel in numels(p):
            results = run_loopback(Collective.REDUCE_SCATTER, name, topology, numel)
            full = expected(ReduceOp.SUM, p, numel * p, torch.float64)
            for rank in range(p):
                torch.testing.assert_close(results[rank], full[rank * numel:(rank + 1) * numel])


@pytest.mark.parametrize(("name", "p"), cases(Collective.ALLGATHER))
def test_allgather(name: str, p: int) -> None:
    for topology in layouts_for(name, p):
        for numel in numels(p):
            results = run_loopback(Collective.ALLGATHER, name, topology, numel)
            want = torch.arange(1, p + 1, dtype=torch.float64).repeat_interleave(numel)
            check_reduced(results, want, list(range(p)))


@pytest.mark.parametrize(("name", "p"), cases(Collective.BROADCAST))
def test_broadcast(name: str, p: int) -> None:
    for topology in layouts_for(name, p):
        for root in sorted({0, p - 1, p // 2}):
            for numel in numels(p):
                results = run_loopback(Collective.BROADCAST, name, topology, numel, root=root)
                check_reduced(results, rank_input(root, numel), list(range(p)))


@pytest.mark.parametrize(("name", "p"), cases(Collective.REDUCE))
def test_reduce(name: str, p: int) -> None:
    for topology in layouts_for(name, p):
        for root in sorted({0, p - 1, p // 2}):
            for numel in numels(p):
                results = run_loopback(Collective.REDUCE, name, topology, numel, root=root)
                check_reduced(results, expected(ReduceOp.SUM, p, numel, torch.float64), [root])


ALLREDUCE_ALGORITHMS = [n for n in SCHEDULED if Collective.ALLREDUCE in ALGORITHMS[n].supports]


@pytest.mark.parametrize("op", list(ReduceOp))
@pytest.mark.parametrize("name", ALLREDUCE_ALGORITHMS)
def test_allreduce_ops(name: str, op: ReduceOp) -> None:
    for p in (3, 4, 6):
        topology = layouts_for(name, p)[-1]
        results = run_loopback(Collective.ALLREDUCE, name, topology, 1000, op=op, chunk_numel=61)
        check_reduced(results, expected(op, p, 1000, torch.float64), list(range(p)))
