"""The common part of every parameter-server strategy: roles, server, link, accounting, state.

Building the strategy (on every rank, same arguments) creates the parameter-server group and,
with dedicated servers, the worker group; rank 0's parameters and buffers are broadcast so every
worker and every server starts from the same point (version 0).  Then:

* a worker trains and talks to the server(s) through its :class:`ServerConnection` in ``step()``;
* a dedicated server rank (``is_worker`` False) runs :meth:`serve` until every worker finished
  or was dropped;
* with ``servers=0`` rank 0 hosts the server as threads beside its worker, started at rank 0's
  first request, and rank 0's :meth:`finish` waits for the other workers to finish.

``state_dict()`` on a worker holds the model, optimizer, step counter, the rule's own state and
the server state fetched from every shard (parameters or center, server momentum, versions);
``load_state_dict()`` restores it without communicating, so the trainer may call it on every
rank: a rank that hosts a shard restores its slice.  :meth:`close` (after the last step)
joins the server threads and destroys the groups.

The servers apply plain SGD (with the server's or the worker's momentum), so the optimizer must
be ``torch.optim.SGD`` whose parameter groups share one learning rate and weight decay; they
are read from the first group at every step, so learning-rate schedulers work.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.base import Strategy
from scaledl.strategies.elastic import check_alpha, flatten_parameters, learning_rate
from scaledl.strategies.options import ServerOptions, StrategyOptions
from scaledl.strategies.parameter_server.layout import Layout, check_timeout, plan_layout
from scaledl.strategies.parameter_server.connections import (
    InProcessServers, RemoteServers, ServerConnection,
)
from scaledl.strategies.parameter_server.server import ShardServer
from scaledl.strategies.parameter_server.shard import ServerShard
from scaledl.sync.stats import SpanRecorder, SyncStats, blocking_exchange

__all__ = ["ParameterServerStrategy", "check_optimizer", "optimizer_momentum"]

log = logging.getLogger(__name__)


def check_optimizer(optimizer: Optimizer, strategy: str, nesterov: bool = False) -> None:
    """Raise a one-line error unless ``optimizer`` is ``torch.optim.SGD`` whose parameter groups
    share one lr and weight decay (and, unless ``nesterov``, without Nesterov momentum)."""
    if type(optimizer) is not torch.optim.SGD:
        raise ValueError(f"{strategy} applies plain SGD on the server, not "
                         f"{type(optimizer).__name__}; build the optimizer as torch.optim.SGD")
    groups = optimizer.param_groups
    settings = {(float(g["lr"]), float(g.get("weight_decay", 0.0))) for g in groups}
    if len(settings) > 1:
        raise ValueError(f"{strategy} uses one lr and weight decay, but the optimizer's "
                         f"{len(groups)} parameter groups have {sorted(settings)}; use one group")
    if not nesterov and any(g.get("nesterov", False) for g in groups):
        raise ValueError(f"{strategy} cannot apply Nesterov momentum on the server; build "
                         "torch.optim.SGD with nesterov=False")


def optimizer_momentum(optimizer: Optimizer, strategy: str) -> float:
    """The momentum of ``optimizer``'s first group, for a strategy that applies it itself."""
    group = optimizer.param_groups[0]
    if float(group.get("dampening", 0.0)):
        raise ValueError(f"{strategy} applies momentum without dampening, but the optimizer has "
                         f"dampening={group['dampening']}; use dampening=0 or pass momentum=")
    return float(group.get("momentum", 0.0))


class ParameterServerStrategy(Strategy):
    """Workers and parameter server(s); subclasses define ``step`` and the server ``rule``."""

    rule: ClassVar[str] = "sgd"
    locked: ClassVar[bool] = True
    collectives = "none"
    server = True
    keywords: ClassVar[tuple[str, ...]] = ("timeout_s", "timeline", "idle_timeout_s")
    options: ClassVar[type[StrategyOptions]] = ServerOptions

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, servers: int = 0,
                 timeout_s: float = 60.0, link: ServerConnection | None = None,
                 timeline: SpanRecorder | None = None, server_momentum: float = 0.0,
                 alpha: float | None = None, idle_timeout_s: float | None = None) -> None:
        super().__init__(module, optimizer)
        check_optimizer(optimizer, self.name, nesterov=self.rule != "sgd")
        self.timeout_s = check_timeout(timeout_s)
        self.idle_timeout_s = None if idle_timeout_s is None else check_timeout(idle_timeout_s)
        """Deadline of a server's wait for a worker's next request (None: none)."""
        if alpha is not None:
            check_alpha(alpha)
        self.flat = flatten_parameters(module)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._stats = SyncStats()
        self.timeline = timeline
        self.steps = 0
        self._finished = False
        self._server: ShardServer | None = None
        self._shard: ServerShard | None = None
        self._layout: Layout | None = None
        if link is not None:
            self.alpha = check_alpha(alpha if alpha is not None else 0.9 / link.num_workers)
            self._link: ServerConnection | None = link
            return
        layout = plan_layout(servers, self.flat.numel())
        self.alpha = check_alpha(alpha if alpha is not None else 0.9 / len(layout.worker_ranks))
        layout.make_groups(self.timeout_s)
        if layout.distributed:
            dist.broadcast(self.flat, src=0, group=layout.ps_group)
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0, group=layout.ps_group)
        self._layout = layout
        self._link = self._connect(layout, server_momentum)

    def _connect(self, layout: Layout, server_momentum: float) -> ServerConnection | None:
        spec = layout.hosts_shard
        if spec is not None:
            self._shard = ServerShard(spec, self.flat.narrow(0, spec.offset, spec.numel),
                                      self.rule, locked=self.locked, momentum=server_momentum,
                                      alpha=self.alpha)
        workers = layout.worker_ranks
        if not layout.distributed:
            assert self._shard is not None
            return InProcessServers([self._shard], 0, 1)
        assert layout.ps_group is not None
        if self._shard is not None:
            remote = [w for w in workers if w != layout.rank]
            self._server = ShardServer(self._shard, layout.rank, remote, layout.ps_group,
                                       self.timeout_s, self.idle_timeout_s)
        if not layout.is_worker:
            return None
        if self._shard is not None:  # rank 0 with the server thread beside it
            return InProcessServers([self._shard], 0, len(workers), before_use=self._server_start)
        servers = list(zip(layout.server_ranks, layout.shards))
        return RemoteServers(layout.rank, servers, layout.ps_group, self.timeout_s, layout.rank,
                          len(workers), self.flat.dtype, self.idle_timeout_s)

    def _server_start(self) -> None:
        if self._server is not None and not self._server.started:
            self._server.start()

    # -- roles -----------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The wrapped module itself (forward passes need no hooks)."""
        return self.module

    @property
    def stats(self) -> SyncStats:
        """Time blocked talking to the servers, bytes moved, pushes and their staleness."""
        return self._stats

    @property
    def is_worker(self) -> bool:
        """False on a dedicated server rank."""
        return self._layout is None or self._layout.is_worker

    @property
    def worker_rank(self) -> int:
        """This worker's index (the global rank: servers are the last ranks)."""
        if self._layout is None:
            assert self._link is not None
            return self._link.worker
        return self._layout.rank

    @property
    def num_workers(self) -> int:
        """Ranks that train."""
        if self._layout is None:
            assert self._link is not None
            return self._link.num_workers
        return len(self._layout.worker_ranks)

    @property
    def worker_group(self) -> dist.ProcessGroup | None:
        """The workers' group (``None`` when every rank is a worker)."""
        return None if self._layout is None else self._layout.worker_group

    @property
    def layout(self) -> Layout | None:
        """Roles and groups (``None`` for a strategy given an explicit link)."""
        return self._layout

    @property
    def dropped_workers(self) -> list[int]:
        """Worker ranks this rank's server dropped (dead or silent); empty without a server."""
        return [] if self._server is None else list(self._server.dropped)

    @property
    def shard_server(self) -> ShardServer | None:
        """The threads serving this rank's shard (a dedicated server, or rank 0 beside its
        worker); None on a rank that hosts no shard or without a process group."""
        return self._server

    @property
    def link(self) -> ServerConnection:
        """This worker's connection to the servers."""
        if self._link is None:
            raise RuntimeError(f"rank {self._layout.rank if self._layout else 0} is a dedicated "
                               f"parameter server of {self.name!r}; call serve(), not step()")
        return self._link

    def serve(self) -> None:
        """Serve the workers until every one has finished or been dropped."""
        if self.is_worker or self._server is None:
            super().serve()
            return
        self._server.join()

    def finish(self) -> None:
        """Tell the servers this worker is done; rank 0 hosting the server thread then waits for
        every other worker to finish (or be dropped)."""
        if self._finished or not self.is_worker:
            return
        self._finished = True
        with self.communicating("done", 0):
            self.link.done()
        if self._server is not None:
            self._server.join()

    def close(self, timeout_s: float | None = None) -> None:
        """Release what the strategy holds: join the server threads (for at most ``timeout_s``,
        default the strategy's ``timeout_s``) and destroy the process groups it created.  Call it
        after :meth:`finish` or :meth:`serve`; calling it again does nothing."""
        layout = self._layout
        if self._server is not None and self._server.started:
            limit = self.timeout_s if timeout_s is None else timeout_s
            if not self._server.join(limit):
                log.warning("parameter server rank %d: serving threads still running after "
                            "%g s; keeping its process groups", self._server.rank, limit)
                return
        if layout is not None:
            layout.destroy_groups()

    # -- helpers for subclasses --------------------------------------------------------------------
    def communicating(self, name: str, nbytes: int) -> contextlib.AbstractContextManager[None]:
        """Account a blocking exchange with the servers (time, bytes, timeline span)."""
        return blocking_exchange(self._stats, self.timeline, name, nbytes)

    def gather_gradient(self, out: torch.Tensor) -> torch.Tensor:
        """Copy every parameter's gradient (zeros where none) into the flat ``out``, plus the
        optimizer's weight decay times the parameters; return ``out``."""
        offset = 0
        for param in self._params:
            n = param.numel()
            if param.grad is None:
                out[offset:offset + n].zero_()
            else:
                out[offset:offset + n].copy_(param.grad.reshape(-1))
            offset += n
        decay = float(self.optimizer.param_groups[0].get("weight_decay", 0.0))
        if decay:
            out.add_(self.flat, alpha=decay)
        return out

    @property
    def lr(self) -> float:
        """The learning rate, from the optimizer (so schedulers work)."""
        return learning_rate(self.optimizer)

    @property
    def message_bytes(self) -> int:
        """Bytes of one full parameter vector."""
        return self.flat.numel() * self.flat.element_size()

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, steps, the rule's state and (on a worker) every shard's state."""
        state = super().state_dict()
        strategy = state["strategy"]
        strategy["steps"] = self.steps
        strategy.update(self.rule_state())
        if self.is_worker:
            with self.communicating("fetch server state", 2 * self.message_bytes):
                server = self.link.state()
            strategy["server"] = {"params": server.params, "velocity": server.velocity,
                                  "versions": list(server.versions)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (no communication; call it on every rank)."""
        super().load_state_dict(state)
        strategy = state.get("strategy", {})
        self.steps = int(strategy.get("steps", 0))
        server = strategy.get("server")
        if server is not None and self._shard is not None:
            spec = self._shard.spec
            velocity = server.get("velocity")
            self._shard.load(server["params"].narrow(0, spec.offset, spec.numel),
                             None if velocity is None
                             else velocity.narrow(0, spec.offset, spec.numel),
                             self._saved_version(server["versions"], spec.index))
        if self.is_worker:
            self.load_rule_state(strategy, server)

    def _saved_version(self, versions: list[int], index: int) -> int:
        """The saved version of shard ``index`` (the largest when the shard count changed)."""
        shards = len(self.link.shards) if self._link is not None else (
            self._layout.servers if self._layout is not None else 1)
        return int(versions[index]) if len(versions) == max(1, shards) else int(max(versions))

    def rule_state(self) -> dict[str, Any]:
        """The rule's own state for a checkpoint (momentum buffers, read versions)."""
        return {}

    def load_rule_state(self, strategy: dict[str, Any], server: dict[str, Any] | None) -> None:
        """Restore :meth:`rule_state` (``server``: the saved server state, if any)."""
