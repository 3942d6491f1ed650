"""What a job's iteration is measured against beyond the schedule's replay: the one-rank
baseline when ranks share cores, and the input pipeline that feeds the ranks."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from scaledl.sim.iteration import IterationResult
from scaledl.sim.profile import default_input

if TYPE_CHECKING:
    from scaledl.sim.job import Job
    from scaledl.sim.network import Network
    from scaledl.topology import Topology

__all__ = ["against_one_rank", "fed_by_pipeline", "job_record"]


def job_record(job: Job, topology: Topology, network: Network) -> dict[str, Any]:
    """``job``'s fields as JSON values with what was used in place of a default left to the
    simulator: the topology's spec, the stack's name, the input shape, the link names, the
    negotiation cycle's period and fusion buffer, the TCP sockets' per-thread rate, and the
    profile's model, precision and layout (paths as text)."""
    data = asdict(job)
    for key in ("calibration", "profile_path"):
        data[key] = str(data[key]) if data[key] else None
    measured = job.measured()
    shape = (measured.input_shape if measured is not None
             else job.input_shape or default_input(job.model)[0])
    cycle = job.cycle()
    sockets = network.cpu_beta > 0 and not network.tcp_inside
    data.update(
        topology=topology.spec, stack=job.stack_name(), input_shape=list(shape),
        intra=network.intra.name, uplink=None if network.uplink is None else network.uplink.name,
        cycle_ms=None if cycle is None else cycle.cycle_s * 1e3,
        fusion_mb=None if cycle is None else cycle.fusion_bytes / (1 << 20),
        socket_gbps=1e-9 / network.cpu_beta if sockets else None)
    if measured is not None:
        data.update(model=measured.model, mixed_precision=measured.mixed_precision,
                    channels_last=measured.channels_last)
    return data


def against_one_rank(result: IterationResult, stretch: float) -> IterationResult:
    """``result`` against one rank with a core of its own: where ranks share cores, its compute
    and update were stretched by ``stretch``, and the one-GPU baseline (which has a core to
    itself) is not, nor the update it includes; the difference is ``timeshare_s``."""
    if stretch == 1.0:
        return result
    single = result.single_gpu_s / stretch
    return replace(result, single_gpu_s=single, exposed_s=result.iteration_s - single,
                   timeshare_s=result.single_gpu_s - single, update_s=result.update_s / stretch)


def fed_by_pipeline(result: IterationResult, ranks_per_host: int,
                    input_rate: float) -> IterationResult:
    """``result`` waiting for the input pipeline: it prepares the next batches while the ranks
    train (prefetching), so an iteration takes at least the ``ranks_per_host x samples /
    input_rate`` seconds one host's pipeline needs for it, and one GPU alone at least ``samples
    / input_rate``, ``samples`` being the iteration's per GPU (every micro-batch's).  The input
    wait is what the pipeline adds beyond both the unfed iteration and the fed single GPU, and
    the other parts stay inside the time beyond one GPU: where a fed single GPU is slower, they
    shrink with what is left of it."""
    samples = result.batch_per_gpu
    iteration = max(result.iteration_s, ranks_per_host * samples / input_rate)
    single = max(result.single_gpu_s, samples / input_rate)
    exposed = iteration - single
    waited = iteration - max(result.iteration_s, single)  # beyond both, the pipeline's
    parts = result.straggler_s + result.software_s + result.interference_s + result.timeshare_s
    share = min(1.0, (exposed - waited) / parts) if parts > 0 else 1.0
    return replace(result, iteration_s=iteration, single_gpu_s=single, exposed_s=exposed,
                   input_s=waited, straggler_s=result.straggler_s * share,
                   software_s=result.software_s * share,
                   interference_s=result.interference_s * share,
                   timeshare_s=result.timeshare_s * share)
