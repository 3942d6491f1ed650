"""In-process transport: ranks are threads that exchange tensors through mailboxes.

Built for exhaustive unit tests: every collective, algorithm and world size can be run in
milliseconds without processes or sockets.  A send copies its tensor into the mailbox of
``(source, destination, tag)`` at commit time; a receive waits for the next message of its mailbox
and copies it out, checking that the element counts and dtypes agree.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from scaledl.transport.base import Handle, Transport, TransportError

__all__ = ["LoopbackFabric", "LoopbackTransport", "run_threads"]

T = TypeVar("T")


class LoopbackFabric:
    """The shared mailboxes of one group of thread-ranks."""

    def __init__(self, world_size: int, timeout: float = 30.0) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self._boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def box(self, source: int, destination: int, tag: int) -> queue.Queue[torch.Tensor]:
        key = (source, destination, tag)
        with self._lock:
            if key not in self._boxes:
                self._boxes[key] = queue.Queue()
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

    def post(self) -> None:
        self.posted = True
        if self.kind == "send":
            self.fabric.box(self.source, self.destination, self.tag).put(self.tensor.clone())
            self.done = True

    def wait(self, timeout: float | None = None) -> None:
        if not self.posted:
            raise TransportError("wait() called before commit(): commit the transport first")
        if self.done:
            return
        limit = self.fabric.timeout if timeout is None else timeout
        try:
            message = self.fabric.box(self.source, self.destination, self.tag).get(timeout=limit)
        except queue.Empty:
            raise TransportError(
                f"rank {self.destination} timed out after {limit} s waiting for "
                f"{self.tensor.numel()} elements from rank {self.source} (tag {self.tag})"
            ) from None
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
    world_size: int, fn: Callable[[LoopbackTransport], T], timeout: float = 30.0
) -> list[T]:
    """Run ``fn(transport)`` on ``world_size`` thread-ranks; return results by rank.

    The first exception raised by any rank is re-raised here after every thread finished.
    """
    fabric = LoopbackFabric(world_size, timeout)
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
