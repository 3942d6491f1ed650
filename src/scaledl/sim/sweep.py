"""Scaling sweeps: the same job at 1, 2, 4, ... GPUs up to the target, as JSON and a plot."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scaledl.sim.iteration import IterationResult
from scaledl.topology import Topology

__all__ = ["scaled_topology", "sweep_sizes", "run_sweep", "write_sweep_json", "write_sweep_plot"]


def scaled_topology(target: Topology, gpus: int) -> Topology:
    """``target``'s layout shrunk to ``gpus``: inner axes filled first, up to their size."""
    if gpus < 1:
        raise ValueError(f"GPU count {gpus} must be >= 1")
    remaining, axes = gpus, []
    for size in target.axes[:-1]:
        take = math.gcd(size, remaining)
        axes.append(take)
        remaining //= take
    axes.append(remaining)
    return Topology(tuple(axes), explicit=True)


def sweep_sizes(gpus: int) -> list[int]:
    """1, 2, 4, ... up to ``gpus`` (which is included)."""
    sizes = [1]
    while sizes[-1] * 2 < gpus:
        sizes.append(sizes[-1] * 2)
    if gpus > 1:
        sizes.append(gpus)
    return sizes


def run_sweep(
    target: Topology, simulate: Callable[[Topology], IterationResult]
) -> list[IterationResult]:
    """``simulate`` at every size of :func:`sweep_sizes` on the scaled topologies."""
    return [simulate(scaled_topology(target, g)) for g in sweep_sizes(target.world_size)]


def write_sweep_json(results: list[IterationResult], setup: dict[str, Any], path: Path,
                     published_check: dict[str, Any] | None = None) -> None:
    """The sweep's setup, one row per GPU count and the published check of its largest job
    (:meth:`scaledl.sim.trust.Band.to_dict`; None on CPUs and with the ideal model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": "scaledl.simulate.sweep/1", "setup": setup,
            "results": [r.to_dict() for r in results], "published_check": published_check}
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_sweep_plot(results: list[IterationResult], title: str, path: Path) -> None:
    """Scaling efficiency and throughput against GPUs (log2 axis), PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r.world_size for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(gpus, [r.efficiency * 100 for r in results], marker="o")
    left.set_xscale("log", base=2)
    left.set_ylim(0, 105)
    left.set_xlabel("GPUs")
    left.set_ylabel("scaling efficiency (%)")
    left.grid(True, alpha=0.3)
    right.plot(gpus, [r.samples_per_s for r in results], marker="o", label="predicted")
    base = results[0].samples_per_s / results[0].world_size
    right.plot(gpus, [base * g for g in gpus], linestyle="--", label="linear")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("GPUs")
    right.set_ylabel("samples / s")
    right.legend()
    right.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")  # exactly ``path``, whatever its suffix
    plt.close(fig)
