"""Asynchronous SGD on a parameter server: Async SGD, Async MSGD, Hogwild SGD.

The baselines of You, Buluç, Demmel (SC17), Sec. 4.2 of our notes: the server holds the
parameters ``w``; after ``loss.backward()`` a worker's ``step()`` pushes ``u = lr * (gradient +
weight_decay * w_read)`` and receives the fresh parameters in the same round trip (push-then-pull;
there is no separate pull before computing).  So each gradient is computed on the parameters the
worker received at its previous step, and the updates other workers pushed since then are its
staleness, which the server reports and :class:`SyncStats` accumulates.

* ``async-sgd``: the server applies ``w <- w - u`` first come first served under a lock.
* ``async-msgd``: the same with momentum on the server: ``v <- momentum * v + u; w <- w - v``.
* ``hogwild-sgd``: no lock: the threads serving different workers update ``w`` concurrently
  (lost element updates and torn reads tolerated, see :mod:`.parameter_server.shard`).

The optimizer (``torch.optim.SGD``, one lr and weight decay, no Nesterov) contributes its
learning rate and weight decay.  ``async-msgd``'s server momentum defaults to the optimizer's
momentum; ``async-sgd`` and ``hogwild-sgd`` apply none.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.elastic import check_momentum
from scaledl.strategies.parameter_server.connections import ServerConnection
from scaledl.strategies.parameter_server.strategy import (
    ParameterServerStrategy, optimizer_momentum,
)
from scaledl.sync.stats import SpanRecorder

__all__ = ["AsyncSGD", "AsyncMSGD", "HogwildSGD"]


class AsyncSGD(ParameterServerStrategy):
    """Workers push ``lr * gradient``; the server applies them one at a time, FCFS."""

    name = "async-sgd"
    rule = "sgd"
    locked = True
    applies_momentum = False
    comparison = MethodRow(60, "Async SGD")

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, servers: int = 0,
                 timeout_s: float = 60.0, timeline: SpanRecorder | None = None,
                 link: ServerConnection | None = None, idle_timeout_s: float | None = None) -> None:
        super().__init__(module, optimizer, servers=servers, timeout_s=timeout_s, link=link,
                         timeline=timeline, server_momentum=self.server_momentum(),
                         idle_timeout_s=idle_timeout_s)
        self.versions = [0] * len(self._layout.shards if self._layout else self.link.shards)
        if not self.is_worker:
            return
        self._update = torch.zeros_like(self.flat)
        if link is not None:  # an in-process server: start from its parameters
            self.versions = self.link.pull(self.flat)

    def server_momentum(self) -> float:
        """The momentum the server applies (none)."""
        return 0.0

    def step(self) -> None:
        """Push this step's update and take the fresh parameters from the reply."""
        link = self.link
        self.gather_gradient(self._update).mul_(self.lr)
        with self.communicating("push gradient", 2 * self.message_bytes):
            result = link.push(self._update, self.versions, self.flat)
        self.versions = result.versions
        self._stats.record_push(result.staleness)
        self.steps += 1

    def evaluation_module(self) -> nn.Module:
        """The worker's module after pulling the current parameters."""
        with self.communicating("pull parameters", self.message_bytes):
            self.versions = self.link.pull(self.flat)
        return self.module

    def rule_state(self) -> dict[str, Any]:
        return {"versions": list(self.versions)}

    def load_rule_state(self, strategy: dict[str, Any], server: dict[str, Any] | None) -> None:
        """Workers resume from the saved server parameters and versions."""
        if server is None:
            return
        self.flat.copy_(server["params"])
        saved = [int(v) for v in server["versions"]]
        self.versions = saved if len(saved) == len(self.versions) else [max(saved)] * len(
            self.versions)


class AsyncMSGD(AsyncSGD):
    """Async SGD with momentum applied by the server (equations (3), (4) of the notes)."""

    name = "async-msgd"
    keywords: ClassVar[tuple[str, ...]] = AsyncSGD.keywords + ("momentum",)
    applies_momentum = True
    comparison = MethodRow(70, "Async MSGD", momentum=True)

    def __init__(self, module: nn.Module, optimizer: Optimizer, *,
                 momentum: float | None = None, **options: Any) -> None:
        """``options``: :class:`AsyncSGD`'s keywords."""
        self.momentum = check_momentum(optimizer_momentum(optimizer, self.name)
                                       if momentum is None else momentum)
        """The server's momentum (default: the optimizer's)."""
        super().__init__(module, optimizer, **options)

    def server_momentum(self) -> float:
        """The momentum the server applies: :attr:`momentum`."""
        return self.momentum


class HogwildSGD(AsyncSGD):
    """Async SGD with no server lock: concurrent updates of the parameters."""

    name = "hogwild-sgd"
    locked = False
    comparison = MethodRow(80, "Hogwild SGD")
