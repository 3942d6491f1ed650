"""How much one GPU's training speed differs from its neighbours' for a whole run, from PAL's
per-GPU measurements (docs/simulation.md, "Stragglers": why the simulator has no term for it).

PAL's artifact (github.com/hal-uw/blox-pal, branch ``artifact``, commit 8a59070) holds, under
``aggregated_data/sim/``, one row per single-GPU run on TACC's Longhorn (four V100 per node):
the node (``cab-node`` or ``cabinet`` and ``node``), the start time ``ts`` (the four GPUs of a
node start together), the run's median step time ``perf`` and its median SM clock ``freq`` with
its mean ``mean_freq``.  The data are not in this repository; fetch them and run::

    git -C blox-pal show artifact:aggregated_data/sim/bert-longhorn-agg.csv > bert.csv  # etc.
    python benchmarks/sim_validation/gpu_spread.py bert.csv resnet.csv sgemm.csv

For each file it prints, over the groups of GPUs that ran together on one node, the robust
standard deviation of each run against its group's mean (the interquartile range over 1.349,
each deviation scaled by sqrt(n / (n - 1)) for a group of n), the same with the outer 5% cut,
the median ratio of the slowest to the fastest GPU of a group, the share of runs whose median
clock is the top one, and the correlation of step time with mean clock.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np


def _node(row: dict[str, str]) -> str:
    return row.get("cab-node") or f"{row['cabinet']}-{row['node']}"


def spread(path: Path) -> str:
    """One line of statistics for the runs in ``path``."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        groups[_node(row), row["ts"]].append(float(row["perf"]))
    deviations: list[float] = []
    ratios: list[float] = []
    for times in (np.array(group) for group in groups.values() if len(group) >= 2):
        scale = math.sqrt(len(times) / (len(times) - 1))
        deviations.extend(float(d) for d in (times / times.mean() - 1) * scale)
        ratios.append(float(times.max() / times.min()))
    dev = np.array(deviations)
    q1, q3 = np.percentile(dev, [25, 75])
    lo, hi = np.percentile(dev, [2.5, 97.5])
    perf = np.array([float(row["perf"]) for row in rows])
    clock = np.array([float(row["mean_freq"]) for row in rows]) if "mean_freq" in rows[0] \
        else None
    top = np.array([float(row["freq"]) for row in rows])
    parts = [f"{path.name}: {len(ratios)} groups, robust sigma {(q3 - q1) / 1.349:.2%}",
             f"trimmed sd {dev[(dev > lo) & (dev < hi)].std():.2%}",
             f"median slowest/fastest {np.median(ratios):.3f}",
             f"runs at the top clock {np.mean(top == top.max()):.0%}"]
    if clock is not None:
        parts.append(f"corr(step, mean clock) {np.corrcoef(perf, clock)[0, 1]:+.2f}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="aggregated_data/sim/*-agg.csv")
    for path in parser.parse_args().files:
        print(spread(path))


if __name__ == "__main__":
    main()
