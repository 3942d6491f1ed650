"""The update rules of sync-easgd, easgd (round robin) and local-sgd against hand-computed values.

Two workers, one parameter of two elements starting at c = x = [1, 2], plain SGD with lr 0.5
(momentum 0.5 in one case), alpha 0.25, and fixed gradients g[step][rank].  Every number below is
a dyadic fraction, exact in float32, so the results must match exactly.

Derivation (tau = 1, no momentum):
  step 0: x = c, so e_i = 0:  x_0 = [1, 2] - 0.5 [1, -1] = [0.5, 2.5]
                              x_1 = [1, 2] - 0.5 [3,  1] = [-0.5, 1.5];  c = [1, 2]
  step 1 (sync): e_0 = 0.25 (x_0 - c) = [-0.125, 0.125],  e_1 = 0.25 (x_1 - c) = [-0.375, -0.125]
         x_0 = [0.5, 2.5] - 0.5 [0.5, 0] - e_0 = [0.375, 2.375]
         x_1 = [-0.5, 1.5] - 0.5 [-1, 2] - e_1 = [0.375, 0.625]
         c = [1, 2] + e_0 + e_1 = [0.5, 2]         (tree form: c + 0.25 (x_0 + x_1 - 2c), same)
  step 1 (round robin, master first): e_0 as above, c' = [0.875, 2.125];
         e_1 = 0.25 (x_1 - c') = [-0.34375, -0.15625], c = [0.53125, 1.96875]
         x_1 = [-0.5, 1.5] - 0.5 [-1, 2] - e_1 = [0.34375, 0.65625];  x_0 = [0.375, 2.375]
  momentum 0.5 (v <- 0.5 v + g; x <- x - 0.5 v - e), step 1: v_0 = [1, -0.5], v_1 = [0.5, 2.5]
         x_0 = [0, 2.75] - e_0 = [0.125, 2.625];  x_1 = [-0.75, 0.25] - e_1 = [-0.375, 0.375]
  tau = 2 (exchanges at steps 0 and 2), step 2 gradients [0, 1] and [1, 0]:
         after step 1: x_0 = [0.25, 2.5], x_1 = [0, 0.5];  e_0 = [-0.1875, 0.125],
         e_1 = [-0.25, -0.375];  x_0 = [0.25, 2] - e_0 = [0.4375, 1.875],
         x_1 = [-0.5, 0.5] - e_1 = [-0.25, 0.875];  c = [0.5625, 1.75]
  local SGD, tau = 2: after step 1 x_0 = [0.25, 2.5], x_1 = [0, 0.5]; average [0.125, 1.5].
         Outer Nesterov SGD (lr 0.5, momentum 0.5): delta = [1, 2] - [0.125, 1.5] = [0.875, 0.5],
         anchor = [1, 2] - 0.5 * 1.5 * delta = [0.34375, 1.625] on both workers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scaledl.strategies.elastic import check_beta
from scaledl.strategies.local_sgd import LocalSGD
from scaledl.strategies.round_robin_easgd import RoundRobinEASGD
from scaledl.strategies.sync_easgd import SyncEASGD
from tests.harness import run_ranks

GRADS = [
    [[1.0, -1.0], [3.0, 1.0]],
    [[0.5, 0.0], [-1.0, 2.0]],
    [[0.0, 1.0], [1.0, 0.0]],
]


class Pair(nn.Module):
    """One parameter of two elements, [1, 2]."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))


def _nesterov(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5, momentum=0.5, nesterov=True)


CASES: dict[str, tuple[type, dict[str, Any], int, float]] = {
    # name: (class, options, steps, inner momentum)
    "sync-tree": (SyncEASGD, {"alpha": 0.25, "form": "tree"}, 2, 0.0),
    "sync-tree-no-overlap": (SyncEASGD, {"alpha": 0.25, "form": "tree", "overlap": False}, 2, 0.0),
    "sync-allreduce": (SyncEASGD, {"alpha": 0.25, "form": "allreduce"}, 2, 0.0),
    "sync-momentum": (SyncEASGD, {"alpha": 0.25}, 2, 0.5),
    "sync-tau2": (SyncEASGD, {"alpha": 0.25, "tau": 2}, 3, 0.0),
    "round-robin": (RoundRobinEASGD, {"alpha": 0.25}, 2, 0.0),
    "local-sgd": (LocalSGD, {"tau": 2}, 2, 0.0),
    "local-sgd-nesterov": (LocalSGD, {"tau": 2, "outer_optimizer": _nesterov}, 2, 0.0),
}

EXPECTED: dict[str, tuple[list[list[float]], list[float]]] = {
    # name: ([x_0, x_1], center or averaged model)
    "sync-tree": ([[0.375, 2.375], [0.375, 0.625]], [0.5, 2.0]),
    "sync-tree-no-overlap": ([[0.375, 2.375], [0.375, 0.625]], [0.5, 2.0]),
    "sync-allreduce": ([[0.375, 2.375], [0.375, 0.625]], [0.5, 2.0]),
    "sync-momentum": ([[0.125, 2.625], [-0.375, 0.375]], [0.5, 2.0]),
    "sync-tau2": ([[0.4375, 1.875], [-0.25, 0.875]], [0.5625, 1.75]),
    "round-robin": ([[0.375, 2.375], [0.34375, 0.65625]], [0.53125, 1.96875]),
    "local-sgd": ([[0.125, 1.5], [0.125, 1.5]], [0.125, 1.5]),
    "local-sgd-nesterov": ([[0.34375, 1.625], [0.34375, 1.625]], [0.34375, 1.625]),
}


def _run_case(rank: int, name: str) -> dict[str, Any]:
    cls, options, steps, momentum = CASES[name]
    torch.manual_seed(rank)
    model = Pair()
    if rank == 1:  # a different start: the constructor must give every worker rank 0's model
        with torch.no_grad():
            model.w.add_(5.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=momentum)
    strategy = cls(model, optimizer, **options)
    for step in range(steps):
        model.w.grad = torch.tensor(GRADS[step][rank])
        strategy.step()
    strategy.synchronize()
    evaluation = strategy.evaluation_module()
    return {"x": model.w.tolist(), "center": evaluation.w.tolist(),
            "syncs": strategy.stats.syncs, "bytes": strategy.stats.bytes,
            "order": getattr(strategy, "order", None)}


def _error(cls: type, **options: Any) -> str:
    """The message of the error building ``cls`` with ``options`` raises ("" if none)."""
    model = Pair()
    try:
        cls(model, torch.optim.SGD(model.parameters(), lr=0.5), **options)
    except ValueError as error:
        return str(error)
    return ""


def _all_cases(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: _run_case(rank, name) for name in CASES}
    out["errors"] = {  # raised on every rank before any communication, so no rank hangs
        "beta-1": _error(SyncEASGD, alpha=0.5),
        "beta-1.4": _error(SyncEASGD, alpha=0.7, form="allreduce"),
        "beta-0.9": _error(SyncEASGD, alpha=0.45),
        "round-robin-0.7": _error(RoundRobinEASGD, alpha=0.7),
        "tree-ring": _error(SyncEASGD, form="tree", algorithm="ring"),
    }
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(2, _all_cases, timeout=90)


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_hand_computed_values(
    results: list[dict[str, Any]], name: str
) -> None:
    workers, center = EXPECTED[name]
    for rank in range(2):
        got = results[rank][name]
        assert got["x"] == workers[rank], f"{name} rank {rank} x"
        assert got["center"] == center, f"{name} rank {rank} center/evaluation model"


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_exchange_counts_and_order(results: list[dict[str, Any]]) -> None:
    for rank in range(2):
        assert results[rank]["sync-tree"]["syncs"] == 2
        assert results[rank]["sync-tau2"]["syncs"] == 2  # steps 0 and 2 of 3
        assert results[rank]["local-sgd"]["syncs"] == 1
        assert results[rank]["sync-allreduce"]["bytes"] > 0
    assert results[0]["round-robin"]["order"] == [0, 1]


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["sync-tree", "sync-tree-no-overlap", "sync-allreduce",
                                  "sync-tau2"])
def test_sync_easgd_counts_bytes_of_applied_exchanges(
    results: list[dict[str, Any]], name: str
) -> None:
    """With overlap, an exchange starts after the last step and is waited for by
    ``synchronize()`` but applied by no step: it counts neither as a sync nor in the bytes."""
    collectives = 1 if CASES[name][1].get("form") == "allreduce" else 2  # reduce + broadcast
    for rank in range(2):
        got = results[rank][name]
        assert got["syncs"] == 2
        assert got["bytes"] == got["syncs"] * collectives * 2 * 4  # 2 float32 per message


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_sync_easgd_requires_workers_times_alpha_below_one(
    results: list[dict[str, Any]]
) -> None:
    for rank in range(2):
        errors = results[rank]["errors"]
        assert "beta = workers * alpha = 2 * 0.5 = 1 below 1" in errors["beta-1"]
        assert "give alpha 0.45 (0.9 / workers) or smaller" in errors["beta-1"]
        assert "2 * 0.7 = 1.4 below 1" in errors["beta-1.4"]
        assert errors["beta-0.9"] == ""
        assert errors["round-robin-0.7"] == ""  # one worker at a time: alpha < 1 is enough
        assert "algorithm 'ring' does not implement reduce" in errors["tree-ring"]


@pytest.mark.parametrize(("alpha", "workers", "ok"), [
    (0.45, 2, True), (0.5, 2, False), (0.9, 1, True), (0.3, 4, False), (0.2, 4, True),
])
def test_check_beta(alpha: float, workers: int, ok: bool) -> None:
    if ok:
        assert check_beta(alpha, workers) == pytest.approx(alpha * workers)
        return
    with pytest.raises(ValueError, match=f"beta = workers \\* alpha = {workers} \\* {alpha}"):
        check_beta(alpha, workers)


# -- bad input: checked before any communication, so no process group is needed -------------
def _strategy(cls: type, optimizer_momentum: float = 0.0, **options: Any) -> None:
    model = Pair()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=optimizer_momentum)
    cls(model, optimizer, **options)


@pytest.mark.parametrize("cls", [SyncEASGD, RoundRobinEASGD])
@pytest.mark.parametrize("alpha", [0.0, 1.0, 1.5, -0.25])
def test_alpha_outside_open_unit_interval_is_rejected(cls: type, alpha: float) -> None:
    with pytest.raises(ValueError, match=f"alpha {alpha} must be in \\(0, 1\\)"):
        _strategy(cls, alpha=alpha)


@pytest.mark.parametrize("cls", [SyncEASGD, RoundRobinEASGD, LocalSGD])
@pytest.mark.parametrize("tau", [0, -3, 1.5])
def test_tau_below_one_is_rejected(cls: type, tau: object) -> None:
    with pytest.raises(ValueError, match=f"tau {tau!r} must be an integer >= 1"):
        _strategy(cls, tau=tau)


@pytest.mark.parametrize("cls", [SyncEASGD, RoundRobinEASGD, LocalSGD])
def test_momentum_outside_unit_interval_is_rejected(cls: type) -> None:
    with pytest.raises(ValueError, match="momentum 1.0 must be in \\[0, 1\\)"):
        _strategy(cls, optimizer_momentum=1.0)  # the optimizer's own


@pytest.mark.parametrize("cls", [SyncEASGD, RoundRobinEASGD, LocalSGD])
@pytest.mark.parametrize("keyword", ["taus", "momentum", "servers"])
def test_unknown_keywords_are_rejected(cls: type, keyword: str) -> None:
    """A typo (``taus=``) or a keyword of another strategy is an error, not silently dropped;
    momentum belongs to the optimizer."""
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        _strategy(cls, **{keyword: 4})


@pytest.mark.parametrize("cls", [SyncEASGD, RoundRobinEASGD, LocalSGD])
def test_without_a_process_group_the_error_says_to_call_init(cls: type) -> None:
    if dist.is_initialized():
        pytest.skip("this process has a process group")
    with pytest.raises(RuntimeError, match=f"^call scaledl.init\\(\\) before wrapping a "
                                           f"model in {cls.__name__}$"):
        _strategy(cls)


def test_unknown_form_is_rejected() -> None:
    with pytest.raises(ValueError, match="form 'ring' is unknown; use one of: tree, allreduce"):
        _strategy(SyncEASGD, form="ring")
