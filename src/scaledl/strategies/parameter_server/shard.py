"""What one parameter server holds and how it applies updates: :class:`ServerShard`.

A shard is a contiguous slice of the flat parameter vector (all of it when there is one server).
It applies one of two rules (You, Buluç, Demmel, SC17, Sec. 4; Zhang et al. 2015):

* ``"sgd"`` (Async SGD / MSGD / Hogwild SGD): a worker pushes ``u = lr * gradient``; the server
  sets ``v <- momentum * v + u; w <- w - v`` (``momentum = 0``: ``w <- w - u``) and returns ``w``.
* ``"easgd"`` (Async EASGD / MEASGD / Hogwild EASGD): a worker sends its parameters ``x``; the
  server computes ``e = alpha * (x - center)``, sets ``center <- center + e`` and returns ``e``,
  which the worker subtracts from ``x``.

``locked=True`` serves first come first served: each update (with the read of the parameters it
returns) is one critical section, so updates never interleave.  ``locked=False`` is Hogwild: the
threads serving different workers read and write the parameters concurrently with no lock.  The
races it tolerates: two in-place updates of the same element may overlap so that one of them is
lost, and a read (the parameters returned, or the center an elastic difference is computed from)
may mix values from before and after another worker's update.  Only the version counter (the
number of updates applied) keeps its own tiny mutex, so versions and staleness stay exact.

Staleness of an update = updates applied between the worker's read and the application of its
update.  With a lock an elastic exchange reads and writes the center in one critical section, so
its staleness is 0; a pushed gradient was computed on parameters read one step earlier, so other
workers' pushes in between count.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from scaledl.strategies.elastic import elastic_difference
from scaledl.strategies.parameter_server.protocol import Kind, ShardSpec

__all__ = ["ServerShard", "shard_specs", "RULES"]

RULES = ("sgd", "easgd")


def shard_specs(numel: int, servers: int) -> list[ShardSpec]:
    """Split ``numel`` parameters into ``servers`` contiguous shards of near-equal size."""
    if servers < 1 or numel < servers:
        raise ValueError(f"servers {servers} cannot shard {numel} parameters; use between 1 and "
                         f"{numel} servers")
    bounds = [numel * i // servers for i in range(servers + 1)]
    return [ShardSpec(i, bounds[i], bounds[i + 1] - bounds[i]) for i in range(servers)]


class ServerShard:
    """The parameters (or center variable) of one shard, its momentum and its version."""

    def __init__(self, spec: ShardSpec, params: torch.Tensor, rule: str, *, locked: bool = True,
                 momentum: float = 0.0, alpha: float = 0.0) -> None:
        if rule not in RULES:
            raise ValueError(f"server rule {rule!r} is not one of {RULES}")
        if params.numel() != spec.numel:
            raise ValueError(f"shard {spec.index} holds {spec.numel} values, got {params.numel()}")
        self.spec = spec
        self.rule = rule
        self.locked = locked
        self.momentum = momentum
        self.alpha = alpha
        self.params = params.detach().reshape(-1).clone()
        self.velocity = torch.zeros_like(self.params) if rule == "sgd" and momentum else None
        self._version = 0
        self._lock = threading.Lock()
        self._counter = threading.Lock()

    @property
    def version(self) -> int:
        """Updates applied so far."""
        return self._version

    @property
    def allowed(self) -> frozenset[Kind]:
        """The request kinds this shard serves."""
        update = Kind.PUSH if self.rule == "sgd" else Kind.EXCHANGE
        return frozenset({update, Kind.PULL, Kind.STATE, Kind.DONE})

    @contextlib.contextmanager
    def _section(self) -> Iterator[None]:
        """The update lock when locked, else nothing (Hogwild)."""
        if self.locked:
            with self._lock:
                yield
        else:
            yield

    def _ticket(self) -> int:
        """Count one applied update; return how many were applied before it."""
        with self._counter:
            before = self._version
            self._version += 1
        return before

    def push(self, update: torch.Tensor, read_version: int,
             out: torch.Tensor | None = None) -> tuple[torch.Tensor, int, int]:
        """Apply ``w <- w - (momentum * v + update)``; return (parameters, version, staleness),
        the parameters copied into ``out`` when given (no allocation on the hot path)."""
        self._expect("sgd", update)
        with self._section():
            if self.velocity is not None:
                self.velocity.mul_(self.momentum).add_(update)
                self.params.sub_(self.velocity)
            else:
                self.params.sub_(update)
            before = self._ticket()
            fresh = self._copy(out)
        return fresh, before + 1, before - read_version

    def exchange(self, worker: torch.Tensor,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, int, int]:
        """Elastic exchange with ``worker``'s parameters; return (e, version, staleness), ``e``
        written into ``out`` when given."""
        self._expect("easgd", worker)
        with self._section():
            read_version = self._version
            diff = elastic_difference(worker, self.params, self.alpha, out)
            self.params.add_(diff)
            before = self._ticket()
        return diff, before + 1, before - read_version

    def read(self, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """A copy of the parameters (into ``out`` when given) and the version they belong to."""
        with self._section():
            return self._copy(out), self._version

    def _copy(self, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            return self.params.clone()
        if out.numel() != self.spec.numel:
            raise ValueError(f"shard {self.spec.index} holds {self.spec.numel} values, cannot "
                             f"copy them into {out.numel()}")
        return out.copy_(self.params)

    def state(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Parameters, momentum buffer (``None`` without momentum) and version, as copies."""
        with self._section():
            velocity = None if self.velocity is None else self.velocity.clone()
            return self.params.clone(), velocity, self._version

    def load(self, params: torch.Tensor, velocity: torch.Tensor | None, version: int) -> None:
        """Restore what :meth:`state` returned (a missing momentum buffer restarts at zero)."""
        with self._lock:
            self.params.copy_(params.reshape(-1))
            if self.velocity is not None:
                if velocity is None:
                    self.velocity.zero_()
                else:
                    self.velocity.copy_(velocity.reshape(-1))
            with self._counter:
                self._version = int(version)

    def _expect(self, rule: str, tensor: torch.Tensor) -> None:
        if self.rule != rule:
            raise ValueError(f"this shard applies the {self.rule!r} rule, not {rule!r}")
        if tensor.numel() != self.spec.numel:
            raise ValueError(f"shard {self.spec.index} holds {self.spec.numel} values, got "
                             f"{tensor.numel()}")
