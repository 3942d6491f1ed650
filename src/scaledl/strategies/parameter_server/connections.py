"""A worker's connection to the parameter server(s): in-process or over point-to-point.

Both kinds of :class:`ServerConnection` speak in whole flat vectors: a request is split into one
message per shard, sent to every server at once, and the replies are gathered back into one flat
vector.

* :class:`InProcessServers` calls :class:`ServerShard` objects directly: rank 0's own worker when
  the server is a thread beside it, and in-process tests.
* :class:`RemoteServers` sends headers and payloads (:mod:`.protocol`) to the server ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server.protocol import (
    HEADER_TAG, PAYLOAD_TAG, REPLY_PAYLOAD_TAG, REPLY_TAG, Header, Kind, ProtocolError, ShardSpec,
    check_reply, expected_payload,
)
from scaledl.strategies.parameter_server.shard import ServerShard
from scaledl.strategies.parameter_server.framing import recv_header
from scaledl.transport.direct import DirectTransport, PeerError

__all__ = ["ServerConnection", "InProcessServers", "RemoteServers", "ServerState", "ExchangeResult"]


@dataclass
class ServerState:
    """Every shard's state gathered into full-length flat vectors."""

    params: torch.Tensor
    velocity: torch.Tensor | None
    versions: list[int]


@dataclass
class ExchangeResult:
    """What one PUSH or EXCHANGE round returned: per-shard versions and the largest staleness."""

    versions: list[int]
    staleness: int


class ServerConnection(ABC):
    """How one worker reaches the server shards."""

    def __init__(self, shards: list[ShardSpec], worker: int, num_workers: int) -> None:
        self.shards = shards
        self.worker = worker
        self.num_workers = num_workers

    @abstractmethod
    def push(self, update: torch.Tensor, versions: list[int], out: torch.Tensor) -> ExchangeResult:
        """Send ``update`` (read at ``versions``); write the fresh parameters into ``out``."""

    @abstractmethod
    def exchange(self, params: torch.Tensor, out: torch.Tensor) -> ExchangeResult:
        """Send this worker's parameters; write the elastic difference into ``out``."""

    @abstractmethod
    def pull(self, out: torch.Tensor) -> list[int]:
        """Write the server's parameters (center) into ``out``; return the shard versions."""

    @abstractmethod
    def state(self) -> ServerState:
        """The servers' state for a checkpoint."""

    @abstractmethod
    def done(self) -> None:
        """Tell the servers this worker has finished."""

    def part(self, flat: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
        """The slice of ``flat`` that shard ``spec`` owns."""
        return flat.narrow(0, spec.offset, spec.numel)


class InProcessServers(ServerConnection):
    """Direct calls on in-process shards; ``before_use`` runs before each (starts a server)."""

    def __init__(self, shards: list[ServerShard], worker: int, num_workers: int,
                 before_use: Callable[[], None] | None = None) -> None:
        super().__init__([s.spec for s in shards], worker, num_workers)
        self.servers = shards
        self.before_use = before_use

    def _ready(self) -> None:
        if self.before_use is not None:
            self.before_use()

    def push(self, update: torch.Tensor, versions: list[int], out: torch.Tensor) -> ExchangeResult:
        self._ready()
        new, worst = [], 0
        for shard, version in zip(self.servers, versions):
            _, now, staleness = shard.push(self.part(update, shard.spec), version,
                                           self.part(out, shard.spec))
            new.append(now)
            worst = max(worst, staleness)
        return ExchangeResult(new, worst)

    def exchange(self, params: torch.Tensor, out: torch.Tensor) -> ExchangeResult:
        self._ready()
        new, worst = [], 0
        for shard in self.servers:
            _, now, staleness = shard.exchange(self.part(params, shard.spec),
                                               self.part(out, shard.spec))
            new.append(now)
            worst = max(worst, staleness)
        return ExchangeResult(new, worst)

    def pull(self, out: torch.Tensor) -> list[int]:
        self._ready()
        versions = []
        for shard in self.servers:
            _, version = shard.read(self.part(out, shard.spec))
            versions.append(version)
        return versions

    def state(self) -> ServerState:
        self._ready()
        parts = [shard.state() for shard in self.servers]
        params = torch.cat([p for p, _, _ in parts])
        velocities = [v for _, v, _ in parts]
        velocity = None if any(v is None for v in velocities) else torch.cat(
            [v for v in velocities if v is not None])
        return ServerState(params, velocity, [version for _, _, version in parts])

    def done(self) -> None:
        self._ready()


class RemoteServers(ServerConnection):
    """Requests to server ranks over the parameter-server process group.

    Each header announces the payload sent with it (byte count and dtype, taken from that very
    tensor).  The first reply from each server may take as long as ``idle_timeout_s`` (None: no
    deadline), because a server may start serving late (rank 0's threads start at its first
    request; a dedicated server first loads a checkpoint); later replies must come within
    ``timeout_s``.  An ERROR reply, a malformed reply or a failed transfer breaks the link: that
    call raises a one-line :class:`ProtocolError` (a failed transfer: the transport's
    :class:`~scaledl.transport.direct.PeerError`), and every later one a :class:`ProtocolError`.
    """

    def __init__(self, rank: int, servers: list[tuple[int, ShardSpec]], group: dist.ProcessGroup,
                 timeout_s: float, worker: int, num_workers: int, dtype: torch.dtype,
                 idle_timeout_s: float | None = None) -> None:
        super().__init__([spec for _, spec in servers], worker, num_workers)
        self.rank = rank
        self.server_ranks = [server for server, _ in servers]
        self.group = group
        self.wire = DirectTransport(group)
        """Where this worker's requests and the replies travel."""
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.dtype = dtype
        self.broken: str | None = None
        """Why the link is unusable (None while it works)."""
        self._replied: set[int] = set()
        self._abandoned: list[tuple[int, torch.Tensor, dist.Work]] = []
        """Sends of a failed round, kept alive (a server that dropped us never receives them)."""

    def push(self, update: torch.Tensor, versions: list[int], out: torch.Tensor) -> ExchangeResult:
        payloads = [self.part(update, spec) for spec in self.shards]
        replies = self._round(Kind.PUSH, versions, payloads,
                              [self.part(out, spec) for spec in self.shards])
        return ExchangeResult([h.version for h in replies], max(h.aux for h in replies))

    def exchange(self, params: torch.Tensor, out: torch.Tensor) -> ExchangeResult:
        payloads = [self.part(params, spec) for spec in self.shards]
        replies = self._round(Kind.EXCHANGE, [0] * len(self.shards), payloads,
                              [self.part(out, spec) for spec in self.shards])
        return ExchangeResult([h.version for h in replies], max(h.aux for h in replies))

    def pull(self, out: torch.Tensor) -> list[int]:
        replies = self._round(Kind.PULL, [0] * len(self.shards), [None] * len(self.shards),
                              [self.part(out, spec) for spec in self.shards])
        return [h.version for h in replies]

    def state(self) -> ServerState:
        buffers = [torch.empty(2 * spec.numel, dtype=self.dtype) for spec in self.shards]
        replies = self._round(Kind.STATE, [0] * len(self.shards), [None] * len(self.shards),
                              buffers)
        params = torch.cat([b[:spec.numel] for b, spec in zip(buffers, self.shards)])
        with_velocity = all(h.aux for h in replies)
        velocity = torch.cat([b[spec.numel:] for b, spec in zip(buffers, self.shards)]) \
            if with_velocity else None
        return ServerState(params, velocity, [h.version for h in replies])

    def done(self) -> None:
        self._round(Kind.DONE, [0] * len(self.shards), [None] * len(self.shards),
                    [None] * len(self.shards))

    def _check_payloads(self, kind: Kind, payloads: Sequence[torch.Tensor | None]) -> None:
        for spec, payload in zip(self.shards, payloads):
            if payload is not None and (payload.numel(), payload.dtype) != (spec.numel,
                                                                            self.dtype):
                raise ProtocolError(f"{kind.name} payload for shard {spec.index} has "
                                    f"{payload.numel()} {payload.dtype} values; the shard holds "
                                    f"{spec.numel} {self.dtype} values")

    def _round(self, kind: Kind, versions: list[int], payloads: Sequence[torch.Tensor | None],
               outs: Sequence[torch.Tensor | None]) -> list[Header]:
        """Send one request to every server at once, then collect every reply."""
        if self.broken is not None:
            raise ProtocolError(f"the link to the parameter servers is broken ({self.broken}); "
                                "this worker cannot talk to them any more")
        self._check_payloads(kind, payloads)
        pending: list[tuple[int, torch.Tensor, dist.Work]] = []
        try:
            for server, spec, version, payload in zip(self.server_ranks, self.shards, versions,
                                                      payloads):
                header = Header(int(kind), self.rank, version, spec.numel, spec.offset, 0,
                                spec.index).with_payload(payload)
                raw = header.encode()
                pending.append((server, raw, self.wire.isend(raw, server, HEADER_TAG)))
                if payload is not None:
                    pending.append((server, payload,
                                    self.wire.isend(payload, server, PAYLOAD_TAG)))
            replies = self._replies(kind, outs)
            for server, _, work in pending:
                self.wire.wait(work, server, f"{kind.name} to parameter server", self.timeout_s)
        except (ProtocolError, PeerError) as exc:
            self.broken = str(exc)
            self._abandoned.extend(pending)
            raise
        return replies

    def _replies(self, kind: Kind, outs: Sequence[torch.Tensor | None]) -> list[Header]:
        """Every server's reply; an ERROR from one is raised after the others were received."""
        replies, errors = [], []
        for server, spec, out in zip(self.server_ranks, self.shards, outs):
            try:
                replies.append(self._reply(kind, server, spec, out))
            except PeerError:
                raise
            except ProtocolError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return replies

    def _reply(self, kind: Kind, server: int, spec: ShardSpec,
               out: torch.Tensor | None) -> Header:
        first = server not in self._replied
        frame = recv_header(self.wire, server, REPLY_TAG,
                            self.idle_timeout_s if first else self.timeout_s,
                            f"waiting for the {kind.name} reply of parameter server")
        self._replied.add(server)
        header = frame.require(f"parameter server rank {server}")
        check_reply(header, kind, server, spec)
        expected = expected_payload(header.kind, spec.numel, self.dtype, bool(header.aux))
        if (header.payload_bytes, header.dtype) != expected or (
                expected[0] and (out is None or out.numel() * out.element_size() < expected[0])):
            raise ProtocolError(f"parameter server rank {server} announced {header.payload_bytes} "
                                f"bytes (dtype code {header.dtype}) for {kind.name}; expected "
                                f"{expected[0]} bytes (dtype code {expected[1]})")
        if expected[0]:
            assert out is not None
            numel = expected[0] // out.element_size()
            self.wire.recv(out.narrow(0, 0, numel), server, REPLY_PAYLOAD_TAG, self.timeout_s,
                           f"{kind.name} reply of parameter server")
        return header
