"""Data parallelism equals single-process training on the concatenated batch.

Every rank trains on its slice of a fixed global batch; after several SGD-with-momentum steps
its parameters must equal those of one process training on the whole batch (fp tolerance).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import scaledl
from scaledl.collectives import available
from scaledl.topology import Topology
from tests.harness import run_ranks
from tests.helpers_backward import FailingBackward

pytestmark = pytest.mark.distributed

STEPS, PER_RANK = 4, 6


class Net(nn.Module):
    def __init__(self, extra_branch: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.fc2 = nn.Linear(16, 3)
        self.extra = nn.Linear(16, 3) if extra_branch else None

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        out = self.fc2(hidden)
        if use_extra and self.extra is not None:
            out = out + self.extra(hidden)
        return out


def _batch(world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size * PER_RANK, 10, generator=gen)
    y = torch.randint(0, 3, (world_size * PER_RANK,), generator=gen)
    return x, y


def _reference(world_size: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(world_size, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _local(rank: int, world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _batch(world_size, step)
    part = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    return x[part], y[part]


def _run_steps(trainer: scaledl.Strategy, rank: int, world_size: int) -> None:
    """STEPS steps on this rank's slice of the global batches, then wait for communication."""
    for step in range(STEPS):
        x, y = _local(rank, world_size, step)
        trainer.zero_grad()
        nn.functional.cross_entropy(trainer.model(x), y).backward()
        trainer.step()
    trainer.synchronize()


def _topology(name: str, world_size: int) -> Topology | None:
    if name in ("torus", "hierarchical"):
        return Topology(axes=(1, world_size), explicit=True)
    return None


def _train(rank: int, world_size: int, strategy: str, algorithm: str) -> list[str]:
    torch.manual_seed(rank)  # different init per rank: wrapping must copy rank 0's
    model = Net()
    if rank == 0:
        torch.manual_seed(0)
        model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = scaledl.build_strategy(strategy, model, opt, algorithm=algorithm,
                                     topology=_topology(algorithm, world_size))
    _run_steps(trainer, rank, world_size)
    failures = []
    for got, want in zip(model.parameters(), _reference(world_size)):
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            failures.append(f"{strategy}/{algorithm} rank {rank}: max diff "
                            f"{(got - want).abs().max().item():.2e}")
    stats = trainer.stats
    assert stats.bytes > 0 and stats.comm_s >= 0
    return failures


def _all_allreduce(rank: int, world_size: int) -> list[str]:
    failures = []
    for algorithm in available("allreduce"):
        failures += _train(rank, world_size, "allreduce", algorithm)
    for algorithm in ("tree", "chain", "native", "auto"):
        failures += _train(rank, world_size, "reduce-broadcast", algorithm)
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_training_equals_single_process_for_every_algorithm(world_size: int) -> None:
    results = run_ranks(world_size, _all_allreduce, timeout=150)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, failures


def _no_sync(rank: int, world_size: int) -> bool:
    torch.manual_seed(0)
    model = Net()
    dp = scaledl.DataParallel(model, algorithm="ring", bucket_mb=0.001)
    x, y = _local(rank, world_size, 0)
    with dp.no_sync():
        nn.functional.cross_entropy(dp(x[:3]), y[:3], reduction="sum").backward()
    nn.functional.cross_entropy(dp(x[3:]), y[3:], reduction="sum").backward()
    accumulated = [p.grad.clone() for p in model.parameters()]
    reference = Net()
    reference.load_state_dict(model.state_dict())
    gx, gy = _batch(world_size, 0)
    nn.functional.cross_entropy(reference(gx), gy, reduction="sum").backward()
    return all(torch.allclose(a, r.grad / world_size, atol=1e-5)
               for a, r in zip(accumulated, reference.parameters()))


def test_no_sync_accumulation_equals_one_large_batch() -> None:
    assert all(run_ranks(2, _no_sync, timeout=60))


def _unused_branch(rank: int, world_size: int) -> list[float]:
    torch.manual_seed(0)
    model = Net(extra_branch=True)
    dp = scaledl.DataParallel(model, algorithm="ring", bucket_mb=0.0001)
    x, y = _local(rank, world_size, 0)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(dp(x, use_extra=rank == 0), y).backward()
    assert model.extra is not None and model.extra.weight.grad is not None
    return [model.extra.weight.grad.abs().sum().item(), model.fc1.weight.grad.sum().item()]


def test_unused_parameter_on_one_rank_does_not_hang() -> None:
    results = run_ranks(2, _unused_branch, timeout=60)
    assert results[0] == pytest.approx(results[1])
    assert results[0][0] > 0  # rank 0's gradient, averaged with rank 1's zeros


def _unused_everywhere(rank: int, world_size: int) -> list[object]:
    torch.manual_seed(0)
    model = Net(extra_branch=True)
    dp = scaledl.DataParallel(model, algorithm="ring")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    assert model.extra is not None
    before = model.extra.weight.detach().clone()
    x, y = _local(rank, world_size, 0)
    for _ in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(dp(x), y).backward()
        opt.step()
    grad = model.extra.weight.grad
    return [None if grad is None else grad.tolist(), torch.equal(model.extra.weight, before),
            model.fc1.weight.grad is not None]


def test_a_parameter_no_rank_used_keeps_no_gradient() -> None:
    # it got a zero .grad, so weight decay and momentum moved it; single-process training and
    # DDP(find_unused_parameters=True) leave its .grad None and the parameter where it was
    for grad, unmoved, others in run_ranks(2, _unused_everywhere, timeout=60):
        assert grad is None and unmoved and others


def _ddp(rank: int, world_size: int, algorithm: str) -> list[list[float]]:
    torch.manual_seed(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model)
    if algorithm != "plain":
        ddp.register_comm_hook(None, scaledl.ddp_hook(algorithm=algorithm))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = _local(rank, world_size, step)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling"])
def test_ddp_comm_hook_equals_plain_ddp(algorithm: str) -> None:
    plain = run_ranks(2, _ddp, "plain", timeout=60)
    hooked = run_ranks(2, _ddp, algorithm, timeout=60)
    for a, b in zip(plain[0], hooked[0]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-6, rtol=1e-5)


def _mismatched(rank: int, world_size: int) -> str:
    model = nn.Linear(4, 3 if rank == 0 else 5)
    try:
        scaledl.DataParallel(model)
    except ValueError as error:
        dist.barrier()
        return str(error)
    return "NO ERROR"


def test_different_models_raise_on_every_rank() -> None:
    messages = run_ranks(2, _mismatched, timeout=60)
    assert messages[0] == messages[1]
    assert "rank 0" in messages[0] and "rank 1" in messages[0] and "weight" in messages[0]


class RootParams(nn.Module):
    """Parameters on the root module and in a ParameterList: no leaf forward runs for them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 3)
        self.scale = nn.Parameter(torch.ones(3))
        self.extra = nn.ParameterList([nn.Parameter(torch.zeros(3))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale + self.extra[0]


def _root_params(rank: int, world_size: int, strategy: str) -> list[list[float]]:
    torch.manual_seed(0)
    model = RootParams()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = scaledl.build_strategy(strategy, model, opt, algorithm="auto")
    _run_steps(trainer, rank, world_size)
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def test_reduce_broadcast_waits_for_parameters_outside_leaf_modules() -> None:
    allreduce = run_ranks(2, _root_params, "allreduce", timeout=60)
    rooted = run_ranks(2, _root_params, "reduce-broadcast", timeout=60)
    for rank in range(2):
        for a, b in zip(allreduce[rank], rooted[rank]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=1e-4)


def _wrap_errors_and_grad_tensors(rank: int, world_size: int) -> list[str]:
    messages = []
    for make in (lambda: scaledl.DataParallel(Net(), algorithm="torus"),
                 lambda: scaledl.ReduceBroadcast(Net(), algorithm="hierarchical"),
                 lambda: scaledl.DataParallel(Net(), topology=Topology.parse("2x2"))):
        try:
            make()
            messages.append("NO ERROR")
        except ValueError as error:
            messages.append(str(error))
    weight = nn.Parameter(torch.full((5,), float(rank + 1)))
    scaledl.allreduce(weight, algorithm="ring")
    scaledl.broadcast(weight, src=0, algorithm="tree")
    assert weight.requires_grad and torch.all(weight == 3.0)
    return messages


def test_bad_wrapping_fails_at_wrap_time_and_grad_tensors_work() -> None:
    messages = run_ranks(2, _wrap_errors_and_grad_tensors, timeout=60)[0]
    assert "needs the network layout" in messages[0]
    assert "needs the network layout" in messages[1]
    assert "describes 4 ranks but the group has 2" in messages[2]


def _kept_gradients(rank: int, world_size: int) -> list[list[float]]:
    """Keep each step's .grad after zero_grad() dropped it; a later step must not change it."""
    model = nn.Linear(2, 1, bias=False)
    nn.init.ones_(model.weight)
    dp = scaledl.DataParallel(model, algorithm="ring")
    kept = []
    for step in range(3):
        model.zero_grad(set_to_none=True)
        dp(torch.full((1, 2), float(step + 1))).sum().backward()
        assert model.weight.grad is not None
        kept.append(model.weight.grad)
    return [grad.reshape(-1).tolist() for grad in kept]


def test_a_kept_gradient_is_not_overwritten_by_later_steps() -> None:
    # .grad was a view of the reused bucket buffer: every kept gradient read the last step's
    for kept in run_ranks(2, _kept_gradients, timeout=60):
        assert kept == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


class OddDtypes(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.tensor([1 + 2j, 3 + 4j]) * (rank + 1))
        self.register_buffer("cb", torch.tensor([5 + 6j], dtype=torch.complex128) * (rank + 1))
        self.register_buffer("flags", torch.tensor([rank == 0, rank != 0]))
        self.register_buffer("small", torch.tensor([-7, 9], dtype=torch.int8) * (rank + 1))


def _odd_dtypes(rank: int, world_size: int) -> list[str]:
    model = OddDtypes(rank)
    scaledl.DataParallel(model)
    return [repr(t.tolist()) for t in (model.c, model.cb, model.flags, model.small)]


def test_rank_zeros_state_of_every_dtype_reaches_every_rank_exactly() -> None:
    # complex tensors travelled as float64: their imaginary part was dropped on every rank
    expected = [repr(t.tolist()) for t in (torch.tensor([1 + 2j, 3 + 4j]),
                                           torch.tensor([5 + 6j], dtype=torch.complex128),
                                           torch.tensor([True, False]),
                                           torch.tensor([-7, 9], dtype=torch.int8))]
    assert run_ranks(2, _odd_dtypes, timeout=60) == [expected, expected]


def _wrap_refusals(rank: int, world_size: int) -> list[str]:
    messages = []
    for make in (lambda: scaledl.DataParallel(nn.Linear),  # type: ignore[arg-type]
                 lambda: scaledl.DataParallel(nn.parallel.DistributedDataParallel(Net())),
                 lambda: scaledl.DataParallel(Net(), bucket_mb="25"),  # type: ignore[arg-type]
                 lambda: scaledl.DataParallel(Net(), algorithm="ring" if rank else "tree"),
                 lambda: scaledl.DataParallel(Net(), compression="bf61" if rank else "bf16"),
                 lambda: scaledl.DataParallel(_frozen_on_rank_1(rank)),
                 lambda: scaledl.DataParallel(Net(), device_ids=[0] if rank else None)):
        try:
            make()
            messages.append("NO ERROR")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    model = scaledl.DataParallel(Net())  # after every refusal the group goes on
    model(torch.ones(2, 10)).sum().backward()
    messages.append("usable")
    return messages


def _frozen_on_rank_1(rank: int) -> nn.Module:
    net = Net()
    next(net.parameters()).requires_grad_(rank == 0)
    return net


def test_what_cannot_be_wrapped_is_refused_at_wrap_time() -> None:
    # a class, an already-averaging wrapper and a string failed deep inside, or not at all;
    # different algorithms on two ranks aborted inside Gloo at the first backward
    for messages in run_ranks(2, _wrap_refusals, timeout=60):
        assert "wraps a model (an nn.Module instance), got Linear" in messages[0]
        assert "already a DistributedDataParallel" in messages[1]
        assert "bucket_mb must be a number of MiB, got str '25'" in messages[2]
        assert ("ranks disagree on the details of wrapping a model: entry 4 is 'setting "
                "algorithm tree' on rank 0 but 'setting algorithm ring' on rank 1") in messages[3]
        # a value only one rank refuses, and a layer only one rank froze: both ranks raise
        assert messages[4].startswith("wrapping a model: rank 1 passed an argument it refused: "
                                      "unknown compression 'bf61'")
        assert "entry 0 is 'parameter " in messages[5] and " frozen' on rank 1" in messages[5]
        assert messages[6].startswith("wrapping a model: rank 1 passed an argument it refused: "
                                      "device_ids=[0] is for a model on one accelerator, but "
                                      "this model is on the CPU")
        assert messages[7] == "usable"


class Sparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 2, sparse=True)
        self.frozen = nn.Linear(2, 1)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.embed(index))


def _sparse_and_frozen(rank: int, world_size: int) -> list[object]:
    torch.manual_seed(0)
    model = Sparse()
    dp = scaledl.DataParallel(model, algorithm="ring")
    model.frozen.requires_grad_(False)  # frozen after wrapping
    dp(torch.tensor([rank, 3])).sum().backward()
    grad = model.embed.weight.grad
    assert grad is not None and grad.layout == torch.sparse_coo
    rows = sorted(grad.coalesce().indices()[0].tolist())
    return [grad.to_dense().sum(dim=1).tolist(), model.frozen.weight.grad, rows]


def test_sparse_gradients_are_averaged_and_a_frozen_parameter_keeps_no_gradient() -> None:
    # the sparse one failed with "copy_() between dense and sparse Tensors", then came back
    # dense (SparseAdam refused it); the frozen one got a zero .grad, which weight decay moved
    results = run_ranks(2, _sparse_and_frozen, timeout=60)
    assert results[0] == results[1]
    rows, frozen, looked_up = results[0]
    assert looked_up == [0, 1, 3]  # the rows either rank looked up
    weight_sum = float(sum(rows))  # rows 0, 1 once each (halved), row 3 twice (whole)
    assert frozen is None and rows[2] == 0.0 and rows[4] == 0.0 and weight_sum != 0.0
    assert rows[0] == pytest.approx(rows[1]) and rows[3] == pytest.approx(2 * rows[0])


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.last = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(FailingBackward.apply(self.norm(self.first(x)))).sum()


def _failed_backward_with_buffers(rank: int, world_size: int) -> list[float]:
    torch.manual_seed(0)
    net = Normed()
    dp = scaledl.DataParallel(net, algorithm="ring", bucket_mb=1e-5)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
    FailingBackward.fail = rank == 0
    try:
        dp(x).backward()
    except RuntimeError:
        pass
    FailingBackward.fail = False
    net.zero_grad()
    dp(x).backward()
    assert net.last.weight.grad is not None
    return net.last.weight.grad.reshape(-1).tolist()


def test_a_rank_whose_backward_raised_rejoins_a_model_with_buffers() -> None:
    # the failing rank closed its step only at its next backward, after the next forward's
    # buffer broadcast, which met the other rank's gradient collectives: a mismatch
    first, second = run_ranks(2, _failed_backward_with_buffers, timeout=90)
    assert first == pytest.approx(second)


def _wrap_twice(rank: int, world_size: int) -> list[str]:
    import gc
    import warnings

    scaledl.init()
    net = torch.nn.Linear(4, 2)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = scaledl.DataParallel(net)
        second = scaledl.DataParallel(net)  # the first still alive: both would reduce
        seen.append(str(caught[-1].message) if caught else "")
        del first, second
        gc.collect()
        scaledl.DataParallel(net)  # the earlier wrappers are gone: nothing to say
        seen.append(str(caught[-1].message) if len(caught) > 1 else "")
    return seen


def test_wrapping_a_model_twice_warns_while_the_first_wrapper_lives() -> None:
    """Both wrappers averaged every gradient, silently (twice the communication)."""
    for warned, after in run_ranks(2, _wrap_twice, timeout=60):
        assert "already wrapped by a DataParallel that is still alive" in warned
        assert after == ""
