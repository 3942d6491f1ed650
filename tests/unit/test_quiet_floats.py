"""``quiet_floats`` ignores NumPy's floating-point errors inside its block, whatever the
caller's error state, and gives the caller's state back on the way out (an exception included),
on NumPy's context variable and on the ``np.errstate`` fallback alike."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from scaledl.collectives import ops
from scaledl.collectives.ops import quiet_floats

HUGE = np.full(4, 3e38, np.float32)
TINY = np.full(4, 1e-45, np.float32)


@pytest.fixture(params=["context variable", "np.errstate"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "np.errstate":
        monkeypatch.setattr(ops, "_ERROR_STATE", None)
    else:
        assert ops._ERROR_STATE is not None, "NumPy's error state is no context variable here"
    return str(request.param)


def test_errors_are_ignored_inside_and_the_callers_state_returns(way: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            with quiet_floats():
                assert set(np.geterr().values()) == {"ignore"}
                assert np.isinf(np.add(HUGE, HUGE)).all()
                assert (np.divide(TINY, 4) == 0).all()
            assert np.geterr()["over"] == "raise"
            with pytest.raises(FloatingPointError):
                np.add(HUGE, HUGE)


def test_an_exception_inside_still_restores_the_state(way: str) -> None:
    with np.errstate(over="warn", under="raise"):
        with pytest.raises(KeyError), quiet_floats():
            raise KeyError("inside")
        assert np.geterr()["over"] == "warn" and np.geterr()["under"] == "raise"


def test_blocks_nest_and_threads_keep_their_own_state(way: str) -> None:
    seen: list[str] = []

    def other_thread() -> None:  # a new thread starts from NumPy's defaults, not the block's
        seen.append(np.geterr()["over"])

    with np.errstate(over="raise"):
        with quiet_floats():
            with quiet_floats():
                assert np.geterr()["over"] == "ignore"
            assert np.geterr()["over"] == "ignore"
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        assert np.geterr()["over"] == "raise"
    assert seen == ["warn"]
