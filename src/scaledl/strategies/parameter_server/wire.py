"""Blocking point-to-point sends and receives with a deadline, on the parameter-server group.

Gloo matches a send with a receive by (peer, tag) and delivers in order, so one thread per peer
can talk to several peers at once.  Every wait is bounded: a peer that died makes the wait raise
at once (its sockets close), one that hangs makes it raise after ``timeout_s``.  Both, and any
error torch raises when a send or receive is posted, surface as a one-line :class:`PeerError`
naming the peer.  ``timeout_s=None`` waits with no practical deadline (:data:`NO_DEADLINE_S`):
for a server waiting for a worker's next request, which may be quiet for a long time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server.protocol import ProtocolError

__all__ = ["PeerError", "send", "recv", "isend", "wait", "NO_DEADLINE_S"]

NO_DEADLINE_S = 30 * 24 * 3600.0
"""The deadline of a wait that has none: 30 days (a dead peer still fails it at once)."""


class PeerError(ProtocolError):
    """A peer died, hung past the deadline, or the connection to it failed."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _post(start: Callable[[], dist.Work | None], peer: int, what: str) -> dist.Work:
    """Post a send or receive; any error, or none posted, is a :class:`PeerError`."""
    try:
        work = start()
    except Exception as exc:  # torch/Gloo raise multi-line RuntimeErrors here
        raise PeerError(f"{what} rank {peer} failed: {_first_line(exc)}") from exc
    if work is None:  # only when this rank is not in the group
        raise PeerError(f"{what} rank {peer} failed: this rank is not in the parameter-server "
                        "group")
    return work


def isend(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int,
          what: str = "send to") -> dist.Work:
    """Start sending ``tensor`` to global rank ``peer``; keep ``tensor`` alive until waited."""
    return _post(lambda: dist.isend(tensor, dst=peer, group=group, tag=tag), peer, what)


def wait(work: dist.Work, peer: int, what: str, timeout_s: float | None) -> None:
    """Wait for ``work`` (talking to ``peer``) for at most ``timeout_s`` seconds (None: no
    practical deadline)."""
    seconds = NO_DEADLINE_S if timeout_s is None else timeout_s
    try:
        work.wait(timedelta(seconds=seconds))
    except Exception as exc:  # Gloo raises RuntimeError subclasses for closed/timed-out pairs
        limit = "" if timeout_s is None else f" within {timeout_s:g} s"
        raise PeerError(f"{what} rank {peer} failed{limit}: {_first_line(exc)}") from exc


def send(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int,
         timeout_s: float | None, what: str = "send to") -> None:
    """Send ``tensor`` to ``peer`` and wait until it has left."""
    wait(isend(tensor, peer, group, tag, what), peer, what, timeout_s)


def recv(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int,
         timeout_s: float | None, what: str = "receive from") -> None:
    """Receive into ``tensor`` from ``peer``."""
    work = _post(lambda: dist.irecv(tensor, src=peer, group=group, tag=tag), peer, what)
    wait(work, peer, what, timeout_s)
