"""The stack's per-call software cost goes to calls that move bytes through the backend: a call
on shared memory alone pays only its stages (a 64 KiB ``shm`` allreduce takes 0.06 ms on two
ranks of this project's VM where the scaledl stack's cost is 1.44 ms per rank per core)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import CollectiveSimulator, compile_collective
from scaledl.sim.losses import STACKS, Losses
from scaledl.sim.network import on_cores
from scaledl.sim.overlap import call_time
from scaledl.sim.scenario import job_profile, resolve
from scaledl.sim.job import Job
from scaledl.sim.presets import build_network
from scaledl.topology import Topology

NUMEL = 1 << 16
LOSSES = Losses(stack=STACKS["scaledl"])


def _sim(spec: str, contention: float = 2.0, cores_per_rank: float = 0.0
         ) -> CollectiveSimulator:
    network = replace(build_network("10gbit", "loopback", 7e-11), cpu_contention=contention,
                      cores_per_rank=cores_per_rank)
    return CollectiveSimulator(Topology.parse(spec), network)


@pytest.mark.parametrize("algorithm, spec, alone", [
    ("shm", "4", True),
    ("ring", "4", False),
    ("hierarchical[shm,p2p]", "2x2", False),
    ("hierarchical[shm,native]", "2x2", False),
])
def test_only_a_call_without_backend_bytes_is_shared_memory_only(algorithm: str, spec: str,
                                                                  alone: bool) -> None:
    compiled = compile_collective(algorithm, Collective.ALLREDUCE, Topology.parse(spec), NUMEL)
    assert compiled.shared_memory_only is alone


def test_a_shared_memory_call_pays_its_stages_and_no_stack_cost() -> None:
    sim = _sim("4")
    replayed = sim.time("shm", Collective.ALLREDUCE, NUMEL)
    assert replayed > 0
    assert call_time(sim, "shm", Collective.ALLREDUCE, NUMEL, LOSSES) == replayed


def test_a_call_through_the_backend_pays_the_stack_cost_per_rank_per_core() -> None:
    sim = _sim("2x2", contention=2.0)
    replayed = sim.time("hierarchical[shm,p2p]", Collective.ALLREDUCE, NUMEL)
    want = replayed + STACKS["scaledl"].call_overhead_s * 2.0
    assert call_time(sim, "hierarchical[shm,p2p]", Collective.ALLREDUCE, NUMEL,
                     LOSSES) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("cores_per_rank, paid", [(0.0, True), (1.0, True), (1.9, True),
                                                  (2.0, False), (4.0, False)])
def test_the_scaledl_stack_call_is_paid_until_each_rank_has_two_cores(cores_per_rank: float,
                                                                       paid: bool) -> None:
    """The scaledl stack's 1.44 ms is what ranks whose threads share cores pay (two ranks on the
    VM's two cores pay it); six ranks on 16 cores fit it to 0 (sim_validation/raw-h100)."""
    sim = _sim("2x2", contention=1.0, cores_per_rank=cores_per_rank)
    replayed = sim.time("ring", Collective.ALLREDUCE, NUMEL)
    want = replayed + (STACKS["scaledl"].call_overhead_s if paid else 0.0)
    assert call_time(sim, "ring", Collective.ALLREDUCE, NUMEL, LOSSES) == pytest.approx(
        want, rel=1e-12)


@pytest.mark.parametrize("name", ["nccl", "horovod", "tf-replicated", "mpi"])
def test_a_library_call_costs_its_dispatch_whatever_the_cores(name: str) -> None:
    """The GPU stacks' per-call costs are dispatch and launch, paid with cores to spare too."""
    stack = STACKS[name]
    assert not stack.shared_cores_only
    assert stack.call_seconds(1.0, cores_per_rank=4.0) == stack.call_overhead_s > 0
    assert stack.call_seconds(2.0) == pytest.approx(2 * stack.call_overhead_s)
    sim = _sim("2x2", contention=1.0, cores_per_rank=4.0)
    replayed = sim.time("ring", Collective.ALLREDUCE, NUMEL)
    assert call_time(sim, "ring", Collective.ALLREDUCE, NUMEL, Losses(stack=stack)) == \
        pytest.approx(replayed + stack.call_overhead_s, rel=1e-12)


def test_a_job_with_two_cores_per_rank_pays_no_scaledl_call() -> None:
    """``--cores`` reaches the replay: the same job on 4 cores (one per rank) pays 1.44 ms per
    bucket's call more than on 8 (two per rank), and on 2 cores the call stretches."""
    def busy(cores: int) -> float:
        job = Job(model="mlp", device="cpu", network="emulated-10gbit", intra="loopback",
                  gpus=4, topology="2x2", algorithm="ring", batch=32, cores=cores)
        return resolve(job).run().communication_s

    buckets = len(job_profile(Job(model="mlp", device="cpu", gpus=4, topology="2x2")).buckets)
    call = STACKS["scaledl"].call_overhead_s
    assert busy(4) - busy(8) == pytest.approx(buckets * call, rel=1e-6)
    assert busy(8) == busy(16)
    assert busy(2) > busy(4) + buckets * call  # two ranks per core: stretched


def test_cores_set_the_networks_contention_and_no_cores_clear_it() -> None:
    """``on_cores`` owns both fields: a network that an earlier call put on 2 cores is back to
    no contention and unknown cores when the next job names none."""
    network = build_network("emulated-10gbit", "loopback", 7e-11)
    shared = on_cores(network, 4, 2)
    assert (shared.cpu_contention, shared.cores_per_rank) == (2.0, 0.5)
    cleared = on_cores(shared, 4, None)
    assert (cleared.cpu_contention, cleared.cores_per_rank) == (1.0, 0.0)
    assert cleared == network


def test_round_robin_easgd_masters_calls_follow_the_same_rule() -> None:
    """The master's ``2 (P - 1)`` exchanges are calls: 1.44 ms each with a core per rank, none
    with two (and, as before the rule, not stretched by contention)."""
    def busy(cores: int) -> float:
        job = Job(model="mlp", device="cpu", network="emulated-10gbit", intra="loopback",
                  gpus=4, topology="4", strategy="easgd", batch=32, cores=cores)
        return resolve(job).run().communication_s

    assert busy(4) - busy(8) == pytest.approx(2 * 3 * STACKS["scaledl"].call_overhead_s,
                                              rel=1e-6)
