"""Tuning each method's learning rate, and its runs over seeds: ``scaledl bench algorithms
--tune-lr GRID --seeds N``.

A comparison at one shared learning rate favours the methods that rate suits (the averaging
methods move by the mean of the workers' steps).  Papers tune each method's rate on a grid;
so does this, in two phases:

1. **Tune.**  Every method runs once per rate of the grid (seed ``--seed``) on the held-out
   validation split (:func:`scaledl.bench.methods_data.write_validation_split`: part of the
   train split, never the test split).  Its rate is the one that reaches the target validation
   accuracy in the fewest epochs; ties, and a method that reaches it at no rate, go to the
   higher best validation accuracy, then to the smaller rate (:func:`pick_lr`).
2. **Report.**  Every method runs at its own rate with ``N`` seeds (``--seed``, ``--seed + 1``,
   ...) on the full train split, evaluated on the test split; the table gives each number's
   mean and its spread (the sample standard deviation over the seeds) and how many seeds
   reached the target (:func:`seed_summary`).

A grid is ``A..B`` (``A``, ``2A``, ``4A``, ... up to ``B``) or a comma list; it needs two rates
at least, or there is nothing to tune.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scaledl.bench.methods import BenchSpec, Method
from scaledl.bench.methods_result import MethodResult

__all__ = ["parse_grid", "pick_lr", "seed_summary", "SeedSummary", "Tuning", "tune",
           "run_seeds", "SUMMARY_FIELDS"]

SUMMARY_FIELDS = ("epochs_to_target", "time_to_target_s", "final_accuracy", "comm_share",
                  "exposed_share", "train_s")
"""The numbers given as mean and spread over the seeds."""


def parse_grid(text: str) -> tuple[float, ...]:
    """The rates of ``A..B`` (doubling from ``A`` while at most ``B``) or ``a,b,c``, ascending;
    a one-line ``ValueError`` for anything else, or for fewer than two rates."""
    example = "e.g. 0.0125..0.4 (doubling) or 0.01,0.03,0.1"
    try:
        if ".." in text:
            low_text, high_text = text.split("..", 1)
            low, high = float(low_text), float(high_text)
            if not 0 < low <= high:
                raise ValueError
            rates = [low]
            while rates[-1] * 2 <= high * (1 + 1e-9):
                rates.append(rates[-1] * 2)
        else:
            rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--tune-lr {text!r} is not a grid of positive rates; {example}"
                         ) from None
    if any(not (rate > 0 and math.isfinite(rate)) for rate in rates):
        raise ValueError(f"--tune-lr {text!r} holds a rate that is not positive; {example}")
    unique = tuple(sorted(set(rates)))
    if len(unique) < 2:
        raise ValueError(f"--tune-lr {text!r} has one rate, so there is nothing to choose; "
                         f"give two or more, {example}")
    return unique


def pick_lr(trials: list[tuple[float, MethodResult]]) -> float:
    """The rate of the trial that reached the target in the fewest epochs; then the higher best
    accuracy; then the smaller rate (a failed trial ranks last)."""
    def rank(trial: tuple[float, MethodResult]) -> tuple[float, float, float]:
        lr, result = trial
        if result.status != "ok":
            return (math.inf, math.inf, lr)
        epochs = math.inf if result.epochs_to_target is None else result.epochs_to_target
        return (epochs, -(result.best_accuracy or 0.0), lr)

    if not trials:
        raise ValueError("no trial to pick a learning rate from")
    return min(trials, key=rank)[0]


@dataclass
class SeedSummary:
    """One method's runs over the seeds at its rate."""

    method: str
    label: str
    lr: float
    seeds: int
    ok: int
    """Runs that finished."""
    reached: int
    """Runs that reached the target."""
    mean: dict[str, float | None] = field(default_factory=dict)
    """Each of :data:`SUMMARY_FIELDS` averaged over the finished runs (epochs and seconds to
    target over those that reached it; ``None`` where none did)."""
    spread: dict[str, float | None] = field(default_factory=dict)
    """Their sample standard deviation (``None`` with fewer than two values)."""
    reason: str | None = None
    """Why a run failed, when one did."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {"method": self.method, "label": self.label, "lr": self.lr, "seeds": self.seeds,
                "ok": self.ok, "reached": self.reached, "mean": self.mean,
                "spread": self.spread, "reason": self.reason}


def seed_summary(method: Method, lr: float, results: list[MethodResult]) -> SeedSummary:
    """Mean and spread of each number of :data:`SUMMARY_FIELDS` over ``results``."""
    ok = [r for r in results if r.status == "ok"]
    summary = SeedSummary(method.name, method.label, lr, len(results), len(ok),
                          sum(r.epochs_to_target is not None for r in ok))
    failed = [r for r in results if r.status != "ok"]
    if failed:
        summary.reason = f"{failed[0].status}: {failed[0].reason}"
    for name in SUMMARY_FIELDS:
        values = [float(v) for r in ok if (v := getattr(r, name)) is not None]
        summary.mean[name] = statistics.fmean(values) if values else None
        summary.spread[name] = statistics.stdev(values) if len(values) > 1 else None
    return summary


@dataclass
class Tuning:
    """One method's tuning: every rate's validation result and the rate picked."""

    method: Method
    trials: list[tuple[float, MethodResult]]
    lr: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (without curves)."""
        return {"method": self.method.name, "lr": self.lr, "trials": [
            {"lr": lr, "status": r.status, "epochs_to_target": r.epochs_to_target,
             "best_accuracy": r.best_accuracy, "final_accuracy": r.final_accuracy,
             "reason": r.reason} for lr, r in self.trials]}


Runner = Callable[[Method, BenchSpec, Path], MethodResult]
"""Runs one method with one budget into a folder (:func:`scaledl.bench.methods_run.run_method`)."""


def tune(methods: list[Method], spec: BenchSpec, grid: tuple[float, ...], out: Path,
         run: Runner, echo: Callable[[str], None] | None = None, jobs: int = 1
         ) -> list[Tuning]:
    """Phase 1 (module docstring): every method at every rate on ``spec`` (the validation
    split); runs into ``out/<method>/lr-<rate>``, ``jobs`` at a time.  A tuning run is judged
    by its epochs to target only, which running beside another does not change (the report
    runs, whose seconds count, always run one at a time)."""
    if jobs < 1:
        raise ValueError(f"--tune-jobs {jobs} must be at least 1")
    trials = [(method, lr) for method in methods for lr in grid]

    def one(index: int) -> MethodResult:
        method, lr = trials[index]
        result = run(method, replace(spec, lr=lr), out / method.name / f"lr-{lr:g}")
        if echo is not None:
            reached = result.epochs_to_target
            echo(f"[tune {index + 1}/{len(trials)}] {method.label}, lr {lr:g}: "
                 f"{result.status}, validation best {result.best_accuracy or 0.0:.4f}, "
                 f"epochs to target {'-' if reached is None else f'{reached:.2f}'}")
        return result

    # each thread only waits on its run's processes (the run's own, or a pool's)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        results = list(pool.map(one, range(len(trials))))
    finally:
        # On an interrupt, return at once (not after the runs in flight end): the caller stops
        # them (:meth:`scaledl.bench.methods_run.Runs.stop`), which ends these threads too.
        pool.shutdown(wait=False, cancel_futures=True)
    tunings = []
    for method in methods:
        mine = [(lr, result) for (m, lr), result in zip(trials, results) if m is method]
        tunings.append(Tuning(method, mine, pick_lr(mine)))
    return tunings


def run_seeds(methods: list[tuple[Method, float]], spec: BenchSpec, seeds: int, out: Path,
              run: Runner, echo: Callable[[str], None] | None = None
              ) -> list[list[MethodResult]]:
    """Phase 2: every method at its rate with ``seeds`` seeds, round by round (seed ``s`` of
    every method, then seed ``s + 1``: a slow phase of a shared machine hits every method);
    runs into ``out/<method>/seed-<seed>``; the results per method."""
    results: list[list[MethodResult]] = [[] for _ in methods]
    total = seeds * len(methods)
    for round_index in range(seeds):
        seed = spec.seed + round_index
        for index, (method, lr) in enumerate(methods):
            if echo is not None:
                echo(f"[report {round_index * len(methods) + index + 1}/{total}] "
                     f"{method.label}, lr {lr:g}, seed {seed}")
            result = run(method, replace(spec, lr=lr, seed=seed),
                         out / method.name / f"seed-{seed}")
            results[index].append(result)
    return results
