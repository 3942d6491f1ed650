"""The console side of ``scaledl simulate calibrate`` and ``scaledl simulate validate``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from scaledl.collectives.auto import CostModel
from scaledl.sim.calibrate import fit_network, load_points, validate
from scaledl.sim.native import NativeFit, fit_native, load_natives
from scaledl.sim.job import Job
from scaledl.sim.network import Network

__all__ = [
    "calibration_prior", "run_calibrate", "run_validate", "validation_table", "run_reproduce",
]


def _warn_on_default_priors(args: argparse.Namespace) -> None:
    """Say so when the link priors are the GPU defaults (p100/ib-edr) the options did not pick."""
    if getattr(args, "calibration", None) is not None:
        return
    missing = [flag for flag, value in (("--device", args.device), ("--network", args.network))
               if value is None]
    if missing:
        print(f"scaledl: warning: {' and '.join(missing)} not given, so the priors are the "
              "p100 / ib-edr presets (NVLink inside a host); for files measured on CPUs pass "
              "--device cpu --network 1gbit (or 10gbit)", file=sys.stderr)


def calibration_prior(args: argparse.Namespace, job: Job) -> Network:
    """The network the fit starts from; ``gamma`` from ``--device`` when given, else from
    ``auto``'s calibration (measured on this machine), never from the p100 default."""
    prior = job.network_value()
    if args.device is None:
        prior = replace(prior, gamma=CostModel.load().gamma)
    return prior


def run_calibrate(args: argparse.Namespace, job: Job, native_fit: NativeFit) -> int:
    """Fit the link classes, and ``native`` with ``native_fit``; write the calibration in
    ``auto``'s format."""
    _warn_on_default_priors(args)
    points = load_points(args.bench, args.bench_topology, args.placement)
    result = fit_network(points, calibration_prior(args, job))
    model, native = fit_native(load_natives(args.bench, args.bench_topology),
                               result.network.to_cost_model(), native_fit)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(model.to_json() + "\n")
    print(result.describe())
    print(f"{native}; gamma {model.gamma:.3g} s/B")
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
    _warn_on_default_priors(args)
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
