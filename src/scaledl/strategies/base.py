"""Strategy: one interface for every distributed training algorithm.

Wrap a model and its optimizer; train with ``strategy.model`` and, after ``loss.backward()``,
call ``strategy.step()``.  ``state_dict()`` / ``load_state_dict()`` hold everything needed to
resume (model, optimizer, and the strategy's own state); ``stats`` reports communication.
Synchronous strategies are bitwise deterministic for a fixed world size and seed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch import nn
from torch.optim import Optimizer

from scaledl.sync.reducer import SyncStats

__all__ = ["Strategy"]


class Strategy(ABC):
    """A distributed training algorithm around one model and one optimizer."""

    name: str = "strategy"

    def __init__(self, module: nn.Module, optimizer: Optimizer) -> None:
        self.module = module
        self.optimizer = optimizer

    @property
    @abstractmethod
    def model(self) -> nn.Module:
        """The module to call for forward passes (it may wrap ``module``)."""

    @abstractmethod
    def step(self) -> None:
        """Apply this step's update, after ``loss.backward()``."""

    @property
    @abstractmethod
    def stats(self) -> SyncStats:
        """Communication accounting since the last ``stats.reset()``."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the wrapped module."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Finish pending communication, so that ``module`` holds the current parameters."""

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and strategy state."""
        self.synchronize()
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": {"name": self.name},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        saved = state.get("strategy", {}).get("name", self.name)
        if saved != self.name:
            raise ValueError(
                f"checkpoint was written by strategy {saved!r}, not {self.name!r}; "
                f"resume with --strategy {saved}"
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
