"""The iteration model: never more than linear speedup, overlap, EASGD periods, profiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.compiled import compile_schedules
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.iteration import round_robin_schedules, simulate_iteration
from scaledl.sim.losses import Cycle, Losses, Stack
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.profile import Layer, ModelProfile, profile_model
from scaledl.topology import Topology


def _profile(sizes: list[int], flops: list[float], per_bucket: int) -> ModelProfile:
    layers = tuple(Layer(f"l{i}", 4 * n, f) for i, (n, f) in enumerate(zip(sizes, flops)))
    order = list(reversed(range(len(layers))))
    buckets = tuple(
        (sum(sizes[i] for i in order[k:k + per_bucket]), tuple(sorted(order[k:k + per_bucket])))
        for k in range(0, len(order), per_bucket)
    )
    return ModelProfile("random", layers, buckets)


def _network(alpha: float, gbps: float, overhead: float) -> Network:
    return Network("random", LinkClass.from_bandwidth("in", alpha / 4, gbps * 4),
                   LinkClass.from_bandwidth("out", alpha, gbps), overhead=overhead,
                   gamma=1e-11)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    flops=st.floats(1e3, 1e9),
    axes=st.sampled_from([(1,), (2,), (2, 2), (3, 2), (2, 2, 2), (4, 3)]),
    algorithm=st.sampled_from(["ring", "tree", "halving_doubling", "chain", "hierarchical"]),
    strategy=st.sampled_from(["allreduce", "reduce-broadcast", "sync-easgd",
                              "easgd"]),
    alpha=st.floats(0, 1e-3), gbps=st.floats(0.01, 100), overhead=st.floats(0, 1e-4),
    batch=st.integers(1, 64), tau=st.integers(1, 8), overlap=st.booleans(),
    kappa=st.floats(0, 2), cv=st.floats(0, 0.2), call=st.floats(0, 1e-3),
    cycle=st.sampled_from([None, 0.0, 1e-3, 5e-3]),
)
def test_never_more_than_linear_speedup(
    sizes: list[int], flops: float, axes: tuple[int, ...], algorithm: str, strategy: str,
    alpha: float, gbps: float, overhead: float, batch: int, tau: int, overlap: bool,
    kappa: float, cv: float, call: float, cycle: float | None,
) -> None:
    if strategy == "reduce-broadcast" and algorithm in ("ring", "halving_doubling"):
        algorithm = "tree"
    profile = _profile(sizes, [flops] * len(sizes), 2)
    sim = CollectiveSimulator(Topology(axes, explicit=True), _network(alpha, gbps, overhead))
    stack = Stack("random", call, call / 2, None if cycle is None else Cycle(cycle, 4096))
    losses = Losses(kappa, cv, stack)
    result = simulate_iteration(profile, sim, batch, strategy, algorithm, flops=1e12,
                                update_s=1e-4, tau=tau, overlap=overlap, losses=losses)
    assert 0 < result.efficiency <= 1.0
    assert result.iteration_s >= result.compute_s + result.update_s
    assert 0 <= result.communication_share < 1


def test_one_gpu_and_a_free_network_scale_perfectly() -> None:
    profile = _profile([1000, 2000, 3000], [1e6, 2e6, 3e6], 1)
    free = Network("free", LinkClass("a", 0, 0), LinkClass("b", 0, 0), rack_latency=0)
    for axes in [(1,), (4, 2)]:
        sim = CollectiveSimulator(Topology(axes, explicit=True), free)
        assert simulate_iteration(profile, sim, 8, flops=1e9).efficiency == pytest.approx(1.0)


def test_overlap_hides_all_but_the_last_bucket() -> None:
    profile = _profile([100_000] * 4, [1e8] * 4, 1)
    sim = CollectiveSimulator(Topology((4,), explicit=True), _network(1e-5, 1.0, 0.0))
    hidden = simulate_iteration(profile, sim, 16, "allreduce", "ring", flops=1e12)
    exposed = simulate_iteration(profile, sim, 16, "allreduce", "ring", flops=1e12,
                                 overlap=False)
    last = sim.time("ring", Collective.ALLREDUCE, 100_000)
    assert exposed.exposed_s == pytest.approx(exposed.communication_s)
    assert hidden.exposed_s == pytest.approx(last, rel=1e-9)
    assert hidden.iteration_s < exposed.iteration_s


def test_round_robin_exchange_is_sequential() -> None:
    p, numel, alpha, gbps = 6, 10_000, 1e-5, 2.0
    net = Network("rr", LinkClass.from_bandwidth("a", alpha, gbps),
                  LinkClass.from_bandwidth("b", alpha, gbps), share_host_interface=False)
    compiled = compile_schedules(round_robin_schedules(p, numel), p, 4)
    got = makespan(compiled, cost(compiled, Topology((p,), explicit=True), net))
    assert got == pytest.approx((p - 1) * 2 * (alpha + numel * 4 / (gbps * 1e9)), rel=1e-9)


def test_easgd_period_divides_the_exchange() -> None:
    profile = _profile([50_000] * 3, [1e7] * 3, 3)
    sim = CollectiveSimulator(Topology((2, 4), explicit=True), _network(1e-5, 0.5, 0.0))
    every = simulate_iteration(profile, sim, 4, "easgd", flops=1e12, tau=1)
    fourth = simulate_iteration(profile, sim, 4, "easgd", flops=1e12, tau=4)
    assert fourth.communication_s == pytest.approx(every.communication_s / 4)
    assert every.communication_share > fourth.communication_share


@pytest.mark.parametrize("compute_s", [0.5, 1e-4])
def test_round_robin_worker_waits_only_for_its_own_turn(compute_s: float) -> None:
    p, tau, update_s = 5, 2, 1e-3
    profile = _profile([200_000], [1e7], 1)
    net = Network("rr", LinkClass.from_bandwidth("a", 1e-5, 1.0),
                  LinkClass.from_bandwidth("b", 1e-5, 1.0), share_host_interface=False)
    sim = CollectiveSimulator(Topology((p,), explicit=True), net)
    compiled = compile_schedules(round_robin_schedules(p, 200_000), p, 4)
    round_s = makespan(compiled, cost(compiled, sim.topology, net))
    exchange = round_s / (p - 1)
    got = simulate_iteration(profile, sim, 4, "easgd", compute_time=compute_s,
                             update_s=update_s, tau=tau)
    # a cycle of tau steps: the worker's own loop, or the master's round of P - 1 exchanges
    expected = max(tau * (compute_s + update_s) + exchange, (p - 1) * exchange) / tau
    assert got.iteration_s == pytest.approx(expected, rel=1e-9)
    assert got.communication_s == pytest.approx(round_s / tau, rel=1e-9)


def test_profile_buckets_cover_every_parameter() -> None:
    profile = profile_model("lenet", bucket_bytes=20_000)
    assert len(profile.buckets) > 1
    assert sum(n for n, _ in profile.buckets) * 4 == profile.parameter_bytes
    owners = {i for _, layers in profile.buckets for i in layers}
    assert owners == set(range(len(profile.layers)))
    assert profile.forward_flops > 0


def test_sweep_topologies_fill_inner_axes_first() -> None:
    from scaledl.sim.sweep import sweep_topologies

    def axes(*target: int) -> list[tuple[int, ...]]:
        return [t.axes for t in sweep_topologies(Topology(target, explicit=True))]

    assert axes(4, 16, 4) == [(1, 1, 1), (2, 1, 1), (4, 1, 1), (4, 2, 1), (4, 4, 1), (4, 8, 1),
                              (4, 16, 1), (4, 16, 2), (4, 16, 4)]
    assert [t[0] * t[1] for t in axes(16, 10)] == [1, 2, 4, 8, 16, 32, 64, 128, 160]
    # axes that are not powers of two: every job is a corner of the cluster, never 1-GPU hosts
    # of a cluster of 3-GPU hosts (the sweep used to price 2 GPUs as 1x2 across InfiniBand)
    assert axes(3, 8) == [(1, 1), (2, 1), (3, 1), (3, 2), (3, 4), (3, 8)]
    assert axes(6, 2, 2) == [(1, 1, 1), (2, 1, 1), (4, 1, 1), (6, 1, 1), (6, 2, 1), (6, 2, 2)]
    assert axes(1, 64)[:3] == [(1, 1), (1, 2), (1, 4)] and axes(1, 64)[-1] == (1, 64)
    assert axes(1) == [(1,)]
