"""Fit the host constants of a machine to its calibration files (docs/simulation.md).

The host model of `scaledl simulate` for CPU ranks talking TCP has three constants: CPU seconds
per byte at each end of a transfer inside a host (``CPU_TCP_BETA`` in sim/presets.py), the extra
per byte across an emulated link (``CPU_TCP_LINK_BETA``), and the scaledl stack's software cost
per collective call (``STACKS["scaledl"]`` in sim/losses.py; only ranks whose threads share
cores pay it, so it is not fitted where every calibration point has two cores per rank).  This
script fits them, least squares on relative errors, to the points of the calibration files only
(messages >= 1 MiB) with scipy's ``least_squares``, and prints them with the fit's residual.
For the VM of raw/ the calibration files are the 2x2 run 6 files at every rate (host.py):
paste the values into the two source files, then run analyze.py; every other file stays held
out.

    python benchmarks/sim_validation/fit_host.py [RAW_DIR] [--keep-loopback]
    python benchmarks/sim_validation/fit_host.py RAW_DIR --cores N --run K [--free A,B,..]
        [--machine TEXT] --write

``--keep-loopback`` keeps ``CPU_TCP_BETA`` at its preset (scaledl's ring between two ranks of one
host measures it independently: tcp_timeshare.py) and fits the other two; the presets hold that
fit.  For another machine, ``--cores`` is its core count, ``--run K`` makes the 2x2 files of run
K at every rate measured the calibration, ``--free`` names the constants to fit (host.py's
``CONSTANTS``; default the three above) and ``--write`` saves RAW_DIR/host.json, which
analyze.py then replays that folder with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from analyze import MIN_BYTES, predicted_s
from host import CONSTANTS, RATES, Host, defaults, save_host
from scaledl.sim.calibrate import Point, load_points
from scaledl.sim.losses import BUSY_THREADS

SCALE = {"cpu_beta": 1e-9, "cpu_beta_link": 1e-9, "call": 1e-3, "overhead": 1e-5,
         "inter_alpha": 1e-5, "intra_alpha": 1e-5}
"""Units of the parameters (ns/B, ms, 10 us), so the solver's steps are of one size."""
THREE = ("cpu_beta", "cpu_beta_link", "call")


def _points(raw: Path, host: Host) -> list[tuple[str, Point]]:
    chosen = []
    for name in sorted(host.calibration):
        if (raw / name).is_file():
            rate = name.split("-")[2]
            chosen += [(rate, p) for p in load_points([raw / name]) if p.nbytes >= MIN_BYTES]
    return chosen


def _predictions(points: list[tuple[str, Point]], host: Host) -> np.ndarray:
    return np.array([predicted_s(p, host.network(rate), host.call, host.cores)
                     for rate, p in points])


def fit(points: list[tuple[str, Point]], host: Host, free: tuple[str, ...]) -> Host:
    """``host`` with its ``free`` constants fitted by least squares on the relative residuals
    of ``points`` (the others stay at ``host``'s), every constant kept >= 0 (scipy's
    trust-region reflective solver)."""
    measured = np.array([p.measured_s for _, p in points])
    start = defaults(host)
    scale = np.array([SCALE[name] for name in free])

    def trial(values: np.ndarray) -> Host:
        fitted = dict(zip(free, (values * scale).tolist()))
        return Host(host.cores, host.calibration, {**host.constants, **fitted}, host.machine)

    def residuals(values: np.ndarray) -> np.ndarray:
        return _predictions(points, trial(values)) / measured - 1

    x0 = np.array([start[name] for name in free]) / scale
    solved = least_squares(residuals, x0, bounds=(0.0, np.inf), diff_step=1e-2, xtol=1e-6)
    return trial(solved.x)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="?", type=Path, default=Path(__file__).parent / "raw")
    parser.add_argument("--keep-loopback", action="store_true")
    parser.add_argument("--cores", type=int, default=Host().cores)
    parser.add_argument("--run", type=int, help="calibrate on the 2x2 files of this run")
    parser.add_argument("--free", default=",".join(THREE))
    parser.add_argument("--machine", default=Host().machine)
    parser.add_argument("--write", action="store_true", help="save RAW/host.json")
    args = parser.parse_args()
    free = tuple(args.free.split(","))
    if set(free) - set(CONSTANTS):
        parser.error(f"--free {args.free}: each must be one of {', '.join(CONSTANTS)}")
    args.free = tuple(n for n in free if not (args.keep_loopback and n == "cpu_beta"))
    return args


def main() -> None:
    args = _arguments()
    host = Host(cores=args.cores, machine=args.machine)
    if args.run is not None:
        host = Host(args.cores, frozenset(f"allreduce-2x2-{rate}-run{args.run}.json"
                                          for rate in RATES), {}, args.machine)
    points = _points(args.raw, host)
    if not points:
        raise SystemExit(f"{args.raw}: none of the calibration files {sorted(host.calibration)}")
    free = args.free
    if "call" in free and all(host.cores >= BUSY_THREADS * p.topology.world_size
                              for _, p in points):
        free = tuple(n for n in free if n != "call")
        print(f"call: not fitted, every calibration point has {BUSY_THREADS} cores per rank, "
              "where the scaledl stack's call costs nothing (Stack.shared_cores_only)")
    if not free:
        raise SystemExit("nothing to fit: name other constants with --free")
    fitted = fit(points, host, free)
    measured = np.array([p.measured_s for _, p in points])
    errors = _predictions(points, fitted) / measured - 1
    within = int(np.sum(np.abs(errors) <= 0.15))
    rms = np.sqrt(np.mean(errors**2))
    print(f"{len(points)} calibration points; rms relative error {rms:.1%}, {within} within 15%")
    print("   ".join(f"{name} = {value:.4g}" for name, value in defaults(fitted).items()
                       if name in free or name != "call"))
    if args.write:
        save_host(args.raw, Host(fitted.cores,
                                 frozenset(n for n in fitted.calibration
                                           if (args.raw / n).is_file()),
                                 fitted.constants, fitted.machine))


if __name__ == "__main__":
    main()
