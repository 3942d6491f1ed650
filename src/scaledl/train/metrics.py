"""Step metrics: one JSON object per line (JSONL), and the run summary computed from them.

A run's ``metrics.jsonl`` holds records with a ``kind``: ``"run"`` (written once at the start:
model, dataset, world size, config), ``"step"`` (one per training step: ``step``, ``epoch``,
``time``, ``loss``, ``accuracy``, ``samples_per_s``, ``comm_s``, ``wait_s``, ...), ``"eval"``
(one per evaluation: ``test_loss``, ``test_accuracy``, ...) and ``"summary"`` (at the end,
:meth:`RunSummary.to_dict`).  ``time`` is Unix time in seconds.  Non-finite floats (a diverged
loss) are written as ``null`` so every line is strict JSON; bench, sim and plots read the file.

Timing definitions (per step, summed over the run by :class:`RunStats`):

- ``step_s``: wall time of the training step on the training thread.
- ``comm_s``: time collectives were running, measured on the communication thread from the start
  to the completion of each collective (:meth:`StepTimer.add_comm`).
- ``wait_s``: *exposed* wait -- time the training thread was blocked waiting for collectives
  (``handle.wait()``, measured with :meth:`StepTimer.waiting`).
- ``comm_share = comm_s / step_s``: share of step time during which communication ran.
- ``exposed_share = wait_s / step_s``: share of step time lost to communication.
- ``hidden_fraction = 1 - wait_s / comm_s`` clipped to [0, 1]: fraction of communication hidden
  behind compute (1 = fully overlapped, 0 = none); ``None`` when there was no communication.

A gradient bucket's collective starts when its last gradient is ready, so when every gradient
fits one bucket (``--bucket-mb`` at least the model's gradient size: the default 25 MiB holds
the default MLP's 0.07 MiB, and ResNet-20's 1 MiB) it starts only when backward has ended, and
nothing is left to overlap it with: the 0 % is measured, not a fault of the measurement.
:func:`overlap_note` says so beside the number.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = [
    "MetricsWriter", "read_metrics", "StepTimer", "StepTimes", "RunStats", "RunSummary",
    "METRICS_NAME", "overlap_note",
    "SUMMARY_NAME", "json_ready",
]

log = logging.getLogger(__name__)

METRICS_NAME = "metrics.jsonl"
"""File name of the step metrics in a run directory."""

SUMMARY_NAME = "summary.json"
"""File name of a finished run's summary in its run directory, written by rank 0 through
:func:`scaledl.train.in_group.write_summary` (``scaledl train`` and the bench's pooled runs)."""


class MetricsWriter:
    """Appends records to a JSONL file, flushing at most ``flush_interval_s`` after a write."""

    def __init__(
        self, path: str | Path, flush_interval_s: float = 1.0,
        truncate_after_step: int | None = None,
    ) -> None:
        """Open ``path`` for appending; with ``truncate_after_step`` (on resume), first drop the
        records of later steps so that replayed steps are not counted twice."""
        if flush_interval_s < 0:
            raise ValueError(f"flush_interval_s {flush_interval_s} must be >= 0")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            _keep_until(self.path, truncate_after_step)
        self._flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record; values must be numbers, strings, bools, None, lists or dicts
        (tensors and numpy values are converted with ``.tolist()``)."""
        line = json.dumps(json_ready(record), allow_nan=False, separators=(",", ":"))
        with self._lock:
            if self._file is None:
                raise ValueError(f"metrics file {self.path} is closed; open a new MetricsWriter")
            self._file.write(line + "\n")
            now = time.monotonic()
            if now - self._last_flush >= self._flush_interval_s:
                self._file.flush()
                self._last_flush = now

    def log_run(self, **fields: Any) -> None:
        """The run record: model, dataset, world_size, config, ..."""
        self.write({"kind": "run", "time": time.time(), **fields})

    def log_step(self, step: int, epoch: int, **fields: Any) -> None:
        """One training step's record (loss, accuracy, samples_per_s, comm_s, wait_s, ...)."""
        self.write({"kind": "step", "step": step, "epoch": epoch, "time": time.time(), **fields})

    def log_eval(self, step: int, epoch: int, **fields: Any) -> None:
        """One evaluation's record (test_loss, test_accuracy, ...)."""
        self.write({"kind": "eval", "step": step, "epoch": epoch, "time": time.time(), **fields})

    def flush(self) -> None:
        """Write buffered records to the file now."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
                self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and close; further writes raise."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Every record of a metrics file (only those of ``kind`` if given).  A torn last line (the
    writer was killed mid-line) is skipped with a warning; a bad line elsewhere raises."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ValueError(f"metrics file {path} cannot be read ({error.strerror}); "
                         "pass the metrics.jsonl of a run") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                log.warning("%s: ignoring the incomplete last line %d", path, number)
                continue
            raise ValueError(f"metrics file {path} line {number} is not JSON; "
                             "fix or delete that line") from None
        if not isinstance(record, dict):
            raise ValueError(f"metrics file {path} line {number} is not a JSON object")
        if kind is None or record.get("kind") == kind:
            records.append(record)
    return records


def _keep_until(path: Path, step: int) -> None:
    kept = [record for record in read_metrics(path)
            if not isinstance(record.get("step"), int) or record["step"] <= step]
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def json_ready(value: Any, unknown: Callable[[Any], Any] | None = None) -> Any:
    """JSON-ready copy: ``.item()`` for tensors/numpy scalars, ``None`` for non-finite floats
    (JSON has no NaN: ``json.dumps`` would write ``NaN``, which JSON readers refuse), paths as
    strings; any other value goes through ``unknown``, or is refused when it is None."""
    if isinstance(value, Mapping):
        return {str(key): json_ready(item, unknown) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item, unknown) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        return json_ready(value.tolist(), unknown)  # tensors and numpy values
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if unknown is not None:
        return unknown(value)
    raise TypeError(f"metric value {value!r} of type {type(value).__name__} is not JSON; "
                    "pass numbers, strings, lists or dicts")


# -- timing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTimes:
    """What one step cost (see the module docstring for the definitions)."""

    step_s: float
    """Wall time of the step on the training thread."""
    comm_s: float
    """Time collectives reported during the step were running (communication thread)."""
    wait_s: float
    """Time the training thread was blocked waiting for collectives (exposed communication)."""


class StepTimer:
    """Times one step at a time: ``start()``, ``waiting()`` around blocking waits, ``add_comm``
    from the communication thread, ``stop()``.  A collective is counted in the step during which
    it reports its duration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start: float | None = None
        self._comm_s = 0.0
        self._wait_s = 0.0

    def start(self) -> None:
        """Begin a step."""
        with self._lock:
            self._start = time.perf_counter()
            self._comm_s = 0.0
            self._wait_s = 0.0

    def add_comm(self, seconds: float) -> None:
        """Add a collective's running time; thread-safe (call it on the communication thread)."""
        with self._lock:
            self._comm_s += seconds

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the time inside the block as exposed wait (training thread)."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - begin
            with self._lock:
                self._wait_s += elapsed

    def stop(self) -> StepTimes:
        """End the step and return its times."""
        with self._lock:
            if self._start is None:
                raise ValueError("StepTimer.stop() called before start(); call start() first")
            times = StepTimes(time.perf_counter() - self._start, self._comm_s, self._wait_s)
            self._start = None
        return times


@dataclass(frozen=True)
class RunSummary:
    """A run's totals and the ratios derived from them."""

    wall_s: float
    """Wall time from the start of the run to the summary (includes eval, checkpoints)."""
    steps: int
    """Training steps counted."""
    samples: int
    """Samples processed in those steps."""
    step_s: float
    """Summed step time."""
    comm_s: float
    """Summed time collectives were running."""
    wait_s: float
    """Summed exposed wait."""
    samples_per_s: float
    """Training throughput: ``samples / step_s``."""
    comm_share: float
    """``comm_s / step_s``."""
    exposed_share: float
    """``wait_s / step_s``."""
    hidden_fraction: float | None
    """``1 - wait_s / comm_s`` clipped to [0, 1]; ``None`` without communication."""
    pushes: int = 0
    """Updates sent to a parameter server (asynchronous strategies; 0 otherwise)."""
    mean_staleness: float | None = None
    """Mean staleness of those updates (server updates applied in between); ``None`` if none."""
    max_staleness: int | None = None
    """Largest staleness of one of those updates; ``None`` if none."""
    bytes_sent: int = 0
    """Bytes this rank's strategy put into its exchanges (``SyncStats.bytes``: with a gradient
    compression, the compressed bytes on the wire)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


class RunStats:
    """Sums :class:`StepTimes` over a run into a :class:`RunSummary`."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.steps = 0
        self.samples = 0
        self.step_s = 0.0
        self.comm_s = 0.0
        self.wait_s = 0.0
        self.pushes = 0
        self.staleness_sum = 0
        self.staleness_max = 0
        self.bytes_sent = 0

    def add_staleness(self, pushes: int, staleness_sum: int, staleness_max: int) -> None:
        """Count ``pushes`` updates sent to a parameter server with their staleness."""
        self.pushes += pushes
        self.staleness_sum += staleness_sum
        self.staleness_max = max(self.staleness_max, staleness_max)

    def add_bytes(self, nbytes: int) -> None:
        """Count ``nbytes`` this rank's strategy sent."""
        self.bytes_sent += nbytes

    def add(self, times: StepTimes, samples: int) -> None:
        """Count one step of ``samples`` samples (pass the global batch for global throughput)."""
        self.steps += 1
        self.samples += samples
        self.step_s += times.step_s
        self.comm_s += times.comm_s
        self.wait_s += times.wait_s

    def summary(self) -> RunSummary:
        """The totals so far and their ratios (0 where a denominator is 0)."""
        step_s = self.step_s
        hidden = None
        if self.comm_s > 0:
            hidden = min(1.0, max(0.0, 1.0 - self.wait_s / self.comm_s))
        return RunSummary(
            wall_s=time.perf_counter() - self._start, steps=self.steps, samples=self.samples,
            step_s=step_s, comm_s=self.comm_s, wait_s=self.wait_s,
            samples_per_s=self.samples / step_s if step_s > 0 else 0.0,
            comm_share=self.comm_s / step_s if step_s > 0 else 0.0,
            exposed_share=self.wait_s / step_s if step_s > 0 else 0.0,
            hidden_fraction=hidden, pushes=self.pushes,
            mean_staleness=self.staleness_sum / self.pushes if self.pushes else None,
            max_staleness=self.staleness_max if self.pushes else None,
            bytes_sent=self.bytes_sent,
        )


NO_OVERLAP_BELOW = 0.05
"""A hidden fraction under this, with one gradient bucket, is explained by :func:`overlap_note`."""


def overlap_note(hidden_fraction: float | None, bucket_nbytes: list[int],
                 bucket_mb: float) -> str | None:
    """Why (almost) no communication was hidden, when the reason is structural: every gradient
    fit one bucket of ``bucket_mb`` MiB, reduced only after backward had ended.  None when there
    is nothing to explain (no communication, several buckets, or overlap was measured)."""
    if hidden_fraction is None or hidden_fraction >= NO_OVERLAP_BELOW or \
            len(bucket_nbytes) != 1:
        return None
    mib = bucket_nbytes[0] / 2**20
    return (f"all {mib:.2g} MiB of gradients fit one {bucket_mb:g} MiB bucket, which starts "
            f"only once backward has ended; a --bucket-mb below {mib:.2g} starts buckets during "
            "backward, which pays off when backward takes longer than their reduction")
