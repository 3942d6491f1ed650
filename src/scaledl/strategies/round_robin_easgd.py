"""Original EASGD with a round-robin master (the baseline of You, Buluç, Demmel, SC17).

Rank 0 is the master: it holds the center variable ``c`` and also trains as worker 0.  On every
exchange step (``k % tau == 0``) it talks to the workers one at a time, in rank order, worker
``i + 1`` only after worker ``i`` is done (Zhang et al.'s asynchronous EASGD under a round-robin
schedule):

    for i = 0, 1, ..., P - 1:          (worker 0 is the master's own, no message)
        worker i sends x_i to the master
        master:  e_i = alpha * (x_i - c);  c <- c + e_i;  sends e_i back
        worker i: x_i <- OptimizerStep(x_i, grad_i) - e_i      (as in scaledl.strategies.easgd)

Each worker therefore sees the center already moved by the workers before it.  The messages
are point-to-point on the group's transport, run in call order with the group's collectives
(:meth:`~scaledl.collectives.communicator.Communicator.point_to_point`) so they never interleave
with them; the master's exchange time grows linearly with ``P`` (``P (alpha + n beta)`` against
``log P`` for :mod:`~scaledl.strategies.sync_easgd`), which is the point of the baseline.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.collectives.communicator import communicator_for
from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.easgd import ElasticStrategy
from scaledl.strategies.elastic import elastic_difference
from scaledl.sync.stats import SpanRecorder
from scaledl.transport.base import Transport

__all__ = ["RoundRobinEASGD"]


class RoundRobinEASGD(ElasticStrategy):
    """The master exchanges with one worker at a time, in rank order (module docstring)."""

    name = "easgd"
    collectives = "none"
    keywords = ("timeline",)
    timing = "round-robin"
    comparison = MethodRow(50, "EASGD (round-robin)", tau=1, counterpart="allreduce")

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, *, alpha: float | None = None,
        tau: int = 1, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        super().__init__(module, optimizer, alpha, tau, group, timeline)
        master = self.worker_rank == 0
        self._incoming = torch.zeros_like(self.flat) if master else None
        self._reply = torch.zeros_like(self.flat) if master else None
        self.order: list[int] = []
        """Master only: the workers it exchanged with in the last exchange, in order."""

    @torch.no_grad()
    def _master(self, transport: Transport) -> None:
        assert self._incoming is not None and self._reply is not None
        self.order = [0]
        elastic_difference(self.flat, self.center, self.alpha, out=self._elastic)
        self.center.add_(self._elastic)
        reply = self._reply
        for peer in range(1, transport.world_size):
            receive = transport.queue_recv(self._incoming, peer)
            transport.commit()
            receive.wait()
            elastic_difference(self._incoming, self.center, self.alpha, out=reply)
            self.center.add_(reply)
            send = transport.queue_send(reply, peer)
            transport.commit()
            send.wait()
            self.order.append(peer)

    def _worker(self, transport: Transport) -> None:
        send = transport.queue_send(self.flat.detach(), 0)
        receive = transport.queue_recv(self._elastic, 0)
        transport.commit()
        send.wait()
        receive.wait()

    def _exchange(self) -> None:
        """Run this rank's part of the round robin; leave this worker's ``e_i`` in place."""
        part = self._master if self.worker_rank == 0 else self._worker
        handle = communicator_for(self.group).point_to_point(part, async_op=True)
        assert handle is not None
        messages = 2 * (self.num_workers - 1) if self.worker_rank == 0 else 2
        nbytes = messages * self.flat.numel() * self.flat.element_size()
        self._account("round robin", handle, nbytes)
        self._stats.syncs += 1

    def step(self) -> None:
        """Optimizer step; on exchange steps first this worker's turn with the master."""
        self._begin_step()
        exchange = self.is_exchange_step(self.steps)
        if exchange:
            self._exchange()
        self.optimizer.step()
        if exchange:
            with torch.no_grad():
                self.flat.sub_(self._elastic)
        self.steps += 1
