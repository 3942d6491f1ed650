"""Calibration and validation of the network model against ``scaledl bench collectives --json``.

Fit: every measured collective of a scheduled algorithm is replayed on the current network; its
critical path is a linear function of the link parameters (latencies paid and bytes moved per
link class, :func:`scaledl.sim.fastreplay.critical_path`).  A non-negative least-squares fit of
``alpha`` and ``beta`` per class to the measured medians, weighted by ``1 / measured`` so that
small and large messages count alike (relative error), gives new parameters; the replay is
repeated until the critical paths stop changing, then refined on the replayed times (the fit
itself is :mod:`scaledl.calibration.link_fit`'s; this module gives it the replay and says what
the parameters are: ``alpha`` then ``beta`` of each class).  One host alone measures one class: the
inter-host and rack classes are fitted only from files whose topology spans hosts (e.g. the
emulated cluster's ``2x2``), and classes nothing measured keep their prior values.

The per-round software overhead cannot be told apart from latency (every round pays both), so
the fit sets ``overhead = 0`` and each class's ``alpha`` is the whole per-round cost over that
link; a class nothing measured keeps its prior ``alpha`` plus the prior ``overhead`` (so it keeps
paying the per-round cost the fitted classes fold in).  An unmeasured rack uplink (no explicit
``uplink`` in the prior) is derived from the fitted inter-host link plus ``rack_latency``, so that
crossing racks never costs less than crossing hosts.  The reduction cost ``gamma`` and the chunk
size are kept from the prior (the caller picks ``gamma``: see :mod:`scaledl.cli.simulate_report`).
With ``cores`` (the measurements' ranks shared that many cores: the emulated cluster), each
point is replayed with its host CPU model: the prior's ``cpu_beta`` (TCP's cost per byte) and a
contention of ``ranks / cores``, which is not fitted.
``native``'s per-round cost and bandwidth factor are fitted by :mod:`scaledl.calibration.fit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scaledl.calibration.bench_file import RERUN, BenchRow, read_rows, row_topologies
from scaledl.calibration.link_fit import fit_links
from scaledl.collectives.registry import ALGORITHMS, parse_algorithm, plan_numel
from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import compile_collective
from scaledl.sim.compiled import Compiled
from scaledl.sim.fastreplay import cost, critical_path, evaluate
from scaledl.sim.network import CLASS_NAMES, Network, on_cores
from scaledl.topology import Topology

__all__ = [
    "Point", "load_points", "plan_numel", "fit_network", "validate", "FitResult",
    "predict", "on_host",
]


@dataclass(frozen=True)
class Point:
    """One measured median and the compiled plans that produced it."""

    collective: str
    algorithm: str
    nbytes: int
    topology: Topology
    """Where the ranks sat (the plans may assume another layout: cyclic placement)."""
    measured_s: float
    compiled: Compiled
    source: str
    ran: str = ""
    """The algorithm as it ran (the file's ``resolved``: e.g. ``hierarchical[shm,ring]``, the
    paths ``hierarchical`` chose per level), whose plans are compiled; the asked name when the
    file does not say (written before this was recorded)."""


def load_points(
    paths: Sequence[Path], topology: str | None = None, placement: str = "block"
) -> list[Point]:
    """Measurements of scheduled algorithms in bench JSON files, with their plans compiled.

    ``placement`` says how the launcher put ranks on hosts: ``block`` (ranks 0..k-1 on the
    first host, as the topology spec assumes) or ``cyclic`` (rank r on host r % hosts); the
    plans are always made for the spec, as the benchmark made them.
    """
    points = []
    for row in read_rows(paths):
        point = _point(row, topology, placement)
        if point is not None:
            points.append(point)
    if not points:
        raise ValueError("the benchmark files hold no measurement of a scheduled algorithm "
                         "(ring, tree, ...); rerun `scaledl bench collectives` with those")
    return points


def _point(row: BenchRow, topology: str | None, placement: str) -> Point | None:
    """``row`` with its plans compiled (None: not a scheduled algorithm's)."""
    try:
        algo = ALGORITHMS.get(parse_algorithm(row.ran)[0])
    except ValueError as error:
        raise ValueError(f"{row.where}: {error}; {RERUN}") from None
    if algo is None or not algo.scheduled:
        return None
    planned, topo = row_topologies(row, topology, placement)
    numel = plan_numel(row.collective, row.nbytes, row.world_size, row.itemsize)
    try:
        compiled = compile_collective(row.ran, Collective(row.collective), planned, numel, 0,
                                      row.itemsize)
    except ValueError as error:
        raise ValueError(f"{row.where}: {error}; {RERUN}") from None
    return Point(row.collective, row.algorithm, row.nbytes, topo, row.median_s, compiled,
                 str(row.path), row.ran)


def on_host(network: Network, point: Point, cores: int | None) -> Network:
    """``network`` for ``point``'s ranks on ``cores`` cores (:func:`on_cores`)."""
    return on_cores(network, point.topology.world_size, cores)


def predict(point: Point, network: Network, merge_equal: bool = True,
            cores: int | None = None) -> float:
    """Replayed seconds of ``point``'s collective on ``network``."""
    costs = cost(point.compiled, point.topology, on_host(network, point, cores), merge_equal)
    return float(evaluate(point.compiled, costs).max())


UNCONSTRAINED_GBPS = 10_000
"""A fitted bandwidth above this (10 TB/s, beyond any link the presets know: NVLink 4 moves
450 GB/s each way) means the fit drove the class's seconds per byte to about zero: its bytes
did not constrain it, and ``describe`` says so instead of printing the number."""


@dataclass(frozen=True)
class FitResult:
    """The fitted network and how well it explains the measurements."""

    network: Network
    fitted: tuple[bool, bool, bool]
    """Which link classes the measurements constrained."""
    rms_relative_error: float
    points: int
    iterations: int
    """Most fixpoint iterations any start took."""
    uplink_derived: bool = False
    """The unmeasured uplink was derived from the fitted inter-host link."""

    def describe(self) -> str:
        """One line per link class."""
        lines = []
        for index, link in enumerate(self.network.classes):
            derived = index == 2 and self.uplink_derived
            state = ("inter-host + rack latency (not measured)" if derived
                     else "fitted" if self.fitted[index] else "prior (not measured)")
            rate = f"{link.gbytes_per_s:9.3f}"
            if (self.fitted[index] or derived) and link.gbytes_per_s > UNCONSTRAINED_GBPS:
                rate = f"{'>' + str(UNCONSTRAINED_GBPS):>9s}"  # the uplink follows inter-host
                if not derived:
                    state = ("fitted, bandwidth unconstrained (its bytes barely reach a critical "
                             f"path: alpha carries its time; {self._remedy(index)})")
            lines.append(f"{CLASS_NAMES[index]:12s} alpha {link.alpha * 1e6:9.1f} us   "
                         f"bandwidth {rate} GB/s   {state}")
        lines.append(f"fit over {self.points} measurements: rms relative error "
                     f"{self.rms_relative_error:.1%}")
        return "\n".join(lines)

    def _remedy(self, index: int) -> str:
        """What to do about class ``index`` when its bytes reach no critical path: larger
        messages, or, where the prior charges host CPU per byte on that class's transfers (TCP
        through the hosts' sockets), host costs that may outweigh the link there."""
        net = self.network
        tcp = (net.cpu_beta > 0 or net.cpu_beta_link > 0) if index > 0 else (
            net.tcp_inside and net.cpu_beta > 0)
        if not tcp:
            return "measure larger messages to fit it"
        return ("measure larger messages, or, if they were large, the prior's host TCP cost "
                f"per byte ({net.cpu_beta * 1e9:.3g} ns/B at each end, from --device or "
                "--socket-bandwidth) may outweigh the link on the measured host: see "
                "docs/simulation.md, 'Calibration'")


@dataclass(frozen=True)
class _Replay:
    """``points`` replayed on ``base`` with each parameter vector's links (alpha then beta of
    each class: :func:`_params`), for :mod:`scaledl.calibration.link_fit`."""

    points: Sequence[Point]
    base: Network
    cores: int | None

    def network(self, params: np.ndarray) -> Network:
        return self.base.with_classes(tuple(params[:3]), tuple(params[3:]))

    def paths(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        network = self.network(params)
        rows, known = [], []
        for point in self.points:
            costs = cost(point.compiled, point.topology, on_host(network, point, self.cores),
                         merge_equal=False)
            path = critical_path(point.compiled, costs)
            rows.append([*path.alpha_counts, *path.byte_counts])
            known.append(path.known)
        return np.array(rows, dtype=np.float64), np.array(known, dtype=np.float64)

    def times(self, params: np.ndarray) -> np.ndarray:
        network = self.network(params)
        return np.array([predict(point, network, False, self.cores) for point in self.points])


def _params(network: Network) -> np.ndarray:
    return np.array([*(link.alpha for link in network.classes),
                     *(link.beta for link in network.classes)])


_FLOOR = np.array([1e-9] * 3 + [1e-15] * 3)
"""The smallest alpha and beta the log-parameter refinement starts from."""


def fit_network(points: Sequence[Point], prior: Network, max_iterations: int = 12,
                cores: int | None = None) -> FitResult:
    """Fit alpha and beta per link class to ``points`` (see the module docstring)."""
    if len(points) < 2:
        raise ValueError(f"calibration needs at least two measurements, got {len(points)}")
    base = replace(prior, overhead=0.0)
    starts = []
    for slow in (1.0, 10.0, 100.0):  # starts: the prior, and outer links slower than inner
        alphas = tuple(link.alpha * (slow if c else 1.0) for c, link in enumerate(base.classes))
        betas = tuple(link.beta * (slow if c else 1.0) for c, link in enumerate(base.classes))
        starts.append(_params(base.with_classes(alphas, betas)))
    replay = _Replay(points, base, cores)
    fit = fit_links([p.measured_s for p in points], replay, starts, _FLOOR, max_iterations)
    if fit is None:
        raise ValueError(
            f"the measurements constrain no link of network {prior.name!r}: on it every "
            "replayed critical path is host CPU work, not link time; give the --network (and "
            "--cores) they were measured on, e.g. --network 1gbit --cores 2 for the emulated "
            "cluster")
    fitted = fit.fitted
    params = _derive_uplink(prior, np.where(fitted, fit.params, _unfitted(prior)), fitted)
    network = replay.network(fit.params).with_classes(tuple(params[:3]), tuple(params[3:]))
    classes = tuple(bool(fitted[c] or fitted[c + 3]) for c in range(3))
    derived = prior.uplink is None and classes[1] and not classes[2]
    return FitResult(replace(network, name="calibrated"), classes,  # type: ignore[arg-type]
                     fit.rms_relative_error, len(points), fit.iterations, derived)


def _unfitted(prior: Network) -> np.ndarray:
    """The prior's parameters with its per-round ``overhead`` in every ``alpha``."""
    params = _params(prior)
    params[:3] += prior.overhead
    return params


def _derive_uplink(prior: Network, params: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """An unmeasured uplink follows the fitted inter-host link plus ``rack_latency`` (unless
    the prior names an uplink of its own), so crossing racks never beats crossing hosts."""
    if prior.uplink is None and (fitted[1] or fitted[4]) and not (fitted[2] or fitted[5]):
        params = params.copy()
        params[2], params[5] = params[1] + prior.rack_latency, params[4]
    return params


def validate(
    points: Sequence[Point], network: Network, min_bytes: int = 1 << 20,
    cores: int | None = None,
) -> list[dict[str, Any]]:
    """Predicted vs measured for every point of at least ``min_bytes``."""
    rows = []
    for point in points:
        if point.nbytes < min_bytes:
            continue
        predicted = predict(point, network, cores=cores)
        rows.append({
            "collective": point.collective, "algorithm": point.algorithm,
            "nbytes": point.nbytes, "topology": point.topology.spec
            + (" cyclic" if point.topology.order is not None else ""),
            "measured_ms": point.measured_s * 1e3, "predicted_ms": predicted * 1e3,
            "error": predicted / point.measured_s - 1, "source": point.source,
        })
    return rows
