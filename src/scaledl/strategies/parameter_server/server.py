"""Serving a :class:`ServerShard` to remote workers: one thread per worker.

Each thread loops: receive a header from its worker, check it, receive the payload, apply the
request to the shard, reply.  The threads run concurrently, so requests are served in the order
they arrive (first come first served), serialized by the shard's lock, or, for Hogwild shards,
applied at the same time by several threads.

Failures stay local to one worker.  A worker may be quiet for a long time between requests
(tau local steps, an evaluation, a checkpoint, a slower worker at a collective), so the wait for
its next request header has its own deadline, ``idle_timeout_s`` (default: none; a worker that
dies is still noticed at once, because its connection closes).  Once a header has arrived, its
payload must arrive within ``timeout_s``.  A reply (or ERROR) waits for the worker to take it
with the idle deadline too: a send completes only when the worker has posted its receive, and
a worker of several shards takes the replies one shard after another, so one late shard (still
loading a checkpoint, or busy with a queue of requests) holds every later shard's reply; with
``timeout_s`` there, the later shards dropped a worker that was only waiting.  Every header and
payload is received with its exact size checked (:mod:`.framing`), so a longer or shorter
message than announced is never served.  A malformed request is answered with an ERROR header
and logged; when its framing can be trusted and its announced payload fits in one shard that
payload is received and discarded and the thread goes on serving, otherwise (a wrong magic, a
message whose size is not the size it declares) the worker is dropped: the thread never
receives from it again, so a stray payload can never be matched with a later receive.  A worker
that dies, hangs past a deadline, or breaks the protocol, and any unexpected error in its
thread, drops that worker with a log line while the other threads keep serving.
:meth:`ShardServer.join` returns when every worker has sent DONE or been dropped.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server.protocol import (
    HEADER_TAG, PAYLOAD_TAG, REPLY_PAYLOAD_TAG, REPLY_TAG, REPLY_TO, ErrorCode, Header, Kind,
    check_request,
)
from scaledl.strategies.parameter_server.shard import ServerShard
from scaledl.strategies.parameter_server.framing import Frame, Inbox, recv_header
from scaledl.transport.direct import DirectTransport, PeerError

__all__ = ["ShardServer"]

log = logging.getLogger(__name__)


class _Drop(Exception):
    """This worker's stream can no longer be trusted: stop serving it."""


class _Buffers:
    """One serving thread's reusable tensors: the request payload and the reply data."""

    def __init__(self, shard: ServerShard) -> None:
        self.inbox = Inbox(shard.params)
        """Where request payloads arrive (and a rejected request's payload is discarded)."""
        self.reply = torch.empty_like(shard.params)


class ShardServer:
    """Serve ``shard`` from global rank ``rank`` to the worker ranks ``workers``."""

    def __init__(self, shard: ServerShard, rank: int, workers: list[int],
                 group: dist.ProcessGroup, timeout_s: float,
                 idle_timeout_s: float | None = None) -> None:
        self.shard = shard
        self.rank = rank
        self.workers = list(workers)
        self.group = group
        self.wire = DirectTransport(group)
        """Where requests arrive and replies leave."""
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s
        """Deadline of the wait for a worker's next request, and for it to take a reply (None:
        none)."""
        self.finished: list[int] = []
        """Workers that sent DONE."""
        self.dropped: list[int] = []
        """Workers that died, went silent or broke the protocol, in the order they were dropped."""
        self.rejected = 0
        """Malformed or unexpected requests answered with an ERROR header."""
        self._threads: list[threading.Thread] = []
        self._record = threading.Lock()
        self._logged = False

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

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until every worker has finished or been dropped, or ``timeout_s`` seconds have
        passed (None: no limit); return whether every serving thread has ended."""
        self.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        done = not any(thread.is_alive() for thread in self._threads)
        if done and not self._logged:
            self._logged = True
            log.info("parameter server rank %d: shard %d done at version %d; %d workers "
                     "finished, %d dropped %s, %d requests rejected", self.rank,
                     self.shard.spec.index, self.shard.version, len(self.finished),
                     len(self.dropped), self.dropped, self.rejected)
        return done

    # -- one worker ------------------------------------------------------------------------------
    def _serve_worker(self, worker: int) -> None:
        try:
            buffers = _Buffers(self.shard)
            while not self._serve_one(worker, buffers):
                pass
        except Exception as exc:  # noqa: BLE001 - every failure drops this worker only
            self._drop(worker, exc)
            return
        with self._record:
            self.finished.append(worker)

    def _drop(self, worker: int, exc: Exception) -> None:
        with self._record:
            self.dropped.append(worker)
            left = len(self.workers) - len(self.dropped) - len(self.finished)
        if isinstance(exc, (PeerError, _Drop)):
            log.warning("parameter server rank %d: dropping worker rank %d (%s); %d workers "
                        "still training", self.rank, worker, exc, left)
        else:
            log.error("parameter server rank %d: dropping worker rank %d after an unexpected "
                      "%s: %s; %d workers still training", self.rank, worker,
                      type(exc).__name__, exc, left, exc_info=exc)

    def _serve_one(self, worker: int, buffers: _Buffers) -> bool:
        """Serve one request from ``worker``; True when it was DONE."""
        frame = recv_header(self.wire, worker, HEADER_TAG, self.idle_timeout_s,
                            "waiting for a request from")
        header = frame.header  # None exactly when frame.problem says why
        problem = frame.problem if header is None else check_request(
            header, worker, self.shard.spec, self.shard.version, self.shard.allowed,
            self.shard.params.dtype)
        if problem is not None or header is None:
            assert problem is not None
            self._skip_payload(worker, frame, buffers)
            self._reject(worker, frame, *problem)
            self._drop_if_untrusted(frame, buffers)
            return False
        kind = Kind(header.kind)
        payload = None
        if header.payload_bytes:
            if not buffers.inbox.receive(header.payload_bytes, self.wire, worker, PAYLOAD_TAG,
                                         self.timeout_s, "payload from"):
                self._reject(worker, frame, ErrorCode.BAD_PAYLOAD, "the payload is not the "
                             f"{header.payload_bytes} bytes its header announced")
                return False
            payload = buffers.inbox.tensor
        try:
            reply, data = self.answer(kind, header, payload, buffers.reply)
        except Exception as exc:  # noqa: BLE001 - answered as SERVER_FAULT, then serve on
            log.exception("parameter server rank %d failed to serve %s from rank %d",
                          self.rank, kind.name, worker)
            self._reject(worker, frame, ErrorCode.SERVER_FAULT, str(exc))
            return False
        # the worker may be taking an earlier shard's reply first: wait as for a next request
        self.wire.send(reply.with_payload(data).encode(), worker, REPLY_TAG,
                       self.idle_timeout_s, "reply to")
        if data is not None:
            self.wire.send(data, worker, REPLY_PAYLOAD_TAG, self.idle_timeout_s, "reply to")
        return kind == Kind.DONE

    @staticmethod
    def _trusted(frame: Frame, buffers: _Buffers) -> bool:
        """Whether ``frame``'s announced payload can be received into the inbox."""
        return frame.trusted and 0 <= frame.payload_bytes <= buffers.inbox.capacity

    def _skip_payload(self, worker: int, frame: Frame, buffers: _Buffers) -> None:
        """Receive and discard a rejected request's announced payload, when that is safe."""
        if self._trusted(frame, buffers) and frame.payload_bytes:
            buffers.inbox.receive(frame.payload_bytes, self.wire, worker, PAYLOAD_TAG,
                                  self.timeout_s, "payload of a rejected request from")

    def _drop_if_untrusted(self, frame: Frame, buffers: _Buffers) -> None:
        if not self._trusted(frame, buffers):
            why = frame.problem[1] if not frame.trusted and frame.problem else (
                f"announced payload of {frame.payload_bytes} bytes exceeds the shard's "
                f"{buffers.inbox.capacity}")
            raise _Drop(f"its {frame.kind_name} request cannot be skipped safely ({why}); no "
                        "further receives from it")

    def _reject(self, worker: int, frame: Frame, code: ErrorCode, reason: str) -> None:
        with self._record:
            self.rejected += 1
        log.error("parameter server rank %d rejected a request from rank %d (%s): %s; "
                  "answering ERROR", self.rank, worker, frame.kind_name, reason)
        error = Header(Kind.ERROR, self.rank, self.shard.version, 0, 0, int(code),
                       self.shard.spec.index)
        self.wire.send(error.encode(), worker, REPLY_TAG, self.idle_timeout_s,
                       "error reply to")

    def answer(self, kind: Kind, header: Header, payload: torch.Tensor | None,
               out: torch.Tensor | None = None) -> tuple[Header, torch.Tensor | None]:
        """Apply one checked request to the shard; return the reply header and payload (written
        into ``out`` when given, for PUSH, EXCHANGE and PULL)."""
        shard, spec = self.shard, self.shard.spec
        aux, data = 0, None
        if kind == Kind.PUSH:
            assert payload is not None
            data, version, aux = shard.push(payload, header.version, out)
        elif kind == Kind.EXCHANGE:
            assert payload is not None
            data, version, aux = shard.exchange(payload, out)
        elif kind == Kind.PULL:
            data, version = shard.read(out)
        elif kind == Kind.STATE:
            params, velocity, version = shard.state()
            data, aux = (params, 0) if velocity is None else (torch.cat([params, velocity]), 1)
        else:
            version = shard.version
        reply = Header(int(REPLY_TO[kind]), self.rank, version, spec.numel, spec.offset, aux,
                       spec.index)
        return reply, data
