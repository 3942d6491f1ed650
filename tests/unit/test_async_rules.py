"""Update rules of the asynchronous strategies against hand-computed values.

Two workers share one in-process server shard (the same code path as rank 0's worker beside
its server thread); gradients are fixed, so every value below is worked out by hand.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from scaledl.strategies.async_easgd import AsyncEASGD, AsyncMEASGD, HogwildEASGD
from scaledl.strategies.async_sgd import AsyncMSGD, AsyncSGD, HogwildSGD
from scaledl.strategies.parameter_server import InProcessServers, ServerShard, ShardSpec
from scaledl.strategies.parameter_server.strategy import ParameterServerStrategy


class Vec(nn.Module):
    """One trainable vector."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(values, dtype=torch.float64))


def _shard(values: list[float], rule: str, **options: float | bool) -> ServerShard:
    return ServerShard(ShardSpec(0, 0, len(values)), torch.tensor(values, dtype=torch.float64),
                       rule, **options)  # type: ignore[arg-type]


def _worker(cls: type[ParameterServerStrategy], shard: ServerShard, index: int,
            start: list[float], lr: float = 0.1, weight_decay: float = 0.0,
            optimizer_momentum: float = 0.0, **options: float) -> ParameterServerStrategy:
    module = Vec(start)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, weight_decay=weight_decay,
                                momentum=optimizer_momentum)
    link = InProcessServers([shard], index, 2)
    return cls(module, optimizer, link=link, **options)


def _step(worker: ParameterServerStrategy, grad: list[float]) -> list[float]:
    param = next(worker.module.parameters())
    param.grad = torch.tensor(grad, dtype=torch.float64)
    worker.step()
    return param.detach().tolist()


def _close(actual: list[float], expected: list[float]) -> None:
    assert actual == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("cls, locked", [(AsyncSGD, True), (HogwildSGD, False)])
def test_async_sgd_push_pull_and_staleness(cls: type[AsyncSGD], locked: bool) -> None:
    shard = _shard([1.0, 2.0], "sgd", locked=locked)
    a = _worker(cls, shard, 0, [9.0, 9.0])  # starts from the server's parameters, not its own
    b = _worker(cls, shard, 1, [9.0, 9.0])
    _close(a.module.w.tolist(), [1.0, 2.0])
    _close(_step(a, [1.0, 1.0]), [0.9, 1.9])          # w -= 0.1 * g, nothing in between
    _close(_step(b, [2.0, 0.0]), [0.7, 1.9])          # b read at version 0, a's push in between
    _close(_step(a, [1.0, 1.0]), [0.6, 1.8])          # a read at version 1, b's push in between
    assert shard.version == 3
    assert (a.stats.pushes, a.stats.staleness_sum) == (2, 1)
    assert (b.stats.pushes, b.stats.staleness_max) == (1, 1)


def test_async_msgd_server_momentum() -> None:
    shard = _shard([1.0, 2.0], "sgd", momentum=0.5)
    a = _worker(AsyncMSGD, shard, 0, [0.0, 0.0], momentum=0.5)
    b = _worker(AsyncMSGD, shard, 1, [0.0, 0.0], momentum=0.5)
    _close(_step(a, [1.0, 1.0]), [0.9, 1.9])          # v = [.1, .1]
    _close(_step(b, [2.0, 0.0]), [0.65, 1.85])        # v = .5 v + [.2, 0] = [.25, .05]
    _close(_step(a, [1.0, 1.0]), [0.425, 1.725])      # v = [.225, .125]
    assert shard.velocity is not None
    _close(shard.velocity.tolist(), [0.225, 0.125])


def test_async_msgd_momentum_defaults_to_the_optimizers() -> None:
    shard = _shard([1.0, 2.0], "sgd", momentum=0.5)
    assert _worker(AsyncMSGD, shard, 0, [0.0, 0.0], optimizer_momentum=0.5).momentum == 0.5
    assert _worker(AsyncMSGD, shard, 0, [0.0, 0.0], optimizer_momentum=0.5,
                   momentum=0.25).momentum == 0.25
    assert _worker(AsyncMSGD, shard, 0, [0.0, 0.0]).momentum == 0.0


def test_weight_decay_joins_the_gradient() -> None:
    shard = _shard([1.0, 2.0], "sgd")
    a = _worker(AsyncSGD, shard, 0, [0.0, 0.0], weight_decay=0.5)
    _close(_step(a, [1.0, 0.0]), [1.0 - 0.1 * 1.5, 2.0 - 0.1 * 1.0])


@pytest.mark.parametrize("cls, locked", [(AsyncEASGD, True), (HogwildEASGD, False)])
def test_async_easgd_exchange(cls: type[AsyncEASGD], locked: bool) -> None:
    shard = _shard([0.0, 0.0], "easgd", locked=locked, alpha=0.25)
    a = _worker(cls, shard, 0, [1.0, 1.0], alpha=0.25, tau=2)
    b = _worker(cls, shard, 1, [2.0, 0.0], alpha=0.25, tau=2)
    # a: e = .25 ([1, 1] - [0, 0]); x = x - .1 g - e; center += e
    _close(_step(a, [1.0, 0.0]), [0.65, 0.75])
    _close(shard.params.tolist(), [0.25, 0.25])
    # b: e = .25 ([2, 0] - [.25, .25]) = [.4375, -.0625]
    _close(_step(b, [0.0, 1.0]), [1.5625, -0.0375])
    _close(shard.params.tolist(), [0.6875, 0.1875])
    # tau = 2: a's second step is local only
    _close(_step(a, [1.0, 1.0]), [0.55, 0.65])
    _close(shard.params.tolist(), [0.6875, 0.1875])
    _close(next(a.evaluation_module().parameters()).tolist(), [0.6875, 0.1875])
    assert a.stats.pushes == 1 and shard.version == 2


@pytest.mark.parametrize("momentum", [{"momentum": 0.5}, {"optimizer_momentum": 0.5}])
def test_async_measgd_nesterov_form(momentum: dict[str, float]) -> None:
    """The momentum is the keyword's, or by default the optimizer's."""
    shard = _shard([0.0, 0.0], "easgd", alpha=0.25)
    a = _worker(AsyncMEASGD, shard, 0, [1.0, 1.0], alpha=0.25, **momentum)
    # x1 = x0 - e0 + v1, v1 = .5 * 0 - .1 g = [-.1, 0]; the model holds x1 + .5 v1
    _close(_step(a, [1.0, 0.0]), [0.6, 0.75])
    _close(shard.params.tolist(), [0.25, 0.25])
    # e1 = .25 (x1 - c) = [.1, .125]; v2 = [-.05, 0] - [0, .1]; x2 = [.5, .525]
    _close(_step(a, [0.0, 1.0]), [0.475, 0.475])
    _close(shard.params.tolist(), [0.35, 0.375])
    _close((a.flat - a.velocity).tolist(), [0.5, 0.525])


def test_hogwild_applies_without_the_lock() -> None:
    """With the update lock held elsewhere, a Hogwild shard still applies; a locked one waits."""
    for locked, rule in ((False, "sgd"), (False, "easgd"), (True, "sgd")):
        shard = _shard([1.0, 1.0], rule, locked=locked, alpha=0.5)
        update = torch.ones(2, dtype=torch.float64)
        call = shard.push if rule == "sgd" else shard.exchange
        with shard._lock:
            thread = threading.Thread(target=call, args=(update, 0) if rule == "sgd"
                                      else (update,), daemon=True)
            thread.start()
            thread.join(timeout=1.0)
            assert thread.is_alive() == locked
        thread.join(timeout=5.0)
        assert shard.version == 1


@pytest.mark.parametrize("locked", [False, True])
def test_hogwild_counts_every_update_under_contention(locked: bool) -> None:
    """Every update gets its own version; without the lock exchanges overlap (staleness > 0),
    with it none can (an exchange reads and writes the center in one critical section)."""
    shard = _shard([0.0] * 200_000, "easgd", locked=locked, alpha=0.1)
    versions: list[int] = []
    stale: list[int] = []
    start = threading.Barrier(4)

    def exchange() -> None:
        update = torch.ones(200_000, dtype=torch.float64)
        start.wait()
        for _ in range(100):
            _, version, staleness = shard.exchange(update)
            versions.append(version)
            stale.append(staleness)

    threads = [threading.Thread(target=exchange) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(versions) == list(range(1, 401)) and shard.version == 400
    assert (sum(stale) > 0) == (not locked), sum(stale)


@pytest.mark.parametrize("cls", [AsyncSGD, AsyncMSGD, AsyncMEASGD, HogwildEASGD])
def test_state_dict_round_trip(cls: type[ParameterServerStrategy]) -> None:
    rule = "easgd" if issubclass(cls, AsyncEASGD) else "sgd"

    def fresh() -> tuple[ServerShard, ParameterServerStrategy]:
        shard = _shard([1.0, -1.0, 0.5], rule, alpha=0.25, momentum=0.5,
                       locked=cls.locked)
        options = {AsyncSGD: {}, AsyncMSGD: {"momentum": 0.5}, HogwildEASGD: {"alpha": 0.25},
                   AsyncMEASGD: {"alpha": 0.25, "momentum": 0.5}}[cls]
        return shard, _worker(cls, shard, 0, [0.5, 0.5, 0.5], **options)

    grads = [[1.0, 0.0, -1.0], [0.5, 0.5, 0.5], [0.0, -1.0, 2.0], [1.0, 1.0, 1.0]]
    shard, worker = fresh()
    for grad in grads[:2]:
        _step(worker, grad)
    state = copy.deepcopy(worker.state_dict())  # state_dict tensors alias the live model
    expected = [_step(worker, grad) for grad in grads[2:]]
    shard2, resumed = fresh()
    shard2.load(state["strategy"]["server"]["params"], state["strategy"]["server"]["velocity"],
                state["strategy"]["server"]["versions"][0])
    resumed.load_state_dict(state)
    assert resumed.steps == 2
    for grad, values in zip(grads[2:], expected):
        _close(_step(resumed, grad), values)
    _close(shard2.params.tolist(), shard.params.tolist())
