"""What a backend's error means: the one place that reads Gloo's and NCCL's message text.

torch.distributed reports every backend failure as a ``RuntimeError`` whose message is the
backend's own text, often with a C++ trace after it.  Gloo's first line carries its source
location and, for a closed connection, advice meant for its own users::

    [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by
    peer [127.0.0.1]:21163. This is typically caused by a remote worker crashing. Check the logs
    of the remote worker before reporting an error. GLHF! ...

    [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out
    waiting 2000ms for recv operation to complete

(texts of torch 2.13's Gloo: a peer that exited, and a peer that never made the call).  Callers
need two things from such an error, and :func:`classify` gives both: what kind of failure it is
(a lost peer, a timeout, anything else), so a caller can say "the other ranks did not make this
call" instead of quoting a socket, and one clean line of it for a message that already names the
peer.  Nothing else in scaledl matches backend text, so a change in the backend's wording is
fixed here once.

A caller turns such an error into its own outside the ``except`` block that caught it
(:func:`attempt`), because of Ctrl-C: the rank interrupted first exits and closes its
connections, and a rank waiting inside the backend gets "Connection closed by peer" before
Python runs its own interrupt, pending since the signal came, at the next call.  Inside the
handler that interrupt would carry the backend's error as its context, and Python would print
Gloo's text above the ``KeyboardInterrupt`` of a job the user stopped on purpose.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

__all__ = ["FailureKind", "BackendFailure", "classify", "first_line", "attempt", "raise_in_words"]

_T = TypeVar("_T")


class FailureKind(enum.Enum):
    """Why a backend's call failed, as far as its message tells."""

    LOST_PEER = "lost peer"
    """A peer's connection closed or broke: its process exited or crashed."""
    TIMEOUT = "timeout"
    """No answer within the group's timeout: a peer is elsewhere, or too slow."""
    OTHER = "other"
    """Anything else (a bad argument, a backend bug): the caller keeps the error as it is."""


_REASONS = {
    FailureKind.LOST_PEER: "a peer closed its connection: it exited or crashed",
    FailureKind.TIMEOUT: "no answer within the group's timeout",
}

# Gloo: "Connection closed by peer" (pair.cc, the peer's socket closed), "Read error ...:
# Connection reset by peer" and "Broken pipe" (a write to a socket the peer has closed).
_LOST_PEER = re.compile(r"Connection (closed|reset) by peer|Broken pipe")
# Gloo: "Timed out waiting 2000ms for recv operation"; NCCL's watchdog: "caught collective
# operation timeout".
_TIMEOUT = re.compile(r"[Tt]imed out|[Tt]imeout")
_LOCATION = re.compile(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*")
"""Gloo's ``[path/file.cc:123]`` prefix."""
_ADVICE = ". This is typically caused by"
"""Where Gloo's advice to read the remote worker's logs begins."""


@dataclass(frozen=True)
class BackendFailure:
    """One backend error, read: its kind and its first line without Gloo's decorations."""

    kind: FailureKind
    line: str
    """The message's first line, without Gloo's source location and advice (the error's type
    name when the message is empty)."""

    @property
    def reason(self) -> str | None:
        """Why the call failed, in words that follow "the other ranks did not make this call"
        (``"a peer closed its connection: it exited or crashed"``); None for
        :attr:`FailureKind.OTHER`, whose own line is the only explanation there is."""
        return _REASONS.get(self.kind)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (torch errors carry long C++ traces), without
    Gloo's source location and its advice to read the remote worker's logs; the error's type
    name when the message is empty."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    line = _LOCATION.sub("", lines[0])
    return line.split(_ADVICE, 1)[0] or lines[0]


def classify(error: BaseException) -> BackendFailure:
    """What ``error`` (a backend's ``RuntimeError``, or any exception) means.

    The kind is read from the whole message, not only its first line, so an error that wraps
    the backend's (its text on a later line) reads the same."""
    text = str(error)
    if _LOST_PEER.search(text):
        kind = FailureKind.LOST_PEER
    elif _TIMEOUT.search(text):
        kind = FailureKind.TIMEOUT
    else:
        kind = FailureKind.OTHER
    return BackendFailure(kind, first_line(error))


def attempt(call: Callable[[], _T]) -> _T | RuntimeError:
    """``call()``'s result, or the ``RuntimeError`` it raised (how torch reports a backend's
    failure), returned instead of raised, so the caller handles it outside any ``except`` block
    and a pending Ctrl-C surfaces as a bare ``KeyboardInterrupt`` (see the module's text).
    Other exceptions propagate."""
    try:
        return call()
    except RuntimeError as error:
        return error  # no call between here and the caller: the interrupt cannot fire in here


def raise_in_words(
    error: RuntimeError, words: Callable[[BackendFailure], BaseException | None]
) -> NoReturn:
    """Raise the caller's own error for a backend's ``error``, which :func:`attempt` returned.

    ``words`` builds it from :func:`classify`'s reading.  For a lost or late peer it is raised
    without the backend's error chained: the caller's words say all there is, and Gloo's
    socket text would only bury them.  For any other failure it is raised with ``error`` as
    its cause.  When ``words`` returns None (a caller with nothing to add), ``error`` itself
    is raised, whatever its kind."""
    failure = classify(error)
    raised = words(failure)
    if raised is None:
        raise error
    if failure.reason is None:
        raise raised from error
    raise raised from None
