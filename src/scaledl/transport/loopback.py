"""In-process transport: ranks are threads that exchange tensors through mailboxes.

Built for exhaustive unit tests: every collective, algorithm and world size can be run in
milliseconds without processes or sockets.  A send copies its tensor into the mailbox of
``(source, destination, tag)`` at commit time; a receive claims the next message of its mailbox
when it is committed (messages match in posting order, as on a real backend) and copies it out
when waited for, checking that the element counts and dtypes agree.  An *ordered* fabric keeps
one mailbox per pair of ranks whatever the tag, which is how NCCL matches messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from scaledl.transport.base import Handle, Transport, TransportError

__all__ = ["LoopbackFabric", "LoopbackTransport", "run_threads"]

T = TypeVar("T")


class _Mailbox:
    """Messages from one rank to another (per tag unless ordered), matched in posting order:
    the ``k``-th receive posted gets the ``k``-th message sent."""

    def __init__(self) -> None:
        self.messages: dict[int, torch.Tensor] = {}
        self.sent = 0
        self.claimed = 0
        self.ready = threading.Condition()

    def put(self, message: torch.Tensor) -> None:
        with self.ready:
            self.messages[self.sent] = message
            self.sent += 1
            self.ready.notify_all()

    def claim(self) -> int:
        with self.ready:
            ticket = self.claimed
            self.claimed += 1
            return ticket

    def take(self, ticket: int, timeout: float) -> torch.Tensor | None:
        with self.ready:
            if not self.ready.wait_for(lambda: ticket in self.messages, timeout):
                return None
            return self.messages.pop(ticket)


class LoopbackFabric:
    """The shared mailboxes of one group of thread-ranks."""

    def __init__(self, world_size: int, timeout: float = 30.0, ordered: bool = False) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.ordered = ordered
        """Ignore tags: one mailbox per pair of ranks, as NCCL matches messages."""
        self._boxes: dict[tuple[int, int, int], _Mailbox] = {}
        self._lock = threading.Lock()

    def box(self, source: int, destination: int, tag: int) -> _Mailbox:
        key = (source, destination, 0 if self.ordered else tag)
        with self._lock:
            if key not in self._boxes:
                self._boxes[key] = _Mailbox()
            return self._boxes[key]

    def transport(self, rank: int) -> LoopbackTransport:
        return LoopbackTransport(self, rank)


@dataclass
class _LoopbackHandle:
    fabric: LoopbackFabric
    kind: str
    tensor: torch.Tensor
    source: int
    destination: int
    tag: int
    posted: bool = False
    done: bool = False
    ticket: int = -1

    def post(self) -> None:
        self.posted = True
        box = self.fabric.box(self.source, self.destination, self.tag)
        if self.kind == "send":
            box.put(self.tensor.clone())
            self.done = True
        else:
            self.ticket = box.claim()

    def wait(self, timeout: float | None = None) -> None:
        if not self.posted:
            raise TransportError("wait() called before commit(): commit the transport first")
        if self.done:
            return
        limit = self.fabric.timeout if timeout is None else timeout
        box = self.fabric.box(self.source, self.destination, self.tag)
        message = box.take(self.ticket, limit)
        if message is None:
            raise TransportError(
                f"rank {self.destination} timed out after {limit} s waiting for "
                f"{self.tensor.numel()} elements from rank {self.source} (tag {self.tag})"
            )
        if message.numel() != self.tensor.numel() or message.dtype != self.tensor.dtype:
            raise TransportError(
                f"rank {self.destination} expected {self.tensor.numel()} {self.tensor.dtype} "
                f"elements from rank {self.source} but got {message.numel()} {message.dtype}"
            )
        self.tensor.copy_(message.view_as(self.tensor))
        self.done = True


class LoopbackTransport(Transport):
    """One thread-rank's view of a :class:`LoopbackFabric`."""

    def __init__(self, fabric: LoopbackFabric, rank: int) -> None:
        self.fabric = fabric
        self.rank = rank
        self.world_size = fabric.world_size
        self.ordered_by_peer = fabric.ordered
        self._queued: list[_LoopbackHandle] = []

    def queue_send(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        self._check_peer(peer)
        handle = _LoopbackHandle(self.fabric, "send", tensor, self.rank, peer, tag)
        self._queued.append(handle)
        return handle

    def queue_recv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        self._check_peer(peer)
        handle = _LoopbackHandle(self.fabric, "recv", tensor, peer, self.rank, tag)
        self._queued.append(handle)
        return handle

    def commit(self) -> None:
        queued, self._queued = self._queued, []
        for handle in queued:
            handle.post()


def run_threads(
    world_size: int, fn: Callable[[LoopbackTransport], T], timeout: float = 30.0,
    ordered: bool = False,
) -> list[T]:
    """Run ``fn(transport)`` on ``world_size`` thread-ranks; return results by rank.

    ``ordered`` matches messages by posting order alone, ignoring tags (NCCL's rule).  The first
    exception raised by any rank is re-raised here after every thread finished.
    """
    fabric = LoopbackFabric(world_size, timeout, ordered)
    results: list[T | None] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(fabric.transport(rank))
        except BaseException as error:  # re-raised in the caller
            errors[rank] = error

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5.0)
        if thread.is_alive():
            raise TransportError(f"a loopback rank did not finish within {timeout + 5.0} s")
    for error in errors:
        if error is not None:
            raise error
    return results  # type: ignore[return-value]
