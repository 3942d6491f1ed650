"""Random sequences of Horovod calls under random delays in the negotiation.

Every rank draws the same sequence of calls from a shared seed (allreduce with each op,
allgather of unequal first dimensions, broadcast from a random root, alltoall with splits,
reducescatter of uneven rows, and bursts of named ``*_async`` calls synchronized in a shuffled
order), while a per-rank generator sleeps 0..2 ms before and after the negotiation's wire
operations (starting the control allgather, waiting for it).  Each result must equal its closed
form exactly (small integers in float64), and the run must finish within the harness timeout:
any reordering the delays could expose shows up as a wrong value or a hang.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed
ENV = {"SCALEDL_TIMEOUT": "30"}
CALLS = 25
SEEDS = (11, 12)

Check = Callable[[Any], None]


def _data(rank: int, step: int, rows: int, cols: int = 3) -> torch.Tensor:
    """Rank- and step-seeded integers in float64, so every sum is exact."""
    base = torch.arange(rows * cols, dtype=torch.float64).view(rows, cols)
    return base + 100.0 * rank + 1000.0 * step


def _delayed(negotiation: Any, jitter: random.Random) -> None:
    """Sleep 0..2 ms before and after starting and waiting for each negotiation allgather."""
    original = negotiation._ALLGATHER

    def nap() -> None:
        time.sleep(jitter.uniform(0.0, 0.002))

    class SlowWork:
        def __init__(self, work: Any) -> None:
            self._work = work

        def wait(self) -> Any:
            nap()
            result = self._work.wait()
            nap()
            return result

    def allgather(*args: Any, **kwargs: Any) -> Any:
        nap()
        work = original(*args, **kwargs)
        nap()
        return SlowWork(work) if work is not None else None

    negotiation._ALLGATHER = allgather


def _start(hvd: Any, kind: str, rank: int, world: int, step: int, plan: random.Random,
           name: str) -> tuple[Any, Check]:
    """Start one asynchronous call; its handle and the check of its result."""
    everyone = range(world)
    if kind == "allreduce":
        op = plan.choice([hvd.Sum, hvd.Average, hvd.Min, hvd.Max])
        rows = plan.randint(1, 4)
        mine = [_data(r, step, rows) for r in everyone]
        summed = sum(mine, torch.zeros_like(mine[0]))
        expected = {hvd.Sum: summed, hvd.Average: summed / world, hvd.Min: mine[0],
                    hvd.Max: mine[-1]}[op]
        handle = hvd.allreduce_async(mine[rank], name=name, op=op)
        return handle, lambda out: _equal(out, expected)
    if kind == "allgather":
        counts = [plan.randint(0, 3) for _ in everyone]
        expected = torch.cat([_data(r, step, counts[r]) for r in everyone])
        handle = hvd.allgather_async(_data(rank, step, counts[rank]), name=name)
        return handle, lambda out: _equal(out, expected)
    if kind == "broadcast":
        root = plan.randrange(world)
        handle = hvd.broadcast_async(_data(rank, step, 2), root_rank=root, name=name)
        return handle, lambda out: _equal(out, _data(root, step, 2))
    if kind == "alltoall":
        splits = [[plan.randint(0, 2) for _ in everyone] for _ in everyone]  # [sender][receiver]
        sent = [_data(r, step, sum(splits[r])) for r in everyone]
        pieces = [sent[q].split(splits[q])[rank] for q in everyone]
        handle = hvd.alltoall_async(sent[rank], splits=splits[rank], name=name)

        def check_alltoall(out: Any) -> None:
            output, received = out
            _equal(output, torch.cat(pieces))
            assert received.tolist() == [splits[q][rank] for q in everyone]
        return handle, check_alltoall
    rows = plan.randint(world, 3 * world + 1)
    summed = sum((_data(r, step, rows) for r in everyone), torch.zeros(rows, 3,
                                                                         dtype=torch.float64))
    quotient, extra = divmod(rows, world)
    first = rank * quotient + min(rank, extra)
    mine = summed[first:first + quotient + (1 if rank < extra else 0)]
    handle = hvd.reducescatter_async(_data(rank, step, rows), name=name, op=hvd.Sum)
    return handle, lambda out: _equal(out, mine)


def _equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == expected.shape and torch.equal(out, expected), (out, expected)


KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]


def _delays_worker(rank: int, world: int) -> int:
    import scaledl.horovod as hvd
    from scaledl.horovod import negotiation

    hvd.init()
    checked = 0
    for seed in SEEDS:
        plan = random.Random(seed)  # the same calls on every rank
        _delayed(negotiation, random.Random(seed * 1000 + rank))  # different delays per rank
        step = 0
        while step < CALLS:
            burst = plan.randint(1, 4)  # 1: a blocking call; more: named async calls in flight
            started = []
            for _ in range(burst):
                kind = plan.choice(KINDS)
                started.append(_start(hvd, kind, rank, world, step, plan, f"s{seed}.{step}"))
                step += 1
            order = list(range(len(started)))
            plan.shuffle(order)
            for index in order:
                handle, check = started[index]
                check(hvd.synchronize(handle))
                checked += 1
    hvd.shutdown()
    return checked


def test_random_calls_under_random_negotiation_delays() -> None:
    results = run_ranks(2, _delays_worker, timeout=90, env=ENV)
    assert results[0] == results[1] >= CALLS * len(SEEDS)
