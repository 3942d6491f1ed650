"""The one reader of backend error text: the kind of a failure and its clean line.

``CLOSED`` and ``TIMED_OUT`` are texts torch 2.13's Gloo produced on this machine (two ranks over
TCP, a 2 s timeout); the reset, broken-pipe and watchdog lines are written in the shape of those
messages (they need a socket torn down mid-write, or NCCL), not captured.  A live lost peer is
also covered end to end by tests/distributed/test_bad_input.py."""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from scaledl.backend_errors import FailureKind, attempt, classify, first_line, raise_in_words
from scaledl.data.factory import first_line as factory_first_line
from scaledl.horovod import negotiation
from scaledl.horovod.errors import HorovodInternalError
from scaledl.signature import CallMismatch, Kind, Signature, agree
from scaledl.transport import channel
from scaledl.transport.torch_p2p import TorchTransport

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


def test_attempt_returns_a_backend_failure_and_lets_the_rest_through() -> None:
    def fails() -> int:
        raise RuntimeError(CLOSED)

    def wrong() -> int:
        raise ValueError("bad argument")

    assert attempt(lambda: 7) == 7
    failure = attempt(fails)
    assert isinstance(failure, RuntimeError) and str(failure) == CLOSED
    with pytest.raises(ValueError, match="bad argument"):
        attempt(wrong)


def test_raise_in_words_chains_the_backend_only_when_it_explains_the_failure() -> None:
    """A lost or late peer: the caller's error alone.  Anything else: chained to the backend's
    error, or the backend's error itself when the caller has no words for it."""
    for text in (CLOSED, TIMED_OUT):
        with pytest.raises(ValueError, match="the peers are gone") as lost:
            raise_in_words(RuntimeError(text), lambda failure: ValueError(
                f"the peers are gone ({failure.reason})"))
        assert lost.value.__cause__ is None and lost.value.__suppress_context__
    other = RuntimeError("[x.cc:1] invalid argument")
    with pytest.raises(ValueError, match="invalid argument") as wrapped:
        raise_in_words(other, lambda failure: ValueError(failure.line))
    assert wrapped.value.__cause__ is other
    with pytest.raises(RuntimeError) as itself:
        raise_in_words(other, lambda failure: None)
    assert itself.value is other and itself.value.__context__ is None


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


class _Failing:
    """A negotiation allgather whose wait raises the backend's ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, *args: object, **kwargs: object) -> _Failing:
        return self

    def wait(self) -> None:
        raise RuntimeError(self.text)


class _Interrupted:
    """A negotiation allgather that waits inside Gloo for rank 1 while Ctrl-C reaches the
    process and then rank 1's process ends (its group is destroyed): the interrupt stays pending
    until Gloo's wait fails with "Connection closed by peer", as under ``scaledl run``."""

    def __init__(self, groups: dict[int, dist.ProcessGroup]) -> None:
        self.groups = groups
        self.timer: threading.Timer | None = None

    def __call__(self, *args: object, **kwargs: object) -> _Interrupted:
        return self

    def _interrupt_then_leave(self) -> None:
        _thread.interrupt_main(signal.SIGINT)
        del self.groups[1]  # its last reference: the group closes its connections

    def start(self) -> None:
        """In 0.2 s (this thread is inside Gloo by then): Ctrl-C, then rank 1 leaves."""
        self.timer = threading.Timer(0.2, self._interrupt_then_leave)
        self.timer.start()

    def wait(self) -> None:
        self.start()
        self.groups[0].barrier().wait()


def _drain() -> None:
    """A Python call: pending signal handlers run on entry."""


@pytest.fixture
def gloo_pair() -> Iterator[dict[int, dist.ProcessGroup]]:
    """A real two-rank Gloo group whose ranks are threads of this process (a 5 s timeout):
    threads, so the interrupt reaches the waiting rank at a chosen moment; the same race between
    real processes is tests/e2e/test_run_interrupt_horovod.py."""
    store, groups = dist.HashStore(), {}

    def join(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=5))

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    yield groups
    groups.clear()


def _negotiate(monkeypatch: pytest.MonkeyPatch, failing: _Failing | _Interrupted) -> None:
    monkeypatch.setattr(negotiation, "_ALLGATHER", failing)
    context = SimpleNamespace(ranks=(0, 3), rank=1, size=2, control=None)
    negotiation.negotiate(context, negotiation.Request(Kind.BARRIER))  # type: ignore[arg-type]


def test_a_horovod_call_whose_peer_is_gone_says_so_without_gloos_text(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HorovodInternalError) as error:
        _negotiate(monkeypatch, _Failing(CLOSED))
    assert str(error.value) == (
        "barrier on rank 3: the ranks of process set [0, 3] did not all reach it (a peer closed "
        "its connection: it exited or crashed): Connection closed by peer [127.0.0.1]:21163")
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_a_horovod_call_keeps_any_other_backend_error_as_its_cause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HorovodInternalError) as error:
        _negotiate(monkeypatch, _Failing("Tensors must be contiguous"))
    assert str(error.value).endswith(
        "(a rank died, timed out or issued fewer collectives): Tensors must be contiguous")
    assert isinstance(error.value.__cause__, RuntimeError)


def _agree(monkeypatch: pytest.MonkeyPatch, interrupted: _Interrupted) -> None:
    def exchange(values: object) -> list[list[int]]:
        interrupted.wait()
        return []

    agree(Signature(Kind.WRAP_MODEL), exchange)


def _transport_wait(monkeypatch: pytest.MonkeyPatch, interrupted: _Interrupted) -> None:
    """A receive from rank 1 (which never sends) on scaledl's transport, waited on."""
    group = interrupted.groups[0]
    channel = SimpleNamespace(rank=0, world_size=2, backend="gloo", timeout=5.0,
                              ordered_by_peer=False, global_ranks=(0, 1),
                              post=lambda ops: [group.recv([ops[0][1]], 1, 0)])
    transport = TorchTransport(channel)  # type: ignore[arg-type]
    handle = transport.queue_recv(torch.zeros(4), 1)
    transport.commit()
    interrupted.start()
    handle.wait()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call", [_negotiate, _agree, _transport_wait],
                         ids=["negotiation", "agree", "transport"])
def test_an_interrupted_rank_whose_peer_left_first_raises_a_bare_interrupt(
        monkeypatch: pytest.MonkeyPatch, gloo_pair: dict[int, dist.ProcessGroup],
        call: Callable[[pytest.MonkeyPatch, _Interrupted], None]) -> None:
    """Ctrl-C while the rank waits inside Gloo fires once Gloo's error is back in Python: the
    interrupt must not carry that error as its context (Python would print Gloo's text above
    it, as under ``scaledl run``: tests/e2e/test_run_interrupt_horovod.py)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupted = _Interrupted(gloo_pair)
    try:
        with pytest.raises(KeyboardInterrupt) as error:
            call(monkeypatch, interrupted)
    finally:  # an interrupt still pending must not reach pytest: run it with a no-op handler
        if interrupted.timer is not None:
            interrupted.timer.join()
        signal.signal(signal.SIGINT, lambda number, frame: None)
        _drain()
        signal.signal(signal.SIGINT, previous)
    assert Path(error.traceback[-1].path) != Path(__file__), "it came before Gloo's wait"
    assert error.value.__context__ is None and error.value.__cause__ is None
