"""What a prediction reports adds up: the parts of the time beyond one GPU stay inside it, one
GPU is the baseline of every loss, and an option never makes a job faster by dropping a cost
(each case here was a silently wrong result a review found)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.sim.scenario import resolve
from scaledl.sim.job import Job
from scaledl.sim.sweep import run_sweep

BASE = Job(model="resnet50", gpus=64, topology="4x16", batch=32)


def _parts(result: object) -> float:
    return sum(getattr(result, name) for name in
               ("straggler_s", "software_s", "interference_s", "input_s", "timeshare_s"))


@pytest.mark.parametrize("stack", ["horovod", "horovod-0.21", "nccl"])
def test_one_gpu_is_the_baseline_whatever_the_stack(stack: str) -> None:
    """Horovod's DistributedOptimizer reduces nothing on one rank (``if size() > 1``), so one
    GPU pays no negotiation cycle: exactly 100%."""
    one = resolve(replace(BASE, gpus=1, topology="1", stack=stack,
                          cycle_ms=50.0 if "horovod" in stack else None)).run()
    assert one.efficiency == 1.0 and one.exposed_s == 0.0


def test_horovod_without_overlap_still_waits_for_its_cycle() -> None:
    """Gradients handed to Horovod after backward wait for the next wake-up like any other:
    not overlapping is never faster than overlapping, and a longer cycle costs more."""
    job = replace(BASE, stack="horovod", cycle_ms=50.0)
    assert resolve(replace(job, overlap=False)).run().iteration_s >= resolve(job).run().iteration_s
    assert resolve(replace(job, overlap=False)).run().iteration_s > \
        resolve(replace(job, overlap=False, cycle_ms=1.0)).run().iteration_s


def test_reduce_broadcast_books_waiting_for_broadcasts_as_communication() -> None:
    """Forward waits for each layer's broadcast: that is communication, not interference (the
    ideal model has none, and interference is at most kappa times the compute)."""
    job = replace(BASE, strategy="reduce-broadcast", algorithm="tree", network="10gbe")
    ideal = resolve(replace(job, lossless=True)).run()
    assert ideal.interference_s == pytest.approx(0.0, abs=1e-12)
    full = resolve(job).run()
    assert full.interference_s <= 0.189 * full.compute_s + 1e-12
    assert full.communication_share > 0.5  # most of this 10 GbE step is waiting


@pytest.mark.parametrize("rate", [10.0, 100.0, 400.0, 1000.0])
def test_the_input_pipeline_is_a_part_of_the_time_beyond_one_gpu(rate: float) -> None:
    for gpus, topology in ((1, "1"), (8, "4x2")):
        result = resolve(replace(BASE, gpus=gpus, topology=topology, input_rate=rate)).run()
        assert result.input_s <= result.exposed_s + 1e-12
        assert _parts(result) <= result.exposed_s + 1e-12


def test_shared_cores_count_against_one_rank_with_a_core_of_its_own() -> None:
    """With ``--cores`` the efficiency is per-rank throughput at P over one rank alone, so it
    matches the sweep's own throughput, and the time-sharing loss is its own part."""
    job = Job(model="resnet20", device="cpu", network="1gbit", gpus=8, topology="4x2", cores=2,
              batch=32)
    scenario = resolve(job)
    results = run_sweep(scenario.topology, scenario.run)
    one = results[0]
    for result in results:
        per_rank = result.samples_per_s / result.world_size
        assert result.efficiency == pytest.approx(per_rank / one.samples_per_s, rel=1e-9)
        assert _parts(result) <= result.exposed_s + 1e-12
    assert results[-1].timeshare_s > 0
