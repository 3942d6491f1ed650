"""A failed Horovod collective raises ``HorovodInternalError`` (what elastic training catches)
naming a lost or late peer in words, without Gloo's text; any other failure by its first line."""

from __future__ import annotations

import pytest

from scaledl.horovod.dispatch import _start
from scaledl.horovod.errors import HorovodInternalError

GLOO_LOST = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
             "[127.0.0.1]:41235. This is typically caused by a remote worker crashing; check "
             "the remote worker's logs")


def _raising(error: BaseException) -> object:
    def start(async_op: bool) -> None:
        raise error
    return start


def test_a_lost_peer_is_named_in_words_without_gloos_text() -> None:
    with pytest.raises(HorovodInternalError) as caught:
        _start("allreduce", _raising(RuntimeError(GLOO_LOST)), True)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith("allreduce failed: a peer closed its connection")
    assert "pair.cc" not in message and "typically caused" not in message
    assert caught.value.__cause__ is None


def test_another_failure_keeps_its_first_line_and_its_cause() -> None:
    error = RuntimeError("rank 1 called broadcast of 8 float32 but rank 0 called allreduce\nmore")
    with pytest.raises(HorovodInternalError) as caught:
        _start("allreduce", _raising(error), True)  # type: ignore[arg-type]
    assert str(caught.value) == ("allreduce failed: rank 1 called broadcast of 8 float32 but "
                                 "rank 0 called allreduce")
    assert caught.value.__cause__ is error


def test_horovods_own_error_and_other_exceptions_pass_through() -> None:
    own = HorovodInternalError("already Horovod's")
    with pytest.raises(HorovodInternalError) as caught:
        _start("allreduce", _raising(own), True)  # type: ignore[arg-type]
    assert caught.value is own
    with pytest.raises(ValueError):
        _start("allreduce", _raising(ValueError("a user's mistake")), True)  # type: ignore[arg-type]
