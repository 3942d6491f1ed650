"""Training algorithms behind one interface: ``loss.backward(); strategy.step()``."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.allreduce_sgd import AllreduceSGD
from scaledl.strategies.base import Strategy
from scaledl.strategies.reduce_broadcast import ReduceBroadcastSGD

__all__ = ["Strategy", "AllreduceSGD", "ReduceBroadcastSGD", "STRATEGIES", "build_strategy"]

STRATEGIES: dict[str, type[Strategy]] = {
    AllreduceSGD.name: AllreduceSGD,
    ReduceBroadcastSGD.name: ReduceBroadcastSGD,
}


def build_strategy(name: str, module: nn.Module, optimizer: Optimizer, **options: Any) -> Strategy:
    """The strategy ``name`` around ``module`` and ``optimizer``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; use one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](module, optimizer, **options)
