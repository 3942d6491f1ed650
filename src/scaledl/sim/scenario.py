"""A scenario: what a checked :class:`~scaledl.sim.job.Job`'s fields resolve to (the topology,
the network it runs on, the device, the losses, the compute model and the model profile), each
computed once by :func:`resolve`, and the prediction of one iteration on it
(:meth:`Scenario.run`).

Each step of the resolution is a function of the job (:func:`job_network`: the preset or
calibrated links with the job's overrides, the stack's share of their rates and the host CPU's
costs of TCP; :func:`job_losses`, :func:`compute_model`, :func:`job_profile`, ...), so that a
front end can resolve the parts one by one (``scaledl simulate`` warns between them) and hand
them to :func:`resolve`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scaledl.collectives.auto import CostModel
from scaledl.collectives.cost import reduce_scatter_is_allreduce
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.compute import (
    ComputeModel, FlopsCompute, RooflineCompute, Times, measured_compute, scaled)
from scaledl.sim.device_model import Device
from scaledl.sim.iteration import (
    IterationResult,
    accumulated,
    against_one_rank,
    fed_by_pipeline,
    simulate_iteration,
    timing_of,
)
from scaledl.sim.job import Job, JobError
from scaledl.sim.losses import IDEAL, Cycle, Losses, stack
from scaledl.sim.network import LinkClass, Network, on_cores, ranks_per_core
from scaledl.sim.presets import TCP_LINKS, build_network, burst_bytes, device
from scaledl.sim.profile import ModelProfile, default_input, profile_model
from scaledl.topology import Topology

__all__ = ["Scenario", "resolve", "job_network", "job_device", "job_cycle", "bucket_bytes",
           "job_losses", "compute_model", "job_profile", "contention", "stretch", "layer_times",
           "update_seconds", "job_record", "UPDATE_PASSES", "FLOAT32_BYTES"]


@dataclass(frozen=True)
class Scenario:
    """A checked job with what its fields resolve to (:func:`resolve`).  A sweep predicts the
    same scenario on smaller topologies (:meth:`run`); a study of one part replaces it
    (``dataclasses.replace(scenario, network=...)``)."""

    job: Job
    topology: Topology
    network: Network
    """The job's links (:func:`job_network`), before the shared cores of ``job.cores``, which
    depend on the ranks of the topology predicted on (:meth:`run`)."""
    device: Device
    """The device preset with the job's ``efficiency`` (:func:`job_device`)."""
    profile: ModelProfile
    losses: Losses
    compute: ComputeModel
    """How long ``profile``'s layers take on one device (:func:`compute_model`)."""
    update_s: float
    """The optimizer step on one dedicated device (:func:`update_seconds`)."""

    def layer_times(self, world_size: int | None = None) -> Times:
        """Per-layer forward and backward seconds on one device, stretched by CPU contention
        among ``world_size`` ranks (default: the topology's) when ``job.cores`` is given."""
        ranks = self.topology.world_size if world_size is None else world_size
        return _layer_times(self.job, self.compute, self.profile, ranks)

    def run(self, topology: Topology | None = None) -> IterationResult:
        """Predict one iteration on ``topology`` (default: the scenario's)."""
        job = self.job
        topo = topology if topology is not None else self.topology
        net = on_cores(self.network, topo.world_size, None if job.lossless else job.cores)
        wire = self.profile.reduced_as(job.allreduce_bytes)  # compute and update stay float32's
        sim = CollectiveSimulator(topo, net, wire.itemsize)
        factor = stretch(job, topo.world_size)
        result = simulate_iteration(
            wire, sim, job.batch, job.strategy, job.algorithm,
            update_s=self.update_s * factor, tau=job.tau, overlap=job.overlap,
            times=self.layer_times(topo.world_size), losses=self.losses,
        )
        shared = against_one_rank(accumulated(result, job.accumulation), factor)
        if job.input_rate is None or job.lossless:
            return shared
        return fed_by_pipeline(shared, topo.ranks_per_node, job.input_rate)

    def record(self) -> dict[str, Any]:
        """The job's fields as JSON values with what the scenario used (:func:`job_record`)."""
        return job_record(self.job, self.topology, self.network)


def resolve(job: Job, *, topology: Topology | None = None, network: Network | None = None,
            profile: ModelProfile | None = None) -> Scenario:
    """Check ``job`` (:meth:`Job.check`) and resolve its fields into a :class:`Scenario`.  Parts
    already resolved (by these functions, from the same job) may be given instead of resolved
    again."""
    job.check()
    topo = topology if topology is not None else job.topology_value()
    prof = profile if profile is not None else job_profile(job)
    net = network if network is not None else job_network(job)
    return Scenario(job, topo, net, job_device(job), prof, job_losses(job),
                    compute_model(job, prof), update_seconds(job, prof))


FLOAT32_BYTES = 4
"""A traced profile's gradient element size; ``allreduce_bytes`` is the wire's."""

UPDATE_PASSES = 5
"""Memory passes over the parameters per optimizer step (SGD with momentum: read weight,
gradient, momentum; write weight, momentum)."""


def job_device(job: Job) -> Device:
    """The device preset, the efficiency in use (the tensor-core one under mixed precision)
    overridden by ``efficiency``."""
    dev = device(job.device)
    if job.efficiency is not None and job.mixed_precision:
        dev = replace(dev, tensor_efficiency=job.efficiency)
    elif job.efficiency is not None:
        dev = replace(dev, compute_efficiency=job.efficiency)
    return dev


def contention(job: Job, world_size: int) -> float:
    """Ranks per core when ``cores`` is given and the ranks outnumber them, else 1."""
    if job.cores is None or job.lossless:
        return 1.0
    return ranks_per_core(world_size, job.cores)


def stretch(job: Job, world_size: int) -> float:
    """How much longer a rank's compute and update take when ``cores`` is given and the
    ranks outnumber them: the fair share ``c = ranks / cores`` times ``1 + timeshare *
    (1 - 1 / c)``, the device's time-sharing loss for the share of time the rank waits for a
    core (1 with ``lossless`` or dedicated cores).  Collectives' CPU work uses
    :func:`contention` and TCP's own measured factor (``Network.cpu_timeshare``) instead."""
    share = contention(job, world_size)
    if share == 1.0:
        return 1.0
    return share * (1.0 + device(job.device).timeshare * (1.0 - 1.0 / share))


def job_cycle(job: Job) -> Cycle | None:
    """The stack's negotiation cycle with ``job``'s ``cycle_ms`` and ``fusion_mb`` (its
    HOROVOD_CYCLE_TIME and HOROVOD_FUSION_THRESHOLD); None for a stack without one."""
    cycle = stack(job.stack_name()).cycle
    if cycle is None:
        return None
    if job.cycle_ms is not None:
        cycle = replace(cycle, cycle_s=job.cycle_ms * 1e-3)
    if job.fusion_mb is not None:
        cycle = replace(cycle, fusion_bytes=max(1, round(job.fusion_mb * (1 << 20))))
    return cycle


def bucket_bytes(job: Job) -> int:
    """Gradient bytes per bucket: ``bucket_mb``, or a cycle's fusion buffer on a stack with
    one (the ideal model, which has no cycle, buckets at it).  Horovod fuses the tensors it
    is handed, already compressed to the wire's dtype (``Compression.fp16``), so a buffer
    holds ``fusion_bytes`` of wire bytes: the bucket is those elements' float32 gradients
    (DDP's ``bucket_cap_mb`` counts the gradients before its compression hook)."""
    cycle = job_cycle(job)
    if cycle is None:
        return int(job.bucket_mb * (1 << 20))
    return cycle.fusion_bytes * FLOAT32_BYTES // job.allreduce_bytes


def job_losses(job: Job) -> Losses:
    """The loss terms: the device's (or the profile's measured) interference and jitter, and
    the stack's per-call overhead and cycle; none with ``lossless``.

    A profile measured on CUDA keeps the device's interference: its own comes from a
    reduction kernel over the whole GPU beside the model, where NCCL's kernels take a few
    of its multiprocessors (0.41-0.43 on an H100 against 0.189 measured with real
    collectives; docs/simulation.md, "Measured profiles"), so it is an upper bound."""
    if job.lossless:
        return IDEAL
    dev, measured = device(job.device), job.measured()
    software = replace(stack(job.stack_name()), cycle=job_cycle(job))
    if measured is not None:
        on_gpu = measured.device.get("type") == "cuda"
        return Losses(dev.interference if on_gpu else measured.interference,
                      measured.jitter_cv, software)
    return Losses(dev.interference, dev.jitter_cv, software)


def compute_model(job: Job, profile: ModelProfile) -> ComputeModel:
    """FLOPs at a constant rate (``lossless``), the measured profile, or the roofline."""
    if job.lossless:
        dev = device(job.device)
        return FlopsCompute(dev.peak_tflops * 1e12 * (job.efficiency or dev.efficiency))
    measured = job.measured()
    if measured is not None:
        return measured_compute(measured, profile)
    return RooflineCompute(job_device(job), job.channels_last, job.mixed_precision)


def layer_times(job: Job, profile: ModelProfile, world_size: int = 1) -> Times:
    """Per-layer forward and backward seconds on one device of ``job``, stretched by CPU
    contention when ``cores`` is given (:func:`stretch`, as the update is in
    :meth:`Scenario.run`)."""
    return _layer_times(job, compute_model(job, profile), profile, world_size)


def _layer_times(job: Job, model: ComputeModel, profile: ModelProfile, world_size: int
                 ) -> Times:
    times = model.layer_times(profile, job.batch)
    if job.compute_time is not None:
        times = scaled(times, job.compute_time)
    factor = stretch(job, world_size)
    if factor != 1.0:
        times = ([f * factor for f in times[0]], [b * factor for b in times[1]])
    return times


def job_profile(job: Job) -> ModelProfile:
    """The model profile with ``job``'s bucketing (the measured profile's model and input
    shape when one is given)."""
    by_layer = timing_of(job.strategy) == "per-layer"
    measured = job.measured()
    if measured is not None:
        return profile_model(measured.model, bucket_bytes(job), measured.input_shape,
                             measured.num_classes, by_layer=by_layer)
    return profile_model(job.model, bucket_bytes(job), job.input_shape, by_layer=by_layer)


def update_seconds(job: Job, profile: ModelProfile) -> float:
    """The optimizer step: given, or memory passes over the parameters."""
    if job.update_time is not None:
        if job.update_time < 0:
            raise JobError(f"<update_time> {job.update_time} must be >= 0")
        return job.update_time
    measured = job.measured()
    if measured is not None and not job.lossless:
        return measured.update_seconds
    dev = device(job.device)
    return UPDATE_PASSES * profile.parameter_bytes / (dev.memory_gbps * 1e9)


def job_network(job: Job) -> Network:
    """Preset or calibrated links with any overrides applied, at the stack's measured share of
    their rates (not a calibration's, which measured the library already), with the device's
    TCP costs where bytes go through sockets."""
    dev = device(job.device)
    if job.calibration is not None:
        try:
            model = CostModel.from_json(Path(job.calibration).read_text())
        except (KeyError, TypeError, AttributeError):
            raise JobError(f"<calibration> {job.calibration} is not a calibration (no links "
                             "of the form `scaledl simulate calibrate` writes); write one with "
                             "`scaledl simulate calibrate BENCH.json -o FILE`") from None
        except (OSError, ValueError) as error:
            raise JobError(f"cannot read calibration {job.calibration}: {error}; "
                             "write one with `scaledl simulate calibrate BENCH.json -o FILE`"
                             ) from None
        net = replace(Network.from_cost_model(model), oversubscription=job.oversubscription,
                       burst_bytes=burst_bytes(job.network))
    else:
        net = build_network(job.network, job.intra or dev.intra, dev.gamma,
                            job.oversubscription, job.uplink)
    inter = _override(net.inter, job.inter_latency_us, job.inter_gbps)
    intra = _override(net.intra, job.intra_latency_us, job.intra_gbps)
    uplink = net.uplink
    if uplink is not None and (job.inter_latency_us is not None or job.inter_gbps):
        uplink = _override(uplink, job.inter_latency_us, job.inter_gbps)
    burst = 0.0 if job.inter_gbps else net.burst_bytes  # an overridden rate is not tbf's
    net = replace(net, inter=inter, intra=intra, uplink=uplink, burst_bytes=burst,
                  native_reduce_scatter_allreduce=reduce_scatter_is_allreduce(dev.backend))
    if not job.lossless:
        if job.calibration is None:  # a calibration measured the library's rates already
            share = stack(job.stack_name()).link_efficiency
            net = replace(net, intra=_share(net.intra, share), inter=_share(net.inter, share),
                          uplink=None if net.uplink is None else _share(net.uplink, share))
        gloo = dev.backend == "gloo"
        sockets = gloo or net.inter.name in TCP_LINKS
        net = replace(net, cpu_beta=_socket_beta(job, dev) if sockets else 0.0,
                       tcp_inside=gloo, cpu_beta_link=dev.tcp_link_beta,
                       cpu_timeshare=dev.tcp_timeshare)
    return net


def _socket_beta(job: Job, dev: Device) -> float:
    """Host CPU seconds per byte at each end of a socket: ``socket_gbps`` if given,
    else a CPU profile's loopback stream (when it measured one) where Gloo moves the bytes (the
    host the profile was taken on; docs/simulation.md, "Measured profiles"), else the device
    preset's.

    A CUDA profile's stream is not used: a GPU host's sockets are NCCL's, whose preset rate
    (``GPU_HOST_TCP_BETA``) includes its proxy thread and copies, which a raw stream does not.
    A stream measures the host's TCP stack only; what a link beyond the host adds
    (``tcp_link_beta``) stays the preset's."""
    if job.socket_gbps is not None:
        return 1e-9 / job.socket_gbps
    measured = job.measured()
    if (measured is not None and dev.backend == "gloo" and measured.tcp_beta > 0
            and measured.device.get("type") == "cpu"):
        return measured.tcp_beta
    return dev.tcp_beta


def _override(link: LinkClass, latency_us: float | None, gbps: float | None) -> LinkClass:
    if latency_us is not None and (not math.isfinite(latency_us) or latency_us < 0):
        raise JobError(f"latency {latency_us} us must be >= 0")
    alpha = link.alpha if latency_us is None else latency_us * 1e-6
    if gbps is None:
        return replace(link, alpha=alpha)
    return LinkClass.from_bandwidth(link.name, alpha, gbps)


def _share(link: LinkClass, efficiency: float) -> LinkClass:
    """``link`` at ``efficiency`` of its rate (a library's measured share of it)."""
    return link if efficiency == 1.0 else replace(link, beta=link.beta / efficiency)


def job_record(job: Job, topology: Topology, network: Network) -> dict[str, Any]:
    """``job``'s fields as JSON values with what was used in place of a default left to the
    simulator: the topology's spec, the stack's name, the input shape, the link names, the
    negotiation cycle's period and fusion buffer, the TCP sockets' per-thread rate, and the
    profile's model, precision and layout (paths as text)."""
    # the record names the field as the option does (``--ideal``), as it always has
    data = {"ideal" if key == "lossless" else key: value for key, value in asdict(job).items()}
    for key in ("calibration", "profile_path"):
        data[key] = str(data[key]) if data[key] else None
    measured = job.measured()
    shape = (measured.input_shape if measured is not None
             else job.input_shape or default_input(job.model)[0])
    cycle = job_cycle(job)
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
