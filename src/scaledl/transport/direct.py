"""Direct point-to-point messaging: each send or receive posted at once, every wait bounded.

The collectives' :class:`~scaledl.transport.base.Transport` queues a schedule's operations and
posts them together, on scaledl's private channel, with peers named by group rank.  A
request/reply protocol (the parameter server) needs something else: several threads of one
process talking to different peers at the same time, each posting one message when it is ready.
:class:`DirectTransport` is that door: it posts on a process group of its own (the
parameter-server group), addresses peers by *global* rank and tag, and is safe to use from
several threads, because Gloo matches a send with a receive by (peer, tag) and delivers the
messages of one pair in order.

Every wait is bounded: a peer that died makes the wait raise at once (its sockets close), one
that hangs makes it raise after the deadline.  Both, and any error torch raises while posting,
surface as a one-line :class:`PeerError` naming the peer.  A deadline of ``None`` waits with no
practical limit (:data:`NO_DEADLINE_S`), for a server waiting on a worker's next request.

For tests of the protocols above it under skewed schedules, ``SCALEDL_WIRE_JITTER=SEED:MAX_MS
[:PROBABILITY]`` (:data:`WIRE_JITTER_ENV`) makes every transport of the process sleep at random
(a :class:`~scaledl.transport.shm_jitter.Jitter` seeded by ``SEED`` and the global rank) before
and after posting every send and receive and around every wait.  Off, each call pays one
``is None`` test.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from scaledl.backend_errors import first_line
from scaledl.transport.base import TransportError
from scaledl.transport.shm_jitter import Jitter

_T = TypeVar("_T")

__all__ = ["DirectTransport", "PeerError", "NO_DEADLINE_S", "WIRE_JITTER_ENV"]

WIRE_JITTER_ENV = "SCALEDL_WIRE_JITTER"
"""The variable that switches on random delays around every post and wait (``SEED:MAX_MS
[:PROBABILITY]``, as :class:`~scaledl.transport.shm_jitter.Jitter` reads it)."""

NO_DEADLINE_S = 30 * 24 * 3600.0
"""The deadline of a wait that has none: 30 days (a dead peer still fails it at once)."""


class PeerError(TransportError):
    """A peer died, hung past the deadline, or the connection to it failed."""


class DirectTransport:
    """Sends and receives posted at once on ``group``; peers are global ranks.

    ``what`` in each call describes the operation for the error message, e.g. ``"send to"``
    gives ``send to rank 3 failed: ...``.
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.jitter = Jitter.from_environment(_global_rank(), WIRE_JITTER_ENV)
        """Random delays around every post and wait (``SCALEDL_WIRE_JITTER``), or None."""

    def isend(self, tensor: torch.Tensor, peer: int, tag: int,
              what: str = "send to") -> dist.Work:
        """Start sending ``tensor`` to ``peer``; keep ``tensor`` alive until :meth:`wait`."""
        return self._delayed("isend", lambda: _post(
            lambda: dist.isend(tensor, dst=peer, group=self.group, tag=tag), peer, what))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int,
              what: str = "receive from") -> dist.Work:
        """Start receiving into ``tensor`` from ``peer``."""
        return self._delayed("irecv", lambda: _post(
            lambda: dist.irecv(tensor, src=peer, group=self.group, tag=tag), peer, what))

    def wait(self, work: dist.Work, peer: int, what: str, timeout_s: float | None) -> None:
        """Wait for ``work`` (talking to ``peer``) for at most ``timeout_s`` seconds (None: no
        practical deadline)."""
        self._delayed("wait", lambda: _wait(work, peer, what, timeout_s))

    def _delayed(self, point: str, call: Callable[[], _T]) -> _T:
        """``call()``, with the jitter's random delays before and after it when one is set."""
        if self.jitter is None:
            return call()
        self.jitter.pause(f"before {point}")
        result = call()
        self.jitter.pause(f"after {point}")
        return result

    def send(self, tensor: torch.Tensor, peer: int, tag: int, timeout_s: float | None,
             what: str = "send to") -> None:
        """Send ``tensor`` to ``peer`` and wait until it has left."""
        self.wait(self.isend(tensor, peer, tag, what), peer, what, timeout_s)

    def recv(self, tensor: torch.Tensor, peer: int, tag: int, timeout_s: float | None,
             what: str = "receive from") -> None:
        """Receive into ``tensor`` from ``peer``."""
        self.wait(self.irecv(tensor, peer, tag, what), peer, what, timeout_s)


def _global_rank() -> int:
    """This process's global rank (0 without a process group), to seed the jitter."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _wait(work: dist.Work, peer: int, what: str, timeout_s: float | None) -> None:
    """:meth:`DirectTransport.wait` without the delays."""
    seconds = NO_DEADLINE_S if timeout_s is None else timeout_s
    try:
        work.wait(timedelta(seconds=seconds))
    except Exception as exc:  # Gloo raises RuntimeError subclasses for closed/timed-out pairs
        limit = "" if timeout_s is None else f" within {timeout_s:g} s"
        raise PeerError(f"{what} rank {peer} failed{limit}: {first_line(exc)}") from exc


def _post(start: Callable[[], dist.Work | None], peer: int, what: str) -> dist.Work:
    """Post a send or receive; any error, or none posted, is a :class:`PeerError`."""
    try:
        work = start()
    except Exception as exc:  # torch/Gloo raise multi-line RuntimeErrors here
        raise PeerError(f"{what} rank {peer} failed: {first_line(exc)}") from exc
    if work is None:  # only when this rank is not in the group
        raise PeerError(f"{what} rank {peer} failed: this rank is not in the group")
    return work
