"""Calibration: fit the parameters of ``auto``'s cost model to measured collective times.

The cost model (:func:`scaledl.collectives.auto.schedule_time`) charges each round of a rank's
schedule ``overhead + max over transfers (alpha + bytes * beta)`` plus the reduction of one chunk
that the pipeline cannot hide.  Summed over a schedule that is, to a good approximation,

    time = per_round * rounds + beta * critical_bytes + known

with ``rounds`` the number of rounds, ``critical_bytes`` the sum over rounds of the largest
transfer, and ``known`` the reduction term (``gamma`` is not fitted).  Step 1 fits ``per_round``
and ``beta`` by least squares on the scheduled algorithms' median times, weighting every point by
its inverse time so small and large messages count alike (the fit minimises relative error).
``per_round`` covers both the executor's overhead and the link latency, which one host cannot tell
apart: the prior ``overhead`` is kept and ``alpha`` takes the rest.  Step 2 fits ``native``'s
per-round cost and bandwidth factor the same way on the native times (its overhead is the
per-round cost less ``alpha``), with ``native`` modelled as auto models it: the cheaper of its
proxy schedules (ring or halving-doubling; tree for broadcast and reduce).  Step 3 fits the
shared-memory class on the ``shm`` times (:func:`_fit_shm`): its fixed cost per call (direct
path, planned path), ``alpha`` per wait, ``beta`` per byte copied in the cache and beyond it
(the cache's size read from the machine), or, on ranks that outnumber the cores, the cost of a
wait when cores are time-shared (the links and ``native`` are then kept: ``auto`` stretches the
own-core values by ranks per core).  Every link class gets the one fitted link: a single host
measures one.

:func:`calibrate` fits one run's measurements (``scaledl bench collectives --calibrate``).
``scaledl simulate calibrate`` fits the links on the simulator's replay
(:mod:`scaledl.sim.calibrate`) and then ``native`` here on the files' native rows
(:func:`load_natives`, :func:`fit_native`): the largest group of them sharing a topology and
dtype, against the link the backend's rounds wait on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls  # type: ignore[import-untyped]

from scaledl.calibration.bench_file import Measurement, read_rows, row_topologies
from scaledl.collectives.auto import Fabric, choose
from scaledl.collectives.cost import (
    CostModel, LinkCost, ShmTerms, memory_factor, schedule_time, shm_call_time, shm_terms,
)
from scaledl.collectives.registry import ALGORITHMS, plan, plan_numel
from scaledl.collectives.schedule import Action, Collective, Schedule
from scaledl.topology import Topology

__all__ = [
    "Sample", "LinearFit", "fit_two", "schedule_features", "calibrate", "auto_residual", "describe",
    "Native", "load_natives", "fit_native", "last_level_cache",
]

_NATIVE_PROXIES = {Collective.BROADCAST: ("tree",), Collective.REDUCE: ("tree",)}
"""What ``auto`` models ``native`` as (mirrors ``scaledl.collectives.auto._native_time``: ring or
halving-doubling otherwise, and reduce_scatter costed as a whole allreduce where the backend runs
it so: ``CostModel.native_reduce_scatter_allreduce``)."""


@dataclass(frozen=True)
class Sample:
    """One measured time and the schedule features that explain it."""

    seconds: float
    rounds: float
    critical_bytes: float
    known_seconds: float
    """The part of the time the model already fixes (reduction that the pipeline cannot hide)."""


@dataclass(frozen=True)
class LinearFit:
    """``y = first * x1 + second * x2`` fitted with relative weights, coefficients >= 0."""

    first: float
    second: float
    rms_relative_error: float
    points: int


def fit_two(x1: Sequence[float], x2: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Least squares for ``y ~ a x1 + b x2`` minimising relative error, with ``a, b >= 0``."""
    if len(y) < 2:
        raise ValueError(f"a fit needs at least two measurements, got {len(y)}")
    rows = [(u / t, v / t) for u, v, t in zip(x1, x2, y, strict=True)]  # weight 1/y: target is 1
    s11 = sum(u * u for u, _ in rows)
    s22 = sum(v * v for _, v in rows)
    s12 = sum(u * v for u, v in rows)
    s1 = sum(u for u, _ in rows)
    s2 = sum(v for _, v in rows)
    det = s11 * s22 - s12 * s12
    a = b = -1.0
    if det > 1e-12 * max(s11 * s22, 1e-300):
        a, b = (s1 * s22 - s2 * s12) / det, (s2 * s11 - s1 * s12) / det
    if a < 0 or b < 0:  # the constrained optimum lies on an axis: fit one coefficient
        only_a = s1 / s11 if s11 > 0 else 0.0
        only_b = s2 / s22 if s22 > 0 else 0.0
        err_a = sum((1 - only_a * u) ** 2 for u, _ in rows)
        err_b = sum((1 - only_b * v) ** 2 for _, v in rows)
        a, b = (only_a, 0.0) if err_a <= err_b else (0.0, only_b)
    residual = sum((1 - a * u - b * v) ** 2 for u, v in rows) / len(rows)
    return LinearFit(a, b, math.sqrt(residual), len(rows))


def schedule_features(
    schedule: Schedule, itemsize: int, model: CostModel, topology: Topology | None = None
) -> tuple[int, int, float]:
    """``(rounds, critical_bytes, known_seconds)`` of one rank's schedule under ``model``.

    A round's critical bytes are, as in ``schedule_time``, the larger of its largest receive and
    the bytes it sends over one link class (sends of a round share the rank's interface).
    """
    critical = 0
    known = 0.0
    for round_ in schedule.rounds:
        received = max((t.numel for t in round_.transfers if not t.is_send), default=0)
        sent: dict[int, int] = {}
        for t in round_.transfers:
            if t.is_send:
                axis = topology.link_axis(schedule.rank, t.peer) if topology is not None else 0
                sent[axis] = sent.get(axis, 0) + t.numel
        critical += max([received, *sent.values()]) * itemsize
        reduced = sum(t.numel for t in round_.transfers if t.action is Action.RECV_REDUCE)
        known += min(reduced * itemsize, model.chunk_bytes) * model.gamma
    return len(schedule.rounds), critical, known


def _numel(m: Measurement, itemsize: int) -> int:
    return plan_numel(m.collective, m.nbytes, m.world_size, itemsize)


def _sample(
    name: str, m: Measurement, topology: Topology, itemsize: int, model: CostModel,
    overhead: float | None = None, beta_factor: float = 1.0,
    collective: Collective | None = None, numel: int | None = None,
) -> tuple[float, Sample]:
    """The slowest rank's features of algorithm ``name`` (with its predicted time)."""
    collective = collective if collective is not None else Collective(m.collective)
    numel = numel if numel is not None else _numel(m, itemsize)
    best: tuple[float, Sample] | None = None
    for rank in range(min(topology.world_size, 16)):
        schedule = plan(name, collective, topology, rank, numel, 0)
        predicted = schedule_time(schedule, topology, itemsize, model, overhead, beta_factor)
        rounds, critical, known = schedule_features(schedule, itemsize, model, topology)
        if best is None or predicted > best[0]:
            best = (predicted, Sample(m.median_us * 1e-6, rounds, critical, known))
    assert best is not None
    return best


def calibrate(
    measurements: Sequence[Measurement], topology: Topology, itemsize: int, prior: CostModel,
    chunk_bytes: int,
) -> tuple[CostModel, dict[str, object]]:
    """Fit the model to ``measurements``; return it and a JSON-ready summary with residuals."""
    prior = replace(prior, chunk_bytes=chunk_bytes)
    if prior.contention(topology.ranks_per_node) > 1:
        return _calibrate_timeshared(measurements, topology, itemsize, prior)
    # shared memory first: its two copy speeds say how much slower loopback bytes move
    # beyond the cache (memory_factor), which the link's beta then leaves out
    shared = [m for m in measurements if m.algorithm == "shm"]
    shm_summary: dict[str, object] | None = None
    if shared:
        prior, shm_summary = _fit_shm(shared, itemsize, prior)
    scheduled = [
        _in_cache(_sample(m.algorithm, m, topology, itemsize, prior)[1], m, topology, prior)
        for m in measurements
        if m.algorithm in ALGORITHMS and ALGORITHMS[m.algorithm].scheduled
        and not ALGORITHMS[m.algorithm].needs_shm
    ]
    if len({(s.rounds, s.critical_bytes) for s in scheduled}) < 2:
        raise ValueError(
            "--calibrate needs scheduled algorithms (e.g. ring) measured at two or more message "
            "sizes; widen --min-bytes/--max-bytes or add algorithms"
        )
    link_fit = fit_two([s.rounds for s in scheduled], [s.critical_bytes for s in scheduled],
                       [max(s.seconds - s.known_seconds, 1e-9) for s in scheduled])
    overhead = min(prior.overhead, link_fit.first)
    link = LinkCost(link_fit.first - overhead, link_fit.second)
    model = replace(prior, links=tuple(link for _ in prior.links), overhead=overhead)
    summary: dict[str, object] = {
        "link": {"per_round_s": link_fit.first, "alpha_s": link.alpha, "beta_s_per_byte":
                 link.beta, "bandwidth_gbps": 1e-9 / link.beta if link.beta else None,
                 "rms_relative_error": link_fit.rms_relative_error, "points": link_fit.points},
        "overhead_s": overhead, "gamma_s_per_byte": prior.gamma, "chunk_bytes": chunk_bytes,
        "note": "one host measures one link class; per_round = overhead (prior) + alpha",
    }
    natives = [m for m in measurements if m.algorithm == "native"]
    if natives:
        model, summary["native"] = _fit_native(natives, topology, itemsize, model)
    if shm_summary is not None:
        summary["shm"] = shm_summary
    summary["auto"] = auto_residual(measurements, topology, itemsize, model)
    return model, summary


def _in_cache(sample: Sample, m: Measurement, topology: Topology, model: CostModel) -> Sample:
    """``sample`` with its critical bytes counted as cache bytes: those beyond the cache
    weigh ``memory_factor`` times (``auto`` slows links inside a host by it)."""
    slow = memory_factor(model, topology.ranks_per_node * m.nbytes)
    return replace(sample, critical_bytes=sample.critical_bytes * slow)


def _calibrate_timeshared(
    measurements: Sequence[Measurement], topology: Topology, itemsize: int, prior: CostModel,
) -> tuple[CostModel, dict[str, object]]:
    """A run whose ranks outnumber the host's cores: the links, ``native`` and the
    shared-memory class of a core per rank stay the prior's (``auto`` stretches them by ranks
    per core, :func:`scaledl.collectives.auto.host_contention`); only the cost of a wait on
    time-shared cores is fitted."""
    link = prior.link(0)
    summary: dict[str, object] = {
        "link": {"per_round_s": prior.overhead + link.alpha, "alpha_s": link.alpha,
                 "beta_s_per_byte": link.beta, "bandwidth_gbps": _gbps(link.beta),
                 "kept": True},
        "overhead_s": prior.overhead, "gamma_s_per_byte": prior.gamma,
        "chunk_bytes": prior.chunk_bytes,
        "note": (f"{topology.ranks_per_node} ranks on {prior.host_cores} cores: links, native and "
                 "shared memory's own-core terms kept from the earlier calibration; calibrate "
                 "with a core per rank first"),
    }
    model = prior
    shared = [m for m in measurements if m.algorithm == "shm"]
    if shared:
        model, summary["shm"] = _fit_shm(shared, itemsize, model)
    summary["auto"] = auto_residual(measurements, topology, itemsize, model)
    return model, summary


def _fit_shm(
    measurements: Sequence[Measurement], itemsize: int, model: CostModel
) -> tuple[CostModel, dict[str, object]]:
    """Fit the shared-memory class on whole-group ``shm`` times (:func:`shm_terms`,
    :func:`shm_call_time`).

    On ranks with a core each: ``time = call + waits x alpha + cached bytes x beta + memory
    bytes x memory beta + adds``, with ``call`` the direct call path's fixed cost for allreduce
    and the planned path's for the others, all five by non-negative least squares in relative
    error; a parameter no measurement pays (no collective but allreduce, no size beyond the
    cache) keeps the prior's value.  On ranks that outnumber the cores, only the cost of a wait
    (``shm_timeshared_alpha``) and what a planned call adds (``timeshared_call_overhead``) are
    fitted, the rest taken from the prior stretched by ranks per core: such a run cannot tell
    a core's speed from its sharing.
    """
    model = replace(model, cache_bytes=last_level_cache() or model.cache_bytes)
    rows = []
    for m in measurements:
        collective = Collective(m.collective)
        flat = Topology.flat(m.world_size)
        stage = next(iter(plan("shm", collective, flat, 0, _numel(m, itemsize)).stages()), None)
        if stage is not None:
            rows.append((collective, shm_terms(stage, itemsize, model), m.median_us * 1e-6,
                         m.world_size))
    if len({(collective, terms.waits, terms.cached_bytes + terms.memory_bytes)
            for collective, terms, _, _ in rows}) < 2:
        return model, {"skipped": "shm measured at fewer than two sizes"}
    if rows[0][1].timeshared:
        return _fit_timeshared(rows, model)
    columns = [
        [float(c is Collective.ALLREDUCE) for c, _, _, _ in rows],
        [float(c is not Collective.ALLREDUCE) for c, _, _, _ in rows],
        [t.waits for _, t, _, _ in rows],
        [t.cached_bytes for _, t, _, _ in rows],
        [t.memory_bytes for _, t, _, _ in rows],
    ]
    prior = [model.direct_call_overhead, model.call_overhead, model.shm.alpha, model.shm.beta,
             model.shm_memory_beta]
    seconds = np.array([t for _, _, t, _ in rows])
    known = np.array([terms.adds for _, terms, _, _ in rows])
    matrix = np.array(columns).T
    paid = np.array([bool(column.any()) for column in matrix.T])
    known += matrix[:, ~paid] @ np.array(prior)[~paid]
    weights = 1 / seconds
    solution, _ = nnls(matrix[:, paid] * weights[:, None], (seconds - known) * weights)
    values = np.array(prior, dtype=float)
    values[paid] = solution
    direct, planned, alpha, beta, memory_beta = (float(v) for v in values)
    fitted = replace(model, shm=LinkCost(alpha, beta), shm_memory_beta=memory_beta,
                     call_overhead=planned, direct_call_overhead=direct)
    return fitted, {
        "alpha_s": alpha, "beta_s_per_byte": beta, "bandwidth_gbps": _gbps(beta),
        "memory_bandwidth_gbps": _gbps(memory_beta), "cache_bytes": fitted.cache_bytes,
        "call_overhead_s": planned, "direct_call_overhead_s": direct,
        "kept_from_prior": [name for name, used in zip(_SHM_PARAMETERS, list(paid))
                            if not used],
        "rms_relative_error": _rms(fitted, rows), "points": len(rows),
    }


_SHM_PARAMETERS = ("direct_call_overhead", "call_overhead", "shm.alpha", "shm.beta",
                   "shm_memory_beta")


def _fit_timeshared(
    rows: Sequence[tuple[Collective, ShmTerms, float, int]], model: CostModel
) -> tuple[CostModel, dict[str, object]]:
    """On a run whose ranks outnumber the cores: ``shm_timeshared_alpha`` per wait and
    ``timeshared_call_overhead`` per planned call, by non-negative least squares in relative
    error, the prior's other terms (stretched by ranks per core) taken as known."""
    columns, known, seconds = [], [], []
    for collective, terms, measured, world_size in rows:
        untimed = replace(model, shm_timeshared_alpha=0.0, timeshared_call_overhead=0.0)
        known.append(terms.seconds(untimed) + shm_call_time(collective, world_size, untimed))
        columns.append([terms.waits, float(collective is not Collective.ALLREDUCE)])
        seconds.append(measured)
    matrix, measured_s = np.array(columns), np.array(seconds)
    weights = 1 / measured_s
    solution, _ = nnls(matrix * weights[:, None], (measured_s - np.array(known)) * weights)
    alpha, planned = (float(v) for v in solution)
    fitted = replace(model, shm_timeshared_alpha=alpha, timeshared_call_overhead=planned)
    return fitted, {"timeshared_alpha_s": alpha, "timeshared_call_overhead_s": planned,
                    "host_cores": model.host_cores, "ranks_per_core": rows[0][1].contention,
                    "rms_relative_error": _rms(fitted, rows), "points": len(rows)}


def _gbps(beta: float) -> float | None:
    return 1e-9 / beta if beta else None


def _rms(model: CostModel, rows: Sequence[tuple[Collective, ShmTerms, float, int]]) -> float:
    """The relative rms error of whole-group shm calls as ``model`` predicts them."""
    errors = [(terms.seconds(model) + shm_call_time(collective, world_size, model)) / measured
              - 1 for collective, terms, measured, world_size in rows]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def last_level_cache() -> int | None:
    """Bytes of this machine's last-level CPU cache (Linux sysfs), None when it does not say."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        scale = units.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].upper() in units else text
        if digits.isdigit():
            sizes.append((level, int(digits) * scale))
    return max(sizes)[1] if sizes else None


def auto_residual(
    measurements: Sequence[Measurement], topology: Topology, itemsize: int, model: CostModel
) -> dict[str, object]:
    """How well ``auto``'s full model (critical-path replay) predicts the measured medians."""
    rows: list[dict[str, Any]] = []
    errors: list[float] = []
    cache: dict[tuple[str, int], dict[str, float]] = {}
    one_host = any(m.algorithm == "shm" for m in measurements)
    fabric = Fabric((0,) * topology.world_size if one_host else None, native_stages=True)
    for m in measurements:
        key = (m.collective, _numel(m, itemsize))
        if key not in cache:
            cache[key] = choose(Collective(key[0]), topology, key[1], itemsize, model,
                                fabric=fabric).predictions
        predicted = cache[key].get(m.algorithm)
        if predicted is None:
            continue
        rows.append({"collective": m.collective, "algorithm": m.algorithm, "nbytes": m.nbytes,
                     "measured_us": m.median_us, "predicted_us": predicted * 1e6})
        errors.append(predicted * 1e6 / m.median_us - 1.0)
    rms = math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else None
    return {"rms_relative_error": rms, "points": rows}


def _fit_native(
    natives: Sequence[Measurement], topology: Topology, itemsize: int, model: CostModel
) -> tuple[CostModel, dict[str, object]]:
    samples = []
    for m in natives:
        collective, numel = Collective(m.collective), _numel(m, itemsize)
        proxies = _NATIVE_PROXIES.get(collective, ("ring", "halving_doubling"))
        if collective is Collective.REDUCE_SCATTER and model.native_reduce_scatter_allreduce:
            # Gloo runs it as a whole allreduce
            collective, numel = Collective.ALLREDUCE, m.nbytes // itemsize
        candidates = [
            _sample(name, m, topology, itemsize, model, model.native_overhead,
                    model.native_beta_factor, collective, numel)
            for name in proxies
        ]
        samples.append(_in_cache(min(candidates, key=lambda item: item[0])[1], m, topology,
                                 model))
    link = model.link(0)
    if len(samples) < 2:
        return model, {"skipped": "native measured at fewer than two sizes"}
    native_fit = fit_two([s.rounds for s in samples],
                         [s.critical_bytes * link.beta for s in samples],
                         [max(s.seconds - s.known_seconds, 1e-9) for s in samples])
    overhead = max(native_fit.first - link.alpha, 0.0)  # per round = native overhead + alpha
    factor = native_fit.second if native_fit.second > 0 else model.native_beta_factor
    fitted = replace(model, native_overhead=overhead, native_beta_factor=factor)
    return fitted, {"per_round_s": native_fit.first, "native_overhead_s": overhead,
                    "native_beta_factor": factor,
                    "rms_relative_error": native_fit.rms_relative_error,
                    "points": native_fit.points}


def describe(summary: dict[str, Any]) -> str:
    """One line of the fitted values and residuals for the console."""
    link = summary["link"]
    text = (f"calibration: {link['per_round_s'] * 1e6:.1f} us per round (alpha "
            f"{link['alpha_s'] * 1e6:.1f} us + overhead {summary['overhead_s'] * 1e6:.1f} us), "
            f"link {link['bandwidth_gbps'] or 0:.3f} GB/s, "
            + ("kept from the earlier calibration (ranks outnumber the cores)" if link.get("kept")
               else f"fit error {link['rms_relative_error']:.0%}"))
    shm = summary.get("shm") or {}
    if "alpha_s" in shm:
        text += (f"; shared memory {shm['direct_call_overhead_s'] * 1e6:.1f} us per direct "
                 f"call, {shm['call_overhead_s'] * 1e6:.1f} us per planned call, "
                 f"{shm['alpha_s'] * 1e6:.1f} us per wait, {shm['bandwidth_gbps'] or 0:.2f} GB/s "
                 f"copies in the cache ({shm['cache_bytes'] >> 20} MiB), "
                 f"{shm['memory_bandwidth_gbps'] or 0:.2f} GB/s beyond it, "
                 f"fit error {shm['rms_relative_error']:.0%}")
    if "timeshared_alpha_s" in shm:
        text += (f"; shared memory with {shm['ranks_per_core']:.1f} ranks per core: "
                 f"{shm['timeshared_alpha_s'] * 1e6:.1f} us per wait, "
                 f"{shm['timeshared_call_overhead_s'] * 1e6:.1f} us more per planned call, "
                 f"fit error {shm['rms_relative_error']:.0%}")
    native = summary.get("native") or {}
    if "native_beta_factor" in native:
        text += (f"; native overhead {native['native_overhead_s'] * 1e6:.1f} us, bandwidth "
                 f"factor {native['native_beta_factor']:.2f}, "
                 f"fit error {native['rms_relative_error']:.0%}")
    auto = summary.get("auto") or {}
    if auto.get("rms_relative_error") is not None:
        text += f"; auto's model vs measured: {auto['rms_relative_error']:.0%} rms"
    return text


@dataclass(frozen=True)
class Native:
    """One measured median of the backend's own collective, with the plans' topology."""

    collective: str
    nbytes: int
    world_size: int
    median_s: float
    planned: Topology
    itemsize: int


def load_natives(paths: Sequence[Path], topology: str | None = None) -> list[Native]:
    """The ``native`` measurements of the benchmark files (planned topology as the bench's)."""
    return [Native(row.collective, row.nbytes, row.world_size, row.median_s,
                   row_topologies(row, topology, "block")[0], row.itemsize)
            for row in read_rows(paths) if row.algorithm == "native"]


def fit_native(natives: Sequence[Native], model: CostModel) -> tuple[CostModel, str]:
    """``model`` with ``native``'s overhead and bandwidth factor fitted (as :func:`calibrate`
    fits them) on the largest group of native measurements sharing a topology and dtype
    (``model`` unchanged, and why, when it could not fit)."""
    groups: dict[tuple[str, int], list[Native]] = {}
    for native in natives:
        groups.setdefault((native.planned.spec, native.itemsize), []).append(native)
    if not groups:
        return model, "native: not measured, prior kept"
    group = max(groups.values(), key=len)
    planned = group[0].planned
    # the fit normalises by links[0] (one host); across hosts the backend's ring-like rounds
    # wait on the outermost link crossed, so fit against that link and keep the real ones
    outer = max((axis for axis, size in enumerate(planned.axes) if size > 1), default=0)
    measured = [Measurement(n.collective, "native", n.nbytes, n.world_size, (n.median_s,))
                for n in group]
    fitted, summary = _fit_native(measured, planned, group[0].itemsize,
                                  replace(model, links=(model.link(outer),)))
    if "native_beta_factor" not in summary:
        return model, f"native: {summary.get('skipped', 'not fitted')}, prior kept"
    fitted = replace(model, native_overhead=fitted.native_overhead,
                     native_beta_factor=fitted.native_beta_factor)
    return fitted, (f"native: overhead {fitted.native_overhead * 1e6:.1f} us per round beyond "
                    f"alpha, bandwidth factor {fitted.native_beta_factor:.2f} "
                    f"({len(group)} measurements on {group[0].planned.spec})")
