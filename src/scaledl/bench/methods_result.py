"""What one method's run gave, read from its run directory.

A run's result (:class:`MethodResult`) is read from its ``metrics.jsonl``
(:func:`scaledl.train.metrics.read_metrics`):

* *training time*: seconds since the run record (written once the data, model and strategy are
  built, so start-up is excluded) **less the time spent evaluating** (from each ``step`` record
  of step k to the ``eval`` record of step k), so the evaluation interval does not tilt the
  comparison;
* *time to target*: the training time of the first evaluation with test accuracy >= target
  (``None`` when never reached); *epochs to target* likewise in epochs (step / steps per epoch);
* *comm share*: the summary's ``comm_s / step_s`` of rank 0 (time communication ran / step
  time); *exposed share*: its ``wait_s / step_s`` (time the training thread was blocked on
  communication / step time), the part of the comm share not hidden behind computation;
* *updates/s*: local model updates per second summed over the workers, i.e. steps per worker x
  workers / training time (every worker takes the same number of steps: the data is sharded
  evenly);
* *roughness*: the sum of the decreases of test accuracy between consecutive evaluations (0 for
  a curve that never goes down): how far from smooth the accuracy curve is.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from scaledl.bench.methods import BenchSpec, Method, ranks
from scaledl.train.metrics import SUMMARY_NAME, read_metrics

__all__ = ["MethodResult", "read_result", "failed_result", "time_to_target", "median_result"]


@dataclass
class MethodResult:
    """What one method's run gave (module docstring: definitions)."""

    method: str
    label: str
    status: str = "ok"
    """``ok``, ``failed`` (non-zero exit or unreadable metrics) or ``timeout``."""
    reason: str | None = None
    """Why it failed: the last error line of its stderr."""
    ranks: int = 0
    workers: int = 0
    wall_s: float | None = None
    """Wall time of the run as the bench saw it, start-up included: the whole ``scaledl train``
    process, or in a pool of ranks from handing it the job to every rank's done file (the
    pool's start-up included for its first run)."""
    train_s: float | None = None
    eval_s: float | None = None
    """Time spent evaluating (excluded from ``train_s``)."""
    steps: int | None = None
    """Steps per worker."""
    final_accuracy: float | None = None
    best_accuracy: float | None = None
    time_to_target_s: float | None = None
    epochs_to_target: float | None = None
    comm_share: float | None = None
    exposed_share: float | None = None
    updates_per_s: float | None = None
    samples_per_s: float | None = None
    mean_staleness: float | None = None
    roughness: float | None = None
    curve: list[dict[str, float]] = field(default_factory=list)
    """One point per evaluation: ``time_s`` (training time), ``epoch``, ``accuracy``."""
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """Every repeat's numbers (without curves) when the method ran more than once."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def failed_result(method: Method, spec: BenchSpec, status: str, reason: str,
                  wall_s: float | None = None) -> MethodResult:
    """The result of a run that did not finish (``status`` ``failed`` or ``timeout``)."""
    return MethodResult(method=method.name, label=method.label, status=status, reason=reason,
                        ranks=ranks(method, spec), workers=spec.workers, wall_s=wall_s)


def time_to_target(curve: list[dict[str, float]], target: float, key: str = "time_s"
                   ) -> float | None:
    """``key`` of the first curve point whose accuracy reaches ``target``; ``None`` if none."""
    for point in curve:
        if point["accuracy"] >= target:
            return point[key]
    return None


def _roughness(accuracies: list[float]) -> float:
    return sum(max(0.0, a - b) for a, b in zip(accuracies, accuracies[1:]))


def _curve(records: list[dict[str, Any]], start: float, steps_per_epoch: float
           ) -> tuple[list[dict[str, float]], float, float]:
    """Evaluation points on the training-time axis, the total evaluation time, and the
    training time (run record to last step, less the evaluations in between)."""
    curve: list[dict[str, float]] = []
    last_time, last_step_time, eval_s, eval_inside = start, start, 0.0, 0.0
    for record in records:
        kind = record.get("kind")
        if kind == "step":
            last_time = last_step_time = record["time"]
            eval_inside = eval_s
        elif kind == "eval":
            eval_s += max(0.0, record["time"] - last_time)
            last_time = record["time"]
            if record.get("test_accuracy") is not None:
                curve.append({"time_s": record["time"] - start - eval_s,
                              "epoch": record["step"] / steps_per_epoch,
                              "accuracy": float(record["test_accuracy"])})
    return curve, eval_s, max(0.0, last_step_time - start - eval_inside)


def _staleness(run_dir: Path, summary: dict[str, Any]) -> float | None:
    """Mean staleness over the workers (``summary.json``), else rank 0's (summary record)."""
    try:
        result = json.loads((run_dir / SUMMARY_NAME).read_text())["result"]
        values = [v for v in result.get("staleness_per_worker") or [] if v is not None]
    except (OSError, ValueError, KeyError, TypeError):
        values = []
    if values:
        return float(statistics.fmean(values))
    value = summary.get("mean_staleness")
    return float(value) if value is not None else None


def read_result(method: Method, spec: BenchSpec, run_dir: Path) -> MethodResult:
    """The result of a finished run from ``run_dir/metrics.jsonl`` (``ValueError`` when the
    file is missing, holds no run record or no evaluation)."""
    records = read_metrics(run_dir / "metrics.jsonl")
    runs = [r for r in records if r.get("kind") == "run"]
    if not runs:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no run record; the run did not "
                         "start")
    summaries = [r for r in records if r.get("kind") == "summary"]
    summary = summaries[-1] if summaries else {}
    steps = [r for r in records if r.get("kind") == "step"]
    total_steps = int(summary.get("steps") or len(steps))
    steps_per_epoch = max(1.0, total_steps / spec.epochs)
    curve, eval_s, train_s = _curve(records, runs[-1]["time"], steps_per_epoch)
    if not curve:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no evaluation; the run stopped "
                         "before its first one")
    accuracies = [p["accuracy"] for p in curve]
    return MethodResult(
        method=method.name, label=method.label, ranks=ranks(method, spec),
        workers=spec.workers, train_s=train_s, eval_s=eval_s, steps=total_steps,
        final_accuracy=accuracies[-1], best_accuracy=max(accuracies),
        time_to_target_s=time_to_target(curve, spec.target),
        epochs_to_target=time_to_target(curve, spec.target, "epoch"),
        comm_share=summary.get("comm_share"), exposed_share=summary.get("exposed_share"),
        updates_per_s=total_steps * spec.workers / train_s if train_s else None,
        samples_per_s=summary.get("samples_per_s"),
        mean_staleness=_staleness(run_dir, summary), roughness=_roughness(accuracies),
        curve=curve,
    )


_MEDIAN_FIELDS = ("wall_s", "train_s", "eval_s", "final_accuracy", "best_accuracy",
                  "comm_share", "exposed_share", "updates_per_s", "samples_per_s",
                  "mean_staleness", "roughness")


def _median_or_none(values: list[float | None], none_is_worst: bool = False) -> float | None:
    """Median of the values; ``None`` entries are dropped, or (``none_is_worst``: a target not
    reached) count as infinitely late, so the median is ``None`` when most are ``None``."""
    if none_is_worst:
        ordered = sorted(float("inf") if v is None else v for v in values)
        middle = ordered[(len(ordered) - 1) // 2]
        return None if middle == float("inf") else middle
    kept = [v for v in values if v is not None]
    return float(statistics.median(kept)) if kept else None


def median_result(results: list[MethodResult]) -> MethodResult:
    """One method's repeats as one result: medians over the successful repeats, the curve of
    the first one, and every repeat's numbers in ``repeats`` (``results`` must not be empty)."""
    ok = [r for r in results if r.status == "ok"]
    base = replace(ok[0] if ok else results[-1])
    if len(results) > 1:
        base.repeats = [{k: v for k, v in r.to_dict().items() if k not in ("curve", "repeats")}
                        for r in results]
    if len(ok) < 2:
        return base
    for name in _MEDIAN_FIELDS:
        setattr(base, name, _median_or_none([getattr(r, name) for r in ok]))
    base.time_to_target_s = _median_or_none([r.time_to_target_s for r in ok], True)
    base.epochs_to_target = _median_or_none([r.epochs_to_target for r in ok], True)
    return base
