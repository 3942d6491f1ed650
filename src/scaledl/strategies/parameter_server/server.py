"""Serving a :class:`ServerShard` to remote workers: one thread per worker.

Each thread loops: receive a header from its worker, check it, receive the payload, apply the
request to the shard, reply.  The threads run concurrently, so requests are served in the order
they arrive (first come first served), serialized by the shard's lock, or, for Hogwild shards,
applied at the same time by several threads.

Failures stay local to one worker: a malformed header is answered with an ERROR header and
logged, and the thread goes on serving; a worker that dies (its connection closes) or stays
silent past the deadline is dropped with a warning while the other threads keep serving.
:meth:`ShardServer.join` returns when every worker has sent DONE or been dropped.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server.protocol import (
    HEADER_TAG, PAYLOAD_TAG, REPLY_PAYLOAD_TAG, REPLY_TAG, REPLY_TO, ErrorCode, Header, Kind,
    ProtocolError, check_request, empty_header,
)
from scaledl.strategies.parameter_server.shard import ServerShard
from scaledl.strategies.parameter_server.wire import PeerError, recv, send

__all__ = ["ShardServer"]

log = logging.getLogger(__name__)


class ShardServer:
    """Serve ``shard`` from global rank ``rank`` to the worker ranks ``workers``."""

    def __init__(self, shard: ServerShard, rank: int, workers: list[int],
                 group: dist.ProcessGroup, timeout_s: float) -> None:
        self.shard = shard
        self.rank = rank
        self.workers = list(workers)
        self.group = group
        self.timeout_s = timeout_s
        self.finished: list[int] = []
        """Workers that sent DONE."""
        self.dropped: list[int] = []
        """Workers that died or went silent, in the order they were dropped."""
        self.rejected = 0
        """Malformed or unexpected requests answered with an ERROR header."""
        self._threads: list[threading.Thread] = []
        self._record = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the serving threads were started."""
        return bool(self._threads) or not self.workers

    def start(self) -> None:
        """Start one serving thread per worker (once)."""
        if self._threads:
            return
        for worker in self.workers:
            thread = threading.Thread(target=self._serve_worker, args=(worker,), daemon=True,
                                      name=f"ps{self.rank}-worker{worker}")
            thread.start()
            self._threads.append(thread)

    def join(self) -> None:
        """Wait until every worker has finished or been dropped (each thread's waits are bounded
        by the deadline, so this returns)."""
        self.start()
        for thread in self._threads:
            thread.join()
        log.info("parameter server rank %d: shard %d done at version %d; %d workers finished, "
                 "%d dropped %s, %d requests rejected", self.rank, self.shard.spec.index,
                 self.shard.version, len(self.finished), len(self.dropped), self.dropped,
                 self.rejected)

    # -- one worker ------------------------------------------------------------------------------
    def _serve_worker(self, worker: int) -> None:
        try:
            while not self._serve_one(worker):
                pass
        except PeerError as exc:
            with self._record:
                self.dropped.append(worker)
                left = len(self.workers) - len(self.dropped) - len(self.finished)
            log.warning("parameter server rank %d: dropping worker rank %d (%s); %d workers "
                        "still training", self.rank, worker, exc, left)
            return
        with self._record:
            self.finished.append(worker)

    def _serve_one(self, worker: int) -> bool:
        """Serve one request from ``worker``; True when it was DONE."""
        raw = empty_header()
        recv(raw, worker, self.group, HEADER_TAG, self.timeout_s, "waiting for a request from")
        header = Header.decode(raw)
        problem = check_request(header, worker, self.shard.spec, self.shard.version,
                                self.shard.allowed)
        if problem is not None:
            self._reject(worker, header, *problem)
            return False
        kind = Kind(header.kind)
        payload = None
        if header.payload_numel():
            payload = torch.empty(header.payload_numel(), dtype=self.shard.params.dtype)
            recv(payload, worker, self.group, PAYLOAD_TAG, self.timeout_s, "payload from")
        try:
            reply, data = self.answer(kind, header, payload)
        except (ValueError, RuntimeError, ProtocolError) as exc:
            log.exception("parameter server rank %d failed to serve %s from rank %d",
                          self.rank, kind.name, worker)
            self._reject(worker, header, ErrorCode.SERVER_FAULT, str(exc))
            return False
        send(reply.encode(), worker, self.group, REPLY_TAG, self.timeout_s, "reply to")
        if data is not None:
            send(data, worker, self.group, REPLY_PAYLOAD_TAG, self.timeout_s, "reply to")
        return kind == Kind.DONE

    def _reject(self, worker: int, header: Header, code: ErrorCode, reason: str) -> None:
        with self._record:
            self.rejected += 1
        log.error("parameter server rank %d rejected a request from rank %d (%s): %s; "
                  "answering ERROR and serving on", self.rank, worker, header.kind_name, reason)
        error = Header(Kind.ERROR, self.rank, self.shard.version, 0, 0, int(code),
                       self.shard.spec.index)
        send(error.encode(), worker, self.group, REPLY_TAG, self.timeout_s, "error reply to")

    def answer(self, kind: Kind, header: Header,
               payload: torch.Tensor | None) -> tuple[Header, torch.Tensor | None]:
        """Apply one checked request to the shard; return the reply header and payload."""
        shard, spec = self.shard, self.shard.spec
        aux, data = 0, None
        if kind == Kind.PUSH:
            assert payload is not None
            data, version, aux = shard.push(payload, header.version)
        elif kind == Kind.EXCHANGE:
            assert payload is not None
            data, version, aux = shard.exchange(payload)
        elif kind == Kind.PULL:
            data, version = shard.read()
        elif kind == Kind.STATE:
            params, velocity, version = shard.state()
            data, aux = (params, 0) if velocity is None else (torch.cat([params, velocity]), 1)
        else:
            version = shard.version
        reply = Header(int(REPLY_TO[kind]), self.rank, version, spec.numel, spec.offset, aux,
                       spec.index)
        return reply, data

