"""The parameter-server wire protocol: a self-framing int64 header, then (maybe) one payload.

Every message starts with a header tensor of :data:`HEADER_LEN` int64 values::

    [MAGIC, header_len, payload_bytes, kind, sender, version, numel, offset, aux, shard, dtype]

The first :data:`FIXED_FIELDS` values are the preamble, laid out the same in every protocol
version from 3 on: ``MAGIC`` (the family in the high bits, the version in the low 16),
``header_len`` (how many int64 values this header message has, itself included) and
``payload_bytes`` (how many bytes follow on the payload tag).  So a receiver can always tell how
much a sender sent, even a sender of another version, before it trusts any other field.

``sender`` is the sender's global rank; ``version`` the number of updates the shard had applied
when the sender read it (requests) or after this request was served (replies); ``numel`` and
``offset`` locate the shard in the flat parameter vector; ``aux`` is the staleness of an update
(replies to PUSH and EXCHANGE), a flag that momentum follows the parameters (STATE reply), or an
error code (ERROR).  ``payload_bytes`` and ``dtype`` (a :data:`DTYPE_CODES` code) describe the
payload that follows the header, written by the sender from the very tensor it sends: ``numel``
values of the model's dtype (twice that for a STATE reply carrying momentum), or nothing.
Headers and payloads travel on different tags, so a payload can never be mistaken for a header.
Nothing is pickled.

Gloo matches a message with the buffer posted for it by size only loosely: a message larger than
the buffer aborts the receiving process, a smaller one fills part of it and looks complete.  So
the receiver never trusts a fixed-size buffer: it receives a header into a buffer of
:data:`HEADER_CAPACITY` values and a payload into one with spare bytes, both pre-filled with a
random canary, and checks that exactly the announced size arrived (:mod:`.framing`).  It judges
the preamble first: a wrong magic family, or a version older than the preamble, means nothing
else can be trusted; another version, or a header length that is not this version's, is
rejected, but its announced payload can still be skipped exactly.

The server checks every header (:func:`.framing.recv_header`, then :func:`check_request`) before it
reads a payload.  A bad one is answered with an ERROR header and logged.  A rejected request's
payload is never left in the stream: when the framing can be trusted and the announced payload
fits in one shard, the server receives it and serves on; otherwise it answers ERROR and drops
that worker without receiving from it again.  A payload whose size differs from its
announcement is rejected too; the message was consumed whole, so the server serves on.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch

__all__ = [
    "MAGIC", "HEADER_LEN", "HEADER_TAG", "PAYLOAD_TAG", "REPLY_TAG", "REPLY_PAYLOAD_TAG",
    "Kind", "ErrorCode", "Header", "ShardSpec", "ProtocolError", "check_request", "check_reply",
    "REQUEST_KINDS", "REPLY_TO", "empty_header", "DTYPE_CODES", "dtype_code", "payload_size",
    "expected_payload", "FIXED_FIELDS", "HEADER_CAPACITY", "LENGTH_INDEX", "PROTOCOL_VERSION",
    "VERSION_BITS", "FIRST_FRAMED_VERSION",
]

MAGIC = 0x5CA1ED1_0003
"""Protocol identifier: the family ``0x5CA1ED1`` above the low 16 bits, the version in them."""
VERSION_BITS = 16
PROTOCOL_VERSION = MAGIC & ((1 << VERSION_BITS) - 1)
"""This protocol's version (3: the self-framing header)."""
FIRST_FRAMED_VERSION = 3
"""The first version whose headers start with ``[magic, header_len, payload_bytes]``."""
HEADER_LEN = 11
"""int64 values in a header of this version."""
FIXED_FIELDS = 3
"""Length of the preamble every version >= 3 starts its header with."""
LENGTH_INDEX = 1
"""Where a header holds its own length (in int64 values)."""
HEADER_CAPACITY = 64
"""The longest header a receiver takes in (a longer message would abort it inside Gloo)."""
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
"""The ``dtype`` field of a header: which dtype the payload has (0: no payload)."""
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
    BAD_PAYLOAD = 8
    BAD_FRAME = 9
    """The message's size is not the size it declares (or it has no valid preamble)."""
    BAD_PROTOCOL = 10
    """Another protocol version."""
    BAD_HEADER = 11
    """A header length that is not this version's."""


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
    payload_bytes: int = 0
    dtype: int = 0
    magic: int = MAGIC

    def encode(self) -> torch.Tensor:
        """The header as an int64 tensor of :data:`HEADER_LEN` values, preamble first."""
        return torch.tensor([self.magic, HEADER_LEN, self.payload_bytes, self.kind, self.sender,
                             self.version, self.numel, self.offset, self.aux, self.shard,
                             self.dtype], dtype=torch.int64)

    def with_payload(self, payload: torch.Tensor | None) -> Header:
        """This header announcing ``payload`` (its byte count and dtype; nothing for None)."""
        nbytes, code = payload_size(payload)
        return dataclasses.replace(self, payload_bytes=nbytes, dtype=code)

    @classmethod
    def decode(cls, tensor: torch.Tensor) -> Header:
        """Read a header tensor (any values; :func:`check_request` judges them)."""
        if tensor.dtype != torch.int64 or tensor.numel() != HEADER_LEN:
            raise ProtocolError(f"a header is {HEADER_LEN} int64 values, got {tensor.numel()} "
                                f"{tensor.dtype} values")
        magic, length, nbytes, kind, sender, version, numel, offset, aux, shard, dtype = (
            int(v) for v in tensor.tolist())
        if length != HEADER_LEN:
            raise ProtocolError(f"a header of {HEADER_LEN} values declares {length} values")
        return cls(kind, sender, version, numel, offset, aux, shard, nbytes, dtype, magic)

    @property
    def kind_name(self) -> str:
        """The kind's name, or the raw number when it is not a known kind."""
        try:
            return Kind(self.kind).name
        except ValueError:
            return str(self.kind)


def dtype_code(dtype: torch.dtype) -> int:
    """The header code of ``dtype``."""
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype {dtype} cannot travel to a parameter server; use one of "
                         f"{sorted(str(d) for d in DTYPE_CODES)}")
    return DTYPE_CODES[dtype]


def payload_size(payload: torch.Tensor | None) -> tuple[int, int]:
    """``(payload_bytes, dtype code)`` announcing ``payload`` (``(0, 0)`` for None)."""
    if payload is None:
        return 0, 0
    return payload.numel() * payload.element_size(), dtype_code(payload.dtype)


def expected_payload(kind: int, numel: int, dtype: torch.dtype,
                     momentum: bool = False) -> tuple[int, int]:
    """``(payload_bytes, dtype code)`` a message of ``kind`` about ``numel`` values must carry."""
    if kind not in REQUESTS_WITH_PAYLOAD and kind not in REPLIES_WITH_PAYLOAD:
        return 0, 0
    count = numel * (2 if kind == Kind.STATE_REPLY and momentum else 1)
    return count * torch.empty(0, dtype=dtype).element_size(), dtype_code(dtype)


def empty_header() -> torch.Tensor:
    """A buffer to receive a header into."""
    return torch.zeros(HEADER_LEN, dtype=torch.int64)


def check_request(header: Header, source: int, shard: ShardSpec, version: int,
                  allowed: frozenset[Kind], dtype: torch.dtype) -> tuple[ErrorCode, str] | None:
    """Why ``header`` (received from rank ``source`` by the server of ``shard`` of ``dtype``
    values, now at ``version``, serving requests of kinds ``allowed``) must be rejected, or
    ``None``."""
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
    expected = expected_payload(header.kind, shard.numel, dtype)
    if (header.payload_bytes, header.dtype) != expected:
        return ErrorCode.BAD_PAYLOAD, (
            f"{header.kind_name} announces a payload of {header.payload_bytes} bytes (dtype code "
            f"{header.dtype}); expected {expected[0]} bytes (dtype code {expected[1]})")
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
