"""local-sgd and the checkpoint round trips of sync-easgd, easgd and local-sgd on real ranks.

* local-sgd: tau = 1 with plain SGD equals large-batch SGD; an outer SGD(lr=1) equals plain
  averaging; replicas are identical after an outer step.
* state_dict round trip: gather + save on rank 0 + load everywhere resumes bit for bit; without
  the gather, every worker restarts from rank 0's parameters.

The model, data and training helpers are those of ``test_sync_strategies.py``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scaledl.strategies.base import Strategy
from scaledl.strategies.elastic import flatten_parameters
from scaledl.strategies.local_sgd import LocalSGD
from scaledl.strategies.periodic import PeriodicStrategy
from scaledl.strategies.round_robin_easgd import RoundRobinEASGD
from scaledl.strategies.sync_easgd import SyncEASGD
from tests.distributed.test_sync_strategies import (
    ALPHA, LR, MOMENTUM, STEPS, TAU, WORLD, Net, _batch, _close, _hex, _local_step, _model,
    _train, _values,
)
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


def _plain(m: nn.Module, o: torch.optim.Optimizer) -> Strategy:
    return LocalSGD(m, o, tau=3)


def _outer_sgd(m: nn.Module, o: torch.optim.Optimizer) -> Strategy:
    return LocalSGD(m, o, tau=3, outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0))


def _diloco(m: nn.Module, o: torch.optim.Optimizer) -> Strategy:
    return LocalSGD(m, o, tau=2, outer_optimizer=lambda p: torch.optim.SGD(
        p, lr=0.7, momentum=0.9, nesterov=True))


RESUMABLE: dict[str, Callable[[nn.Module, torch.optim.Optimizer], Strategy]] = {
    "sync-tree": lambda m, o: SyncEASGD(m, o, alpha=ALPHA, tau=TAU),
    "sync-allreduce": lambda m, o: SyncEASGD(m, o, alpha=ALPHA, form="allreduce"),
    "easgd": lambda m, o: RoundRobinEASGD(m, o, alpha=ALPHA, tau=TAU),
    "local-sgd": lambda m, o: LocalSGD(m, o, tau=TAU),
    "diloco": _diloco,
}


def _checkpoint_everywhere(strategy: Strategy, gather: bool) -> dict[str, Any]:
    """What the trainer does: (gather on every rank,) rank 0 saves, every rank loads."""
    if gather:
        assert isinstance(strategy, PeriodicStrategy)
        strategy.prepare_checkpoint()
    payload = [None]
    if dist.get_rank() == 0:
        handle = io.BytesIO()
        torch.save(strategy.state_dict(), handle)
        payload = [handle.getvalue()]
    dist.broadcast_object_list(payload, src=0)
    return torch.load(io.BytesIO(payload[0]), weights_only=True)


def _resume(make: Callable[..., Strategy], rank: int, gather: bool) -> tuple[str, str, str]:
    _, before = _train(make, rank, 0, 3)
    state = _checkpoint_everywhere(before, gather)
    saved_x0 = _hex(torch.cat([t.reshape(-1) for t in state["model"].values()]))
    torch.manual_seed(123 + rank)
    model = Net()  # a different start: everything must come from the checkpoint
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    strategy = make(model, optimizer)
    strategy.load_state_dict(state)
    after_load = _hex(flatten_parameters(model))
    for step in range(3, STEPS):
        _local_step(strategy.model, rank, step)
        strategy.step()
    strategy.synchronize()
    end = _hex(flatten_parameters(model)) + "/" + _hex(
        flatten_parameters(strategy.evaluation_module()))
    return end, after_load, saved_x0


def _local_and_resume_suite(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, make in (("plain", _plain), ("outer-sgd", _outer_sgd)):
        model, strategy = _train(make, rank)
        out[name] = _values(flatten_parameters(model))
        out[name + "-hex"] = _hex(flatten_parameters(model))
    model, _ = _train(lambda m, o: LocalSGD(m, o, tau=1), rank, momentum=0.0)
    out["tau1"] = _values(flatten_parameters(model))
    for name, make in RESUMABLE.items():
        straight, uninterrupted = _train(make, rank)
        center = flatten_parameters(uninterrupted.evaluation_module())
        out[f"resume-{name}"] = (_hex(flatten_parameters(straight)) + "/" + _hex(center),
                                 _resume(make, rank, gather=True)[0])
        _, after_load, saved_x0 = _resume(make, rank, gather=False)
        out[f"rank0-{name}"] = (after_load, saved_x0)
    return out


@pytest.fixture(scope="module")
def local_runs() -> list[dict[str, Any]]:
    """``[rank]``: local SGD and resume results."""
    return run_ranks(WORLD, _local_and_resume_suite, timeout=240)


@pytest.mark.timeout(300)
def test_local_sgd_tau_one_equals_large_batch_sgd(local_runs: list[dict[str, Any]]) -> None:
    model = _model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        batches = [_batch(rank, step) for rank in range(WORLD)]
        model.zero_grad()
        loss = sum(nn.functional.cross_entropy(model(x), y) for x, y in batches) / WORLD
        loss.backward()
        optimizer.step()
    for result in local_runs:
        assert _close(result["tau1"], _values(flatten_parameters(model)))


@pytest.mark.timeout(300)
def test_outer_sgd_lr_one_equals_plain_averaging(local_runs: list[dict[str, Any]]) -> None:
    for result in local_runs:
        assert _close(result["outer-sgd"], result["plain"])
    # STEPS is a multiple of tau = 3: the replicas end identical, bit for bit
    for result in local_runs[1:]:
        assert result["plain-hex"] == local_runs[0]["plain-hex"]
        assert result["outer-sgd-hex"] == local_runs[0]["outer-sgd-hex"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(RESUMABLE))
def test_state_dict_round_trip_resumes_bitwise(local_runs: list[dict[str, Any]],
                                               name: str) -> None:
    for rank, result in enumerate(local_runs):
        straight, resumed = result[f"resume-{name}"]
        assert resumed == straight, (name, rank)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(RESUMABLE))
def test_resume_without_gather_restarts_every_worker_from_rank_0(
    local_runs: list[dict[str, Any]], name: str
) -> None:
    for rank, result in enumerate(local_runs):
        after_load, saved_x0 = result[f"rank0-{name}"]
        assert after_load == saved_x0, (name, rank)
