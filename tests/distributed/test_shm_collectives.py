"""The shared-memory path against torch.distributed's own results.

Every collective x op x dtype, world sizes 1..5, element counts 0, 1, p-1, p+1 and a prime above
10^5 that streams through many windows (64 KiB windows here), two groups in use at once, and the
shared-memory path back to back with other algorithms on one group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import scaledl
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
OPS = ("sum", "avg", "min", "max")
SMALL_WINDOW = {"SCALEDL_SHM_WINDOW_MB": "0.0625"}
PRIME = 100_003


def _data(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(97 * rank + salt)
    return torch.randint(-8, 9, (numel,), generator=gen).to(dtype)


def _torch_op(op: str) -> dist.ReduceOp:
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX}[op]


def _finish(tensor: torch.Tensor, op: str, p: int) -> torch.Tensor:
    if op != "avg":
        return tensor
    if tensor.is_floating_point():
        return tensor / p
    return torch.div(tensor, p, rounding_mode="floor")


def _one(collective: str, rank: int, p: int, numel: int, dtype: torch.dtype, op: str,
         algorithm: str = "shm", group: dist.ProcessGroup | None = None) -> bool:
    x = _data(rank, numel, dtype)
    root = p - 1
    reference = dtype if dtype not in (torch.float16, torch.bfloat16) else torch.float32
    if collective == "allreduce":
        got = x.clone()
        scaledl.allreduce(got, op=op, algorithm=algorithm, group=group)
        want = x.to(reference, copy=True)
        dist.all_reduce(want, op=_torch_op(op), group=group)
        want = _finish(want, op, p).to(dtype)
    elif collective == "reduce":
        got = x.clone()
        scaledl.reduce(got, dst=root, op=op, algorithm=algorithm, group=group)
        want = x.to(reference, copy=True)
        dist.all_reduce(want, op=_torch_op(op), group=group)
        want = _finish(want, op, p).to(dtype) if rank == root else x
    elif collective == "broadcast":
        got = x.clone()
        scaledl.broadcast(got, src=root, algorithm=algorithm, group=group)
        want = x.clone()
        dist.broadcast(want, src=dist.get_global_rank(group or dist.group.WORLD, root),
                       group=group)
    elif collective == "reduce_scatter":
        full = _data(rank, numel * p, dtype, 1)
        got = torch.empty(numel, dtype=dtype)
        scaledl.reduce_scatter(got, full, op=op, algorithm=algorithm, group=group)
        total = full.to(reference, copy=True)
        dist.all_reduce(total, op=_torch_op(op), group=group)
        want = _finish(total, op, p).to(dtype)[rank * numel:(rank + 1) * numel]
    else:
        got = torch.empty(numel * p, dtype=dtype)
        scaledl.allgather(got, x, algorithm=algorithm, group=group)
        parts = [torch.empty(numel, dtype=dtype) for _ in range(p)]
        dist.all_gather(parts, x, group=group)
        want = torch.cat(parts)
    return torch.equal(got, want)


COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def _every_case(rank: int, p: int) -> list[str]:
    scaledl.init()
    failures = []
    for numel in sorted({0, 1, max(p - 1, 0), p + 1, PRIME}):
        for collective in COLLECTIVES:
            for dtype in DTYPES:
                ops = OPS if collective in ("allreduce", "reduce", "reduce_scatter") else ("sum",)
                for op in ops:
                    if numel == PRIME and (dtype, op) not in ((torch.float32, "sum"),
                                                              (torch.bfloat16, "max"),
                                                              (torch.int64, "avg")):
                        continue
                    if not _one(collective, rank, p, numel, dtype, op):
                        failures.append(f"{collective} {dtype} {op} numel={numel}")
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_collective_op_and_dtype_matches_torch(world_size: int) -> None:
    results = run_ranks(world_size, _every_case, timeout=240, env=SMALL_WINDOW)
    assert [f for per_rank in results for f in per_rank] == []


def _two_groups_and_neighbours(rank: int, p: int) -> list[str]:
    scaledl.init()
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    failures = []
    for numel in (7, PRIME):
        handles = []
        a, b = _data(rank, numel, torch.float32), _data(rank, numel, torch.float32, 5)
        a_want, b_want = a.clone(), b.clone()
        dist.all_reduce(a_want)
        dist.all_reduce(b_want, group=mine)
        handles.append(scaledl.allreduce(a, algorithm="shm", async_op=True))
        handles.append(scaledl.allreduce(b, algorithm="shm", group=mine, async_op=True))
        for handle in handles:
            assert handle is not None
            handle.wait()
        if not (torch.equal(a, a_want) and torch.equal(b, b_want)):
            failures.append(f"two groups numel={numel}")
        for algorithm in ("ring", "shm", "native", "shm", "halving_doubling", "auto", "shm"):
            if not _one("allreduce", rank, p, numel, torch.float32, "sum", algorithm):
                failures.append(f"back to back {algorithm} numel={numel}")
    return failures


def test_two_groups_at_once_and_back_to_back_with_other_algorithms() -> None:
    results = run_ranks(4, _two_groups_and_neighbours, timeout=180, env=SMALL_WINDOW)
    assert [f for per_rank in results for f in per_rank] == []


def _large_default_window(rank: int, p: int) -> bool:
    scaledl.init()
    numel = 3 * (4 << 20) // 4 + 12_345  # allreduce: six 2 MiB pieces and a small last one
    one_split_piece = (3 << 19) // 4 + 7  # 1.5 MiB: above the one-piece limit, below a piece
    return _one("allreduce", rank, p, numel, torch.float32, "sum") and _one(
        "allreduce", rank, p, one_split_piece, torch.float32, "sum") and _one(
        "reduce_scatter", rank, p, numel // 8, torch.float32, "max")


def test_tensor_larger_than_the_default_window() -> None:
    assert run_ranks(2, _large_default_window, timeout=120) == [True, True]


def _auto_takes_shm(rank: int, p: int) -> list[str]:
    scaledl.init()
    return [scaledl.explain("allreduce", n).splitlines()[0] for n in (1024, 1 << 22)]


def test_auto_chooses_shared_memory_inside_one_host() -> None:
    for lines in run_ranks(2, _auto_takes_shm, timeout=60):
        assert all(line == "auto chose shm:" for line in lines), lines


def _arena_buckets(rank: int, p: int) -> tuple[bool, float]:
    from torch import nn

    from scaledl.collectives.communicator import communicator_for

    scaledl.init()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(30, 200), nn.ReLU(), nn.Linear(200, 7))
    ref = nn.Sequential(nn.Linear(30, 200), nn.ReLU(), nn.Linear(200, 7))
    ref.load_state_dict(net.state_dict())
    model = scaledl.DataParallel(net, bucket_mb=0.02)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    shm = communicator_for(None).shm
    in_place = shm is not None and all(shm.locate(b) is not None for b in model.reducer.buffers)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, ref))
    for _ in range(4):
        x, y = torch.randn(6, 30) * (rank + 1), torch.randint(0, 7, (6,))
        for wrapped, optimizer in ((model, opt), (ddp, ref_opt)):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(wrapped(x), y).backward()
            optimizer.step()
    return in_place, max(float((a - b).abs().max()) for a, b in zip(net.parameters(),
                                                                       ref.parameters()))


@pytest.mark.parametrize("world_size", [2, 3])
def test_data_parallel_buckets_live_in_shared_memory_and_match_ddp(world_size: int) -> None:
    for in_place, difference in run_ranks(world_size, _arena_buckets, timeout=120):
        assert in_place and difference < 1e-6


def _uneven_hosts(rank: int, p: int) -> tuple[list[int], bool, bool, bool]:
    import os

    from scaledl.collectives.communicator import communicator_for

    os.environ["SCALEDL_HOSTNAME"] = "a" if rank < 2 else "b"  # hosts of 2 and 1 ranks
    scaledl.init()
    comm = communicator_for(None)
    joined = sorted(peer.global_rank for peer in comm.shm.peers) if comm.shm else []
    whole = _one("allreduce", rank, p, PRIME, torch.float32, "sum", "auto")
    pair = dist.new_group([0, 1])
    on_a = True
    if rank < 2:
        on_a = communicator_for(pair).fabric.one_host and _one(
            "allreduce", rank, 2, PRIME, torch.float32, "sum", "shm", pair)
    return joined, whole, on_a, comm.fabric.one_host


def test_uneven_hosts_share_memory_per_host() -> None:
    results = run_ranks(3, _uneven_hosts, timeout=120)
    assert [r[0] for r in results] == [[0, 1], [0, 1], []]
    assert all(whole and on_a and not one_host for _, whole, on_a, one_host in results)
