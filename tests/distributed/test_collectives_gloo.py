"""Every algorithm on real processes over Gloo, checked against torch.distributed's own result.

Several algorithms run back to back on one group, which catches tag and buffer reuse bugs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives import available
from scaledl.topology import Topology
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

NUMELS = (0, 1, 5, 1000, 70_001)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def _topology(world_size: int) -> Topology:
    if world_size % 2 == 0 and world_size > 2:
        return Topology.parse(f"2x{world_size // 2}", world_size)
    return Topology(axes=(1, world_size), explicit=True)


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234 + rank)
    return torch.randint(-8, 9, (numel,), generator=gen).to(dtype)


def _all_algorithms(rank: int, world_size: int) -> list[str]:
    topology = _topology(world_size)
    failures = []
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        for name in available(collective):
            for numel in NUMELS:
                failures += _check(collective, name, rank, world_size, numel, topology)
    return failures


def _check(
    collective: str, name: str, rank: int, p: int, numel: int, topology: Topology
) -> list[str]:
    x = _data(rank, numel, torch.float32)
    root = p - 1
    if collective == "allreduce":
        got, want = x.clone(), x.clone()
        scaledl.allreduce(got, algorithm=name, topology=topology)
        dist.all_reduce(want)
    elif collective == "broadcast":
        got, want = x.clone(), x.clone()
        scaledl.broadcast(got, src=root, algorithm=name, topology=topology)
        dist.broadcast(want, src=root)
    elif collective == "reduce":
        got, want = x.clone(), x.clone()
        scaledl.reduce(got, dst=root, algorithm=name, topology=topology)
        dist.all_reduce(want)
        if rank != root:
            want = x
    elif collective == "reduce_scatter":
        full = _data(rank, numel * p, torch.float32)
        got = torch.empty(numel)
        scaledl.reduce_scatter(got, full, algorithm=name, topology=topology)
        total = full.clone()
        dist.all_reduce(total)
        want = total[rank * numel:(rank + 1) * numel]
    else:
        got = torch.empty(numel * p)
        scaledl.allgather(got, x, algorithm=name, topology=topology)
        parts = [torch.empty(numel) for _ in range(p)]
        dist.all_gather(parts, x)
        want = torch.cat(parts)
    if not torch.equal(got, want):
        return [f"{collective}/{name} numel={numel} rank={rank}"]
    return []


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_every_algorithm_matches_torch(world_size: int) -> None:
    results = run_ranks(world_size, _all_algorithms, timeout=150)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, failures


def _dtypes_and_ops(rank: int, world_size: int) -> list[str]:
    failures = []
    for dtype in DTYPES:
        for op in ("sum", "avg", "min", "max"):
            for name in ("ring", "halving_doubling", "tree", "native"):
                x = _data(rank, 1001, dtype)
                got = x.clone()
                scaledl.allreduce(got, op=op, algorithm=name)
                ref = x.to(torch.float64)
                torch_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
                            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
                dist.all_reduce(ref, op=torch_op)
                if op == "avg":
                    ref = ref / world_size
                    if not dtype.is_floating_point:
                        ref = torch.floor(ref)
                tolerance = 0.05 if dtype in (torch.float16, torch.bfloat16) else 1e-6
                if not torch.allclose(got.to(torch.float64), ref, atol=tolerance, rtol=0.01):
                    failures.append(f"{dtype} {op} {name}")
    return failures


def test_dtypes_and_ops() -> None:
    results = run_ranks(3, _dtypes_and_ops, timeout=120)
    assert not [f for r in results for f in r]


def _async_and_noncontiguous(rank: int, world_size: int) -> bool:
    tensors = [torch.full((3000,), float(rank + i)) for i in range(6)]
    handles = [scaledl.allreduce(t, algorithm=("ring", "tree", "native")[i % 3], async_op=True)
               for i, t in enumerate(tensors)]
    for handle in handles:
        assert handle is not None
        handle.wait()
    total = sum(range(world_size))
    for i, t in enumerate(tensors):
        assert torch.all(t == total + i * world_size), (i, t[:3])
    matrix = torch.arange(40.0).reshape(8, 5) * (rank + 1)
    column = matrix[:, 1]
    assert not column.is_contiguous()
    scaledl.allreduce(column, algorithm="ring")
    factor = world_size * (world_size + 1) / 2
    assert torch.equal(matrix[:, 1], torch.arange(40.0).reshape(8, 5)[:, 1] * factor)
    assert torch.equal(matrix[:, 0], torch.arange(40.0).reshape(8, 5)[:, 0] * (rank + 1))
    return True


def test_async_handles_and_noncontiguous() -> None:
    assert all(run_ranks(3, _async_and_noncontiguous, timeout=60))
