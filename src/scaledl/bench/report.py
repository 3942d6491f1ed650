"""Benchmark results and their presentation: busbw formulas, header lines, JSON and the plot
(the console table is :func:`scaledl.cli.bench_collectives.render_table`).

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``): ``algbw = S / t`` with ``S`` the bytes of
the whole buffer (for reduce_scatter and allgather the full ``p x shard`` buffer), and
``busbw = algbw x factor`` with factor ``2(p-1)/p`` for allreduce, ``(p-1)/p`` for
reduce_scatter and allgather, and ``1`` for broadcast and reduce, so busbw is comparable to the
speed of one link whatever ``p``.  Latencies are OSU-style microseconds per iteration; each
iteration's time is the slowest rank's.  GB/s means 10^9 bytes per second.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "format_bytes", "busbw_factor", "Measurement", "P2PResult", "CopyBound",
    "BenchReport", "environment", "native_ratios", "peer_rows", "header_lines", "write_json",
    "write_plot", "report_from_dict",
]

def format_bytes(nbytes: int) -> str:
    """``4096 -> "4 KiB"``; exact binary units where the count divides, else bytes."""
    for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {suffix}"
    return f"{nbytes} B"


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor for ``collective`` on ``world_size`` ranks."""
    p = world_size
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in ("reduce_scatter", "allgather"):
        return (p - 1) / p
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus bandwidth factor for collective {collective!r}")


@dataclass(frozen=True)
class Measurement:
    """Timed iterations of one algorithm on one collective and message size."""

    collective: str
    algorithm: str
    nbytes: int
    """Bytes of the whole buffer (``p x shard`` for reduce_scatter and allgather)."""
    world_size: int
    times_s: tuple[float, ...]
    """Per-iteration seconds, each the maximum over ranks."""
    resolved: str | None = None
    """The algorithm that ran, with the paths per level it was given or chosen (for example
    ``hierarchical[shm,ring]`` for ``hierarchical``, or ``auto``'s choice); None: not known
    (``torch``, or a file written before this was recorded); for a peer, the library that ran."""
    peer: bool = False
    """A peer library (``--peers``), not one of scaledl's algorithms."""

    @property
    def avg_us(self) -> float:
        """Mean latency, microseconds."""
        return statistics.fmean(self.times_s) * 1e6

    @property
    def min_us(self) -> float:
        """Fastest iteration, microseconds."""
        return min(self.times_s) * 1e6

    @property
    def max_us(self) -> float:
        """Slowest iteration, microseconds."""
        return max(self.times_s) * 1e6

    @property
    def median_us(self) -> float:
        """Median latency, microseconds."""
        return statistics.median(self.times_s) * 1e6

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth at the mean latency, GB/s."""
        return self.nbytes / (self.avg_us * 1e-6) / 1e9

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth (nccl-tests), GB/s."""
        return self.algbw_gbps * busbw_factor(self.collective, self.world_size)

    def to_dict(self, p2p_gbps: float | None = None) -> dict[str, Any]:
        """JSON-ready summary with the raw per-iteration times."""
        fraction = self.busbw_gbps / p2p_gbps if p2p_gbps else None
        return {
            "collective": self.collective, "algorithm": self.algorithm,
            "resolved": self.resolved, "peer": self.peer, "nbytes": self.nbytes,
            "world_size": self.world_size,
            "iterations": len(self.times_s),
            "avg_us": self.avg_us, "min_us": self.min_us, "max_us": self.max_us,
            "median_us": self.median_us, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "busbw_over_p2p": fraction,
            "times_us": [t * 1e6 for t in self.times_s],
        }


@dataclass(frozen=True)
class P2PResult:
    """Point-to-point loopback bandwidth, rank 0 -> rank 1: the ceiling busbw is compared to."""

    nbytes: int
    times_s: tuple[float, ...]

    @property
    def gbps(self) -> float:
        """Bandwidth at the median time, GB/s."""
        return self.nbytes / statistics.median(self.times_s) / 1e9


@dataclass(frozen=True)
class CopyBound:
    """Memory copies of one message size, measured beside the collectives: the memory bound.

    An allreduce of private buffers through shared memory needs at least two copies' worth of
    traffic on every rank (its input into shared memory, its result out), all ranks at once, so
    its time is at least twice that of every rank copying ``nbytes`` at once; reading the peers'
    data to reduce it comes on top, so the bound is generous to the collective."""

    nbytes: int
    world_size: int
    one_core_s: float
    """Median seconds of one copy of ``nbytes`` by rank 0 while the others wait."""
    all_ranks_s: float
    """Median seconds of every rank copying ``nbytes`` at once (the slowest rank's)."""

    @property
    def one_core_gbps(self) -> float:
        """Bytes copied per second by one core alone, GB/s."""
        return self.nbytes / self.one_core_s / 1e9

    @property
    def all_ranks_gbps(self) -> float:
        """Bytes copied per second by all ranks together, GB/s."""
        return self.world_size * self.nbytes / self.all_ranks_s / 1e9

    @property
    def allreduce_busbw_gbps(self) -> float:
        """The highest allreduce busbw the memory allows: busbw at twice the all-ranks copy."""
        return self.nbytes / (2 * self.all_ranks_s) / 1e9 * busbw_factor("allreduce",
                                                                         self.world_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"nbytes": self.nbytes, "world_size": self.world_size,
                "one_core_us": self.one_core_s * 1e6, "all_ranks_us": self.all_ranks_s * 1e6,
                "one_core_gbps": self.one_core_gbps, "all_ranks_gbps": self.all_ranks_gbps,
                "allreduce_busbw_bound_gbps": self.allreduce_busbw_gbps}


@dataclass
class BenchReport:
    """Everything one run measured, with the environment and configuration that produced it."""

    environment: dict[str, Any]
    config: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)
    p2p: P2PResult | None = None
    calibration: dict[str, Any] | None = None
    memcpy: P2PResult | None = None
    """One core's memory-copy bandwidth: the shared-memory path's ceiling."""
    copies: list[CopyBound] = field(default_factory=list)
    """The memory bound at each allreduce size (runs with peers)."""
    peers: dict[str, str] = field(default_factory=dict)
    """Peers that ran: name -> library and version."""
    skipped_peers: list[str] = field(default_factory=list)
    """One line per requested peer that could not run, with how to install it."""

    @property
    def p2p_gbps(self) -> float | None:
        """The point-to-point ceiling, GB/s, if measured."""
        return self.p2p.gbps if self.p2p is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        p2p = None
        if self.p2p is not None:
            p2p = {"nbytes": self.p2p.nbytes, "gbps": self.p2p.gbps,
                   "times_us": [t * 1e6 for t in self.p2p.times_s]}
        memcpy = None
        if self.memcpy is not None:
            memcpy = {"nbytes": self.memcpy.nbytes, "gbps": self.memcpy.gbps,
                      "times_us": [t * 1e6 for t in self.memcpy.times_s]}
        return {
            "schema": "scaledl.bench.collectives/1", "environment": self.environment,
            "config": self.config, "p2p": p2p, "memcpy": memcpy,
            "results": [m.to_dict(self.p2p_gbps) for m in self.measurements],
            "ratios_vs_native": native_ratios(self.measurements),
            "ratios_vs_torch": native_ratios(self.measurements, "torch", every_size=True),
            "calibration": self.calibration,
            "peers": self.peers, "skipped_peers": self.skipped_peers,
            "copies": [copy.to_dict() for copy in self.copies],
            "peer_rows": peer_rows(self.measurements, self.copies),
        }


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


def native_ratios(
    measurements: list[Measurement], baseline: str = "native", every_size: bool = False,
) -> list[dict[str, Any]]:
    """busbw of each algorithm over ``baseline``'s (``native``, or ``torch``: torch.distributed
    outside scaledl), at each collective's largest size or, with ``every_size``, at every size."""
    ratios = []
    for collective in dict.fromkeys(m.collective for m in measurements):
        rows = [m for m in measurements if m.collective == collective]
        sizes = sorted({m.nbytes for m in rows}) if every_size else [max(m.nbytes for m in rows)]
        for nbytes in sizes:
            at_size = {m.algorithm: m for m in rows if m.nbytes == nbytes}
            reference = at_size.get(baseline)
            if reference is None:
                continue
            for name, m in at_size.items():
                if name != baseline:
                    ratios.append({"collective": collective, "algorithm": name, "nbytes": nbytes,
                                   "busbw_ratio": reference.avg_us / m.avg_us})  # = busbw ratio
    return ratios


def peer_rows(
    measurements: list[Measurement], copies: list[CopyBound] | None = None,
) -> list[dict[str, Any]]:
    """Per collective, size and scaledl algorithm: its median time and busbw, each peer's median
    over it (``> 1``: scaledl faster), and for allreduce its busbw as a fraction of the memory
    bound (:class:`CopyBound`).  Empty when no peer ran."""
    bounds = {copy.nbytes: copy for copy in copies or []}
    rows = []
    for collective in dict.fromkeys(m.collective for m in measurements):
        at = [m for m in measurements if m.collective == collective]
        for nbytes in sorted({m.nbytes for m in at}):
            here = [m for m in at if m.nbytes == nbytes]
            peers = [m for m in here if m.peer]
            if not peers:
                continue
            bound = bounds.get(nbytes) if collective == "allreduce" else None
            for m in (m for m in here if not m.peer):
                rows.append({
                    "collective": collective, "nbytes": nbytes, "algorithm": m.algorithm,
                    "resolved": m.resolved, "median_us": m.median_us,
                    "busbw_gbps": _median_busbw(m),
                    "vs": {peer.algorithm: peer.median_us / m.median_us for peer in peers},
                    "peer_us": {peer.algorithm: peer.median_us for peer in peers},
                    "bound_fraction": (_median_busbw(m) / bound.allreduce_busbw_gbps
                                       if bound is not None else None),
                })
    return rows


def _median_busbw(m: Measurement) -> float:
    """busbw at the median time (the peers' table compares medians), GB/s."""
    return m.nbytes / (m.median_us * 1e-6) / 1e9 * busbw_factor(m.collective, m.world_size)


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


def write_json(report: BenchReport, path: Path) -> None:
    """Write the report as indented JSON (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")


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


def report_from_dict(data: dict[str, Any]) -> BenchReport:
    """Rebuild a report from :meth:`BenchReport.to_dict` output (for plots of saved runs)."""
    measurements = [
        Measurement(r["collective"], r["algorithm"], r["nbytes"], r["world_size"],
                    tuple(t * 1e-6 for t in r["times_us"]), r.get("resolved"),
                    bool(r.get("peer", False)))
        for r in data["results"]
    ]
    copies = [CopyBound(c["nbytes"], c["world_size"], c["one_core_us"] * 1e-6,
                        c["all_ranks_us"] * 1e-6) for c in data.get("copies", [])]
    ceilings = [
        P2PResult(item["nbytes"], tuple(t * 1e-6 for t in item["times_us"])) if item else None
        for item in (data.get("p2p"), data.get("memcpy"))
    ]
    return BenchReport(data["environment"], data["config"], measurements, ceilings[0],
                       data.get("calibration"), ceilings[1], copies, data.get("peers", {}),
                       data.get("skipped_peers", []))

