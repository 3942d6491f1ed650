"""The shared-memory wait's schedule: naps grow with the wait, so a long wait (a peer still in
its backward pass) wakes rarely and takes little from the ranks that share its core, while a
peer that arrives during a nap is noticed late by a bounded fraction of the wait."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaledl.transport import shm
from scaledl.transport.shm import (
    NAP_FRACTION, NAP_MAX_S, NAP_S, SPINS, YIELD_S, ShmGroup, WaitCounts, nap_seconds,
    spins_for,
)


def test_nap_closed_form() -> None:
    assert nap_seconds(0.0) == NAP_S
    assert nap_seconds(YIELD_S) == pytest.approx(YIELD_S * NAP_FRACTION)
    assert nap_seconds(8e-3) == pytest.approx(0.5e-3)
    assert nap_seconds(10.0) == NAP_MAX_S


@given(st.floats(0.0, 1e4), st.floats(0.0, 1e4))
def test_nap_bounded_and_monotone(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert NAP_S <= nap_seconds(low) <= nap_seconds(high) <= NAP_MAX_S
    assert nap_seconds(low) <= max(NAP_S, low * NAP_FRACTION)


class _Clock:
    """A fake clock: sleeping and yielding advance it; the peer arrives at ``arrive``."""

    def __init__(self, words: np.ndarray, arrive: float) -> None:
        self.now, self.naps, self.yields = 0.0, 0, 0
        self.words, self.arrive = words, arrive

    def _tick(self, seconds: float) -> None:
        self.now += seconds
        if self.now >= self.arrive:
            self.words[0] = 1

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps += 1
        self._tick(seconds)

    def sched_yield(self) -> None:
        self.yields += 1
        self._tick(1e-6)


def _wait_for(arrive: float, monkeypatch: pytest.MonkeyPatch) -> _Clock:
    words = np.zeros(1, dtype=np.int64)
    clock = _Clock(words, arrive)
    monkeypatch.setattr(shm.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(shm.time, "sleep", clock.sleep)
    monkeypatch.setattr(shm.os, "sched_yield", clock.sched_yield)
    group = SimpleNamespace(_words=[words], _done=ShmGroup._done, waits=WaitCounts(), spins=SPINS,
                            _check_peer=lambda *args: None, _pause=lambda point: None)
    ShmGroup._wait(group, 0, 0, 1, "arrive")  # type: ignore[arg-type]
    return clock


def test_long_wait_wakes_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500 ms wait: about 32 growing naps, then 1 ms ones (naps of 50 us: ~10,000)."""
    clock = _wait_for(0.5, monkeypatch)
    assert clock.naps <= 0.5 / NAP_MAX_S + 40
    assert clock.yields == pytest.approx(YIELD_S / 1e-6, rel=0.01)


@pytest.mark.parametrize("arrive", [0.003, 0.02, 0.3, 2.0])
def test_arrival_noticed_within_a_fraction_of_the_wait(
        arrive: float, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _wait_for(arrive, monkeypatch)
    assert arrive <= clock.now <= arrive + max(NAP_S, min(NAP_MAX_S, arrive * NAP_FRACTION))


def test_short_wait_only_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _wait_for(YIELD_S / 2, monkeypatch)
    assert clock.naps == 0


def test_waits_spin_only_while_every_rank_has_a_core() -> None:
    """A rank that spins holds the core its late peer needs once the host's ranks outnumber
    the cores: there the wait yields at once."""
    assert spins_for(2, 2) == SPINS and spins_for(1, 16) == SPINS
    assert spins_for(3, 2) == 0 and spins_for(4, 2) == 0
