"""Plots of a run's metrics: loss and accuracy against the training step, as PNG files.

Reads the JSONL written by :class:`scaledl.train.metrics.MetricsWriter`: ``step`` records give
the training curves, ``eval`` records (one per epoch) the test points, and the ``run`` record
the title.  Figures are drawn with matplotlib's Agg canvas directly, without ``pyplot``, so
plotting neither changes the global backend nor needs a display.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaledl.train.metrics import read_metrics

__all__ = ["plot_metrics", "run_title", "PLOTS"]

log = logging.getLogger(__name__)

PLOTS = (("loss", "loss", "test_loss"), ("accuracy", "accuracy", "test_accuracy"))
"""Each plot of a run: its file's stem (``loss.png``) and the train and test metrics on it."""


def run_title(records: Sequence[dict[str, Any]]) -> str | None:
    """``"mlp on digits, 4 workers, allreduce"`` from the last ``run`` record, if any."""
    runs = [r for r in records if r.get("kind") == "run"]
    if not runs:
        return None
    run = runs[-1]
    config: dict[str, Any] = run["config"] if isinstance(run.get("config"), dict) else {}
    model = run.get("model") or config.get("model", {}).get("name")
    dataset = run.get("dataset") or config.get("data", {}).get("dataset")
    world_size = run.get("world_size")
    strategy = run.get("strategy") or config.get("parallel", {}).get("strategy")
    parts = [" on ".join(str(p) for p in (model, dataset) if p)]
    if world_size:
        parts.append(f"{world_size} worker{'s' if world_size != 1 else ''}")
    if strategy:
        parts.append(str(strategy))
    title = ", ".join(p for p in parts if p)
    return title or None


def plot_metrics(
    metrics_path: str | Path, out_dir: str | Path, title: str | None = None
) -> list[Path]:
    """Write ``loss.png`` and ``accuracy.png`` (each when the metric is present) into
    ``out_dir``; return their paths.  ``title`` defaults to the run's model and data set."""
    records = read_metrics(metrics_path)
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not steps and not evals:
        raise ValueError(f"metrics file {metrics_path} has no step or eval records; "
                         "plot the metrics.jsonl of a run that trained at least one step")
    title = title if title is not None else run_title(records)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, train_key, test_key in PLOTS:
        train = _series(steps, train_key)
        test = _series(evals, test_key)
        if not train and not test:
            continue
        path = out_dir / f"{name}.png"
        _plot_curve(path, name, train, test, evals, test_key, title)
        written.append(path)
        log.info("wrote %s", path)
    return written


def _series(records: Sequence[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """``(step, value)`` pairs where both are numbers (a diverged loss is stored as null)."""
    points = []
    for record in records:
        step, value = record.get("step"), record.get(key)
        if isinstance(step, (int, float)) and isinstance(value, (int, float)):
            points.append((float(step), float(value)))
    return sorted(points)


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    averaged, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        averaged.append(total / min(index + 1, window))
    return averaged


def _plot_curve(
    path: Path, metric: str, train: list[tuple[float, float]], test: list[tuple[float, float]],
    evals: Sequence[dict[str, Any]], test_key: str, title: str | None,
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    if train:
        xs, ys = [x for x, _ in train], [y for _, y in train]
        window = max(1, len(ys) // 50)
        ax.plot(xs, ys, color="tab:blue", alpha=0.35 if window > 1 else 1.0, linewidth=0.8,
                label=f"train {metric}" if window == 1 else f"train {metric} (per step)")
        if window > 1:
            ax.plot(xs, _moving_average(ys, window), color="tab:blue",
                    label=f"train {metric} ({window}-step mean)")
    if test:
        ax.plot([x for x, _ in test], [y for _, y in test], color="tab:orange", marker="o",
                label=f"test {metric} (per epoch)")
        _label_epochs(ax, evals, test_key)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    if metric == "loss" and all(y > 0 for _, y in train + test):
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(f"{metric}: {title}" if title else metric, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _label_epochs(ax: Any, evals: Sequence[dict[str, Any]], key: str) -> None:
    """Annotate each test point with its epoch when there are few enough to read."""
    points = [(r["step"], r[key], r.get("epoch")) for r in evals
              if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))]
    if len(points) > 12:
        return
    for step, value, epoch in points:
        if epoch is not None:
            ax.annotate(f"e{epoch}", (step, value), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize="x-small")
