"""Run a scaledl schedule on in-process thread-ranks and build rank-valued inputs."""

from __future__ import annotations

import threading

import torch

from scaledl.collectives import registry
from scaledl.collectives.executor import (
    Workspace, execute, execute_allgather, execute_reduce_scatter,
)
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective, Stage
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


class LoopbackStages:
    """A stage runner for thread-ranks: the reference meaning of every stage, computed from the
    members' deposited slices (shared memory and backend stages are tested on processes)."""

    def __init__(self, world_size: int) -> None:
        self.lock = threading.Lock()
        self.meetings: dict[tuple[tuple[int, ...], int], dict[str, object]] = {}
        self.counts: dict[tuple[int, tuple[int, ...]], int] = {}

    def runner(self, rank: int) -> _RankStages:
        return _RankStages(self, rank)

    def meet(self, rank: int, stage: Stage, piece: torch.Tensor) -> dict[int, torch.Tensor]:
        with self.lock:
            k = self.counts.get((rank, stage.members), 0)
            self.counts[(rank, stage.members)] = k + 1
            meeting = self.meetings.setdefault(
                (stage.members, k),
                {"barrier": threading.Barrier(len(stage.members)), "pieces": {}},
            )
        pieces = meeting["pieces"]
        barrier = meeting["barrier"]
        assert isinstance(pieces, dict) and isinstance(barrier, threading.Barrier)
        pieces[rank] = piece.clone()
        barrier.wait(timeout=20)
        return pieces


class _RankStages:
    def __init__(self, shared: LoopbackStages, rank: int) -> None:
        self.shared, self.rank = shared, rank

    def run(self, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
        piece = buffer[stage.lo:stage.hi]
        pieces = self.shared.meet(self.rank, stage, piece)
        ordered = [pieces[m] for m in stage.members]
        reduced = ordered[0].clone()
        for other in ordered[1:]:
            op.combine(reduced, other)
        collective = stage.collective
        if collective is Collective.ALLREDUCE or (
            collective is Collective.REDUCE and self.rank == stage.root
        ):
            piece.copy_(reduced)
        elif collective is Collective.BROADCAST:
            piece.copy_(pieces[stage.root])
        elif collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER):
            for index, (lo, hi) in enumerate(stage.parts()):
                member = stage.members[index]
                source = reduced if collective is Collective.REDUCE_SCATTER else pieces[member]
                if collective is Collective.ALLGATHER or member == self.rank:
                    buffer[lo:hi].copy_(source[lo - stage.lo:hi - stage.lo])


def run_loopback(
    collective: Collective, algorithm: str, topology: Topology, numel: int,
    op: ReduceOp = ReduceOp.SUM, root: int = 0, dtype: torch.dtype = torch.float64,
    chunk_numel: int = 997,
) -> list[torch.Tensor]:
    """Run one collective on every thread-rank; return each rank's result tensor."""
    p = topology.world_size
    shared = LoopbackStages(p)

    def body(transport: LoopbackTransport) -> torch.Tensor:
        rank = transport.rank
        stages = shared.runner(rank)
        schedule = registry.plan(algorithm, collective, topology, rank, numel, root)
        schedule.validate()
        workspace = Workspace()
        if collective is Collective.REDUCE_SCATTER:
            out = torch.zeros(numel, dtype=dtype)
            execute_reduce_scatter(schedule, rank_input(rank, numel * p, dtype), out, transport,
                                   op, chunk_numel, workspace, stages)
            op.finish(out, p)
            return out
        if collective is Collective.ALLGATHER:
            out = torch.zeros(numel * p, dtype=dtype)
            shard = torch.full((numel,), rank + 1, dtype=dtype)
            execute_allgather(schedule, shard, out, transport, chunk_numel, workspace, stages)
            return out
        if collective is Collective.BROADCAST:
            buffer = rank_input(rank, numel, dtype)
            if rank != root:
                buffer.zero_()
        else:
            buffer = rank_input(rank, numel, dtype)
        execute(schedule, buffer, transport, op, chunk_numel, workspace, stages)
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
