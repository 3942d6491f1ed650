"""Markdown tables for docs/cluster.md from the raw JSON in this directory.

Usage: python benchmarks/cluster/summarize.py > benchmarks/cluster/summary.md

Times are the median over runs of each run's median (``median_us``).  Ratios are the block-placed
flat ring's time over the algorithm's time (> 1 = faster than the flat ring).  Bytes are each
host's ``eth0`` transmit counter over the run divided by the number of allreduces (7).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALGORITHMS = ("native", "ring", "hierarchical", "torus")
CALLS_PER_BYTES_RUN = 7  # 1 verification + 1 warm-up + 5 timed
LINK_BYTES_PER_S = {"1gbit": 125e6, "10gbit": 1250e6}
THEORY_LINK_FACTOR = {("block", "ring"): 1.5, ("block", "native"): 1.5,
                      ("block", "hierarchical"): 1.0, ("block", "torus"): 1.0,
                      ("cyclic", "ring"): 3.0, ("cyclic", "native"): 3.0,
                      ("cyclic", "hierarchical"): 2.0, ("cyclic", "torus"): 2.0}
"""Bytes each host sends over its link per allreduce, in units of the message size n."""


def _runs(rate: str, placement: str) -> list[dict[tuple[str, int], float]]:
    runs = []
    for path in sorted(HERE.glob(f"allreduce-2h2r-{rate}-{placement}-run*.json")):
        data = json.loads(path.read_text())
        runs.append({(r["algorithm"], r["nbytes"]): r["median_us"] / 1e3 for r in data["results"]})
    return runs


def timing_table(rate: str, placement: str, reference: dict[int, float] | None) -> str:
    runs = _runs(rate, placement)
    if not runs:
        return f"(no runs for {rate} {placement})\n"
    keys = sorted({k for run in runs for k in run}, key=lambda k: (k[1], k[0]))
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for run in runs:
        for key in keys:
            if key in run:
                times[key].append(run[key])
    sizes = sorted({n for _, n in keys})
    lines = [f"{len(runs)} runs; ms (median of runs; min-max of runs); ratio = flat ring "
             "(block) / algorithm", "",
             "| size | " + " | ".join(ALGORITHMS) + " | " +
             " | ".join(f"ring/{a}" for a in ALGORITHMS if a != "ring") + " |",
             "|---" * (1 + 2 * len(ALGORITHMS) - 1) + "|"]
    for n in sizes:
        med = {a: statistics.median(times[(a, n)]) for a in ALGORITHMS if times[(a, n)]}
        ring = (reference or {}).get(n, med.get("ring", float("nan")))
        cells = [f"{med[a]:.1f} ({min(times[(a, n)]):.0f}-{max(times[(a, n)]):.0f})"
                 if a in med else "-" for a in ALGORITHMS]
        ratios = [f"{ring / med[a]:.2f}x" if a in med else "-" for a in ALGORITHMS if a != "ring"]
        lines.append(f"| {n >> 20} MiB | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def ring_reference(rate: str) -> dict[int, float]:
    runs = _runs(rate, "block")
    sizes = sorted({n for run in runs for (a, n) in run if a == "ring"})
    return {n: statistics.median(run[("ring", n)] for run in runs if ("ring", n) in run)
            for n in sizes}


def bytes_table() -> str:
    lines = ["| placement | algorithm | MB per allreduce over each host link (h0 / h1) | "
             "in units of n = 16 MiB | theory | loopback MB per allreduce (h0) |",
             "|---|---|---|---|---|---|"]
    n = 16 << 20
    for placement in ("block", "cyclic"):
        for algorithm in ALGORITHMS:
            path = HERE / f"bytes-2h2r-1gbit-{placement}-{algorithm}.json"
            if not path.exists():
                continue
            moved = json.loads(path.read_text())["bytes"]
            per = [moved[h]["eth0_tx"] / CALLS_PER_BYTES_RUN for h in ("h0", "h1")]
            lo = moved["h0"]["lo_tx"] / CALLS_PER_BYTES_RUN
            units = statistics.mean(per) / n
            theory = THEORY_LINK_FACTOR[(placement, algorithm)]
            lines.append(f"| {placement} | {algorithm} | {per[0] / 1e6:.1f} / {per[1] / 1e6:.1f} "
                         f"| {units:.2f} n | {theory:.1f} n | {lo / 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    out = sys.stdout
    for rate in ("1gbit", "10gbit", "100mbit"):
        reference = ring_reference(rate)
        for placement in ("block", "cyclic"):
            if not _runs(rate, placement):
                continue
            out.write(f"\n### allreduce, 2 hosts x 2 ranks, {rate}, {placement} placement\n\n")
            out.write(timing_table(rate, placement, reference))
    out.write("\n### bytes over the link, 16 MiB allreduce, 1gbit\n\n")
    out.write(bytes_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
