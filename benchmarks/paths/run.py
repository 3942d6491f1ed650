"""Shared-memory and per-level paths against torch.distributed's own collectives.

Runs ``scaledl bench collectives`` side by side (every algorithm at every size in one run,
torch's op as the baseline) for 2 and 4 ranks, with OMP_NUM_THREADS=1 (as torchrun sets it) and
with torch's default threads (OMP_NUM_THREADS unset is what mpirun, srun and
torch.multiprocessing give; ``scaledl bench`` itself would set 1, so the default is spelled out
as the machine's core count), repeated, and writes every run's JSON under ``raw/`` and the
medians of the ratios to ``results.md``.

Usage (repository root, venv active, nothing else running):
    python benchmarks/paths/run.py [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"

CASES = [
    # (name, ranks, collectives, algorithms, min, max, step)
    ("allreduce-2", 2, "allreduce", "shm,auto,native,torch", "4K", "256M", "4"),
    ("rsag-2", 2, "reduce_scatter,allgather", "shm,auto,native,torch", "1M", "64M", "8"),
    ("allreduce-4", 4, "allreduce", "shm,auto,torch", "4K", "64M", "4"),
]


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(repeats: int, quick: bool) -> list[Path]:
    RAW.mkdir(parents=True, exist_ok=True)
    written = []
    threads = {"1": "1", "default": str(os.cpu_count() or 1)}
    for repeat in range(1, repeats + 1):
        for name, ranks, collectives, algorithms, low, high, step in CASES:
            for label, value in threads.items():
                out = RAW / f"{name}-omp{label}-run{repeat}.json"
                env = {**os.environ, "OMP_NUM_THREADS": value}
                before = _load()
                command = [sys.executable, "-m", "scaledl.cli.main", "bench", "collectives",
                           "--ranks", str(ranks), "--collectives", collectives,
                           "--algorithms", algorithms, "--min-bytes", low,
                           "--max-bytes", "16M" if quick else high, "--step-factor", step,
                           "--target-seconds", "0.2" if quick else "0.3", "--json", str(out)]
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                with open(RAW / "load.txt", "a") as log:
                    log.write(f"{time.strftime('%H:%M:%S')} {out.name}: load {before} -> "
                              f"{_load()}\n")
                written.append(out)
    return written


def summarize(paths: list[Path]) -> str:
    """Median over repeats of each algorithm's ratio to torch, per case, threads and size."""
    table: dict[tuple[str, str, str, int, str], list[float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        case, _, rest = path.stem.partition("-omp")
        label = rest.split("-run")[0]
        for row in data["ratios_vs_torch"]:
            key = (case, label, row["collective"], row["nbytes"], row["algorithm"])
            table.setdefault(key, []).append(row["busbw_ratio"])
    lines = ["| case | threads | collective | size | algorithm | x torch (median) | runs |",
             "|---|---|---|---:|---|---:|---:|"]
    for (case, label, collective, nbytes, algorithm), ratios in sorted(table.items()):
        lines.append(f"| {case} | {label} | {collective} | {_size(nbytes)} | {algorithm} | "
                     f"{statistics.median(ratios):.2f} | {len(ratios)} |")
    return "\n".join(lines) + "\n"


def _size(nbytes: int) -> str:
    for suffix, unit in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {suffix}"
    return f"{nbytes} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="up to 16 MiB, short timings")
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    paths = sorted(RAW.glob("*.json")) if args.summarize_only else run(args.repeats, args.quick)
    (HERE / "results.md").write_text(summarize(paths))
    print((HERE / "results.md").read_text())


if __name__ == "__main__":
    main()
