"""Scaling sweeps: the same job from 1 GPU up to the target cluster, filling its axes innermost
first (:func:`sweep_topologies`), as JSON and a plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scaledl.sim.iteration import IterationResult
from scaledl.topology import Topology

__all__ = ["sweep_topologies", "run_sweep", "write_sweep_json", "write_sweep_plot"]


def sweep_topologies(target: Topology) -> list[Topology]:
    """The sweep's jobs on ``target``'s cluster, innermost axis first: that axis holds 1, 2, 4,
    ... GPUs and then its full size, with every outer axis at 1; then the next axis grows the
    same way with the inner ones full, and so on.  Every job is a corner of the target (4x16x4:
    1, 2, 4 GPUs on one host, then 2, 4, 8, 16 hosts, then 2 and 4 racks; 3x8: 1, 2, 3 GPUs,
    then 2, 4, 8 hosts of 3), never a layout the cluster does not have."""
    axes = target.axes
    jobs = [(1,) * len(axes)]
    for index, size in enumerate(axes):
        count = 2
        while count < size:
            jobs.append((*axes[:index], count, *(1,) * (len(axes) - index - 1)))
            count *= 2
        if size > 1:
            jobs.append((*axes[:index], size, *(1,) * (len(axes) - index - 1)))
    return [Topology(job, explicit=True) for job in jobs]


def run_sweep(
    target: Topology, simulate: Callable[[Topology], IterationResult]
) -> list[IterationResult]:
    """``simulate`` on every topology of :func:`sweep_topologies`, smallest first."""
    return [simulate(topology) for topology in sweep_topologies(target)]


def write_sweep_json(results: list[IterationResult], setup: dict[str, Any], path: Path,
                     published_check: dict[str, Any] | None = None) -> None:
    """The sweep's setup, one row per GPU count and the published check of its largest job
    (:meth:`scaledl.sim.trust.Band.to_dict`; None on CPUs and with the ideal model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": "scaledl.simulate.sweep/1", "setup": setup,
            "results": [r.to_dict() for r in results], "published_check": published_check}
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_sweep_plot(results: list[IterationResult], title: str, path: Path,
                     units: str = "GPUs") -> None:
    """Scaling efficiency and throughput against ``units`` (GPUs, or ranks of a CPU preset; log2
    axis), PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r.world_size for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(gpus, [r.efficiency * 100 for r in results], marker="o")
    left.set_xscale("log", base=2)
    left.set_ylim(0, 105)
    left.set_xlabel(units)
    left.set_ylabel("scaling efficiency (%)")
    left.grid(True, alpha=0.3)
    right.plot(gpus, [r.samples_per_s for r in results], marker="o", label="predicted")
    base = results[0].samples_per_s / results[0].world_size
    right.plot(gpus, [base * g for g in gpus], linestyle="--", label="linear")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel(units)
    right.set_ylabel("samples / s")
    right.legend()
    right.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")  # exactly ``path``, whatever its suffix
    plt.close(fig)
