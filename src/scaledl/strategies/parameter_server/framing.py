"""Exact-size framing of the parameter server's messages, over a direct transport.

Bytes move through :class:`scaledl.transport.direct.DirectTransport` (posted at once, every wait
bounded, a one-line :class:`~scaledl.transport.direct.PeerError` naming the peer); this module
makes sure a message is exactly as long as it says.

Gloo aborts a process that receives a message larger than the buffer posted for it, and fills a
larger buffer only in part without saying so.  :func:`recv_header` therefore posts
:data:`HEADER_CAPACITY` int64 values for every header, pre-filled with a random 64-bit canary, and
compares what arrived with the length the header declares: a shorter message leaves the canary in
its last declared value, a longer one overwrites the canary after it.  An :class:`Inbox` does the
same for a payload, with :data:`SLACK_BYTES` spare bytes.  A message matches the canary by chance
with probability ``2**-64`` per 8 bytes checked (a payload of fewer than 8 bytes checks only
those); only a message longer than the posted capacity still aborts, which no sender of this
protocol sends.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from scaledl.strategies.parameter_server.protocol import (
    FIRST_FRAMED_VERSION, FIXED_FIELDS, HEADER_CAPACITY, HEADER_LEN, LENGTH_INDEX, MAGIC,
    PROTOCOL_VERSION, VERSION_BITS, ErrorCode, Header, ProtocolError,
)
from scaledl.transport.direct import DirectTransport

__all__ = ["recv_header", "Inbox", "SLACK_BYTES", "Frame", "read_frame", "untrusted_magic"]

SLACK_BYTES = 64
"""Spare bytes after a payload buffer, where a longer payload than announced shows."""

@dataclass(frozen=True)
class Frame:
    """A header message received whole, judged by its preamble before anything else."""

    header: Header | None
    """The decoded header; None when the message is not a header of this version."""
    payload_bytes: int
    """Bytes the sender sends next on the payload tag, as its preamble says (0: unknown)."""
    problem: tuple[ErrorCode, str] | None
    """Why the message cannot be served as a header of this version; None when it can."""
    trusted: bool
    """Whether the sender's framing can be followed (its payload received and discarded)."""

    @property
    def kind_name(self) -> str:
        """The request's kind name, or ``malformed`` without a header."""
        return "malformed" if self.header is None else self.header.kind_name

    def require(self, sender: str) -> Header:
        """The header, or :class:`ProtocolError` (one line) naming ``sender`` and the problem."""
        if self.header is None or self.problem is not None:
            reason = "no header" if self.problem is None else self.problem[1]
            raise ProtocolError(f"{sender} sent a message that is not a protocol-"
                                f"{PROTOCOL_VERSION} header: {reason}")
        return self.header


def untrusted_magic(magic: int) -> Frame | None:
    """The verdict on a header whose first value is ``magic``, when that alone condemns it: not
    this protocol family, or a version older than the preamble (its length cannot be read)."""
    if magic >> VERSION_BITS != MAGIC >> VERSION_BITS:
        return Frame(None, 0, (ErrorCode.BAD_MAGIC, f"bad magic {magic:#x} (expected "
                                                    f"{MAGIC:#x})"), False)
    version = magic & ((1 << VERSION_BITS) - 1)
    if version < FIRST_FRAMED_VERSION:
        return Frame(None, 0, (ErrorCode.BAD_PROTOCOL, f"protocol version {version}, whose "
                               f"headers do not declare their length; this side speaks "
                               f"version {PROTOCOL_VERSION}"), False)
    return None


def read_frame(values: torch.Tensor) -> Frame:
    """Judge a header message of exactly the values sent (``values[LENGTH_INDEX]`` of them).

    The magic decides whether the preamble can be trusted at all (:func:`untrusted_magic`);
    then another version, or a header length other than :data:`HEADER_LEN`, is a problem whose
    announced payload can still be skipped.
    """
    fields = [int(v) for v in values[:FIXED_FIELDS].tolist()]
    verdict = untrusted_magic(fields[0])
    if verdict is not None:
        return verdict
    version = fields[0] & ((1 << VERSION_BITS) - 1)
    if len(fields) < FIXED_FIELDS or fields[2] < 0:
        return Frame(None, 0, (ErrorCode.BAD_FRAME, f"a preamble {fields} without a payload "
                               "size"), False)
    payload_bytes = fields[2]
    if version != PROTOCOL_VERSION:
        return Frame(None, payload_bytes, (ErrorCode.BAD_PROTOCOL, f"protocol version {version}; "
                     f"this side speaks version {PROTOCOL_VERSION}"), True)
    if values.numel() != HEADER_LEN:
        return Frame(None, payload_bytes, (ErrorCode.BAD_HEADER, f"a header of {values.numel()} "
                     f"values; version {PROTOCOL_VERSION} headers have {HEADER_LEN}"), True)
    return Frame(Header.decode(values), payload_bytes, None, True)


def _canary() -> int:
    """A fresh random int64 no sender can predict."""
    return secrets.randbits(64) - (1 << 63)


def recv_header(wire: DirectTransport, peer: int, tag: int, timeout_s: float | None,
                what: str) -> Frame:
    """Receive one header message from ``peer`` and judge it: its magic first
    (:func:`untrusted_magic`), then whether its size is the size it declares, then the rest
    (:func:`read_frame`).

    A message whose size is not the size it declares (or that declares none) comes back as a
    :class:`Frame` with problem ``BAD_FRAME`` that cannot be trusted; a failed transfer raises
    :class:`~scaledl.transport.direct.PeerError`.
    """
    canary = _canary()
    buffer = torch.full((HEADER_CAPACITY,), canary, dtype=torch.int64)
    wire.recv(buffer, peer, tag, timeout_s, what)
    verdict = None if int(buffer[0]) == canary else untrusted_magic(int(buffer[0]))
    if verdict is not None:
        return verdict
    declared = int(buffer[LENGTH_INDEX])
    if declared == canary or not LENGTH_INDEX < declared <= HEADER_CAPACITY:
        shown = "no length" if declared == canary else f"length {declared}"
        return Frame(None, 0, (ErrorCode.BAD_FRAME, f"a header message with {shown} (a valid "
                               f"one declares 2..{HEADER_CAPACITY} int64 values)"), False)
    if int(buffer[declared - 1]) == canary:
        return Frame(None, 0, (ErrorCode.BAD_FRAME, f"a header message shorter than the "
                               f"{declared} int64 values it declares"), False)
    if bool((buffer[declared:] != canary).any()):
        return Frame(None, 0, (ErrorCode.BAD_FRAME, f"a header message longer than the "
                               f"{declared} int64 values it declares"), False)
    return read_frame(buffer[:declared].clone())


class Inbox:
    """A receive buffer for payloads of up to the bytes of ``like``, that tells whether a message
    had exactly the announced size; :attr:`tensor` views its first bytes as ``like``."""

    def __init__(self, like: torch.Tensor) -> None:
        self.capacity = like.numel() * like.element_size()
        """The largest payload, in bytes, this inbox takes."""
        self._raw = torch.empty(self.capacity + SLACK_BYTES, dtype=torch.uint8)
        self.tensor = self._raw[:self.capacity].view(like.dtype)
        """The payload as values of ``like``'s dtype (valid after an exact :meth:`receive`)."""

    def receive(self, nbytes: int, wire: DirectTransport, peer: int, tag: int,
                timeout_s: float | None, what: str) -> bool:
        """Receive a payload announced as ``nbytes`` (``1..capacity``) bytes; True when exactly
        that many arrived (False: shorter or longer; the message was consumed either way)."""
        assert 0 < nbytes <= self.capacity, (nbytes, self.capacity)
        region = self._raw[:nbytes + SLACK_BYTES]
        last = min(8, nbytes)
        pattern = torch.tensor([_canary()], dtype=torch.int64).view(torch.uint8)
        fill = pattern.repeat((last + SLACK_BYTES + 7) // 8)[:last + SLACK_BYTES]
        region[nbytes - last:].copy_(fill)
        wire.recv(region, peer, tag, timeout_s, what)
        complete = not torch.equal(region[nbytes - last:nbytes], fill[:last])
        return complete and torch.equal(region[nbytes:], fill[last:])
