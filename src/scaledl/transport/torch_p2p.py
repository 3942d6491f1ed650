"""Transport over ``torch.distributed`` point-to-point operations (Gloo, NCCL, MPI).

Gloo posts each operation with ``isend``/``irecv`` and honours tags; on NCCL, point-to-point
operations issued together must be grouped, so :meth:`TorchTransport.commit` posts each batch
of queued operations with ``batch_isend_irecv`` (NCCL ignores tags, matching by order).  Every wait
carries a timeout (the group's, unless a shorter one is given), so a dead peer raises an error
naming it instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scaledl.transport.base import Handle, Transport, TransportError

__all__ = ["TorchTransport", "resolve_group"]


@dataclass
class _TorchHandle:
    kind: str
    peer_global: int
    tensor: torch.Tensor
    tag: int
    work: dist.Work | None = None
    default_timeout: float | None = None

    def wait(self, timeout: float | None = None) -> None:
        if self.work is None:
            raise TransportError("wait() called before commit(): commit the transport first")
        limit = timeout if timeout is not None else self.default_timeout
        try:
            if limit is None:
                self.work.wait()
            else:
                self.work.wait(timedelta(seconds=limit))
        except RuntimeError as error:
            direction = "to" if self.kind == "send" else "from"
            raise TransportError(
                f"{self.kind} of {self.tensor.numel()} elements {direction} rank "
                f"{self.peer_global} failed: {_first_line(error)}; the peer may have died or "
                "fallen out of step (check that every rank runs the same collectives in order)"
            ) from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def resolve_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or the default group; a clear error when torch.distributed is not set up."""
    resolved = group if group is not None else dist.group.WORLD
    if resolved is None or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised; call scaledl.init() (or "
            "torch.distributed.init_process_group) first"
        )
    return resolved


class TorchTransport(Transport):
    """Point-to-point messaging over a ``torch.distributed`` process group."""

    def __init__(
        self, group: dist.ProcessGroup | None = None, timeout: float | None = None
    ) -> None:
        self.group = resolve_group(group)
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group))
        self.timeout = timeout
        self._global = [dist.get_global_rank(self.group, r) for r in range(self.world_size)]
        self._queued: list[_TorchHandle] = []

    def queue_send(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return self._queue("send", tensor, peer, tag)

    def queue_recv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> Handle:
        return self._queue("recv", tensor, peer, tag)

    def _queue(self, kind: str, tensor: torch.Tensor, peer: int, tag: int) -> Handle:
        self._check_peer(peer)
        if not tensor.is_contiguous():
            raise ValueError("transport tensors must be contiguous; pass tensor.contiguous()")
        handle = _TorchHandle(kind, self._global[peer], tensor, tag, None, self.timeout)
        self._queued.append(handle)
        return handle

    def commit(self) -> None:
        queued, self._queued = self._queued, []
        if not queued:
            return
        if self.backend == "nccl":
            ops = [
                dist.P2POp(dist.isend if h.kind == "send" else dist.irecv, h.tensor,
                           h.peer_global, self.group, h.tag)
                for h in queued
            ]
            works = dist.batch_isend_irecv(ops)
            # A coalescing backend returns one work for the whole batch.
            for index, handle in enumerate(queued):
                handle.work = works[index] if len(works) == len(queued) else works[0]
            return
        for handle in queued:
            post = dist.isend if handle.kind == "send" else dist.irecv
            handle.work = post(handle.tensor, handle.peer_global, group=self.group, tag=handle.tag)
