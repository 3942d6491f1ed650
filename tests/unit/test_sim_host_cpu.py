"""The host terms of the replay against closed forms on tiny cases: processor sharing of the
cores among one round's ranks, the sender's extra cost per flow leaving a host, the backend's
own collectives as CPU work and its reduce_scatter priced as it runs (Gloo: a whole allreduce;
NCCL: its own), and the burst a shaped emulated link passes after idling."""

from __future__ import annotations

import pathlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaledl.collectives.auto import _native_time
from scaledl.collectives.cost import CostModel, stage_time
from scaledl.cluster.spec import ClusterSpec, parse_rate
from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.sim.collective import compile_collective
from scaledl.sim.fastreplay import cost, critical_path, makespan
from scaledl.sim.hostcpu import shared_cores, stage_seconds
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.scenario import contention, job_network, job_profile, layer_times, stretch
from scaledl.sim.job import Job
from scaledl.sim.presets import DEVICES, TCP_PAYLOAD, build_network
from scaledl.topology import Topology

FREE = Network("free", LinkClass("a", 0, 0), LinkClass("b", 0, 0), rack_latency=0)
TWO_BY_TWO = Topology.parse("2x2")


def test_one_core_per_rank_leaves_the_work_as_it_is() -> None:
    work = np.array([3.0, 1.0, 0.0, 2.0])
    assert shared_cores(work, 4, 1, 1.0).tolist() == work.tolist()


def test_equal_works_stretch_by_the_contention() -> None:
    work = np.full(6 * 3, 2.0)
    assert np.allclose(shared_cores(work, 6, 3, 3.0), 6.0, rtol=1e-12)


def test_two_heavy_and_two_light_ranks_on_two_cores() -> None:
    """Four ranks, two cores, one round: the light ones (1 s) run at half a core and end at
    2 s; then each heavy one (3 s) has a core for its last 2 s and ends at 4 s, the total work
    over the cores, where a fixed stretch would give 6 s."""
    work = np.array([3.0, 1.0, 3.0, 1.0])
    assert shared_cores(work, 4, 1, 2.0).tolist() == pytest.approx([4.0, 2.0, 4.0, 2.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=2, max_size=8), st.floats(1.0, 4.0))
def test_sharing_is_bounded_by_each_work_and_by_the_cores(works: list[float],
                                                          contention: float) -> None:
    work = np.array(works)
    finish = shared_cores(work, len(works), 1, contention)
    cores = len(works) / contention
    assert np.all(finish >= work * (1 - 1e-12))
    assert np.all(finish <= work.max() * contention * (1 + 1e-12) + 1e-12)
    assert finish.max() >= max(work.max(), work.sum() / cores) * (1 - 1e-9)
    order = np.argsort(work, kind="stable")
    assert np.all(np.diff(finish[order]) >= -1e-9)  # the lighter finish first


def test_a_ring_on_two_hosts_shares_two_cores() -> None:
    """Ring allreduce of n bytes on 2x2 (block layout): every round moves n/4 per rank; ranks 1
    and 3 send off their host (cpu_beta + link each byte), 0 and 2 on loopback, and every
    receive costs cpu_beta.  On two cores a round takes the total work over two cores."""
    n, beta, link = 1 << 20, 1e-9, 3e-9
    network = replace(FREE, cpu_beta=beta, cpu_beta_link=link, cpu_contention=2.0)
    compiled = compile_collective("ring", Collective.ALLREDUCE, TWO_BY_TWO, n // 4)
    heavy, light = n / 4 * (2 * beta + link), n / 4 * 2 * beta
    want = 6 * (2 * heavy + 2 * light) / 2
    assert makespan(compiled, cost(compiled, TWO_BY_TWO, network)) == pytest.approx(want, 1e-12)


def test_flows_leaving_one_host_together_cost_their_senders_more() -> None:
    """torus[ring,ring] on 2x2: the axis-1 phase is two rounds in which both ranks of each host
    send n/4 bytes to the other host at once, so each byte costs its sender 2 x link; the
    axis-0 phase stays on the host and costs nothing here (cpu_beta = 0)."""
    n, link = 1 << 20, 2e-9
    network = replace(FREE, cpu_beta_link=link)
    compiled = compile_collective("torus[ring,ring]", Collective.ALLREDUCE, TWO_BY_TWO, n // 4)
    want = 2 * n / 4 * link * 2
    assert makespan(compiled, cost(compiled, TWO_BY_TWO, network)) == pytest.approx(want, 1e-12)


def test_a_native_reduce_scatter_stage_is_a_whole_allreduce_on_gloo() -> None:
    members, numel = 3, 3000
    stage = Stage(Collective.REDUCE_SCATTER, tuple(range(members)), 0, numel, Path.NATIVE,
                  level=1)
    nccl = CostModel(native_reduce_scatter_allreduce=False)
    gloo = CostModel(native_reduce_scatter_allreduce=True)
    allreduce = replace(stage, collective=Collective.ALLREDUCE)
    assert stage_time(stage, 4, gloo) == pytest.approx(stage_time(allreduce, 4, gloo), 1e-12)
    link = nccl.link(1)
    ring = (members - 1) * (nccl.native_overhead + link.alpha
                            + numel * 4 / members * link.beta * nccl.native_beta_factor)
    assert stage_time(stage, 4, nccl) == pytest.approx(ring, rel=1e-12)
    assert stage_time(stage, 4, gloo) > stage_time(stage, 4, nccl)


def test_the_native_reduce_scatter_follows_the_backend() -> None:
    topo = Topology((4,), explicit=True)
    gloo = _native_time(Collective.REDUCE_SCATTER, topo, 1 << 16, 4, CostModel(), 0)
    whole = _native_time(Collective.ALLREDUCE, topo, 4 << 16, 4, CostModel(), 0)
    nccl = _native_time(Collective.REDUCE_SCATTER, topo, 1 << 16, 4,
                        CostModel(native_reduce_scatter_allreduce=False), 0)
    assert gloo == pytest.approx(whole, rel=1e-12)
    assert nccl < gloo


def test_the_simulator_prices_native_stages_by_the_devices_backend() -> None:
    assert DEVICES["cpu"].backend == "gloo"
    assert all(d.backend != "gloo" for name, d in DEVICES.items() if name != "cpu")
    cpu = Job(model="mlp", device="cpu", gpus=4, topology="2x2", network="1gbit")
    gpu = Job(model="mlp", device="v100", gpus=4, topology="2x2", network="1gbit")
    assert job_network(cpu).native_reduce_scatter_allreduce
    assert not job_network(gpu).native_reduce_scatter_allreduce


def test_a_native_stage_across_hosts_is_cpu_work_where_bytes_pass_through_tcp() -> None:
    """Gloo's allreduce of n bytes between two hosts, two such stages leaving each host at once,
    two ranks per core: each member sends and receives n (2 (L-1)/L n with L = 2); a sent byte
    costs cpu_beta + 2 x link, a received one cpu_beta."""
    n, beta, link = 8 << 20, 1e-9, 3e-9
    network = replace(FREE, cpu_beta=beta, cpu_beta_link=link, cpu_contention=2.0,
                      native_reduce_scatter_allreduce=True)
    model = network.to_cost_model()
    stage = Stage(Collective.ALLREDUCE, (0, 2), 0, n // 4, Path.NATIVE, level=1)
    want = n * (beta + 2 * link + beta) * 2.0
    assert want > stage_time(stage, 4, model, 2)
    assert stage_seconds(stage, 4, model, network, 2) == pytest.approx(want, rel=1e-12)
    scatter = replace(stage, collective=Collective.REDUCE_SCATTER)  # Gloo: a whole allreduce
    assert stage_seconds(scatter, 4, model, network, 2) == pytest.approx(want, rel=1e-12)
    gather = replace(stage, collective=Collective.ALLGATHER)
    assert stage_seconds(gather, 4, model, network, 2) == pytest.approx(want / 2, rel=1e-12)
    inside = replace(stage, level=0)
    assert stage_seconds(inside, 4, model, network, 2) == pytest.approx(n * 2 * beta * 2.0,
                                                                        rel=1e-12)
    shm = replace(stage, path=Path.SHM)
    assert stage_seconds(shm, 4, model, network, 2) == pytest.approx(
        stage_time(shm, 4, model) * 2.0, rel=1e-12)


def test_an_idle_shaped_link_passes_its_burst_at_once() -> None:
    """Ring allreduce of n bytes between two hosts of one rank each: two rounds of n/2; the
    first leaves a full token bucket of b bytes at once, the second pays every byte."""
    n, burst = 1 << 20, 100_000.0
    link = LinkClass.from_bandwidth("shaped", 1e-4, 0.1)
    network = Network("t", link, link, burst_bytes=burst)
    topo = Topology.parse("1x2")
    compiled = compile_collective("ring", Collective.ALLREDUCE, topo, n // 4)
    want = 2 * link.alpha + (n - burst) * link.beta
    assert makespan(compiled, cost(compiled, topo, network)) == pytest.approx(want, rel=1e-12)
    huge = replace(network, burst_bytes=10.0 * n)  # never below the latency
    assert makespan(compiled, cost(compiled, topo, huge)) == pytest.approx(
        2 * link.alpha + n / 2 * link.beta, rel=1e-12)
    with pytest.raises(ValueError, match="burst"):
        replace(network, burst_bytes=-1.0)


@pytest.mark.parametrize("rate", ["100mbit", "1gbit", "10gbit"])
def test_the_emulated_presets_burst_is_the_clusters_token_bucket(rate: str) -> None:
    spec = ClusterSpec("b", 2, parse_rate(rate), 0)
    assert build_network(rate, "loopback", 0.0).burst_bytes == pytest.approx(
        spec.burst_bytes * TCP_PAYLOAD, rel=1e-12)
    assert build_network("ib-edr", "nvlink1", 0.0).burst_bytes == 0.0


def test_the_burst_is_one_per_host_interface() -> None:
    """halving-doubling on 3x2 leaves host 0 in two successive rounds: only the first finds the
    bucket full, and every host spends it once."""
    topo = Topology.parse("3x2")
    link = LinkClass.from_bandwidth("shaped", 1e-4, 0.1)
    network = Network("t", link, link, burst_bytes=1000.0)
    compiled = compile_collective("halving_doubling", Collective.ALLREDUCE, topo, 1 << 16)
    spent = cost(compiled, topo, replace(network, burst_bytes=0.0)).out - cost(
        compiled, topo, network).out
    nodes = np.flatnonzero(spent.sum(axis=1))
    hosts = {topo.node(int(node // compiled.max_rounds)) for node in nodes}
    assert hosts == {0, 1}
    for host in hosts:
        mine = [int(n % compiled.max_rounds) for n in nodes
                if topo.node(int(n // compiled.max_rounds)) == host]
        assert len(set(mine)) == 1  # one round per host
    assert np.allclose(spent[nodes].max(axis=1), 1000.0)


def test_a_burst_that_covers_a_rounds_bytes_still_pays_its_latency_on_the_critical_path() -> None:
    topo = TWO_BY_TWO
    network = Network("t", LinkClass.from_bandwidth("in", 5e-6, 10.0),
                      LinkClass.from_bandwidth("out", 300e-6, 0.125))
    compiled = compile_collective("ring", Collective.ALLREDUCE, topo, 1024)
    plain = critical_path(compiled, cost(compiled, topo, network))
    burst = critical_path(compiled, cost(compiled, topo, replace(network, burst_bytes=1.3e5)))
    assert burst.alpha_counts == plain.alpha_counts
    assert burst.known == pytest.approx(plain.known, abs=1e-12)


def test_a_calibrated_emulated_network_keeps_its_burst_and_an_overridden_rate_has_none(
        tmp_path: pathlib.Path) -> None:
    job = Job(model="mlp", device="cpu", gpus=4, topology="2x2", network="1gbit")
    burst = job_network(job).burst_bytes
    assert burst > 0
    calibration = tmp_path / "cal.json"
    calibration.write_text(job_network(job).to_cost_model().to_json())
    assert job_network(replace(job, calibration=calibration)).burst_bytes == burst
    assert job_network(replace(job, inter_gbps=0.5)).burst_bytes == 0.0


@pytest.mark.parametrize("backend, whole", [("gloo", True), ("nccl", False), ("mpi", False)])
def test_only_gloo_runs_reduce_scatter_as_a_whole_allreduce(backend: str, whole: bool) -> None:
    flipped = CostModel(native_reduce_scatter_allreduce=not whole)
    assert flipped.for_backend(backend).native_reduce_scatter_allreduce is whole
    assert flipped.for_backend(backend).links == flipped.links


@pytest.mark.parametrize(("ranks", "cores", "expected"), [
    (4, 2, 2 * (1 + 0.5 * 0.17)),   # twice oversubscribed: waits half the time for a core
    (6, 2, 3 * (1 + 2 / 3 * 0.17)),
    (2, 2, 1.0),                    # a core per rank: no sharing, no loss
    (1, 4, 1.0),
])
def test_time_sharing_stretches_compute_beyond_the_fair_share(
        ranks: int, cores: int, expected: float) -> None:
    job = Job(model="mlp", device="cpu", gpus=ranks, topology=str(ranks), cores=cores)
    assert DEVICES["cpu"].timeshare == pytest.approx(0.17)
    assert stretch(job, ranks) == pytest.approx(expected)
    assert contention(job, ranks) == pytest.approx(max(1.0, ranks / cores)), \
        "collectives' CPU work keeps the fair share its constants were fitted with"
    profile = job_profile(job)
    alone = layer_times(replace(job, cores=None), profile, ranks)
    shared = layer_times(job, profile, ranks)
    assert sum(shared[0]) == pytest.approx(sum(alone[0]) * expected)
    assert sum(shared[1]) == pytest.approx(sum(alone[1]) * expected)


def test_time_sharing_is_off_for_dedicated_cores_gpus_and_the_ideal_model() -> None:
    assert stretch(Job(device="cpu", gpus=4, topology="4"), 4) == 1.0
    assert stretch(Job(device="cpu", gpus=4, topology="4", cores=2, lossless=True), 4) == 1.0
    assert stretch(Job(device="p100", gpus=4, topology="4", cores=2), 4) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="time-sharing"):
        replace(DEVICES["cpu"], timeshare=-0.1)
