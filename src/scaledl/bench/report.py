"""A collectives run presented: its header lines, its environment and its plot (the console
table is :func:`scaledl.cli.bench_collectives.render_table`; the run's values and the JSON file
they are written to are :mod:`scaledl.calibration.bench_file`'s, whose docstring gives the
bandwidth definitions).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
from pathlib import Path
from typing import Any

from scaledl.calibration.bench_file import BenchReport

__all__ = ["format_bytes", "environment", "header_lines", "write_plot"]


def format_bytes(nbytes: int) -> str:
    """``4096 -> "4 KiB"``; exact binary units where the count divides, else bytes."""
    for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {suffix}"
    return f"{nbytes} B"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version() -> str:
    try:
        return importlib.metadata.version("scaledl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def environment(backend: str, world_size: int, topology: str) -> dict[str, Any]:
    """Hardware, versions and launch configuration, for the report header and the JSON."""
    import torch

    return {
        "cpu": _cpu_model(), "cores": os.cpu_count(), "host": platform.node(),
        "os": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "scaledl": _version(), "backend": backend,
        "world_size": world_size, "topology": topology,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
    }


def header_lines(report: BenchReport) -> list[str]:
    """Hardware, software and configuration lines of the report header."""
    env, cfg = report.environment, report.config
    return [
        f"hardware: {env['cpu']} ({env['cores']} cores), host {env['host']}, {env['os']}",
        f"software: python {env['python']}, torch {env['torch']}, scaledl {env['scaledl']}",
        f"config:   backend {env['backend']}, world size {env['world_size']}, topology "
        f"{env['topology']}, dtype {cfg['dtype']}, chunk {format_bytes(cfg['chunk_bytes'])}, "
        f"OMP_NUM_THREADS={env['omp_num_threads']}, torch threads {env['torch_threads']}",
    ]


def _tick(nbytes: int) -> str:
    """Plot label: exact binary units, or ``~`` the nearest power of two (4092 B -> ~4 KiB)."""
    nearest = 1 << max(0, round(math.log2(max(nbytes, 1))))
    return format_bytes(nbytes) if nbytes == nearest else f"~{format_bytes(nearest)}"


def write_plot(report: BenchReport, path: Path) -> None:
    """busbw vs message size per algorithm, one panel per collective, p2p ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    collectives = list(dict.fromkeys(m.collective for m in report.measurements))
    columns = min(3, max(1, len(collectives)))
    rows_count = math.ceil(max(1, len(collectives)) / columns)
    fig, axes = plt.subplots(rows_count, columns, squeeze=False,
                             figsize=(5.5 * columns, 4.2 * rows_count))
    for ax in axes.flat[len(collectives):]:
        ax.set_visible(False)
    for ax, collective in zip(axes.flat, collectives, strict=False):
        rows = [m for m in report.measurements if m.collective == collective]
        for name in dict.fromkeys(m.algorithm for m in rows):
            points = sorted((m.nbytes, m.busbw_gbps) for m in rows if m.algorithm == name)
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        if report.p2p_gbps:
            ax.axhline(report.p2p_gbps, linestyle="--", color="gray", label="p2p ceiling")
        if report.memcpy is not None:
            ax.axhline(report.memcpy.gbps, linestyle=":", color="black", label="memcpy ceiling")
        ax.set_xscale("log", base=2)
        sizes = sorted({m.nbytes for m in rows})
        ax.set_xticks(sizes, [_tick(n) for n in sizes], rotation=30, fontsize="small")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(bottom=0)
        ax.set_xlabel("message size")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{collective}, p={report.environment['world_size']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    env = report.environment
    fig.suptitle(f"{env['cpu']} ({env['cores']} cores), torch {env['torch']}, "
                 f"{env['backend']}, topology {env['topology']}", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
