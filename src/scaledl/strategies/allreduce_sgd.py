"""Allreduce SGD: synchronous data parallelism, every rank averages gradients and steps.

The gradients are averaged during backward by :class:`scaledl.DataParallel` (bucketed,
overlapped); ``step()`` is the optimizer's step on every rank, which keeps the replicas
identical.  This is DDP's algorithm, with scaledl's choice of collective.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.base import COLLECTIVE_KEYWORDS, Strategy
from scaledl.strategies.comparison import MethodRow
from scaledl.sync.data_parallel import DataParallel
from scaledl.sync.stats import SpanRecorder, SyncStats
from scaledl.topology import Topology

__all__ = ["AllreduceSGD"]


class AllreduceSGD(Strategy):
    """Average gradients with an allreduce in backward, then step everywhere."""

    name = "allreduce"
    keywords = COLLECTIVE_KEYWORDS + ("bucket_mb", "compression")
    timing = "bucketed"
    comparison = MethodRow(10, "Sync SGD (allreduce)")

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, algorithm: str = "auto",
        bucket_mb: float = 25.0, topology: Topology | None = None,
        group: dist.ProcessGroup | None = None, timeline: SpanRecorder | None = None,
        compression: str = "none",
    ) -> None:
        super().__init__(module, optimizer)
        self._model = DataParallel(module, algorithm, bucket_mb, topology, group,
                                   timeline=timeline, compression=compression)

    @property
    def model(self) -> DataParallel:
        """The DataParallel wrapper."""
        return self._model

    def step(self) -> None:
        """The optimizer step (gradients were averaged at the end of backward)."""
        self.optimizer.step()

    @property
    def stats(self) -> SyncStats:
        """Communication accounting of the gradient allreduces."""
        return self._model.stats
