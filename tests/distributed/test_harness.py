"""The test harness itself: ``run_ranks`` reports a rank that raises, one that dies and one that
hangs, each naming the rank, and gives every rank the parent's environment as it is at the call
(ranks are forked from a fork server that started earlier, with the environment of that time)."""

from __future__ import annotations

import os
import time

import pytest

from tests.harness import RankFailure, run_ranks


def _raise_on_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one says no")
    return rank


def _die_on_one(rank: int, world: int) -> int:
    if rank == 1:
        os._exit(3)
    time.sleep(5)  # the survivor is killed when the parent gives up
    return rank


def _hang(rank: int, world: int) -> None:
    time.sleep(60)


def _environment(rank: int, world: int) -> tuple[str | None, str | None, str | None]:
    return (os.environ.get("SCALEDL_HARNESS_SET"), os.environ.get("SCALEDL_HARNESS_GONE"),
            os.environ.get("SCALEDL_HARNESS_GIVEN"))


def test_a_raising_rank_is_reported_with_its_traceback() -> None:
    with pytest.raises(RankFailure, match="rank 1 failed") as caught:
        run_ranks(2, _raise_on_one, timeout=60)
    assert "ValueError: rank one says no" in str(caught.value)


def test_a_rank_that_dies_is_reported_with_its_exit_code() -> None:
    with pytest.raises(RankFailure, match="rank 1 died with exit code 3"):
        run_ranks(2, _die_on_one, timeout=60)


def test_a_hang_fails_at_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"ranks \[0, 1\] did not finish within 3"):
        run_ranks(2, _hang, timeout=3)
    assert time.monotonic() - start < 20


def test_ranks_get_the_parents_environment_at_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEDL_HARNESS_GONE", "old")
    run_ranks(2, _environment, timeout=60)  # the fork server may start here, with it set
    monkeypatch.delenv("SCALEDL_HARNESS_GONE")
    monkeypatch.setenv("SCALEDL_HARNESS_SET", "now")
    seen = run_ranks(2, _environment, timeout=60, env={"SCALEDL_HARNESS_GIVEN": "given"})
    assert seen == [("now", None, "given")] * 2
