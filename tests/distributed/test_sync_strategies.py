"""sync-easgd and easgd (round robin) on real ranks, against references.

* Sync EASGD: two runs (3 ranks, fresh models and strategies) are bitwise identical; overlap
  on/off are bitwise identical, and with overlap the exchange really runs during the next
  step's compute; tree and allreduce forms agree to fp tolerance, and both follow Zhang et
  al.'s synchronous equations simulated in one process; alpha -> 0 (1e-30, below float32
  resolution) is bitwise independent local SGD with a center that never moves.
* easgd: the master exchanges in rank order (a reversed order gives a measurably different
  result), matching a sequential simulation.

Local SGD and the checkpoint round trips are in ``test_sync_strategies_resume.py``, which
reuses the model and training helpers of this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from scaledl.strategies.base import Strategy
from scaledl.strategies.elastic import flatten_parameters
from scaledl.strategies.periodic import PeriodicStrategy
from scaledl.strategies.round_robin_easgd import RoundRobinEASGD
from scaledl.strategies.sync_easgd import SyncEASGD
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

STEPS, LR, MOMENTUM, ALPHA, TAU, WORLD = 6, 0.1, 0.9, 0.2, 2, 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen)


def _model(rank: int = 0) -> Net:
    torch.manual_seed(0 if rank == 0 else 50 + rank)  # other ranks differ: rank 0's must win
    return Net()


def _hex(tensor: torch.Tensor) -> str:
    return tensor.detach().contiguous().numpy().tobytes().hex()


def _values(tensor: torch.Tensor) -> list[float]:
    return [float(v) for v in tensor.detach().reshape(-1)]


def _local_step(model: nn.Module, rank: int, step: int) -> None:
    x, y = _batch(rank, step)
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()


def _train(make: Callable[[nn.Module, torch.optim.Optimizer], Strategy], rank: int,
           first: int = 0, last: int = STEPS, momentum: float = MOMENTUM,
           ) -> tuple[Net, Strategy]:
    model = _model(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    strategy = make(model, optimizer)
    for step in range(first, last):
        _local_step(strategy.model, rank, step)
        strategy.step()
    strategy.synchronize()
    return model, strategy


def _summary(make: Callable[..., Strategy], rank: int) -> dict[str, Any]:
    model, strategy = _train(make, rank)
    center = flatten_parameters(strategy.evaluation_module())
    return {"x": _hex(strategy.flat if isinstance(strategy, PeriodicStrategy) else center),
            "center": _hex(center), "x_values": _values(flatten_parameters(model)),
            "center_values": _values(center), "order": getattr(strategy, "order", None),
            "replica_center": _hex(getattr(strategy, "center", center))}


SYNC_VARIANTS: dict[str, dict[str, Any]] = {
    "tree": {"form": "tree"},
    "tree-algorithm-tree": {"form": "tree", "algorithm": "tree"},
    "tree-no-overlap": {"form": "tree", "overlap": False},
    "allreduce": {"form": "allreduce"},
    "allreduce-ring": {"form": "allreduce", "algorithm": "ring"},
}


def _sync_suite(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, options in SYNC_VARIANTS.items():
        out[name] = _summary(
            lambda m, o, options=options: SyncEASGD(m, o, alpha=ALPHA, tau=TAU, **options), rank)
    out["easgd"] = _summary(lambda m, o: RoundRobinEASGD(m, o, alpha=ALPHA, tau=TAU), rank)
    for name, cls, options in (("tiny-tree", SyncEASGD, {"form": "tree"}),
                               ("tiny-allreduce", SyncEASGD, {"form": "allreduce"}),
                               ("tiny-easgd", RoundRobinEASGD, {})):
        out[name] = _summary(
            lambda m, o, cls=cls, options=options: cls(m, o, alpha=1e-30, tau=1, **options), rank)
    alone = _model(0)  # independent local SGD: every worker from rank 0's start, no strategy
    optimizer = torch.optim.SGD(alone.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        _local_step(alone, rank, step)
        optimizer.step()
    out["alone"] = _hex(flatten_parameters(alone))
    out["initial"] = _hex(flatten_parameters(_model(0)))
    return out


class _Spans:
    """A timeline that keeps every span: (name, category, start, end)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float]] = []

    def record(self, name: str, category: str, start_s: float, end_s: float, lane: str,
               **args: Any) -> None:
        self.spans.append((name, category, start_s, end_s))


def _overlap_probe(rank: int, overlap: bool) -> list[bool]:
    """For every exchange but the first (step 0 has no previous step to overlap with): whether
    its broadcast had started on this rank before ``step()`` of the step that applies it was
    called, i.e. whether it ran during that step's forward and backward."""
    spans = _Spans()
    model = _model(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    strategy = SyncEASGD(model, optimizer, alpha=ALPHA, tau=TAU, overlap=overlap,
                         timeline=spans)
    step_called = []
    for step in range(STEPS):
        _local_step(strategy.model, rank, step)
        time.sleep(0.02)  # more compute: time for the communication thread to pick the job up
        step_called.append(time.perf_counter())
        strategy.step()
    strategy.synchronize()
    starts = [start for name, category, start, _ in spans.spans
              if category == "comm" and name.endswith("broadcast center")]
    return [starts[j] < step_called[j * TAU] for j in range(1, STEPS // TAU)]


def _everything(rank: int, world_size: int) -> dict[str, Any]:
    """Everything in one set of processes (starting ranks costs seconds each): Sync EASGD
    twice, from fresh models and strategies, then the overlap probes."""
    return {"sync": [_sync_suite(rank, world_size) for _ in range(2)],
            "overlap": {str(on): _overlap_probe(rank, on) for on in (True, False)}}


@pytest.fixture(scope="module")
def everything() -> list[dict[str, Any]]:
    return run_ranks(WORLD, _everything, timeout=240)


@pytest.fixture(scope="module")
def sync_runs(everything: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``[run][rank]``: the two Sync EASGD runs."""
    return [[per_rank["sync"][run] for per_rank in everything] for run in range(2)]


@pytest.mark.timeout(300)
def test_sync_easgd_two_runs_are_bitwise_identical(sync_runs: list[list[dict[str, Any]]]) -> None:
    first, second = sync_runs
    for rank in range(WORLD):
        for name in [*SYNC_VARIANTS, "easgd"]:
            assert first[rank][name]["x"] == second[rank][name]["x"], (name, rank)
            assert first[rank][name]["center"] == second[rank][name]["center"], (name, rank)


@pytest.mark.timeout(300)
def test_overlap_does_not_change_bits(sync_runs: list[list[dict[str, Any]]],
                                     everything: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(sync_runs[0]):
        assert result["tree-no-overlap"]["x"] == result["tree"]["x"], rank
        assert result["tree-no-overlap"]["center"] == result["tree"]["center"], rank
    # ... and the overlap is real: with it, each exchange (after the first) was already
    # running when step() was called; without it, none was (the probe can tell them apart)
    for rank, result in enumerate(everything):
        overlapped, blocking = result["overlap"]["True"], result["overlap"]["False"]
        assert overlapped and all(overlapped), (rank, overlapped)
        assert blocking and not any(blocking), (rank, blocking)


@pytest.mark.timeout(300)
def test_forms_agree_and_centers_are_replicated(sync_runs: list[list[dict[str, Any]]]) -> None:
    results = sync_runs[0]
    for rank, result in enumerate(results):
        for name in ("tree-algorithm-tree", "allreduce", "allreduce-ring"):
            for key in ("x_values", "center_values"):
                got, want = torch.tensor(result[name][key]), torch.tensor(result["tree"][key])
                assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (name, key, rank)
        # the allreduce form's replicated centers are bitwise equal on every rank
        for name in ("allreduce", "allreduce-ring"):
            assert result[name]["replica_center"] == results[0][name]["replica_center"]
        # every rank evaluates the same center
        assert result["tree"]["center"] == results[0]["tree"]["center"]
    # the workers did diverge from each other and from the center (the test is not vacuous)
    assert results[0]["tree"]["x"] != results[1]["tree"]["x"]
    assert results[0]["tree"]["x"] != results[0]["tree"]["center"]


@pytest.mark.timeout(300)
def test_alpha_to_zero_is_independent_local_sgd(sync_runs: list[list[dict[str, Any]]]) -> None:
    for rank, result in enumerate(sync_runs[0]):
        for name in ("tiny-tree", "tiny-allreduce", "tiny-easgd"):
            assert result[name]["x"] == result["alone"], (name, rank)
            assert result[name]["center"] == result["initial"], (name, rank)


def _simulate(world_size: int, alpha: float, tau: int, order: list[int] | None) -> dict[str, Any]:
    """Every worker in one process; ``order`` None: Zhang et al.'s synchronous equations, else
    the round robin in that order."""
    models = [_model(0) for _ in range(world_size)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for m in models]
    flats = [flatten_parameters(m) for m in models]
    center = flats[0].detach().clone()
    for step in range(STEPS):
        for rank, model in enumerate(models):
            _local_step(model, rank, step)
        elastic = [torch.zeros_like(center) for _ in models]
        if step % tau == 0:
            with torch.no_grad():
                if order is None:
                    elastic = [alpha * (flat - center) for flat in flats]
                    center = center + sum(elastic)
                else:
                    for rank in order:
                        elastic[rank] = alpha * (flats[rank] - center)
                        center = center + elastic[rank]
        for optimizer, flat, e in zip(optimizers, flats, elastic):
            optimizer.step()
            with torch.no_grad():
                flat.sub_(e)
    return {"x": [_values(f) for f in flats], "center": _values(center)}


def _close(got: list[float], want: list[float]) -> bool:
    return torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-6, rtol=1e-5)


@pytest.mark.timeout(300)
def test_sync_easgd_follows_the_synchronous_equations(
    sync_runs: list[list[dict[str, Any]]]
) -> None:
    want = _simulate(WORLD, ALPHA, TAU, None)
    for rank, result in enumerate(sync_runs[0]):
        for name in ("tree", "allreduce"):
            assert _close(result[name]["x_values"], want["x"][rank]), (name, rank)
            assert _close(result[name]["center_values"], want["center"]), (name, rank)


@pytest.mark.timeout(300)
def test_round_robin_exchanges_in_rank_order(sync_runs: list[list[dict[str, Any]]]) -> None:
    results = sync_runs[0]
    assert results[0]["easgd"]["order"] == [0, 1, 2]
    want = _simulate(WORLD, ALPHA, TAU, [0, 1, 2])
    reversed_order = _simulate(WORLD, ALPHA, TAU, [2, 1, 0])
    assert not _close(reversed_order["center"], want["center"])  # the order matters
    for rank, result in enumerate(results):
        assert _close(result["easgd"]["x_values"], want["x"][rank]), rank
        assert _close(result["easgd"]["center_values"], want["center"]), rank
