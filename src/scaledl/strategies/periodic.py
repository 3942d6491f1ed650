"""Shared machinery of the strategies whose workers train apart between exchanges.

Sync EASGD, round-robin EASGD and local SGD let every worker take its own optimizer steps and
communicate only every ``tau`` steps, so the workers' parameters (and momentum) differ from rank
to rank.  :class:`PeriodicStrategy` gives them:

* one flat parameter buffer (:func:`~scaledl.strategies.elastic.flatten_parameters`), so an
  exchange is one message, and the same starting model on every rank (rank 0's, broadcast);
* communication accounting (:class:`~scaledl.sync.stats.SyncStats`) and timeline spans;
* exact checkpoints of diverged workers.  The trainer saves rank 0's ``state_dict()`` only, and
  a collective inside ``state_dict()`` would hang the other ranks, so gathering is a separate
  collective step: call :meth:`PeriodicStrategy.prepare_checkpoint` on **every** rank, then
  ``state_dict()`` on rank 0.  The dict then holds every worker's model and optimizer state
  (``strategy["workers"]``), and ``load_state_dict`` on rank ``r`` restores worker ``r``'s, so a
  resumed run continues bit for bit.  Without that gather (or when resuming with a different
  number of workers) every worker restarts from rank 0's parameters and optimizer state: the
  shared state (center, anchor, step counter) is exact, the workers' own trajectories are not.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.collectives import CollectiveHandle
from scaledl.strategies.base import Strategy
from scaledl.strategies.elastic import check_momentum, check_tau, flatten_parameters
from scaledl.strategies.options import PeriodicOptions
from scaledl.sync.consistency import broadcast_state
from scaledl.sync.stats import SpanRecorder, SyncStats, wait_and_charge

__all__ = ["PeriodicStrategy", "check_optimizer_momentum", "process_group_size"]


def check_optimizer_momentum(optimizer: Optimizer) -> None:
    """Raise the one-line momentum error if the momentum of any of ``optimizer``'s parameter
    groups is outside [0, 1)."""
    for group in optimizer.param_groups:
        if "momentum" in group:
            check_momentum(group["momentum"])


def process_group_size(group: dist.ProcessGroup | None, wrapper: str) -> int:
    """The size of ``group``; a one-line error naming ``wrapper`` when torch.distributed has
    not been initialized (these strategies communicate from their constructor on)."""
    if not dist.is_initialized():
        raise RuntimeError(f"call scaledl.init() before wrapping a model in {wrapper}")
    return dist.get_world_size(group)


class PeriodicStrategy(Strategy):
    """Base of strategies that exchange every ``tau`` local steps (see the module docstring).

    Subclasses validate their own hyper-parameters *before* calling this constructor, which
    communicates (it broadcasts rank 0's model), so bad input fails on every rank at once;
    checks that need the number of workers go in :meth:`_check_workers`, which runs after
    ``tau`` is checked and before any communication.  Without an initialized process group the
    constructor raises ``RuntimeError("call scaledl.init() before wrapping a model in ...")``.
    """

    periodic = True
    options = PeriodicOptions

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, tau: int,
        group: dist.ProcessGroup | None = None, timeline: SpanRecorder | None = None,
    ) -> None:
        super().__init__(module, optimizer)
        self.tau = check_tau(tau)
        self._check_workers(process_group_size(group, type(self).__name__))
        self.group = group
        self.timeline = timeline
        self.flat = flatten_parameters(module)
        """Every trainable parameter of ``module``, as views of this one buffer."""
        self.steps = 0
        """``step()`` calls so far (restored on resume)."""
        self._stats = SyncStats()
        self._gathered: tuple[int, list[dict[str, Any]]] | None = None
        with torch.no_grad():
            broadcast_state(module, group)

    def _check_workers(self, workers: int) -> None:
        """Validate hyper-parameters against the number of workers (before communicating)."""

    # -- roles -----------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The wrapped module itself: forward passes need no hooks."""
        return self.module

    @property
    def worker_rank(self) -> int:
        """This rank in ``group``."""
        return dist.get_rank(self.group) if dist.is_initialized() else 0

    @property
    def num_workers(self) -> int:
        """The size of ``group`` (every rank is a worker)."""
        return dist.get_world_size(self.group) if dist.is_initialized() else 1

    @property
    def worker_group(self) -> dist.ProcessGroup | None:
        """The group given to the constructor (``None``: the default group)."""
        return self.group

    @property
    def stats(self) -> SyncStats:
        """Exchanges (``syncs``), seconds they ran (``comm_s``), seconds this rank was blocked
        on them (``wait_s``) and their payload (``bytes``): each collective's buffer once (Sync
        EASGD tree: center and parameters; allreduce form: the elastic differences; local SGD:
        the parameters), each point-to-point message of the round robin."""
        return self._stats

    # -- accounting ------------------------------------------------------------------------------
    def _account(self, label: str, handle: CollectiveHandle, nbytes: int) -> None:
        """Wait for ``handle`` and add its run time, the wait and ``nbytes`` to the stats."""
        self._wait_timed(label, handle, nbytes)
        self._stats.bytes += nbytes

    def _wait_timed(self, label: str, handle: CollectiveHandle, nbytes: int) -> None:
        """Wait for ``handle``; add its run time and the wait (not its bytes) to the stats and
        its spans to the timeline."""
        wait_and_charge(handle, self._stats, self.timeline, comm_span=f"{self.name} {label}",
                        wait_span=f"wait for {label}", span_bytes=nbytes)

    # -- checkpoints -----------------------------------------------------------------------------
    def prepare_checkpoint(self) -> None:
        """Collective (call on every rank): gather every worker's model and optimizer state to
        rank 0, for the next ``state_dict()`` there (until the next ``step()``)."""
        self.synchronize()
        mine = {"model": copy.deepcopy(self.module.state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}
        if self.num_workers == 1:
            self._gathered = (self.steps, [mine])
            return
        everyone: list[Any] | None = [None] * self.num_workers if self.worker_rank == 0 else None
        root = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.gather_object(mine, everyone, dst=root, group=self.group)
        self._gathered = (self.steps, everyone) if everyone is not None else None

    def _strategy_state(self) -> dict[str, Any]:
        """The subclass's own state (center, anchor, ...), saved under ``"strategy"``."""
        return {}

    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_strategy_state` returned."""

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's model and optimizer, the step counter, the subclass's state, and every
        worker's model and optimizer if :meth:`prepare_checkpoint` ran since the last step."""
        state = super().state_dict()
        strategy = state["strategy"]
        strategy.update(self._strategy_state(), step=self.steps, tau=self.tau,
                        workers_saved=self.num_workers)
        if self._gathered is not None and self._gathered[0] == self.steps:
            strategy["workers"] = self._gathered[1]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore on every rank from rank 0's ``state_dict()``: worker ``r``'s own state when
        the checkpoint holds every worker's (same worker count), else rank 0's."""
        self.synchronize()
        super().load_state_dict(state)
        strategy = state.get("strategy", {})
        workers = strategy.get("workers")
        if workers is not None and len(workers) == self.num_workers:
            mine = workers[self.worker_rank]
            self.module.load_state_dict(mine["model"])
            self.optimizer.load_state_dict(mine["optimizer"])
        self.steps = int(strategy.get("step", 0))
        self._gathered = None
        self._load_strategy_state(strategy)

    def _begin_step(self) -> None:
        """Drop a gathered checkpoint: it describes the state before this step."""
        self._gathered = None
