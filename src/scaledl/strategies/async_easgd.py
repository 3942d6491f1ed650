"""Asynchronous elastic averaging on a parameter server: Async EASGD, Async MEASGD, Hogwild EASGD.

Zhang, Choromanska, LeCun (NIPS 2015, Alg. 1 and 2) and You, Buluç, Demmel (SC17): each worker
runs local SGD on its own parameters ``x``; every ``tau`` steps (the first at step 0) it
exchanges with the center ``c`` held by the server.  One exchange is one round trip: the worker
sends its ``x``, the server computes ``e = alpha * (x - c)``, sets ``c <- c + e`` and returns
``e``; the worker then applies its gradient step and ``x <- x - e`` (the simultaneous form:
``e`` and the gradient both use ``x`` before the step).

* ``async-easgd``: exchanges served first come first served, each under the server's lock (so
  the center an exchange reads is the one it updates: staleness 0).
* ``async-measgd``: the worker's local step is Nesterov momentum as in EAMSGD: the gradient is
  taken at the look-ahead point ``x + momentum * v``, then ``v <- momentum * v - lr * g`` and
  ``x <- x + v`` (the model holds the look-ahead point between steps).
* ``hogwild-easgd``: no lock: the threads serving different workers read and update the center
  concurrently; an exchange's staleness counts the updates that landed between its read of the
  center and its write.

The optimizer (``torch.optim.SGD``, one lr and weight decay) contributes its learning rate and
weight decay; ``async-measgd``'s momentum defaults to the optimizer's, the others use none.
``evaluation_module()`` is a copy of the model holding the center, pulled from the server (only
trainable parameters are served; buffers such as batch-norm statistics are the worker's own).
Each worker pulls the center when it calls ``evaluation_module()``; the other workers keep
updating it meanwhile, so workers evaluating together may see slightly different centers (their
own pulls), unless they stop exchanging first, as at the end of training.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.elastic import check_momentum, check_tau, flatten_parameters
from scaledl.strategies.options import ServerElasticOptions
from scaledl.strategies.parameter_server.connections import ServerConnection
from scaledl.strategies.parameter_server.strategy import (
    ParameterServerStrategy, optimizer_momentum,
)
from scaledl.sync.stats import SpanRecorder

__all__ = ["AsyncEASGD", "AsyncMEASGD", "HogwildEASGD"]


class AsyncEASGD(ParameterServerStrategy):
    """Local SGD steps plus an elastic exchange with the server's center every ``tau`` steps."""

    name = "async-easgd"
    rule = "easgd"
    periodic = elastic = True
    options = ServerElasticOptions
    locked = True
    applies_momentum = False
    comparison = MethodRow(90, "Async EASGD", tau=1, counterpart="async-sgd")

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, servers: int = 0,
                 alpha: float | None = None, tau: int = 1, timeout_s: float = 60.0,
                 timeline: SpanRecorder | None = None, link: ServerConnection | None = None,
                 idle_timeout_s: float | None = None) -> None:
        self.tau = check_tau(tau)
        super().__init__(module, optimizer, servers=servers, timeout_s=timeout_s, link=link,
                         timeline=timeline, alpha=alpha, idle_timeout_s=idle_timeout_s)
        self._center_module: nn.Module | None = None
        if not self.is_worker:
            return
        self._grad = torch.zeros_like(self.flat)
        self._diff = torch.zeros_like(self.flat)

    def step(self) -> None:
        """Exchange with the center if due, then the local step and the elastic pull."""
        link = self.link
        due = self.steps % self.tau == 0
        if due:
            with self.communicating("elastic exchange", 2 * self.message_bytes):
                result = link.exchange(self.exchange_point(), self._diff)
            self._stats.record_push(result.staleness)
        self.local_step(self.gather_gradient(self._grad))
        if due:
            self.flat.sub_(self._diff)
        self.after_step()
        self.steps += 1

    def exchange_point(self) -> torch.Tensor:
        """The parameters ``x`` the elastic difference is computed from."""
        return self.flat

    def local_step(self, grad: torch.Tensor) -> None:
        """``x <- x - lr * grad`` (``grad`` includes weight decay)."""
        self.flat.add_(grad, alpha=-self.lr)

    def after_step(self) -> None:
        """Anything after the elastic pull (the momentum look-ahead)."""

    def evaluation_module(self) -> nn.Module:
        """A copy of the model holding the center variable, pulled from the server now (each
        worker pulls at its own moment; see the module docstring)."""
        if self._center_module is None:
            self._center_module = copy.deepcopy(self.module)
        for mine, theirs in zip(self._center_module.buffers(), self.module.buffers()):
            mine.copy_(theirs)  # buffers (batch-norm statistics) are not served: this worker's
        center = flatten_parameters(self._center_module)
        with self.communicating("pull center", self.message_bytes):
            self.link.pull(center)
        return self._center_module


class AsyncMEASGD(AsyncEASGD):
    """Async EASGD whose workers take Nesterov momentum steps (EAMSGD)."""

    name = "async-measgd"
    keywords: ClassVar[tuple[str, ...]] = AsyncEASGD.keywords + ("momentum",)
    applies_momentum = True
    comparison = MethodRow(100, "Async MEASGD", momentum=True, tau=1, counterpart="async-msgd")

    def __init__(self, module: nn.Module, optimizer: Optimizer, *,
                 momentum: float | None = None, **options: Any) -> None:
        """``options``: :class:`AsyncEASGD`'s keywords."""
        self.momentum = check_momentum(optimizer_momentum(optimizer, self.name)
                                       if momentum is None else momentum)
        """The Nesterov momentum of the local steps (default: the optimizer's)."""
        super().__init__(module, optimizer, **options)
        if self.is_worker:
            self.velocity = torch.zeros_like(self.flat)
            """``momentum * v``: the model holds ``x + velocity`` between steps."""
            self._point = torch.zeros_like(self.flat)

    def exchange_point(self) -> torch.Tensor:
        """``x``: the model's look-ahead point less the momentum term."""
        return torch.sub(self.flat, self.velocity, out=self._point)

    def local_step(self, grad: torch.Tensor) -> None:
        """``v <- momentum * v - lr * g(x + momentum * v)``, ``x <- x + v``."""
        self.flat.add_(grad, alpha=-self.lr)
        self.velocity.add_(grad, alpha=-self.lr)

    def after_step(self) -> None:
        """Move to the next look-ahead point ``x + momentum * v``."""
        self.velocity.mul_(self.momentum)
        self.flat.add_(self.velocity)

    def rule_state(self) -> dict[str, Any]:
        return {"velocity": self.velocity.clone()} if self.is_worker else {}

    def load_rule_state(self, strategy: dict[str, Any], server: dict[str, Any] | None) -> None:
        """Restore the momentum buffer (zero when the checkpoint has none)."""
        saved = strategy.get("velocity")
        if saved is None:
            self.velocity.zero_()
        else:
            self.velocity.copy_(saved)


class HogwildEASGD(AsyncEASGD):
    """Async EASGD with no server lock: concurrent updates of the center."""

    name = "hogwild-easgd"
    locked = False
    comparison = MethodRow(110, "Hogwild EASGD", tau=1, counterpart="hogwild-sgd")
