"""Sync EASGD (You, Buluç, Demmel, SC17): every worker exchanges with the center at once.

Per exchange (steps ``k`` with ``k % tau == 0``), with the update rules of
:mod:`scaledl.strategies.easgd` (``e_i = alpha (x_i - c)``, ``x_i <- step(x_i) - e_i``,
``c <- c + sum_i e_i``), the exchange runs in one of two forms:

* ``form="tree"`` (the paper's): rank 0 holds the center; it is broadcast to every worker and
  the workers' parameters are reduced (summed) to rank 0, which sets
  ``c <- c + alpha (sum_i x_i - P c)``.  Both collectives move the whole model as one flat
  message (single-layer communication); their algorithm is ``algorithm`` (binomial ``tree`` as
  in the paper, or any algorithm that implements reduce and broadcast, or ``auto``).
* ``form="allreduce"`` (torch-distlearn's AllReduceEA): every rank keeps a replica of the
  center and one allreduce sums the elastic differences: ``c <- c + allreduce_sum(e_i)``.

Both forms compute the same worker updates from the same center; the center differs only by
floating-point rounding (``sum x_i - P c`` against ``sum (x_i - c)``).

Stability: the center update is ``c <- (1 - beta) c + beta mean_i(x_i)`` with
``beta = P alpha``, which oscillates for ``beta > 1`` and diverges for ``beta > 2``, so the
constructor requires ``P alpha < 1`` (Zhang et al.'s condition; the default is ``0.9 / P``).

Overlap (the paper's Sync EASGD3): the exchange for step ``k`` needs only ``x_i`` and ``c``
before step ``k``'s update, so with ``overlap=True`` it is started asynchronously at the end of
step ``k - 1`` and runs while step ``k``'s forward and backward compute; ``step()`` waits for
it just before the update.  The values exchanged are the same either way, so both settings are
bitwise identical, and so are two runs with the same world size and seed (every collective
runs a fixed schedule).  The exchange started after the last step (when the next step would
exchange) is waited for by ``synchronize()`` but applied by no step; ``stats`` counts an
exchange's ``syncs`` and ``bytes`` when a step applies it, and its time (``comm_s``,
``wait_s``) when it is waited for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl import collectives
from scaledl.collectives import CollectiveHandle
from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.easgd import ElasticStrategy
from scaledl.strategies.elastic import check_beta, elastic_difference
from scaledl.strategies.options import ElasticOptions, option
from scaledl.sync.stats import SpanRecorder
from scaledl.topology import Topology

__all__ = ["SyncEASGD", "SyncEASGDOptions", "FORMS"]

FORMS: tuple[str, ...] = ("tree", "allreduce")
"""Sync EASGD's exchange: reduce + broadcast with the center on rank 0, or an allreduce of the
elastic differences with a replicated center."""


@dataclass(frozen=True)
class SyncEASGDOptions(ElasticOptions):
    """The elastic options and the form of the exchange; ``workers * alpha`` must stay below 1."""

    easgd_form: str | None = option(str, "sync-easgd exchange: tree (reduce + broadcast) "
                                    "or allreduce")
    """The exchange: ``"tree"`` (reduce + broadcast, the default) or ``"allreduce"``."""

    def _check(self) -> None:
        if self.easgd_form is not None and self.easgd_form not in FORMS:
            raise ValueError(f"easgd_form {self.easgd_form!r} is unknown; use one of "
                             f"{', '.join(FORMS)}")

    def check_job(self, ranks: int, lr: float) -> None:
        """The stability condition, before launch (the constructor checks it too)."""
        super().check_job(ranks, lr)
        check_beta(self.moving_rate(ranks, lr), ranks)

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {**super().keywords(ranks, lr), "form": self.easgd_form or "tree"}


class SyncEASGD(ElasticStrategy):
    """Synchronous elastic averaging with a tree or allreduce exchange (module docstring)."""

    name = "sync-easgd"
    options = SyncEASGDOptions
    timing = "periodic"
    comparison = MethodRow(40, "Sync EASGD", tau=1, counterpart="allreduce")

    @classmethod
    def collective_kind(cls, easgd_form: str = "tree") -> str:
        """Rooted collectives in the tree form, any allreduce in the allreduce form."""
        return "rooted" if easgd_form == "tree" else "any"

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, *, alpha: float | None = None,
        tau: int = 1, form: str = "tree", algorithm: str = "auto", overlap: bool = True,
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        if form not in FORMS:
            raise ValueError(f"form {form!r} is unknown; use one of: {', '.join(FORMS)}")
        super().__init__(module, optimizer, alpha, tau, group, timeline)
        self.form = form
        self.replicated_center = form == "allreduce"
        self.algorithm = algorithm
        self.overlap = overlap
        needs = ("reduce", "broadcast") if form == "tree" else ("allreduce",)
        self._topologies = {c: collectives.resolve_topology(algorithm, c, topology, group)
                            for c in needs}
        """The layout each collective of the exchange runs on, checked for ``algorithm``."""
        self.topology = self._topologies[needs[0]]
        self._outgoing = torch.zeros_like(self.flat)
        """Tree: this worker's ``x_i`` (rank 0: then ``sum_i x_i``); allreduce: ``sum_i e_i``."""
        self._pending: list[tuple[str, CollectiveHandle]] = []
        self._launched = False
        self._unapplied_bytes = 0
        """Bytes of the exchange in flight or waited for, not yet applied by a step."""

    def _check_workers(self, workers: int) -> None:
        """Sync EASGD's stability condition ``workers * alpha < 1``."""
        check_beta(self.alpha, workers)

    # -- the exchange ----------------------------------------------------------------------------
    @torch.no_grad()
    def _launch(self) -> None:
        """Start the exchange for step ``self.steps`` from the current ``x_i`` and ``c``."""
        options: dict[str, Any] = {"algorithm": self.algorithm, "group": self.group,
                                   "async_op": True}
        topologies = self._topologies
        if self.form == "tree":
            self._start("broadcast center", collectives.broadcast(
                self.center, src=0, topology=topologies["broadcast"], **options))
            self._outgoing.copy_(self.flat)
            self._start("reduce workers", collectives.reduce(
                self._outgoing, dst=0, op="sum", topology=topologies["reduce"], **options))
        else:
            elastic_difference(self.flat, self.center, self.alpha, out=self._elastic)
            self._outgoing.copy_(self._elastic)
            self._start("allreduce elastic", collectives.allreduce(
                self._outgoing, "sum", topology=topologies["allreduce"], **options))
        self._launched = True

    def _start(self, label: str, handle: CollectiveHandle | None) -> None:
        assert handle is not None  # async_op=True always returns a handle
        self._pending.append((label, handle))

    def _wait_pending(self) -> None:
        """Wait for the exchange's collectives; their bytes count once a step applies them."""
        nbytes = self.flat.numel() * self.flat.element_size()
        pending, self._pending = self._pending, []
        for label, handle in pending:
            self._wait_timed(label, handle, nbytes)
            self._unapplied_bytes += nbytes

    @torch.no_grad()
    def _complete(self) -> None:
        """Wait for the exchange; set this worker's ``e_i`` and move the center."""
        self._wait_pending()
        self._launched = False
        self._stats.syncs += 1
        self._stats.bytes += self._unapplied_bytes
        self._unapplied_bytes = 0
        if self.form == "allreduce":  # e_i was computed at launch
            self.center.add_(self._outgoing)
            return
        elastic_difference(self.flat, self.center, self.alpha, out=self._elastic)
        if self.worker_rank == 0:
            self._outgoing.sub_(self.center, alpha=self.num_workers)  # sum_i x_i - P c
            self.center.add_(self._outgoing, alpha=self.alpha)

    # -- the strategy ----------------------------------------------------------------------------
    def step(self) -> None:
        """Optimizer step; on exchange steps also the elastic pull and the center update."""
        self._begin_step()
        exchange = self.is_exchange_step(self.steps)
        if exchange:
            if not self._launched:
                self._launch()
            self._complete()
        self.optimizer.step()
        if exchange:
            with torch.no_grad():
                self.flat.sub_(self._elastic)
        self.steps += 1
        if self.overlap and self.is_exchange_step(self.steps):
            self._launch()

    def synchronize(self) -> None:
        """Wait for an exchange in flight (its result is applied by the next ``step()``)."""
        self._wait_pending()

    def _strategy_state(self) -> dict[str, Any]:
        """Center (rank 0's), moving rate and form."""
        return {**super()._strategy_state(), "form": self.form}

    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore the center; the next exchange starts afresh from the restored state."""
        super()._load_strategy_state(state)
        self._launched = False
        self._unapplied_bytes = 0
