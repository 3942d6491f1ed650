"""The one reader of backend error text: the kind of a failure and its clean line.

``CLOSED`` and ``TIMED_OUT`` are texts torch 2.13's Gloo produced on this machine (two ranks over
TCP, a 2 s timeout); the reset, broken-pipe and watchdog lines are written in the shape of those
messages (they need a socket torn down mid-write, or NCCL), not captured.  A live lost peer is
also covered end to end by tests/distributed/test_bad_input.py."""

from __future__ import annotations

import pytest

from scaledl.backend_errors import FailureKind, classify, first_line
from scaledl.data.factory import first_line as factory_first_line
from scaledl.signature import CallMismatch, Kind, Signature, agree
from scaledl.transport import channel

CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
          "closed by peer [127.0.0.1]:21163. This is typically caused by a remote worker "
          "crashing. Check the logs of the remote worker before reporting an error. GLHF! "
          "\U0001f3d6\ufe0f")
"""An allreduce whose peer's process had exited (the same text for a send to it)."""
TIMED_OUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
             "Timed out waiting 2000ms for recv operation to complete")
"""An allreduce whose peer was alive but never made the call."""


@pytest.mark.parametrize(("text", "kind", "line"), [
    (CLOSED, FailureKind.LOST_PEER, "Connection closed by peer [127.0.0.1]:21163"),
    (TIMED_OUT, FailureKind.TIMEOUT, "Timed out waiting 2000ms for recv operation to complete"),
    (CLOSED + "\nException raised from recvFromPeer at ...\nframe #0: c10::Error::Error",
     FailureKind.LOST_PEER, "Connection closed by peer [127.0.0.1]:21163"),
    ("Read error [127.0.0.1]:41826: Connection reset by peer", FailureKind.LOST_PEER,
     "Read error [127.0.0.1]:41826: Connection reset by peer"),
    ("[gloo/transport/tcp/pair.cc:598] Write error [127.0.0.1]:5: Broken pipe",
     FailureKind.LOST_PEER, "Write error [127.0.0.1]:5: Broken pipe"),
    ("allgather failed\nWatchdog caught collective operation timeout", FailureKind.TIMEOUT,
     "allgather failed"),
    ("Tensors must be contiguous", FailureKind.OTHER, "Tensors must be contiguous"),
])
def test_kind_and_line(text: str, kind: FailureKind, line: str) -> None:
    failure = classify(RuntimeError(text))
    assert (failure.kind, failure.line) == (kind, line)
    assert first_line(RuntimeError(text)) == line


def test_reasons_name_the_peers_only_when_they_are_at_fault() -> None:
    assert classify(RuntimeError(CLOSED)).reason == \
        "a peer closed its connection: it exited or crashed"
    assert classify(RuntimeError(TIMED_OUT)).reason == "no answer within the group's timeout"
    assert classify(RuntimeError("Tensors must be contiguous")).reason is None


def test_the_transport_layer_still_exports_first_line() -> None:
    assert channel.first_line is first_line  # its home before backend_errors


def test_a_line_that_is_all_decoration_is_kept_whole() -> None:
    assert first_line(RuntimeError("[pair.cc:1] ")) == "[pair.cc:1]"
    assert first_line(ValueError("  \n")) == "ValueError"


def test_a_user_error_keeps_its_type_and_loses_gloos_decoration() -> None:
    assert factory_first_line(KeyError("mnist")) == "KeyError: 'mnist'"
    assert factory_first_line(RuntimeError("")) == "RuntimeError"
    assert factory_first_line(RuntimeError(CLOSED)) == \
        "RuntimeError: Connection closed by peer [127.0.0.1]:21163"


@pytest.mark.parametrize(("text", "reason"), [
    (CLOSED, "a peer closed its connection: it exited or crashed"),
    (TIMED_OUT, "no answer within the group's timeout"),
])
def test_agree_turns_a_lost_peer_into_the_calls_own_error(text: str, reason: str) -> None:
    def exchange(values: object) -> list[list[int]]:
        raise RuntimeError(text)

    with pytest.raises(CallMismatch) as error:
        agree(Signature(Kind.BARRIER), exchange, fix="call it on every rank")
    assert str(error.value) == (f"barrier: the other ranks of the group did not make this call "
                                f"({reason}); call it on every rank")
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_agree_lets_any_other_backend_error_through() -> None:
    def exchange(values: object) -> list[list[int]]:
        raise RuntimeError("Tensors must be contiguous")

    with pytest.raises(RuntimeError, match="^Tensors must be contiguous$"):
        agree(Signature(Kind.BARRIER), exchange)
