"""Transport over a :class:`~scaledl.transport.channel.Channel` (Gloo, NCCL, MPI).

Queued operations are posted together at :meth:`TorchTransport.commit`: on Gloo one by one
(Gloo matches messages by peer, tag and order), on NCCL as one ``batch_isend_irecv`` group.
NCCL ignores tags and matches the messages between two ranks in posting order alone; such a
transport says so with :attr:`TorchTransport.ordered_by_peer`, and the executor then posts every
peer's operations in one schedule order (:mod:`scaledl.collectives.dataflow`).  Setting
``SCALEDL_P2P_ORDERED=1`` makes a Gloo transport behave the same way (every tag becomes 0), which
is how the tests check NCCL's matching rule on a CPU.

Every wait carries a timeout (the group's, unless a shorter one is given), so a dead peer raises
an error naming it instead of hanging.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scaledl.backend_errors import attempt, first_line
from scaledl.transport.base import Handle, Transport, TransportError
from scaledl.transport.channel import Channel

__all__ = ["TorchTransport", "resolve_group", "ORDERED_ENV"]

ORDERED_ENV = "SCALEDL_P2P_ORDERED"
"""Set to 1 to match point-to-point messages by posting order alone, as NCCL does."""


@dataclass
class _TorchHandle:
    kind: str
    peer: int
    peer_global: int
    tensor: torch.Tensor
    tag: int
    work: dist.Work | None = None
    default_timeout: float | None = None

    def wait(self, timeout: float | None = None) -> None:
        if self.work is None:
            raise TransportError("wait() called before commit(): commit the transport first")
        limit = timeout if timeout is not None else self.default_timeout
        work = self.work
        # outside any except block: a Ctrl-C pending since the wait began stays a bare
        # KeyboardInterrupt (scaledl.backend_errors)
        outcome = attempt(lambda: work.wait() if limit is None
                          else work.wait(timedelta(seconds=limit)))
        if isinstance(outcome, RuntimeError):
            direction = "to" if self.kind == "send" else "from"
            raise TransportError(
                f"{self.kind} of {self.tensor.numel()} elements {direction} rank "
                f"{self.peer_global} failed: {first_line(outcome)}; the peer may have died or "
                "fallen out of step (every rank must run the same collectives in order; rerun "
                "with SCALEDL_DEBUG=1 to compare every rank's calls)"
            ) from outcome


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or the default group; a clear error when torch.distributed is not set up."""
    if group is None:
        world = dist.group.WORLD  # None before init_process_group and after its destroy
        if world is not None:
            return world
    elif dist.is_initialized():
        return group
    raise RuntimeError(
        "torch.distributed is not initialised; call scaledl.init() (or "
        "torch.distributed.init_process_group) first"
    )


def _ordered_by_env() -> bool:
    return os.environ.get(ORDERED_ENV, "").strip() not in ("", "0")


class TorchTransport(Transport):
    """Point-to-point messaging over scaledl's channel of one process group."""

    def __init__(self, channel: Channel, timeout: float | None = None) -> None:
        self.channel = channel
        self.rank = channel.rank
        self.world_size = channel.world_size
        self.backend = channel.backend
        self.timeout = timeout if timeout is not None else channel.timeout
        self.ordered_by_peer = channel.ordered_by_peer or _ordered_by_env()
        """True when messages between two ranks are matched by posting order, tags ignored."""
        self._queued: list[_TorchHandle] = []

    def queue_send(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return self._queue("send", tensor, peer, tag)

    def queue_recv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return self._queue("recv", tensor, peer, tag)

    def _queue(self, kind: str, tensor: torch.Tensor, peer: int, tag: int) -> Handle:
        self._check_peer(peer)
        if not tensor.is_contiguous():
            raise ValueError("transport tensors must be contiguous; pass tensor.contiguous()")
        tag = 0 if self.ordered_by_peer else tag
        handle = _TorchHandle(
            kind, peer, self.channel.global_ranks[peer], tensor, tag, None, self.timeout
        )
        self._queued.append(handle)
        return handle

    def commit(self) -> None:
        queued, self._queued = self._queued, []
        if not queued:
            return
        works = attempt(lambda: self.channel.post([  # outside any except block, as in wait
            (h.kind == "send", h.tensor, h.peer, h.tag) for h in queued
        ]))
        if isinstance(works, TransportError):
            raise works
        if isinstance(works, RuntimeError):  # a peer that is gone refuses the post itself
            peers = sorted({h.peer_global for h in queued})
            named = f"rank{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))}"
            raise TransportError(
                f"posting {len(queued)} transfers with {named} failed: {first_line(works)}; "
                "the peer may have died or fallen out of step (every rank must run the same "
                "collectives in order; rerun with SCALEDL_DEBUG=1 to compare every rank's calls)"
            ) from works
        # A coalescing backend returns one work for the whole batch.
        for index, handle in enumerate(queued):
            handle.work = works[index] if len(works) == len(queued) else works[0]
