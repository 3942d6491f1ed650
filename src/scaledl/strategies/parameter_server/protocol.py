"""The parameter-server wire protocol: a fixed-size int64 header, then (maybe) one flat payload.

Every message starts with a header tensor of :data:`HEADER_LEN` int64 values::

    [MAGIC, kind, sender, version, numel, offset, aux, shard]

``sender`` is the sender's global rank; ``version`` the number of updates the shard had applied
when the sender read it (requests) or after this request was served (replies); ``numel`` and
``offset`` locate the shard in the flat parameter vector; ``aux`` is the staleness of an update
(replies to PUSH and EXCHANGE), a flag that momentum follows the parameters (STATE reply), or an
error code (ERROR).  A payload, when the kind has one, is a tensor of ``numel`` values of the
model's dtype (twice that for a STATE reply carrying momentum).  Headers and payloads travel on
different tags, so a payload can never be mistaken for a header.  Nothing is pickled.

The server checks every header (:func:`check_request`) before it reads a payload; a bad one is
answered with an ERROR header and logged, and the server goes on serving.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "MAGIC", "HEADER_LEN", "HEADER_TAG", "PAYLOAD_TAG", "REPLY_TAG", "REPLY_PAYLOAD_TAG",
    "Kind", "ErrorCode", "Header", "ShardSpec", "ProtocolError", "check_request", "check_reply",
    "REQUEST_KINDS", "REPLY_TO", "empty_header",
]

MAGIC = 0x5CA1ED1_0001
"""Protocol identifier (the low 16 bits are the protocol version)."""
HEADER_LEN = 8
HEADER_TAG, PAYLOAD_TAG, REPLY_TAG, REPLY_PAYLOAD_TAG = 71, 72, 73, 74
"""Point-to-point tags: worker -> server header and payload, server -> worker header and payload."""


class Kind(enum.IntEnum):
    """Message kinds; requests from workers are below 100, replies from servers above."""

    PUSH = 1
    """An update ``lr * gradient`` to subtract (SGD family); the reply carries fresh parameters."""
    EXCHANGE = 2
    """The worker's parameters (EASGD family); the reply carries the elastic difference."""
    PULL = 3
    """Read the parameters (or the center variable)."""
    STATE = 4
    """Read the server state (parameters, momentum, version) for a checkpoint."""
    DONE = 5
    """The worker has finished; the server stops serving it."""
    PUSH_REPLY = 101
    EXCHANGE_REPLY = 102
    PULL_REPLY = 103
    STATE_REPLY = 104
    DONE_REPLY = 105
    ERROR = 199


class ErrorCode(enum.IntEnum):
    """Why a request was rejected (the ``aux`` field of an ERROR reply)."""

    BAD_MAGIC = 1
    BAD_KIND = 2
    BAD_SENDER = 3
    BAD_SHARD = 4
    BAD_VERSION = 5
    WRONG_RULE = 6
    SERVER_FAULT = 7


REQUEST_KINDS = frozenset({Kind.PUSH, Kind.EXCHANGE, Kind.PULL, Kind.STATE, Kind.DONE})
REPLY_TO = {Kind.PUSH: Kind.PUSH_REPLY, Kind.EXCHANGE: Kind.EXCHANGE_REPLY,
            Kind.PULL: Kind.PULL_REPLY, Kind.STATE: Kind.STATE_REPLY, Kind.DONE: Kind.DONE_REPLY}
"""The reply kind that answers each request kind."""
REQUESTS_WITH_PAYLOAD = frozenset({Kind.PUSH, Kind.EXCHANGE})
REPLIES_WITH_PAYLOAD = frozenset({Kind.PUSH_REPLY, Kind.EXCHANGE_REPLY, Kind.PULL_REPLY,
                                  Kind.STATE_REPLY})


class ProtocolError(RuntimeError):
    """A message that breaks the protocol (bad header, error reply, dead peer)."""


@dataclass(frozen=True)
class ShardSpec:
    """Which contiguous slice ``[offset, offset + numel)`` of the flat parameters a server owns."""

    index: int
    offset: int
    numel: int


@dataclass(frozen=True)
class Header:
    """One decoded header."""

    kind: int
    sender: int
    version: int = 0
    numel: int = 0
    offset: int = 0
    aux: int = 0
    shard: int = 0
    magic: int = MAGIC

    def encode(self) -> torch.Tensor:
        """The header as an int64 tensor of :data:`HEADER_LEN` values."""
        return torch.tensor([self.magic, self.kind, self.sender, self.version, self.numel,
                             self.offset, self.aux, self.shard], dtype=torch.int64)

    @classmethod
    def decode(cls, tensor: torch.Tensor) -> Header:
        """Read a header tensor (any values; :func:`check_request` judges them)."""
        if tensor.dtype != torch.int64 or tensor.numel() != HEADER_LEN:
            raise ProtocolError(f"a header is {HEADER_LEN} int64 values, got {tensor.numel()} "
                                f"{tensor.dtype} values")
        magic, kind, sender, version, numel, offset, aux, shard = (int(v) for v in tensor.tolist())
        return cls(kind, sender, version, numel, offset, aux, shard, magic)

    @property
    def kind_name(self) -> str:
        """The kind's name, or the raw number when it is not a known kind."""
        try:
            return Kind(self.kind).name
        except ValueError:
            return str(self.kind)

    def payload_numel(self) -> int:
        """How many values follow this header (0 when none)."""
        if self.kind in REQUESTS_WITH_PAYLOAD or self.kind in REPLIES_WITH_PAYLOAD:
            return self.numel * (2 if self.kind == Kind.STATE_REPLY and self.aux else 1)
        return 0


def empty_header() -> torch.Tensor:
    """A buffer to receive a header into."""
    return torch.zeros(HEADER_LEN, dtype=torch.int64)


def check_request(header: Header, source: int, shard: ShardSpec, version: int,
                  allowed: frozenset[Kind]) -> tuple[ErrorCode, str] | None:
    """Why ``header`` (received from rank ``source`` by the server of ``shard``, now at
    ``version``, serving requests of kinds ``allowed``) must be rejected, or ``None``."""
    if header.magic != MAGIC:
        return ErrorCode.BAD_MAGIC, f"bad magic {header.magic:#x} (expected {MAGIC:#x})"
    if header.kind not in REQUEST_KINDS:
        return ErrorCode.BAD_KIND, f"unknown request kind {header.kind}"
    if header.kind not in allowed:
        return ErrorCode.WRONG_RULE, f"request {header.kind_name} is not served by this strategy"
    if header.sender != source:
        return ErrorCode.BAD_SENDER, f"header claims sender {header.sender} but came from {source}"
    if (header.shard, header.offset, header.numel) != (shard.index, shard.offset, shard.numel):
        return ErrorCode.BAD_SHARD, (
            f"shard {header.shard} [{header.offset}, +{header.numel}) does not match this server's "
            f"shard {shard.index} [{shard.offset}, +{shard.numel})")
    if header.kind == Kind.PUSH and not 0 <= header.version <= version:
        return ErrorCode.BAD_VERSION, f"read version {header.version} is not in [0, {version}]"
    return None


def check_reply(header: Header, request: Kind, server: int, shard: ShardSpec) -> None:
    """Raise :class:`ProtocolError` unless ``header`` answers ``request`` from rank ``server``."""
    if header.magic != MAGIC:
        raise ProtocolError(f"server rank {server} replied with bad magic {header.magic:#x}")
    if header.kind == Kind.ERROR:
        reason = ErrorCode(header.aux).name if header.aux in ErrorCode._value2member_map_ \
            else str(header.aux)
        raise ProtocolError(f"server rank {server} rejected {request.name}: {reason}")
    if header.kind != REPLY_TO[request] or header.sender != server:
        raise ProtocolError(f"expected {REPLY_TO[request].name} from rank {server}, got "
                            f"{header.kind_name} from rank {header.sender}")
    if (header.offset, header.numel) != (shard.offset, shard.numel):
        raise ProtocolError(f"server rank {server} replied for [{header.offset}, "
                            f"+{header.numel}), not its shard [{shard.offset}, +{shard.numel})")
