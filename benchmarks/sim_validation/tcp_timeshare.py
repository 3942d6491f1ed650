"""What time-sharing the cores costs TCP: scaledl's ring allreduce among N ranks of one host (no
emulated link, every byte through loopback) on a machine of C cores, for N = C .. 3C.

    python benchmarks/sim_validation/tcp_timeshare.py measure [--ranks 2,3,4,5,6] [--repeats 3]
                                                              [--out raw-dir]
    python benchmarks/sim_validation/tcp_timeshare.py fit [raw-dir]

``measure`` runs ``scaledl bench collectives --ranks N --algorithms ring`` (one thread per rank,
as ``scaledl cluster`` and torchrun set) from 1 to 32 MiB, 40 timed iterations per size, and
writes ``raw/tcp-timeshare-N-runK.json``.  ``fit`` replays every file with the cpu device's
presets and the ranks sharing the cores, and for each N finds the loopback cost per byte
(``CPU_TCP_BETA``) that makes the replay match (least squares on relative errors over the
sizes and repeats); it prints that cost over the one at N = C (a core per rank), the multiplier
``CPU_TCP_TIMESHARE`` holds per ranks per core (sim/presets.py).  Nothing of the emulated
cluster's validation points enters it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import minimize_scalar

from analyze import _network, predicted_s
from scaledl.sim.calibrate import Point, load_points
from scaledl.sim.network import Network, ranks_per_core

RAW = Path(__file__).parent / "raw"
CORES = os.cpu_count() or 1


def measure(ranks: list[int], repeats: int, raw: Path = RAW) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for run in range(1, repeats + 1):
        for n in ranks:
            out = raw / f"tcp-timeshare-{n}-run{run}.json"
            subprocess.run(["scaledl", "bench", "collectives", "--ranks", str(n),
                            "--algorithms", "ring", "--min-bytes", "1M", "--max-bytes", "32M",
                            "--step-factor", "2", "--warmup", "3", "--iters", "40",
                            "--p2p-bytes", "1M", "--timeout", "300", "--json", str(out)],
                           check=True, env=env, stdout=subprocess.DEVNULL)
            print(f"wrote {out}", flush=True)


def _errors(points: list[Point], network: Network, beta: float) -> np.ndarray:
    bare = replace(network, cpu_beta=beta, cpu_timeshare=())
    return np.array([predicted_s(point, bare, cores=CORES) / point.measured_s - 1
                     for point in points])


def fitted_beta(points: list[Point], network: Network) -> float:
    """The loopback cost per byte whose replay matches ``points`` best (rms relative error),
    between 0.05 and 2 ns/B (searched in ns/B so the tolerance is meaningful)."""
    best = minimize_scalar(lambda ns: float(np.mean(_errors(points, network, ns * 1e-9) ** 2)),
                           bounds=(0.05, 2.0), method="bounded", options={"xatol": 1e-5})
    return float(best.x) * 1e-9


def fit(raw: Path = RAW) -> None:
    network = _network("10gbit")
    by_ranks: dict[int, list[Point]] = {}
    for path in sorted(raw.glob("tcp-timeshare-*-run*.json")):
        ranks = int(path.stem.split("-")[2])
        by_ranks.setdefault(ranks, []).extend(load_points([path]))
    betas = {n: fitted_beta(points, network) for n, points in sorted(by_ranks.items())}
    base = betas.get(CORES)
    for n, beta in betas.items():
        errors = _errors(by_ranks[n], network, beta)
        relative = f"{beta / base:.3f}" if base else "-"
        print(f"ranks {n} ({ranks_per_core(n, CORES):.1f} per core): {beta * 1e9:.3f} ns/B, "
              f"x{relative} of a core per rank; {len(errors)} points, median |error| "
              f"{statistics.median(abs(errors)):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="time the ring on this host")
    run.add_argument("--ranks", default="2,3,4,5,6", help="comma list of rank counts")
    run.add_argument("--repeats", type=int, default=3)
    run.add_argument("--out", type=Path, default=RAW, help="raw directory")
    replay = commands.add_parser("fit", help="the multiplier per ranks per core")
    replay.add_argument("raw", type=Path, nargs="?", default=RAW)
    args = parser.parse_args()
    if args.command == "measure":
        measure([int(k) for k in args.ranks.split(",")], args.repeats, args.out)
    else:
        fit(args.raw)


if __name__ == "__main__":
    main()
