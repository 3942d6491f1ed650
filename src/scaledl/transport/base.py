"""Transport protocol: move tensors between two ranks of a group.

The shape follows picotron's ``send_recv``/``commit``/``wait`` and makes asynchrony explicit:

1. ``queue_send`` / ``queue_recv`` record an operation and return its :class:`Handle`;
2. ``commit`` posts every queued operation at once (so a backend can batch them);
3. ``Handle.wait`` blocks until that one operation is done, or raises after ``timeout`` seconds.

Peers are ranks *of the group* (0..world_size-1), not global ranks.  Messages between one pair of
ranks with one tag are matched in the order they were queued on each side; a transport whose
``ordered_by_peer`` is true (NCCL) ignores tags and matches by queueing order alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

__all__ = ["Handle", "Transport", "TransportError"]


class TransportError(RuntimeError):
    """A point-to-point operation failed or timed out; the message names the peer."""


class Handle(Protocol):
    """One queued operation; ``wait`` is valid after the transport's ``commit``."""

    def wait(self, timeout: float | None = None) -> None:
        """Block until the operation completes; raise :class:`TransportError` on failure."""
        ...


class Transport(ABC):
    """Point-to-point messaging among the ranks of one group."""

    rank: int
    world_size: int
    ordered_by_peer: bool = False
    """True when messages between two ranks are matched by posting order alone, tags ignored
    (NCCL); the executor then posts each peer's operations in one schedule order."""

    @abstractmethod
    def queue_send(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        """Record a send of ``tensor`` (contiguous) to ``peer``; posted by :meth:`commit`."""

    @abstractmethod
    def queue_recv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        """Record a receive into ``tensor`` (contiguous) from ``peer``; posted by :meth:`commit`."""

    @abstractmethod
    def commit(self) -> None:
        """Post every queued operation."""

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"rank {self.rank} cannot exchange with peer {peer}: peers are the other ranks "
                f"0..{self.world_size - 1} of the group"
            )
