"""Fit the cpu device's three host constants to the calibration files (docs/simulation.md).

The host model of `scaledl simulate` for CPU ranks talking TCP has three constants: CPU seconds
per byte at each end of a transfer inside a host (``CPU_TCP_BETA`` in sim/presets.py), the extra
per byte across an emulated link (``CPU_TCP_LINK_BETA``), and the scaledl stack's software cost
per collective call (``STACKS["scaledl"]`` in sim/losses.py).  This script fits all three at once,
least squares on relative errors, to the points of the calibration files only (analyze.py's
``CALIBRATION_FILES``: the 2x2 run 6 files at every rate, messages >= 1 MiB) with scipy's
``least_squares``, and prints them with the fit's residual.  Paste the values into the two
source files, then run analyze.py: every other file stays held out.

    python benchmarks/sim_validation/fit_host.py [raw-dir] [--keep-loopback]

``--keep-loopback`` keeps ``CPU_TCP_BETA`` at its preset (scaledl's ring between two ranks of one
host measures it independently: tcp_timeshare.py) and fits the other two; the presets hold that
fit.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from analyze import CALIBRATION_FILES, MIN_BYTES, _network, predicted_s
from scaledl.sim.calibrate import Point, load_points
from scaledl.sim.presets import CPU_TCP_BETA, CPU_TCP_LINK_BETA
from scaledl.sim.losses import STACKS

SCALE = np.array([1e-9, 1e-9, 1e-3])
"""Units of the three parameters (ns/B, ns/B, ms), so the steps are of one size."""


def _points(raw: Path) -> list[tuple[str, Point]]:
    chosen = []
    for name in sorted(CALIBRATION_FILES):
        rate = name.split("-")[2]
        chosen += [(rate, p) for p in load_points([raw / name]) if p.nbytes >= MIN_BYTES]
    return chosen


def _predictions(points: list[tuple[str, Point]], theta: np.ndarray) -> np.ndarray:
    beta, link_beta, call = (theta * SCALE).tolist()
    out = []
    for rate, point in points:
        network = replace(_network(rate), cpu_beta=beta, cpu_beta_link=link_beta)
        out.append(predicted_s(point, network, call))
    return np.array(out)


def fit(points: list[tuple[str, Point]], start: np.ndarray,
        free: tuple[int, ...] = (0, 1, 2)) -> np.ndarray:
    """Least squares on the relative residuals of the ``free`` parameters (the others stay at
    ``start``), parameters kept >= 0 (scipy's trust-region reflective solver)."""
    measured = np.array([p.measured_s for _, p in points])
    chosen = list(free)

    def residuals(values: np.ndarray) -> np.ndarray:
        theta = start.astype(float)
        theta[chosen] = values
        return _predictions(points, theta) / measured - 1

    solved = least_squares(residuals, start[chosen].astype(float), bounds=(0.0, np.inf),
                           diff_step=1e-2, xtol=1e-6)
    theta = start.astype(float)
    theta[chosen] = solved.x
    return theta


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    raw = Path(args[0]) if args else Path(__file__).parent / "raw"
    points = _points(raw)
    start = np.array([CPU_TCP_BETA, CPU_TCP_LINK_BETA, STACKS["scaledl"].call_overhead_s]) / SCALE
    theta = fit(points, start, free=(1, 2) if "--keep-loopback" in sys.argv else (0, 1, 2))
    measured = np.array([p.measured_s for _, p in points])
    errors = _predictions(points, theta) / measured - 1
    within = int(np.sum(np.abs(errors) <= 0.15))
    rms = np.sqrt(np.mean(errors**2))
    print(f"{len(points)} calibration points; rms relative error {rms:.1%}, {within} within 15%")
    print(f"CPU_TCP_BETA = {theta[0]:.3f}e-9   CPU_TCP_LINK_BETA = {theta[1]:.3f}e-9   "
          f"scaledl call overhead = {theta[2]:.3f}e-3")


if __name__ == "__main__":
    main()
