"""Replaying every rank's plan together: sends meet receives of the same size, no deadlock,
and the predicted time equals the closed-form cost on a uniform network."""

from __future__ import annotations

import math

import pytest

from scaledl.collectives.registry import ALGORITHMS, plan
from scaledl.collectives.cost import LinkCost
from scaledl.collectives.replay import replay
from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, ScheduleError, Transfer,
)
from scaledl.topology import Topology
from tests.helpers_loopback import topologies

ALPHA, BETA = 1e-5, 1e-9
UNIFORM = LinkCost(ALPHA, BETA)


def _replay(name: str, collective: Collective, topology: Topology, numel: int, root: int = 0):
    ranks = range(topology.world_size)
    schedules = [plan(name, collective, topology, r, numel, root) for r in ranks]
    return replay(schedules, lambda a, b: UNIFORM, itemsize=4,
                  stage_time=lambda stage, sharers: ALPHA + BETA * 4 * stage.numel)


@pytest.mark.parametrize("name", [n for n, a in ALGORITHMS.items() if a.scheduled])
def test_every_plan_pairs_up(name: str) -> None:
    algo = ALGORITHMS[name]
    for p in range(1, 13):
        layouts = topologies(p) if algo.needs_topology else [Topology.flat(p)]
        for topology in layouts:
            for collective in algo.supports:
                for numel in (0, 1, p + 1, 4099):
                    for root in {0, p - 1}:
                        _replay(name, collective, topology, numel, root)


def test_ring_allreduce_matches_closed_form() -> None:
    for p in (2, 3, 4, 8):
        n = 4096 * p
        got = _replay("ring", Collective.ALLREDUCE, Topology.flat(p), n).makespan
        want = 2 * (p - 1) * (ALPHA + BETA * 4 * n / p)
        assert math.isclose(got, want, rel_tol=1e-9), (p, got, want)


def test_halving_doubling_matches_closed_form_on_powers_of_two() -> None:
    for p in (2, 4, 8, 16):
        n = 1024 * p
        got = _replay("halving_doubling", Collective.ALLREDUCE, Topology.flat(p), n).makespan
        want = sum(2 * (ALPHA + BETA * 4 * n / 2 ** (k + 1)) for k in range(int(math.log2(p))))
        assert math.isclose(got, want, rel_tol=1e-9), (p, got, want)


def test_tree_broadcast_matches_closed_form() -> None:
    for p in (2, 4, 5, 8):
        got = _replay("tree", Collective.BROADCAST, Topology.flat(p), 1000).makespan
        assert math.isclose(got, math.ceil(math.log2(p)) * (ALPHA + BETA * 4000), rel_tol=1e-9)


def test_chain_broadcast_is_pipelined() -> None:
    p, segments, segment = 6, 8, 1 << 18
    got = _replay("chain", Collective.BROADCAST, Topology.flat(p), segments * segment).makespan
    want = (p - 1 + segments - 1) * (ALPHA + BETA * 4 * segment)
    assert math.isclose(got, want, rel_tol=1e-9), (got, want)


def test_torus_matches_closed_form() -> None:
    axes = (2, 3, 2)
    topology = Topology(axes, explicit=True)
    n = 12 * 1000
    got = _replay("torus", Collective.ALLREDUCE, topology, n).makespan
    want, share = 0.0, n
    for size in axes:
        share /= size
        want += 2 * (size - 1) * (ALPHA + BETA * 4 * share)
    assert math.isclose(got, want, rel_tol=1e-9), (got, want)


def test_replay_detects_a_missing_receive() -> None:
    lonely = Schedule(Collective.BROADCAST, "broken", 0, 2, 4,
                      (Round((Transfer(Action.SEND, 1, 0, 4),)),))
    deaf = Schedule(Collective.BROADCAST, "broken", 1, 2, 4, ())
    with pytest.raises(ScheduleError, match="never received"):
        replay([lonely, deaf], lambda a, b: UNIFORM, 4)
    waiting = Schedule(Collective.BROADCAST, "broken", 1, 2, 4,
                       (Round((Transfer(Action.RECV_COPY, 0, 0, 4),)),))
    with pytest.raises(ScheduleError, match="deadlocked"):
        replay([Schedule(Collective.BROADCAST, "broken", 0, 2, 4, ()), waiting],
               lambda a, b: UNIFORM, 4)
