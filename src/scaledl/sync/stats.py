"""Communication accounting: the statistics every strategy keeps, and where timing spans go.

:class:`SyncStats` totals what a strategy's communication cost (seconds it ran, seconds the
training thread was blocked on it, bytes, parameter-server pushes and their staleness);
:class:`SpanRecorder` is the protocol a timeline implements (``scaledl.train.timeline.Timeline``
does), so the sync and strategy layers record spans without importing ``train``.

One rule charges a wait, whoever waits (the gradient reducer, reduce-broadcast's per-layer
broadcasts, the periodic strategies, the parameter-server workers):

* the seconds the collective *ran* (measured where it ran, on the communicator's thread) go to
  ``comm_s`` and become a ``comm`` span on the ``comm`` lane;
* the seconds the caller was *blocked* go to ``wait_s`` and become a ``wait`` span on the
  ``compute`` lane.

``1 - wait_s / comm_s`` is then the share of communication hidden behind computation.
:func:`wait_and_charge` does both for one handle; :func:`charge_run` and :func:`charge_wait` are
its two halves, for a caller that waits for several handles at once; :func:`blocking_exchange`
charges a blocking exchange, whose run time is all wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from scaledl.collectives import CollectiveHandle

__all__ = [
    "SpanRecorder", "SyncStats", "wait_and_charge", "charge_run", "charge_wait",
    "blocking_exchange",
]


class SpanRecorder(Protocol):
    """Where timing spans go (``scaledl.train.timeline.Timeline`` implements it)."""

    def record(
        self, name: str, category: str, start_s: float, end_s: float, lane: str, **args: Any
    ) -> None:
        """Record a span measured with ``time.perf_counter()``."""
        ...


@dataclass
class SyncStats:
    """Communication accounting, accumulated until :meth:`reset`."""

    syncs: int = 0
    """Backward passes whose gradients were reduced."""
    comm_s: float = 0.0
    """Seconds the collectives ran (measured where they ran)."""
    wait_s: float = 0.0
    """Seconds the training thread was blocked waiting for collectives."""
    bytes: int = 0
    """Bytes of gradient this rank put into its allreduces: with a compression, the compressed
    bytes on the wire (or, for parameter-server strategies, bytes sent and received)."""
    pushes: int = 0
    """Updates this worker sent to a parameter server (asynchronous strategies)."""
    staleness_sum: int = 0
    """Sum over those updates of their staleness: how many other updates the server applied
    between this worker's read of the parameters and the arrival of its update."""
    staleness_max: int = 0
    """Largest staleness of one of those updates."""

    @property
    def hidden_fraction(self) -> float:
        """Share of communication time that overlapped computation: ``1 - wait / comm``."""
        if self.comm_s <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.wait_s / self.comm_s))

    @property
    def mean_staleness(self) -> float | None:
        """Mean staleness of this worker's updates (``None`` when it sent none)."""
        return self.staleness_sum / self.pushes if self.pushes else None

    def record_push(self, staleness: int) -> None:
        """Account one update sent to a server, which reported ``staleness``."""
        self.pushes += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)

    def reset(self) -> SyncStats:
        """Return the totals so far and start again from zero."""
        totals = dataclasses.replace(self)
        for item in dataclasses.fields(self):
            setattr(self, item.name, item.default)
        return totals


def charge_run(
    stats: SyncStats, timeline: SpanRecorder | None, span: str, handle: CollectiveHandle,
    span_bytes: int | None = None,
) -> None:
    """Add the run time of the finished ``handle`` to ``stats.comm_s``; record it as the ``comm``
    span ``span`` (with a ``bytes`` argument when ``span_bytes`` is given)."""
    stats.comm_s += handle.duration
    if timeline is None or handle.started_at is None or handle.finished_at is None:
        return
    args = {} if span_bytes is None else {"bytes": span_bytes}
    timeline.record(span, "comm", handle.started_at, handle.finished_at, "comm", **args)


def charge_wait(
    stats: SyncStats, timeline: SpanRecorder | None, span: str, blocked_s: float, until_s: float
) -> None:
    """Add the time blocked from ``blocked_s`` to ``until_s`` (``time.perf_counter()`` values)
    to ``stats.wait_s``; record it as the ``wait`` span ``span`` on the compute lane."""
    stats.wait_s += until_s - blocked_s
    if timeline is not None:
        timeline.record(span, "wait", blocked_s, until_s, "compute")


def wait_and_charge(
    handle: CollectiveHandle, stats: SyncStats, timeline: SpanRecorder | None, *,
    comm_span: str, wait_span: str, span_bytes: int | None = None,
) -> None:
    """Wait for ``handle``; charge its run time (:func:`charge_run`, span ``comm_span``) and the
    time blocked (:func:`charge_wait`, span ``wait_span``).  Bytes are the caller's to count."""
    blocked = time.perf_counter()
    handle.wait()
    until = time.perf_counter()
    charge_run(stats, timeline, comm_span, handle, span_bytes)
    charge_wait(stats, timeline, wait_span, blocked, until)


@contextlib.contextmanager
def blocking_exchange(
    stats: SyncStats, timeline: SpanRecorder | None, span: str, nbytes: int
) -> Iterator[None]:
    """Charge the block as a blocking exchange of ``nbytes``: its time is both run time and
    wait; one ``comm`` span ``span`` (with ``bytes``)."""
    start = time.perf_counter()
    yield
    end = time.perf_counter()
    stats.comm_s += end - start
    stats.wait_s += end - start
    stats.bytes += nbytes
    if timeline is not None:
        timeline.record(span, "comm", start, end, "comm", bytes=nbytes)
