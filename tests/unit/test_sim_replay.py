"""The simulator's fast replay against the full replay and the algorithms' closed forms."""

from __future__ import annotations

import math

import pytest

from scaledl.collectives.registry import ALGORITHMS, plan
from scaledl.collectives.cost import LinkCost
from scaledl.collectives.replay import replay
from scaledl.collectives.schedule import (
    Action, Collective, Round, Schedule, ScheduleError, Transfer,
)
from scaledl.sim.collective import CollectiveSimulator, compile_collective
from scaledl.sim.compiled import compile_schedules
from scaledl.sim.fastreplay import cost, critical_path, makespan
from scaledl.sim.network import LinkClass, Network
from scaledl.topology import Topology

TWO_CLASS = Network("test", LinkClass("fast", 2e-6, 1 / 10e9), LinkClass("slow", 5e-6, 1 / 1e9),
                    overhead=3e-6, gamma=1 / 20e9, chunk_bytes=4096)
ALPHA, BETA = 7e-6, 1 / 2e9
UNIFORM = Network("uniform", LinkClass("u", ALPHA, BETA), LinkClass("u", ALPHA, BETA),
                  rack_latency=0.0, share_host_interface=False)


def _full_replay(name: str, collective: Collective, topo: Topology, numel: int, root: int,
                 net: Network) -> float:
    schedules = [plan(name, collective, topo, r, numel, root) for r in range(topo.world_size)]

    def link_of(a: int, b: int) -> LinkCost:
        link = net.link_of_axis(topo.link_axis(a, b))
        return LinkCost(link.alpha, link.beta)

    return replay(schedules, link_of, 4, net.overhead, net.gamma, net.chunk_bytes,
                  topo.node).makespan


def _fast(name: str, collective: Collective, topo: Topology, numel: int, root: int,
          net: Network, rotation: bool = False) -> float:
    compiled = compile_collective(name, collective, topo, numel, root, 4, use_rotation=rotation)
    return makespan(compiled, cost(compiled, topo, net))


CASES = [(name, collective) for name, algo in ALGORITHMS.items()
         if algo.scheduled and not algo.needs_shm  # stages: test_sim_stages.py
         for collective in sorted(algo.supports, key=lambda c: c.value)]


@pytest.mark.parametrize("name,collective", CASES)
@pytest.mark.parametrize("axes", [(5,), (2, 3), (2, 2, 2)])
def test_fast_replay_equals_full_replay(name: str, collective: Collective,
                                        axes: tuple[int, ...]) -> None:
    topo = Topology(axes, explicit=True)
    p = topo.world_size
    for numel in (1, p - 1, p + 1, 999, 20000):
        root = 1 % p
        expected = _full_replay(name, collective, topo, numel, root, TWO_CLASS)
        got = _fast(name, collective, topo, numel, root, TWO_CLASS)
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-15), (numel, got, expected)


def test_rotation_shortcut_equals_planning_every_rank() -> None:
    topo = Topology((4, 16), explicit=True)
    for name in ("ring", "multiring", "halving_doubling", "torus"):
        for numel in (64 * 300, 64 * 300 + 5):
            a = compile_collective(name, Collective.ALLREDUCE, topo, numel, use_rotation=True)
            b = compile_collective(name, Collective.ALLREDUCE, topo, numel, use_rotation=False)
            assert makespan(a, cost(a, topo, TWO_CLASS)) == pytest.approx(
                makespan(b, cost(b, topo, TWO_CLASS)), rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_closed_forms_on_a_uniform_network(p: int) -> None:
    topo = Topology((p,), explicit=True)
    n = p * 1024
    nbytes = n * 4
    log = math.log2(p)
    sim = CollectiveSimulator(topo, UNIFORM)
    ring = 2 * (p - 1) * (ALPHA + nbytes / p * BETA)
    assert sim.time("ring", Collective.ALLREDUCE, n) == pytest.approx(ring, rel=1e-9)
    tree = 2 * log * (ALPHA + nbytes * BETA)
    assert sim.time("tree", Collective.ALLREDUCE, n) == pytest.approx(tree, rel=1e-9)
    hd = 2 * log * ALPHA + 2 * (p - 1) / p * nbytes * BETA
    assert sim.time("halving_doubling", Collective.ALLREDUCE, n) == pytest.approx(hd, rel=1e-9)


@pytest.mark.parametrize("axes", [(2, 2), (4, 2), (2, 4, 2), (2, 2, 2, 2)])
def test_torus_closed_form_on_a_uniform_network(axes: tuple[int, ...]) -> None:
    topo = Topology(axes, explicit=True)
    n = topo.world_size * 512
    nbytes, expected, shard = n * 4, 0.0, 1
    for size in axes:
        shard *= size
        expected += 2 * (size - 1) * (ALPHA + BETA * nbytes / shard)
    got = CollectiveSimulator(topo, UNIFORM).time("torus", Collective.ALLREDUCE, n)
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("uplink", [None, LinkClass("spine", 9e-6, 1 / 0.5e9)])
def test_oversubscribed_uplink_capacity_is_hosts_times_uplink_bandwidth_over_k(
        uplink: LinkClass | None) -> None:
    # 4 GPUs x 2 hosts x 2 racks; every rank sends n bytes to its twin in the other rack at once
    topo, n, k = Topology((4, 2, 2), explicit=True), 1 << 20, 8.0
    schedules = [_schedule(r, [[Transfer(Action.SEND, (r + 8) % 16, 0, n // 4)],
                               [Transfer(Action.RECV_COPY, (r + 8) % 16, 0, n // 4)]])
                 for r in range(16)]
    compiled = compile_schedules(schedules, 16, 4)
    nets = [Network(f"k={over}", TWO_CLASS.intra, TWO_CLASS.inter, uplink=uplink,
                    rack_latency=1e-6, oversubscription=over) for over in (1.0, k)]
    link = nets[0].classes[2]
    # non-blocking: the 4 ranks of a host share its interface; k = 8: the 8 ranks of a rack share
    # 2 hosts x the uplink class's bandwidth / 8, i.e. each send is charged 8 x 8 / 2 = 32 x n
    for net, weight in zip(nets, (4, 32)):
        got = makespan(compiled, cost(compiled, topo, net))
        assert got == pytest.approx(link.alpha + weight * n * link.beta, rel=1e-9)


def test_shared_host_interface_and_oversubscribed_uplinks_slow_the_ring() -> None:
    topo = Topology((4, 2, 2), explicit=True)
    n = 16 * 4096
    free_net = Network("free", TWO_CLASS.intra, TWO_CLASS.inter, oversubscription=1.0)
    busy_net = Network("over", TWO_CLASS.intra, TWO_CLASS.inter, oversubscription=8.0)
    free = CollectiveSimulator(topo, free_net).time("torus", Collective.ALLREDUCE, n)
    slowed = CollectiveSimulator(topo, busy_net).time("torus", Collective.ALLREDUCE, n)
    assert slowed > free


def _schedule(rank: int, rounds: list[list[Transfer]]) -> Schedule:
    return Schedule(Collective.ALLREDUCE, "handmade", rank, 2, 8,
                    tuple(Round(tuple(r)) for r in rounds))


def test_deadlock_and_unmatched_sends_are_reported() -> None:
    recv_first = [[Transfer(Action.RECV_COPY, 1, 0, 4)], [Transfer(Action.SEND, 1, 0, 4)]]
    recv_first_too = [[Transfer(Action.RECV_COPY, 0, 0, 4)], [Transfer(Action.SEND, 0, 0, 4)]]
    compiled = compile_schedules([_schedule(0, recv_first), _schedule(1, recv_first_too)], 2, 4)
    topo = Topology((2,), explicit=True)
    with pytest.raises(ScheduleError, match="deadlock"):
        makespan(compiled, cost(compiled, topo, TWO_CLASS))
    lonely = [[Transfer(Action.SEND, 1, 0, 4)]]
    with pytest.raises(ScheduleError, match="never received"):
        compile_schedules([_schedule(0, lonely), _schedule(1, [])], 2, 4)


def test_critical_path_reproduces_the_makespan() -> None:
    topo = Topology((2, 3), explicit=True)
    for name in ("ring", "tree", "hierarchical"):
        compiled = compile_collective(name, Collective.ALLREDUCE, topo, 50000)
        costs = cost(compiled, topo, TWO_CLASS)
        path = critical_path(compiled, costs)
        links = TWO_CLASS.classes
        linear = path.known + sum(path.alpha_counts[c] * links[c].alpha
                                  + path.byte_counts[c] * links[c].beta for c in range(3))
        assert linear == pytest.approx(makespan(compiled, costs), rel=1e-9)
