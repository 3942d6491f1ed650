"""The synchronous EASGD family's shared part: the center variable and how steps combine.

Elastic averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015) couples each worker's parameters
``x_i`` to a center variable ``c`` with moving rate ``alpha = eta * rho``.  Two strategies build
on :class:`ElasticStrategy`:

* ``sync-easgd`` (:mod:`scaledl.strategies.sync_easgd`): You, Buluç, Demmel (SC17), every
  worker exchanges with the center at once through collectives;
* ``easgd`` (:mod:`scaledl.strategies.round_robin_easgd`): the original baseline, the master
  exchanges with one worker at a time in rank order.

**How the optimizer step and the elastic term combine.**  An exchange happens at the steps
``k`` with ``k % tau == 0`` (Zhang et al.'s Algorithm 1; ``tau = 1``: every step), and uses the
parameters ``x_i`` *before* that step's update, the ones the gradient was computed at:

    e_i     = alpha * (x_i - c)                          (elastic difference, old x_i and c)
    x_i    <- OptimizerStep(x_i, grad_i) - e_i          (Eq. 1; Eq. 5-6 with momentum)
    c      <- c + sum_i e_i                              (Eq. 2, synchronous form)

``OptimizerStep`` is the wrapped optimizer's own update (plain SGD: ``x - lr * grad``; torch
SGD with momentum ``mu``: ``v <- mu v + grad; x <- x - lr v``).  That is the classical
momentum of You et al.'s MEASGD Eq. 5-6 (``v <- mu v - eta grad; x <- x + v``, torch's ``v``
scaled by ``-eta``) only with
a constant learning rate, ``dampening=0`` and ``nesterov=False``: a schedule that changes
``lr`` rescales the old velocity differently, dampening scales the gradient by ``1 - dampening``
and Nesterov adds ``mu v`` to the gradient step (Zhang et al.'s EAMSGD look-ahead).  The
elastic term is applied after it and never enters the momentum buffer, as in the reference
EAMSGD code (the pull is computed from ``x_i`` before the gradient step and applied after it).
Between exchanges every worker runs its optimizer alone.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl import collectives
from scaledl.strategies.elastic import check_alpha, flatten_parameters
from scaledl.strategies.options import ElasticOptions
from scaledl.strategies.periodic import PeriodicStrategy, check_optimizer_momentum
from scaledl.sync.consistency import broadcast_tensors
from scaledl.sync.stats import SpanRecorder

__all__ = ["ElasticStrategy", "default_alpha"]


def default_alpha(group: dist.ProcessGroup | None = None) -> float:
    """Zhang et al.'s heuristic ``beta = workers * alpha = 0.9``: ``0.9 / workers``."""
    workers = dist.get_world_size(group) if dist.is_initialized() else 1
    return 0.9 / max(1, workers)


class ElasticStrategy(PeriodicStrategy):
    """Workers pulled toward a center variable every ``tau`` steps (see the module docstring).

    ``center`` is authoritative on rank 0; subclasses say whether other ranks keep it current
    (``replicated_center``).  ``evaluation_module()`` gives every rank a module holding it.
    """

    replicated_center = False
    """Whether every rank's ``center`` is always the current center (else only rank 0's)."""
    elastic = True
    options = ElasticOptions

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, alpha: float | None, tau: int,
        group: dist.ProcessGroup | None = None, timeline: SpanRecorder | None = None,
    ) -> None:
        if alpha is not None:
            check_alpha(alpha)
        check_optimizer_momentum(optimizer)
        self.alpha = float(alpha) if alpha is not None else default_alpha(group)
        """The moving rate ``eta * rho`` (default ``0.9 / workers``)."""
        super().__init__(module, optimizer, tau, group, timeline)
        self.center = self.flat.detach().clone()
        """The center variable, flat (rank 0's is authoritative)."""
        self._elastic = torch.zeros_like(self.flat)
        """This worker's elastic difference ``alpha * (x_i - c)`` of the current exchange."""
        self._evaluation: nn.Module | None = None

    def is_exchange_step(self, step: int) -> bool:
        """Whether step ``step`` (0-based) exchanges with the center."""
        return step % self.tau == 0

    @torch.no_grad()
    def evaluation_module(self) -> nn.Module:
        """Collective (call on every worker): a module holding the center variable, with rank
        0's buffers (e.g. batch-norm statistics), the same on every rank."""
        self.synchronize()
        if not self.replicated_center and self.num_workers > 1:
            collectives.broadcast(self.center, src=0, group=self.group)
        if self._evaluation is None:
            self._evaluation = copy.deepcopy(self.module)
        evaluation = self._evaluation
        flatten_parameters(evaluation).copy_(self.center)
        buffers = list(evaluation.buffers())
        for mine, source in zip(buffers, self.module.buffers()):
            mine.copy_(source)
        if buffers and self.num_workers > 1:
            broadcast_tensors(buffers, group=self.group)
        return evaluation

    def _strategy_state(self) -> dict[str, Any]:
        """Center (rank 0's), moving rate."""
        return {"center": self.center.clone(), "alpha": self.alpha}

    @torch.no_grad()
    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        center = state.get("center")
        if center is None or center.numel() != self.center.numel():
            raise ValueError(
                f"checkpoint holds no center variable of {self.center.numel()} elements for "
                f"strategy {self.name!r}; resume from a checkpoint of the same model"
            )
        self.center.copy_(center)
