"""scaledl.horovod's collectives against torch.distributed's results on real Gloo ranks.

Each rank contributes rank-seeded data; every call's result is compared with what
torch.distributed computes on the same tensors (or a closed form where torch has no such call).
One process group runs the calls under two algorithm choices back to back.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed
ENV = {"SCALEDL_TIMEOUT": "30"}


def _reference(tensor: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
    out = tensor.clone()
    dist.all_reduce(out, op=op)
    return out


def _check_allreduce(rank: int, world: int) -> None:
    import scaledl.horovod as hvd

    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(rank))
    before = x.clone()
    total = _reference(x, dist.ReduceOp.SUM)
    torch.testing.assert_close(hvd.allreduce(x), total / world)
    torch.testing.assert_close(hvd.allreduce(x, op=hvd.Sum, name="sum"), total)
    torch.testing.assert_close(hvd.allreduce(x, average=False), total)
    for op, torch_op in ((hvd.Min, dist.ReduceOp.MIN), (hvd.Max, dist.ReduceOp.MAX),
                         (hvd.Product, dist.ReduceOp.PRODUCT)):
        torch.testing.assert_close(hvd.allreduce(x, op=op), _reference(x, torch_op))
    torch.testing.assert_close(
        hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25), total * 0.5)
    torch.testing.assert_close(
        hvd.allreduce(x, prescale_factor=3.0, postscale_factor=0.5), total * 1.5 / world)
    assert torch.equal(x, before), "out-of-place allreduce modified its input"
    ints = torch.arange(4) * (rank + 1) - 5
    int_total = _reference(ints, dist.ReduceOp.SUM)
    assert torch.equal(hvd.allreduce(ints, op=hvd.Sum), int_total)
    assert torch.equal(hvd.allreduce(ints), torch.div(int_total, world, rounding_mode="trunc"))
    small = torch.tensor([200, 3, rank], dtype=torch.uint8)
    assert torch.equal(hvd.allreduce(small, op=hvd.Sum),
                       _reference(small.to(torch.int64), dist.ReduceOp.SUM).to(torch.uint8))
    flags = torch.tensor([rank == 0, False, True])
    assert hvd.allreduce(flags, op=hvd.Max).tolist() == [True, False, True]
    assert hvd.allreduce(flags, op=hvd.Min).tolist() == [world == 1, False, True]
    inplace = x.clone()
    assert hvd.allreduce_(inplace, op=hvd.Sum) is inplace
    torch.testing.assert_close(inplace, total)
    strided = x.clone().t()
    hvd.allreduce_(strided, op=hvd.Sum)
    torch.testing.assert_close(strided, total.t())
    handle = hvd.allreduce_async(x, op=hvd.Sum)
    in_place = hvd.allreduce_async_(x.clone(), op=hvd.Max)
    torch.testing.assert_close(hvd.synchronize(handle), total)
    torch.testing.assert_close(hvd.synchronize(in_place), _reference(x, dist.ReduceOp.MAX))
    assert hvd.poll(handle)
    mixed = [x, ints, x.double(), torch.zeros(0)]
    grouped = hvd.grouped_allreduce(mixed, op=hvd.Sum)
    for got, tensor in zip(grouped, mixed):
        torch.testing.assert_close(got, _reference(tensor, dist.ReduceOp.SUM))
    copies = [t.clone() for t in mixed]
    hvd.synchronize(hvd.grouped_allreduce_async_(copies))
    torch.testing.assert_close(copies[0], total / world)
    assert torch.equal(copies[1], torch.div(int_total, world, rounding_mode="trunc"))


def _check_gather_scatter(rank: int, world: int) -> None:
    import scaledl.horovod as hvd

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    same = torch.empty(world * 4, 3)
    dist.all_gather_into_tensor(same, x)
    torch.testing.assert_close(hvd.allgather(x), same)
    ragged = torch.full((rank + 1, 2), float(rank))
    expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world)])
    torch.testing.assert_close(hvd.allgather(ragged), expected)
    torch.testing.assert_close(hvd.synchronize(hvd.allgather_async(ragged.int())),
                               expected.int())
    got = hvd.grouped_allgather([ragged, torch.zeros(0, 2)])
    torch.testing.assert_close(got[0], expected)
    assert got[1].shape == (0, 2)
    root = world - 1
    reference = x.clone()
    dist.broadcast(reference, src=root)
    torch.testing.assert_close(hvd.broadcast(x, root_rank=root), reference)
    flags = torch.tensor([rank == root, True])
    assert hvd.broadcast_(flags, root).tolist() == [True, True]
    copy = x.clone()
    hvd.synchronize(hvd.broadcast_async_(copy, root))
    torch.testing.assert_close(copy, reference)
    splits = [(rank + r) % 3 for r in range(world)]
    rows = torch.arange(sum(splits) * 2, dtype=torch.float32).view(-1, 2) + 100 * rank
    counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(counts, torch.tensor(splits))
    out = torch.empty(int(counts.sum()) * 2)
    dist.all_to_all_single(out, rows.view(-1), [int(c) * 2 for c in counts],
                           [s * 2 for s in splits])
    output, received = hvd.alltoall(rows, splits=torch.tensor(splits))
    torch.testing.assert_close(output, out.view(-1, 2))
    assert received.tolist() == counts.tolist()
    even = torch.arange(world * 2, dtype=torch.float32) + 10 * rank
    even_out = torch.empty(world * 2)
    dist.all_to_all_single(even_out, even)
    torch.testing.assert_close(hvd.alltoall(even), even_out)
    from scaledl.horovod.reducescatter import slice_rows

    for rows_count in (world * 2, world * 2 + 1):
        data = torch.randn(rows_count, 3, generator=torch.Generator().manual_seed(rank + 7))
        total = _reference(data, dist.ReduceOp.SUM)
        first, count = slice_rows(rows_count, world, rank)
        torch.testing.assert_close(hvd.reducescatter(data, op=hvd.Sum),
                                   total[first:first + count])
        torch.testing.assert_close(hvd.reducescatter(data), total[first:first + count] / world)
    hvd.barrier()


def _check_objects_and_state(rank: int, world: int) -> None:
    import scaledl.horovod as hvd

    assert hvd.broadcast_object({"from": rank, "list": [1, 2]}, root_rank=1) == \
        {"from": 1, "list": [1, 2]}
    assert hvd.allgather_object(("rank", rank) * (rank + 1)) == \
        [("rank", r) * (r + 1) for r in range(world)]
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    everyone = [None] * world
    dist.all_gather_object(everyone, {k: v.clone() for k, v in model.state_dict().items()})
    for theirs in everyone:
        for key, value in theirs.items():
            torch.testing.assert_close(value, model.state_dict()[key])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    if rank == 0:
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    gathered = [None] * world
    dist.all_gather_object(gathered, [b.clone() for b in buffers])
    for theirs in gathered:
        for mine, other in zip(buffers, theirs):
            torch.testing.assert_close(mine, other)


def _check_process_sets_and_autograd(rank: int, world: int, evens: object) -> None:
    import scaledl.horovod as hvd

    assert isinstance(evens, hvd.ProcessSet) and evens.process_set_id == 1
    odds = hvd.add_process_set([r for r in range(world) if r % 2 == 1])
    assert odds.size() == world // 2 and odds.included() == (rank % 2 == 1)
    assert hvd.remove_process_set(odds) and not hvd.remove_process_set(hvd.global_process_set)
    value = torch.tensor([float(rank)])
    if rank % 2 == 0:
        assert evens.rank() == rank // 2 and evens.size() == (world + 1) // 2
        total = sum(float(r) for r in range(0, world, 2))
        assert hvd.allreduce(value, op=hvd.Sum, process_set=evens).item() == total
        last = max(range(0, world, 2))
        assert hvd.broadcast(value, root_rank=last, process_set=evens).item() == last
        assert hvd.allgather(value, process_set=evens).tolist() == \
            [float(r) for r in range(0, world, 2)]
    else:
        assert evens.rank() == -1 and not evens.included()
        with pytest.raises(ValueError, match="not in process set"):
            hvd.allreduce(value, process_set=evens)
    assert hvd.remove_process_set(evens)
    leaf = torch.full((2,), float(rank + 1), requires_grad=True)
    hvd.allreduce(leaf, op=hvd.Sum).sum().backward()
    assert leaf.grad is not None and leaf.grad.tolist() == [float(world)] * 2
    rows = torch.ones(rank + 1, 2, requires_grad=True)
    hvd.allgather(rows).sum().backward()
    assert rows.grad is not None and torch.equal(rows.grad, torch.ones(rank + 1, 2))
    source = torch.full((2,), float(rank), requires_grad=True)
    hvd.broadcast(source, root_rank=0).sum().backward()
    assert source.grad is not None and source.grad.tolist() == [1.0 if rank == 0 else 0.0] * 2
    scattered = torch.ones(world * 2, requires_grad=True)
    hvd.reducescatter(scattered, op=hvd.Sum).sum().backward()
    assert scattered.grad is not None and scattered.grad.tolist() == [float(world)] * world * 2
    spread = torch.arange(world, dtype=torch.float32, requires_grad=True)
    (hvd.alltoall(spread) * 2).sum().backward()  # type: ignore[operator]
    assert spread.grad is not None and spread.grad.tolist() == [2.0] * world


def _check_sync_batch_norm(rank: int, world: int) -> None:
    import scaledl.horovod as hvd

    batches = [torch.randn(2 + r, 3, 4, generator=torch.Generator().manual_seed(50 + r))
               for r in range(world)]
    full = torch.cat(batches).requires_grad_()
    upstream = torch.randn(full.shape, generator=torch.Generator().manual_seed(9))
    reference = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        reference.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
        reference.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    sync = hvd.SyncBatchNorm(3)
    sync.load_state_dict(reference.state_dict())
    expected = reference(full)
    (expected * upstream).sum().backward()
    first = sum(b.shape[0] for b in batches[:rank])
    rows = slice(first, first + batches[rank].shape[0])
    mine = batches[rank].clone().requires_grad_()
    output = sync(mine)
    torch.testing.assert_close(output, expected[rows])
    (output * upstream[rows]).sum().backward()
    assert full.grad is not None and mine.grad is not None and sync.weight.grad is not None
    torch.testing.assert_close(mine.grad, full.grad[rows])
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad)
    torch.testing.assert_close(sync.running_var, reference.running_var)
    torch.testing.assert_close(sync.running_mean, reference.running_mean)
    sync.eval()
    reference.eval()
    torch.testing.assert_close(sync(mine), reference(mine))


def _api_worker(rank: int, world: int) -> str:
    import scaledl.horovod as hvd

    for algorithm in ("auto", "ring"):
        hvd.init(algorithm=algorithm)
        assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == \
            (rank, world, rank, world)
        assert (hvd.cross_rank(), hvd.cross_size(), hvd.is_initialized()) == (0, 1, True)
        _check_allreduce(rank, world)
        _check_gather_scatter(rank, world)
        hvd.shutdown()
    evens = hvd.ProcessSet([r for r in range(world) if r % 2 == 0])
    hvd.init(process_sets=[evens])
    _check_objects_and_state(rank, world)
    _check_process_sets_and_autograd(rank, world, evens)
    _check_sync_batch_norm(rank, world)
    hvd.shutdown()
    assert not hvd.is_initialized()
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_every_call_matches_torch_distributed(world: int) -> None:
    assert run_ranks(world, _api_worker, timeout=120, env=ENV) == ["ok"] * world
