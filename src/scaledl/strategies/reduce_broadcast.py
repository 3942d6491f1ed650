"""Reduce-broadcast: the root owns the update (S-Caffe / OSU-Caffe / CaffeGPI).

Gradients are reduced to the root layer by layer during backward; ``step()`` runs the optimizer
on the root only and then propagates the new parameters layer by layer, each layer's forward
waiting only for its own broadcast (:class:`scaledl.sync.ReduceBroadcast`).  Only the root has
optimizer state, so only the root's checkpoint holds it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.base import Strategy
from scaledl.strategies.comparison import MethodRow
from scaledl.sync.propagation import ReduceBroadcast
from scaledl.sync.stats import SpanRecorder, SyncStats
from scaledl.topology import Topology

__all__ = ["ReduceBroadcastSGD"]


class ReduceBroadcastSGD(Strategy):
    """Per-layer reduce to the root, root-only step, per-layer broadcast."""

    name = "reduce-broadcast"
    collectives = "rooted"
    timing = "per-layer"
    comparison = MethodRow(20, "Sync SGD (reduce+bcast)")

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, algorithm: str = "auto", root: int = 0,
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        super().__init__(module, optimizer)
        self._model = ReduceBroadcast(module, algorithm, root, topology, group, timeline)

    @property
    def model(self) -> ReduceBroadcast:
        """The ReduceBroadcast wrapper."""
        return self._model

    def step(self) -> None:
        """Root: optimizer step; everyone: start propagating the parameters."""
        if self._model.is_root:
            self.optimizer.step()
        self._model.propagate()

    def synchronize(self) -> None:
        """Wait for the parameter broadcasts still in flight."""
        self._model.synchronize()

    @property
    def stats(self) -> SyncStats:
        """Communication accounting of the reduces and broadcasts."""
        return self._model.stats

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; non-root ranks keep no optimizer state (they never step)."""
        super().load_state_dict(state)
