"""Run a scaledl schedule on in-process thread-ranks and build rank-valued inputs."""

from __future__ import annotations

import torch

from scaledl.collectives import registry
from scaledl.collectives.executor import (
    Workspace, execute, execute_allgather, execute_reduce_scatter,
)
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology
from scaledl.transport.loopback import LoopbackTransport, run_threads


def rank_input(rank: int, numel: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rank ``r`` contributes ``(r + 1) * (i % 7 + 1)`` at index ``i``: exact in every dtype."""
    pattern = torch.arange(numel, dtype=torch.int64) % 7 + 1
    return (pattern * (rank + 1)).to(dtype)


def expected(op: ReduceOp, p: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Closed form of reducing ``rank_input`` over ``p`` ranks."""
    pattern = (torch.arange(numel, dtype=torch.int64) % 7 + 1).to(torch.float64)
    factor = {ReduceOp.SUM: p * (p + 1) / 2, ReduceOp.MIN: 1.0, ReduceOp.MAX: float(p),
              ReduceOp.AVG: (p + 1) / 2}[op]
    result = pattern * factor
    if not dtype.is_floating_point:
        result = torch.floor(result)
    return result.to(dtype)


def run_loopback(
    collective: Collective, algorithm: str, topology: Topology, numel: int,
    op: ReduceOp = ReduceOp.SUM, root: int = 0, dtype: torch.dtype = torch.float64,
    chunk_numel: int = 997,
) -> list[torch.Tensor]:
    """Run one collective on every thread-rank; return each rank's result tensor."""
    p = topology.world_size

    def body(transport: LoopbackTransport) -> torch.Tensor:
        rank = transport.rank
        schedule = registry.plan(algorithm, collective, topology, rank, numel, root)
        schedule.validate()
        workspace = Workspace()
        if collective is Collective.REDUCE_SCATTER:
            out = torch.zeros(numel, dtype=dtype)
            execute_reduce_scatter(schedule, rank_input(rank, numel * p, dtype), out, transport,
                                   op, chunk_numel, workspace)
            op.finish(out, p)
            return out
        if collective is Collective.ALLGATHER:
            out = torch.zeros(numel * p, dtype=dtype)
            shard = torch.full((numel,), rank + 1, dtype=dtype)
            execute_allgather(schedule, shard, out, transport, chunk_numel, workspace)
            return out
        if collective is Collective.BROADCAST:
            buffer = rank_input(rank, numel, dtype)
            if rank != root:
                buffer.zero_()
        else:
            buffer = rank_input(rank, numel, dtype)
        execute(schedule, buffer, transport, op, chunk_numel, workspace)
        if collective is Collective.ALLREDUCE or rank == root:
            op.finish(buffer, p)
        return buffer

    return run_threads(p, body, timeout=20.0)


def topologies(p: int) -> list[Topology]:
    """Explicit layouts of ``p`` ranks: one axis, and every two- and three-axis factorisation."""
    layouts = [(p,)]
    for a in range(2, p):
        if p % a == 0:
            layouts.append((a, p // a))
            rest = p // a
            for b in range(2, rest):
                if rest % b == 0:
                    layouts.append((a, b, rest // b))
    layouts.append((1, p))
    return [Topology(axes, explicit=True) for axes in layouts]
