"""Stages in the simulator: the fast replay prices them as the full replay does.

A stage (a whole sub-collective on shared memory or on the backend's own collective) starts when
its last member reaches it and lasts ``stage_time`` on every member; the fast replay ties the
members together with zero-byte markers and must agree with the full replay exactly, and with
the closed forms of :func:`scaledl.collectives.cost.stage_time`.
"""

from __future__ import annotations

import math

import pytest

from scaledl.collectives.cost import stage_time
from scaledl.collectives.registry import plan
from scaledl.collectives.cost import LinkCost
from scaledl.collectives.replay import replay
from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.collectives.shm_ops import stream_piece
from scaledl.sim.collective import compile_collective
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.network import LinkClass, Network
from scaledl.topology import Topology

NET = Network("test", LinkClass("fast", 2e-6, 1 / 10e9), LinkClass("slow", 5e-6, 1 / 1e9),
              overhead=3e-6, gamma=1 / 20e9, chunk_bytes=4096)


def _full(spec: str, collective: Collective, topo: Topology, numel: int, root: int) -> float:
    schedules = [plan(spec, collective, topo, r, numel, root) for r in range(topo.world_size)]
    model = NET.to_cost_model()

    def link_of(a: int, b: int) -> LinkCost:
        link = NET.link_of_axis(topo.link_axis(a, b))
        return LinkCost(link.alpha, link.beta)

    return replay(schedules, link_of, 4, NET.overhead, NET.gamma, NET.chunk_bytes, topo.node,
                  lambda stage, sharers: stage_time(stage, 4, model, sharers)).makespan


SPECS = [
    (spec, collective)
    for inner in ("p2p", "shm", "native") for outer in ("p2p", "shm", "native")
    for spec, collectives in (
        (f"hierarchical[{inner},{outer}]", list(Collective)),
        (f"torus[{inner},{outer}]", [Collective.ALLREDUCE, Collective.REDUCE_SCATTER,
                                     Collective.ALLGATHER]),
    )
    for collective in collectives
] + [("shm", c) for c in Collective]


@pytest.mark.parametrize("spec,collective", SPECS)
@pytest.mark.parametrize("axes", [(2, 2), (3, 2), (2, 2, 2)])
def test_fast_replay_prices_stages_as_the_full_replay(
    spec: str, collective: Collective, axes: tuple[int, ...]
) -> None:
    topo = Topology(axes, explicit=True)
    for numel in (1, 999, 1 << 20):
        root = 1 % topo.world_size
        expected = _full(spec, collective, topo, numel, root)
        compiled = compile_collective(spec, collective, topo, numel, root, 4)
        got = makespan(compiled, cost(compiled, topo, NET))
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-15), (numel, got, expected)


def test_shm_allreduce_stage_matches_its_closed_form() -> None:
    model = NET.to_cost_model()
    members, numel = 4, 3 << 20
    stage = Stage(Collective.ALLREDUCE, tuple(range(members)), 0, numel, Path.SHM)
    nbytes = numel * 4
    pieces = math.ceil(nbytes / stream_piece(model.shm_window))  # 2 MiB pieces, not windows
    cached = 2 * nbytes * min(1.0, model.cache_bytes / (members * nbytes))  # the rest: memory
    want = (3 * pieces * model.shm.alpha + cached * model.shm.beta
            + (2 * nbytes - cached) * model.shm_memory_beta
            + (members - 1) / members * nbytes * model.gamma)
    assert stage_time(stage, 4, model) == pytest.approx(want, rel=1e-12)
    topo = Topology((members,), explicit=True)
    compiled = compile_collective("shm", Collective.ALLREDUCE, topo, numel, 0, 4)
    assert makespan(compiled, cost(compiled, topo, NET)) == pytest.approx(want, rel=1e-12)


def test_native_stage_is_the_backends_ring_on_its_level() -> None:
    model = NET.to_cost_model()
    stage = Stage(Collective.REDUCE_SCATTER, (0, 1, 2), 0, 3000, Path.NATIVE, level=1)
    link = model.link(1)
    step = model.native_overhead + link.alpha
    want = 2 * (step + 3000 * 4 / 3 * link.beta * model.native_beta_factor)
    assert stage_time(stage, 4, model) == pytest.approx(want, rel=1e-12)
