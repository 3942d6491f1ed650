"""Timeline: what each rank did when, as a Chrome trace that Perfetto and chrome://tracing open.

The file follows the Trace Event Format (``{"traceEvents": [...], "displayTimeUnit": "ms"}``):
each span is a complete event (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds since the
rank's origin; ``pid`` is the rank and ``tid`` a *lane* -- by default the recording thread's
name, or an explicit one such as ``"compute"`` or ``"comm"``.  Metadata events (``"ph": "M"``)
name the process ``rank N`` and each lane, so the viewer shows one row per rank and lane.

Spans come from the training thread (:meth:`Timeline.span`) and from the communication thread,
which times a collective itself and hands in its ``time.perf_counter()`` bounds
(:meth:`Timeline.record`); recording is thread-safe.  Only the first ``max_steps`` steps (counted
by :meth:`Timeline.begin_step`) and at most ``max_events`` events are kept, so a long run's trace
stays small.

Ranks have different ``perf_counter`` origins.  Each file stores, in ``otherData``, the wall-clock
time (``time.time()``) at its origin; :func:`merge_timelines` shifts every rank onto the earliest
origin, which aligns ranks to within the hosts' clock skew (microseconds on one host).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scaledl.train.metrics import json_ready

__all__ = ["Timeline", "merge_timelines", "load_timeline", "TIMELINE_NAME"]

log = logging.getLogger(__name__)

TIMELINE_NAME = "timeline.json"
"""File name of the merged timeline in a run directory (per rank: ``timeline-rank{N}.json``)."""


class Timeline:
    """Chrome trace events of one rank."""

    def __init__(self, rank: int, max_steps: int | None = 50, max_events: int = 200_000) -> None:
        """Record for ``rank``; keep the first ``max_steps`` steps (``None``: all) and at most
        ``max_events`` events."""
        if rank < 0:
            raise ValueError(f"timeline rank {rank} must be >= 0")
        if max_steps is not None and max_steps < 0:
            raise ValueError(f"timeline max_steps {max_steps} must be >= 0, or None for all")
        if max_events < 1:
            raise ValueError(f"timeline max_events {max_events} must be at least 1")
        self.rank = rank
        self.max_steps = max_steps
        self.max_events = max_events
        self.origin_s = time.perf_counter()
        """``time.perf_counter()`` at the origin: ``ts = 0``."""
        self.origin_wall_s = time.time()
        """``time.time()`` at the origin, used to align ranks."""
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._lanes: dict[str, int] = {}
        self._steps = 0
        self._full = False

    @property
    def recording(self) -> bool:
        """False once the step or event cap has been reached."""
        return not self._full

    def begin_step(self, step: int) -> None:
        """Mark the start of training step ``step``; past ``max_steps`` steps, stop recording."""
        with self._lock:
            self._steps += 1
            if self.max_steps is not None and self._steps > self.max_steps and not self._full:
                self._stop(f"kept the first {self.max_steps} steps")
        self.instant("step", "step", lane=None, step=step)

    @contextmanager
    def span(self, name: str, category: str, *, lane: str | None = None,
             **args: Any) -> Iterator[None]:
        """Record the block as a span on ``lane`` (default: the current thread's name)."""
        if self._full:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, category, start, time.perf_counter(), lane, **args)

    def record(self, name: str, category: str, start_s: float, end_s: float,
               lane: str | None = None, **args: Any) -> None:
        """Record a span timed elsewhere, from ``time.perf_counter()`` values."""
        if end_s < start_s:
            raise ValueError(f"span {name!r} ends ({end_s}) before it starts ({start_s}); "
                             "pass perf_counter() values in order")
        event = {"name": name, "cat": category, "ph": "X", "ts": self._us(start_s),
                 "dur": round((end_s - start_s) * 1e6, 3)}
        self._append(event, lane, args)

    def instant(self, name: str, category: str, *, lane: str | None = None,
                at_s: float | None = None, **args: Any) -> None:
        """Record a point in time (now, or ``at_s`` from ``time.perf_counter()``)."""
        at = time.perf_counter() if at_s is None else at_s
        event = {"name": name, "cat": category, "ph": "i", "s": "t", "ts": self._us(at)}
        self._append(event, lane, args)

    def events(self) -> list[dict[str, Any]]:
        """Metadata events then recorded events, copies."""
        with self._lock:
            return self._metadata() + [dict(event) for event in self._events]

    def to_dict(self) -> dict[str, Any]:
        """The whole trace as a JSON-ready dict."""
        return {
            "traceEvents": self.events(),
            "displayTimeUnit": "ms",
            "otherData": {"rank": self.rank, "origin_wall_s": self.origin_wall_s},
        }

    def save(self, path: str | Path) -> Path:
        """Write the trace to ``path`` (atomically) and return it."""
        return _write_json(Path(path), self.to_dict())

    def _us(self, at_s: float) -> float:
        return round((at_s - self.origin_s) * 1e6, 3)

    def _append(self, event: dict[str, Any], lane: str | None, args: dict[str, Any]) -> None:
        lane = threading.current_thread().name if lane is None else lane
        if args:
            event["args"] = {key: json_ready(value, unknown=str) for key, value in args.items()}
        with self._lock:
            if self._full:
                return
            if lane not in self._lanes:
                self._lanes[lane] = len(self._lanes)
            event["pid"] = self.rank
            event["tid"] = self._lanes[lane]
            self._events.append(event)
            if len(self._events) >= self.max_events:
                self._stop(f"reached {self.max_events} events")

    def _stop(self, reason: str) -> None:
        """Stop recording with a final marker event (lock held)."""
        self._full = True
        lane = self._lanes.setdefault("timeline", len(self._lanes))
        self._events.append({"name": "timeline stopped", "cat": "timeline", "ph": "i", "s": "p",
                             "ts": self._us(time.perf_counter()), "pid": self.rank, "tid": lane,
                             "args": {"reason": reason}})
        log.info("timeline of rank %d stopped recording: %s", self.rank, reason)

    def _metadata(self) -> list[dict[str, Any]]:
        pid = self.rank
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"rank {self.rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": self.rank}},
        ]
        for lane, tid in self._lanes.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"name": lane}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"sort_index": tid}})
        return meta


def load_timeline(path: str | Path) -> dict[str, Any]:
    """Read a trace written by :meth:`Timeline.save`; ``ValueError`` naming the path if it is
    missing or not one."""
    path = Path(path)
    try:
        trace = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"timeline {path} cannot be read ({error.strerror}); "
                         "pass a file written by Timeline.save") from None
    except json.JSONDecodeError:
        raise ValueError(f"timeline {path} is not valid JSON; pass a file written by "
                         "Timeline.save") from None
    if not (isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
            and "origin_wall_s" in trace.get("otherData", {})):
        raise ValueError(f"timeline {path} lacks traceEvents or otherData.origin_wall_s; "
                         "pass a file written by Timeline.save")
    return trace


def merge_timelines(paths: Sequence[str | Path], out_path: str | Path) -> Path:
    """Merge per-rank traces into one file, shifting each onto the earliest wall-clock origin."""
    if not paths:
        raise ValueError("merge_timelines got no files; pass one timeline per rank")
    traces = [(Path(path), load_timeline(path)) for path in paths]
    base = min(trace["otherData"]["origin_wall_s"] for _, trace in traces)
    seen: dict[Any, Path] = {}
    merged: list[dict[str, Any]] = []
    for path, trace in traces:
        shift_us = (trace["otherData"]["origin_wall_s"] - base) * 1e6
        pids = {event.get("pid") for event in trace["traceEvents"]}
        for pid in pids:
            if pid in seen:
                raise ValueError(f"timelines {seen[pid]} and {path} both hold pid (rank) {pid}; "
                                 "merge one file per rank")
            seen[pid] = path
        for event in trace["traceEvents"]:
            if "ts" in event:
                event = {**event, "ts": round(event["ts"] + shift_us, 3)}
            merged.append(event)
    ranks = sorted(trace["otherData"].get("rank", -1) for _, trace in traces)
    return _write_json(Path(out_path), {
        "traceEvents": merged, "displayTimeUnit": "ms",
        "otherData": {"ranks": ranks, "origin_wall_s": base},
    })


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)
    return path
