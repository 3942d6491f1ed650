"""The one rule that charges a wait: run time to comm_s and a comm span, time blocked to wait_s
and a wait span; a blocking exchange is all wait."""

from __future__ import annotations

import time
from typing import Any

from scaledl.sync.stats import SyncStats, blocking_exchange, charge_run, wait_and_charge


class _Handle:
    """A finished collective that ran from 10.0 to 10.5 (perf_counter values)."""

    def __init__(self, started_at: float | None = 10.0, finished_at: float | None = 10.5) -> None:
        self.started_at, self.finished_at = started_at, finished_at
        self.waited = False

    @property
    def duration(self) -> float:
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return self.finished_at - self.started_at

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep(0.01)
        self.waited = True
        return True


class _Recorder:
    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float, str, dict[str, Any]]] = []

    def record(self, name: str, category: str, start_s: float, end_s: float, lane: str,
               **args: Any) -> None:
        self.spans.append((name, category, start_s, end_s, lane, args))


def test_wait_and_charge_charges_run_time_and_wait_and_records_two_spans() -> None:
    stats, timeline, handle = SyncStats(), _Recorder(), _Handle()
    wait_and_charge(handle, stats, timeline, comm_span="broadcast fc", wait_span="wait fc",
                    span_bytes=64)
    assert handle.waited
    assert stats.comm_s == 0.5 and stats.wait_s >= 0.01 and stats.bytes == 0
    (comm, wait) = timeline.spans
    assert comm == ("broadcast fc", "comm", 10.0, 10.5, "comm", {"bytes": 64})
    assert wait[:2] == ("wait fc", "wait") and wait[4] == "compute" and wait[5] == {}
    assert wait[3] - wait[2] == stats.wait_s


def test_a_span_without_bytes_and_a_handle_without_timestamps() -> None:
    stats, timeline = SyncStats(), _Recorder()
    charge_run(stats, timeline, "reduce", _Handle(), span_bytes=None)
    assert timeline.spans == [("reduce", "comm", 10.0, 10.5, "comm", {})]
    charge_run(stats, timeline, "never ran", _Handle(None, None))
    assert len(timeline.spans) == 1 and stats.comm_s == 0.5


def test_without_a_timeline_only_the_statistics_change() -> None:
    stats = SyncStats()
    wait_and_charge(_Handle(), stats, None, comm_span="c", wait_span="w")
    assert stats.comm_s == 0.5 and stats.wait_s > 0


def test_blocking_exchange_is_run_time_and_wait_with_bytes() -> None:
    stats, timeline = SyncStats(), _Recorder()
    with blocking_exchange(stats, timeline, "push gradient", 128):
        time.sleep(0.01)
    assert stats.comm_s == stats.wait_s >= 0.01 and stats.bytes == 128
    ((name, category, start, end, lane, args),) = timeline.spans
    assert (name, category, lane, args) == ("push gradient", "comm", "comm", {"bytes": 128})
    assert end - start == stats.comm_s
