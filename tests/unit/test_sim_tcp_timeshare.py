"""TCP's CPU cost per byte when ranks share cores (``Network.cpu_timeshare``): the multiplier's
closed form, its validation, and that the replay charges it to every TCP byte, point-to-point
and in the backend's own collectives, and only on the cpu device outside ``--ideal``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.sim.collective import compile_collective
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.hostcpu import stage_seconds
from scaledl.sim.scenario import job_network
from scaledl.sim.job import Job
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import CPU_TCP_TIMESHARE
from scaledl.topology import Topology

FREE = Network("free", LinkClass("a", 0, 0), LinkClass("b", 0, 0), rack_latency=0)
POINTS = ((2.0, 1.2), (3.0, 1.8))


def _at(contention: float, points: tuple[tuple[float, float], ...] = POINTS) -> float:
    return replace(FREE, cpu_contention=contention, cpu_timeshare=points).tcp_scale()


def test_the_multiplier_is_one_with_a_core_per_rank_or_no_points() -> None:
    assert _at(1.0) == 1.0
    assert _at(3.0, ()) == 1.0


@pytest.mark.parametrize("contention, want", [
    (1.5, 1.1),   # between one rank per core (1) and the first point
    (2.0, 1.2),   # at a point
    (2.5, 1.5),   # between points
    (3.0, 1.8),
    (4.0, 1.8),   # beyond the last point: held
])
def test_the_multiplier_is_piecewise_linear_in_ranks_per_core(contention: float,
                                                              want: float) -> None:
    assert _at(contention) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("points, named", [
    (((1.0, 1.2),), "1.0 ranks per core"),
    (((3.0, 1.2), (2.0, 1.5)), "2.0 ranks per core"),
    (((2.0, 0.9),), "multiplier 0.9"),
    (((2.0, float("nan")),), "multiplier nan"),
])
def test_a_malformed_point_is_refused_by_name(points: tuple[tuple[float, float], ...],
                                              named: str) -> None:
    with pytest.raises(ValueError, match=named):
        replace(FREE, cpu_timeshare=points)


def test_a_ring_pays_the_multiplier_on_every_tcp_byte() -> None:
    """Ring allreduce on 2x2 at 3 ranks per core: all its time is TCP CPU work (free links, no
    reduction cost), which is linear in the cost per byte, so the multiplier scales it."""
    topology = Topology.parse("2x2")
    compiled = compile_collective("ring", Collective.ALLREDUCE, topology, 1 << 18)
    plain = replace(FREE, cpu_beta=1e-9, cpu_beta_link=3e-9, cpu_contention=3.0)
    shared = replace(plain, cpu_timeshare=POINTS)
    before = makespan(compiled, cost(compiled, topology, plain))
    assert before > 0
    assert makespan(compiled, cost(compiled, topology, shared)) == pytest.approx(
        1.8 * before, rel=1e-12)


def test_a_native_stage_pays_the_multiplier_where_its_bytes_are_cpu_bound() -> None:
    """Gloo's allreduce of n bytes between two hosts at 2 ranks per core: each member sends and
    receives n, at (2 cpu_beta + link) per byte, stretched by the contention and the
    multiplier."""
    n, beta, link = 8 << 20, 1e-9, 3e-9
    network = replace(FREE, cpu_beta=beta, cpu_beta_link=link, cpu_contention=2.0,
                      cpu_timeshare=POINTS, native_reduce_scatter_allreduce=True)
    stage = Stage(Collective.ALLREDUCE, (0, 2), 0, n // 4, Path.NATIVE, level=1)
    want = n * (2 * beta + link) * 2.0 * 1.2
    assert stage_seconds(stage, 4, network.to_cost_model(), network, 1) == pytest.approx(
        want, rel=1e-12)


def test_only_the_cpu_device_has_it_and_the_ideal_model_does_not() -> None:
    assert job_network(Job(device="cpu", network="10gbit")).cpu_timeshare == CPU_TCP_TIMESHARE
    assert job_network(Job(device="cpu", network="10gbit", lossless=True)).cpu_timeshare == ()
    assert job_network(Job(device="v100", network="ib-edr")).cpu_timeshare == ()


def test_the_measured_multipliers_never_fall_as_ranks_per_core_grow() -> None:
    multipliers = [m for _, m in CPU_TCP_TIMESHARE]
    assert multipliers == sorted(multipliers) and multipliers[0] >= 1.0
