"""Training algorithms behind one interface: ``loss.backward(); strategy.step()``.

Synchronous: ``allreduce`` (DDP's algorithm), ``reduce-broadcast`` (S-Caffe's root update with
per-layer propagation), ``sync-easgd`` (You et al.'s deterministic elastic averaging), ``easgd``
(the original round-robin exchange with a master), ``local-sgd`` (periodic averaging),
``diloco`` and ``streaming-diloco`` (an outer Nesterov step on the averaged pseudo-gradient,
the whole model or staggered fragments).
Asynchronous, through a parameter server: ``async-sgd``, ``async-msgd``, ``hogwild-sgd``,
``async-easgd``, ``async-measgd``, ``hogwild-easgd``.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.allreduce_sgd import AllreduceSGD
from scaledl.strategies.async_easgd import AsyncEASGD, AsyncMEASGD, HogwildEASGD
from scaledl.strategies.async_sgd import AsyncMSGD, AsyncSGD, HogwildSGD
from scaledl.strategies.base import Strategy
from scaledl.strategies.catalogue import strategies, strategy_class
from scaledl.strategies.diloco import DiLoCo, StreamingDiLoCo
from scaledl.strategies.local_sgd import LocalSGD
from scaledl.strategies.reduce_broadcast import ReduceBroadcastSGD
from scaledl.strategies.round_robin_easgd import RoundRobinEASGD
from scaledl.strategies.sync_easgd import SyncEASGD

__all__ = [
    "Strategy", "AllreduceSGD", "ReduceBroadcastSGD", "SyncEASGD", "RoundRobinEASGD", "LocalSGD",
    "DiLoCo", "StreamingDiLoCo", "AsyncSGD", "AsyncMSGD", "HogwildSGD", "AsyncEASGD",
    "AsyncMEASGD", "HogwildEASGD",
    "STRATEGIES", "build_strategy",
]

STRATEGIES: dict[str, type[Strategy]] = strategies()
"""Every strategy of this package by name (:mod:`scaledl.strategies.catalogue`)."""


def build_strategy(name: str, module: nn.Module, optimizer: Optimizer, **options: Any) -> Strategy:
    """The strategy ``name`` around ``module`` and ``optimizer``."""
    return strategy_class(name)(module, optimizer, **options)
