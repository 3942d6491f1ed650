"""Link parameters fitted to measured times through a replay's critical paths.

The parameters are a vector (for the simulator: ``alpha`` then ``beta`` of each link class).  A
replay (:class:`Replay`) gives, for one parameter vector, each measurement's critical path as a
row of how often it pays each parameter (latencies paid, bytes moved) plus the seconds the
parameters do not set, and each measurement's replayed time.

1. From each start, a fixpoint (:func:`path_fit`): replay, take the critical paths, fit the
   parameters they pay by non-negative least squares, weighted by ``1 / measured`` so that small
   and large messages count alike (relative error); repeat until the paths stop changing.
2. Least squares on the replayed (max-plus) times themselves, in log parameters
   (:func:`refine`): the critical path may switch between links as the parameters move.
3. The start whose result has the lowest rms relative error wins (:func:`fit_links`); a
   parameter no critical path of any start paid is left as the caller's.

The simulator's replay and what its parameters mean are :mod:`scaledl.sim.calibrate`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import least_squares, nnls  # type: ignore[import-untyped]

__all__ = ["Replay", "LinkFit", "path_fit", "refine", "relative_errors", "fit_links"]


class Replay(Protocol):
    """The measurements replayed under a parameter vector."""

    def paths(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(one row per measurement: how often its critical path pays each parameter, the
        seconds of each path that no parameter sets)."""

    def times(self, params: np.ndarray) -> np.ndarray:
        """Each measurement's replayed seconds."""


@dataclass(frozen=True)
class LinkFit:
    """The best start's parameters and how well they explain the measurements."""

    params: np.ndarray
    fitted: np.ndarray
    """Which parameters a critical path paid, from any start."""
    rms_relative_error: float
    iterations: int
    """Most fixpoint iterations any start took."""


def path_fit(measured: np.ndarray, replay: Replay, start: np.ndarray, max_iterations: int
             ) -> tuple[np.ndarray, np.ndarray, int]:
    """(parameters, which ones a path paid, iterations): the fixpoint of step 1."""
    params = start
    fitted = np.zeros(len(start), dtype=bool)
    iterations = 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (the count is returned)
        rows, known = replay.paths(params)
        used = rows.any(axis=0)
        if not used.any():  # every critical path is known work: no parameter to fit
            break
        fitted |= used
        weights = 1.0 / measured
        solution, _ = nnls(rows[:, used] * weights[:, None], (measured - known) * weights)
        old = params
        params = old.copy()
        params[used] = solution
        if np.all(np.abs(params - old) <= 1e-9 * np.maximum(np.abs(old), 1e-30)):
            break
    return params, fitted, iterations


def relative_errors(measured: np.ndarray, replay: Replay, params: np.ndarray) -> np.ndarray:
    """Replayed over measured time, less one, per measurement."""
    errors: np.ndarray = replay.times(params) / measured - 1
    return errors


def refine(measured: np.ndarray, replay: Replay, start: np.ndarray, fitted: np.ndarray,
           floor: np.ndarray) -> np.ndarray:
    """Step 2 from ``start``: the ``fitted`` parameters moved (each at least ``floor``)."""

    def build(x: np.ndarray) -> np.ndarray:
        params = start.copy()
        params[fitted] = np.exp(x)
        return params

    x0 = np.log(np.maximum(start[fitted], floor[fitted]))
    result = least_squares(lambda x: relative_errors(measured, replay, build(x)), x0,
                           diff_step=1e-4, xtol=1e-12, ftol=1e-12, max_nfev=400)
    return build(result.x)


def fit_links(measured: Sequence[float], replay: Replay, starts: Sequence[np.ndarray],
              floor: np.ndarray, max_iterations: int) -> LinkFit | None:
    """Steps 1 to 3 from each of ``starts``; None when no critical path of any start paid a
    parameter (every replayed time is work the parameters do not set)."""
    times = np.array(measured)
    best: tuple[float, np.ndarray] | None = None
    fitted = np.zeros(len(floor), dtype=bool)
    iterations = 0
    for start in starts:
        params, used, steps = path_fit(times, replay, start, max_iterations)
        iterations = max(iterations, steps)
        if not used.any():
            continue
        fitted |= used
        params = refine(times, replay, params, used, floor)
        rms = float(np.sqrt(np.mean(relative_errors(times, replay, params) ** 2)))
        if best is None or rms < best[0]:
            best = (rms, params)
    if best is None:
        return None
    return LinkFit(best[1], fitted, best[0], iterations)
