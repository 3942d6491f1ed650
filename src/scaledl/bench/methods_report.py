"""How ``scaledl bench algorithms`` records its results: the table's cells (shown on the console
by :mod:`scaledl.cli.bench_algorithms`, and as markdown), a JSON file, and two PNG plots (test
accuracy against training time and against epochs, one line per method)."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scaledl.bench.methods import METHODS, BenchSpec
from scaledl.bench.methods_result import MethodResult
from scaledl.bench.methods_tune import SeedSummary, Tuning

__all__ = ["COLUMNS", "table_row", "markdown_table", "environment", "to_json", "write_json",
           "write_plots", "PLOT_NAMES", "SEED_COLUMNS", "seed_row", "tuning_rows", "markdown",
           "tuned_json", "work_summary", "work_line"]

PLOT_NAMES = ("accuracy_vs_time.png", "accuracy_vs_epoch.png")
"""File names of the two plots in the plot directory."""


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


COLUMNS = ("method", "ranks", "final acc", "best acc", "s to target", "epochs to target",
           "train s", "comm share", "exposed", "updates/s", "staleness", "roughness", "note")
"""Table columns (definitions: :mod:`scaledl.bench.methods_result`)."""


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def table_row(result: MethodResult) -> list[str]:
    """One method's table cells, in :data:`COLUMNS` order."""
    if result.status != "ok":
        return [result.label, str(result.ranks), *["-"] * 10,
                f"{result.status}: {result.reason}"]
    reached = result.time_to_target_s
    return [
        result.label, str(result.ranks), _fmt(result.final_accuracy, ".4f"),
        _fmt(result.best_accuracy, ".4f"),
        "not reached" if reached is None else f"{reached:.1f}",
        _fmt(result.epochs_to_target, ".2f"), _fmt(result.train_s, ".1f"),
        _percent(result.comm_share), _percent(result.exposed_share),
        _fmt(result.updates_per_s, ",.0f"), _fmt(result.mean_staleness, ".2f"),
        _fmt(result.roughness, ".3f"), "",
    ]


def environment() -> dict[str, Any]:
    """Where the benchmark ran: cores, load, platform, library versions."""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {
        "cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "load_average_at_start": list(load),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1 (set per run)"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def to_json(results: list[MethodResult], spec: BenchSpec, env: dict[str, Any],
            command: list[str] | None = None, skipped: list[str] | None = None
            ) -> dict[str, Any]:
    """Everything in one JSON-ready dict: the budget, the method definitions, the results."""
    methods = {r.method: METHODS[r.method].to_dict() for r in results if r.method in METHODS}
    return {
        "command": command, "environment": env, "spec": asdict(spec),
        "alpha": spec.alpha(), "methods": methods, "not_available": skipped or [],
        "results": [r.to_dict() for r in results],
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write ``data`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


_COLORS = {"allreduce": "C0", "sync-easgd": "C0", "reduce-broadcast": "C7", "local-sgd": "C8",
           "diloco": "C5", "streaming-diloco": "C9",
           "easgd": "C4", "async-sgd": "C1", "async-easgd": "C1", "async-msgd": "C2",
           "async-measgd": "C2", "hogwild-sgd": "C3", "hogwild-easgd": "C3"}
"""An EASGD variant shares its SGD counterpart's color: solid for EASGD, dashed for SGD."""


def _style(method: str) -> dict[str, Any]:
    elastic = method in METHODS and METHODS[method].elastic
    return {"color": _COLORS.get(method, "black"), "linestyle": "-" if elastic else "--",
            "marker": "o" if elastic else "s", "markersize": 3, "linewidth": 1.4}


def write_plots(results: list[MethodResult], spec: BenchSpec, plot_dir: Path) -> list[Path]:
    """Accuracy against training time and against epochs (PNG, one line per finished method;
    left panel the whole range, right panel zoomed on the target); the paths written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plot_dir.mkdir(parents=True, exist_ok=True)
    finished = [r for r in results if r.status == "ok" and r.curve]
    written = []
    axes_of = (("time_s", "training time, s (evaluation excluded)"), ("epoch", "epochs"))
    for (key, label), name in zip(axes_of, PLOT_NAMES):
        figure = Figure(figsize=(13, 5))
        FigureCanvasAgg(figure)
        whole, zoom = figure.subplots(1, 2)
        for ax, limits in ((whole, _limits(finished, spec.target)),
                           (zoom, _zoom(finished, spec.target))):
            _draw(ax, finished, key, spec.target)
            ax.set_xlabel(label)
            ax.set_ylim(*limits)
        whole.set_ylabel("test accuracy")
        zoom.set_title("near the target", fontsize=9)
        handles, labels = whole.get_legend_handles_labels()
        figure.legend(handles, labels, fontsize=8, loc="center right")
        figure.suptitle(f"{spec.model} on {spec.dataset}, {spec.workers} workers")
        figure.tight_layout(rect=(0.0, 0.0, 0.83, 1.0))
        path = plot_dir / name
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


def _draw(ax: Any, results: list[MethodResult], key: str, target: float) -> None:
    for result in results:
        ax.plot([p[key] for p in result.curve], [p["accuracy"] for p in result.curve],
                label=result.label, **_style(result.method))
    ax.axhline(target, color="gray", linewidth=0.8, linestyle=":", label=f"target {target:g}")
    ax.set_xlim(left=0.0)
    ax.grid(alpha=0.3)


def _limits(results: list[MethodResult], target: float) -> tuple[float, float]:
    """y limits: low enough for the curves' later points and the target line, high enough for
    the best point."""
    lows = [min(p["accuracy"] for p in r.curve[len(r.curve) // 4:]) for r in results]
    return (max(0.0, min([target - 0.05, *lows]) - 0.02), _top(results, target))


def _zoom(results: list[MethodResult], target: float) -> tuple[float, float]:
    """y limits of the zoomed panel: from a little below the target to the best point."""
    return max(0.0, target - 0.08), _top(results, target)


def _top(results: list[MethodResult], target: float) -> float:
    highs = [max(p["accuracy"] for p in r.curve) for r in results]
    return min(1.0, max([target, *highs]) + 0.015)


def markdown_table(results: list[MethodResult]) -> str:
    """The table as GitHub markdown (for docs/benchmarks.md)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in results]
    return "\n".join(lines) + "\n"


SEED_COLUMNS = ("method", "lr", "reached", "epochs to target", "s to target", "final acc",
                "comm share", "exposed", "note")
"""Columns of the comparison over seeds (each number: mean ± sample standard deviation)."""


def _mean_spread(summary: SeedSummary, name: str, pattern: str, scale: float = 1.0,
                 unit: str = "") -> str:
    mean, spread = summary.mean.get(name), summary.spread.get(name)
    if mean is None:
        return "-"
    text = format(mean * scale, pattern)
    if spread is not None:
        text += " ± " + format(spread * scale, pattern)
    return text + unit


def seed_row(summary: SeedSummary) -> list[str]:
    """One method's cells of the comparison over seeds, in :data:`SEED_COLUMNS` order."""
    return [
        summary.label, f"{summary.lr:g}", f"{summary.reached}/{summary.seeds}",
        _mean_spread(summary, "epochs_to_target", ".2f"),
        _mean_spread(summary, "time_to_target_s", ".1f"),
        _mean_spread(summary, "final_accuracy", ".4f"),
        _mean_spread(summary, "comm_share", ".0f", 100.0, " %"),
        _mean_spread(summary, "exposed_share", ".0f", 100.0, " %"),
        summary.reason or "",
    ]


def tuning_rows(tunings: list[Tuning]) -> tuple[list[str], list[list[str]]]:
    """The tuning grid as a table: one row per method, one column per rate, each cell the
    epochs to the target validation accuracy (``-``: not reached; the picked rate starred)."""
    rates = sorted({lr for tuning in tunings for lr, _ in tuning.trials})
    header = ["method", *(f"lr {lr:g}" for lr in rates), "picked"]
    rows = []
    for tuning in tunings:
        cells = {lr: _trial_cell(result) + (" *" if lr == tuning.lr else "")
                 for lr, result in tuning.trials}
        rows.append([tuning.method.label, *(cells.get(lr, "") for lr in rates),
                     f"{tuning.lr:g}"])
    return header, rows


def _trial_cell(result: MethodResult) -> str:
    if result.status != "ok":
        return result.status
    if result.epochs_to_target is None:
        return f"- ({result.best_accuracy or 0.0:.3f})"
    return f"{result.epochs_to_target:.2f}"


def markdown(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tuned_json(spec: BenchSpec, env: dict[str, Any], command: list[str] | None,
               grid: tuple[float, ...] | None, tunings: list[Tuning],
               summaries: list[SeedSummary], runs: list[list[MethodResult]],
               workload: str) -> dict[str, Any]:
    """The tuned comparison in one JSON-ready dict: budget, grid, every tuning trial, the
    summaries over seeds and every run (with its curve)."""
    return {
        "command": command, "environment": env, "spec": asdict(spec), "workload": workload,
        "alpha": spec.alpha(), "grid": list(grid) if grid else None,
        "methods": {s.method: METHODS[s.method].to_dict() for s in summaries
                    if s.method in METHODS},
        "tuning": [t.to_dict() for t in tunings],
        "summary": [s.to_dict() for s in summaries],
        "runs": [[r.to_dict() for r in per_method] for per_method in runs],
    }


def work_summary(phases: dict[str, list[MethodResult]], spec: BenchSpec, wall_s: float
                 ) -> dict[str, Any]:
    """What a bench did, for a shared machine where seconds alone say little: per phase
    (``tune``, ``report``) the runs, the epochs and samples trained, and the seconds the runs took
    (wall, of which training and evaluation: the rest is each run's start-up and shutdown);
    ``wall_s`` is the whole bench's time."""
    out: dict[str, Any] = {"wall_s": wall_s}
    for phase, results in phases.items():
        run_s = sum(r.wall_s or 0.0 for r in results)
        inside = sum((r.train_s or 0.0) + (r.eval_s or 0.0) for r in results)
        epochs = sum(r.curve[-1]["epoch"] for r in results if r.curve)
        out[phase] = {
            "runs": len(results), "epochs": epochs,
            "samples": sum((r.steps or 0) for r in results) * spec.workers * spec.batch_size,
            "run_s": run_s, "train_s": inside,
            "startup_share": None if run_s <= 0 else 1.0 - inside / run_s,
        }
    return out


def work_line(work: dict[str, Any]) -> str:
    """:func:`work_summary` in one sentence per phase."""
    parts = [f"bench {work['wall_s'] / 60:.1f} min"]
    for phase, numbers in work.items():
        if not isinstance(numbers, dict):
            continue
        share = numbers["startup_share"]
        parts.append(f"{phase}: {numbers['runs']} runs, {numbers['epochs']:.0f} epochs, "
                     f"{numbers['samples']:,} samples, {numbers['run_s'] / 60:.1f} min of runs "
                     f"({numbers['run_s'] / max(numbers['runs'], 1):.1f} s each), "
                     f"{'-' if share is None else f'{share:.0%}'} of it start-up and shutdown")
    return "; ".join(parts)
