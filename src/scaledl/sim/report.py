"""The console side of ``scaledl simulate calibrate`` and ``scaledl simulate validate``."""

from __future__ import annotations

import argparse

from scaledl.sim.calibrate import fit_network, load_points, validate
from scaledl.sim.job import Job

__all__ = ["run_calibrate", "run_validate", "validation_table", "run_reproduce"]


def run_calibrate(args: argparse.Namespace, job: Job) -> int:
    """Fit the link classes and write the calibration (``auto``'s file format)."""
    points = load_points(args.bench, args.bench_topology, args.placement)
    result = fit_network(points, job.network_value())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(result.network.to_cost_model().to_json() + "\n")
    print(result.describe())
    print(f"wrote {args.output}")
    return 0


def validation_table(rows: list[dict[str, object]], markdown: bool) -> str:
    """Predicted against measured, one line per measurement."""
    lines = []
    if markdown:
        lines += ["| collective | algorithm | bytes | topology | measured ms | predicted ms | "
                  "error |", "|---|---|---:|---|---:|---:|---:|"]
    for row in rows:
        cells = (row["collective"], row["algorithm"], row["nbytes"], row["topology"],
                 f"{row['measured_ms']:.2f}", f"{row['predicted_ms']:.2f}",
                 f"{row['error']:+.1%}")  # type: ignore[str-format]
        if markdown:
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        else:
            lines.append("{:15s} {:17s} {:>10} {:>8} {:>12} {:>12} {:>8}".format(*cells))
    return "\n".join(lines)


def run_validate(args: argparse.Namespace, job: Job, min_bytes: int) -> int:
    """Print predicted vs measured for messages of at least ``min_bytes``."""
    points = load_points(args.bench, args.bench_topology, args.placement)
    rows = validate(points, job.network_value(), min_bytes)
    print(validation_table(rows, args.markdown))
    if rows:
        worst = max(abs(float(r["error"])) for r in rows)  # type: ignore[arg-type]
        within = sum(abs(float(r["error"])) <= 0.2 for r in rows)  # type: ignore[arg-type]
        print(f"{within}/{len(rows)} within 20%; worst {worst:.1%}")
    return 0


def run_reproduce() -> int:
    """Print the seed papers' results beside the predictions, as a markdown table."""
    from scaledl.sim.reproduce import run_cases

    print("| result | published | scaledl predicts | assumptions |")
    print("|---|---|---|---|")
    for case, predicted in run_cases():
        print(f"| {case.name} | {case.published} | {predicted} | {case.assumptions} |")
    return 0
