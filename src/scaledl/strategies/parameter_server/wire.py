"""Blocking point-to-point sends and receives with a deadline, on the parameter-server group.

Gloo matches a send with a receive by (peer, tag) and delivers in order, so one thread per peer
can talk to several peers at once.  Every wait is bounded: a peer that died makes the wait raise
at once (its sockets close), one that hangs makes it raise after ``timeout_s``.  Both surface as
:class:`PeerError` naming the peer.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server.protocol import ProtocolError

__all__ = ["PeerError", "send", "recv", "isend", "wait"]


class PeerError(ProtocolError):
    """A peer died, hung past the deadline, or the connection to it failed."""


def isend(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int) -> dist.Work:
    """Start sending ``tensor`` to global rank ``peer``; keep ``tensor`` alive until waited."""
    work = dist.isend(tensor, dst=peer, group=group, tag=tag)
    if work is None:  # pragma: no cover - only when this rank is not in the group
        raise PeerError(f"rank {peer} is not reachable in the parameter-server group")
    return work


def wait(work: dist.Work, peer: int, what: str, timeout_s: float) -> None:
    """Wait for ``work`` (talking to ``peer``) for at most ``timeout_s`` seconds."""
    try:
        work.wait(timedelta(seconds=timeout_s))
    except Exception as exc:  # Gloo raises RuntimeError subclasses for closed/timed-out pairs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PeerError(f"{what} rank {peer} failed within {timeout_s:g} s: {first}") from exc


def send(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int,
         timeout_s: float, what: str = "send to") -> None:
    """Send ``tensor`` to ``peer`` and wait until it has left."""
    wait(isend(tensor, peer, group, tag), peer, what, timeout_s)


def recv(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup, tag: int,
         timeout_s: float, what: str = "receive from") -> None:
    """Receive into ``tensor`` from ``peer``."""
    work = dist.irecv(tensor, src=peer, group=group, tag=tag)
    if work is None:  # pragma: no cover - only when this rank is not in the group
        raise PeerError(f"rank {peer} is not reachable in the parameter-server group")
    wait(work, peer, what, timeout_s)
