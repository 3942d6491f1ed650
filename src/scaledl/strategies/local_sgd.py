"""Local SGD: every worker steps alone; every ``tau`` steps the models are averaged.

Periodic model averaging (Zinkevich et al. 2010; Stich 2019 "Local SGD converges fast and
communicates little"), written as an *outer step* so DiLoCo (Douillard et al. 2023) is one
constructor argument away:

    after the optimizer step of every step k with (k + 1) % tau == 0:
        delta  = anchor - mean_i(x_i)         the pseudo-gradient (one allreduce-average)
        anchor = OuterOptimizer(anchor, delta)
        x_i    = anchor                       on every worker

``anchor`` is the model of the last synchronization (the same on every rank).  With
``outer_optimizer=None`` (the default) the outer step is plain averaging, ``x_i = mean_i(x_i)``
(one allreduce-average of the flat parameters, no anchor kept), which is what an outer SGD
with learning rate 1 and no momentum computes up to rounding.  ``outer_optimizer`` is a factory
``f(params) -> torch.optim.Optimizer`` called once on the anchor's single flat parameter, e.g.
DiLoCo's outer Nesterov momentum::

    LocalSGD(model, inner_opt, tau=500,
             outer_optimizer=lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, nesterov=True))

Only trainable parameters are averaged; each worker keeps its own buffers (e.g. batch-norm
statistics) and its own inner optimizer state (momentum), as in DiLoCo.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl import collectives
from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.elastic import flatten_parameters
from scaledl.strategies.periodic import PeriodicStrategy, check_optimizer_momentum
from scaledl.sync.stats import SpanRecorder
from scaledl.topology import Topology

__all__ = ["LocalSGD", "OuterOptimizerFactory"]

OuterOptimizerFactory = Callable[[list[nn.Parameter]], Optimizer]
"""Builds the outer optimizer on the anchor's parameters (one flat parameter)."""


class LocalSGD(PeriodicStrategy):
    """Average the workers' models every ``tau`` steps through an outer step (module docstring)."""

    name = "local-sgd"
    comparison = MethodRow(30, "Local SGD (tau 4)", tau=4)

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, *, tau: int = 1,
        outer_optimizer: OuterOptimizerFactory | None = None, algorithm: str = "auto",
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        check_optimizer_momentum(optimizer)
        super().__init__(module, optimizer, tau, group, timeline)
        self.algorithm = algorithm
        self.topology = collectives.resolve_topology(algorithm, "allreduce", topology, group)
        self._buffer = torch.zeros_like(self.flat)
        self.anchor: nn.Parameter | None = None
        """The model of the last synchronization (only with an outer optimizer)."""
        self.outer: Optimizer | None = None
        if outer_optimizer is not None:
            self.anchor = nn.Parameter(self.flat.detach().clone())
            self.outer = outer_optimizer([self.anchor])
        self._evaluation: nn.Module | None = None

    def is_sync_step(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends with an outer step."""
        return (step + 1) % self.tau == 0

    def _average(self, buffer: torch.Tensor) -> None:
        """Replace ``buffer`` by its mean over the workers."""
        handle = collectives.allreduce(buffer, "avg", algorithm=self.algorithm,
                                       topology=self.topology, group=self.group, async_op=True)
        assert handle is not None
        self._account("allreduce average", handle, buffer.numel() * buffer.element_size())

    @torch.no_grad()
    def outer_step(self) -> None:
        """Collective: the pseudo-gradient, the outer optimizer's step, every worker to the
        anchor (plain averaging without an outer optimizer)."""
        if self.outer is None or self.anchor is None:
            self._buffer.copy_(self.flat)
            self._average(self._buffer)
            self.flat.copy_(self._buffer)
        else:
            torch.sub(self.anchor, self.flat, out=self._buffer)
            self._average(self._buffer)  # mean_i(anchor - x_i) = anchor - mean_i(x_i)
            self.anchor.grad = self._buffer
            self.outer.step()
            self.anchor.grad = None
            self.flat.copy_(self.anchor)
        self._stats.syncs += 1

    def step(self) -> None:
        """The worker's own optimizer step; every ``tau``-th also the outer step."""
        self._begin_step()
        self.optimizer.step()
        sync = self.is_sync_step(self.steps)
        self.steps += 1
        if sync:
            self.outer_step()

    @torch.no_grad()
    def evaluation_module(self) -> nn.Module:
        """Collective (call on every worker): the averaged model.  Right after an outer step
        that is every worker's own module; in between, without an outer optimizer, a copy
        holding the mean of the workers' current parameters, and with one, the anchor."""
        if self.steps % self.tau == 0:
            return self.module
        if self._evaluation is None:
            self._evaluation = copy.deepcopy(self.module)
        flat = flatten_parameters(self._evaluation)
        if self.anchor is not None:
            flat.copy_(self.anchor)
        else:
            flat.copy_(self.flat)
            self._average(flat)
        for mine, source in zip(self._evaluation.buffers(), self.module.buffers()):
            mine.copy_(source)
        return self._evaluation

    def _strategy_state(self) -> dict[str, Any]:
        """Anchor and outer optimizer state (the same on every rank)."""
        if self.outer is None or self.anchor is None:
            return {}
        return {"anchor": self.anchor.detach().clone(), "outer": self.outer.state_dict()}

    @torch.no_grad()
    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        if self.outer is None or self.anchor is None:
            return
        if "anchor" not in state:
            raise ValueError("checkpoint holds no outer-optimizer state; resume with the outer "
                             "optimizer it was written with (or none)")
        self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
