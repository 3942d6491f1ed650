"""What ``scaledl simulate`` refuses before it predicts anything: one ValueError, naming the
option and the fix, for every impossible combination of a :class:`~scaledl.sim.job.Job`'s
options."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scaledl.collectives.auto import Fabric, check_paths
from scaledl.collectives.registry import ALGORITHMS, parse_algorithm
from scaledl.collectives.schedule import Collective
from scaledl.sim.iteration import timing_of
from scaledl.sim.timings import timing_model
from scaledl.sim.losses import stack
from scaledl.sim.presets import DEVICES, TCP_LINKS, device, link

if TYPE_CHECKING:
    from scaledl.sim.job import Job

__all__ = ["check_job", "simulated_algorithms", "MAX_GPUS", "BUCKET_MB"]

BUCKET_MB = 25.0
"""``Job.bucket_mb``'s default (DDP's ``bucket_cap_mb``): another value is a bucket size set."""

MAX_GPUS = 4096
"""The most GPUs ``scaledl simulate`` replays: every rank's schedule is replayed, in time and
memory that grow with the square of the ranks (1024 take about 12 s on this project's VM,
2048 about a minute)."""


def simulated_algorithms(collective: Collective) -> list[str]:
    """Algorithms the simulator can replay for ``collective`` (scheduled ones: not native/auto)."""
    return [name for name, algo in ALGORITHMS.items()
            if algo.scheduled and collective in algo.supports]


def check_job(job: Job) -> None:
    """Raise ValueError for an impossible combination of ``job``'s options."""
    timing = timing_model(timing_of(job.strategy))
    collective = timing.collective
    base, _ = parse_algorithm(job.algorithm)
    if base not in simulated_algorithms(collective):
        raise ValueError(
            f"--algorithm {job.algorithm} cannot be simulated for {job.strategy}; choose "
            f"one of: {', '.join(simulated_algorithms(collective))}")
    topo = job.topology_value()  # hosts as it says; every host's ranks share its memory
    hosts = tuple(topo.node(rank) for rank in range(topo.world_size))
    check_paths(job.algorithm, collective, topo, Fabric(hosts, native_stages=True),
                alternatives="ring, tree, ..., or shm inside a level (e.g. "
                             "hierarchical[shm,ring])")
    if job.tau < 1:
        raise ValueError(f"--tau {job.tau} must be >= 1 (exchange every tau steps)")
    if job.tau > 1 and not timing.every_tau:
        raise ValueError(f"--tau {job.tau} applies to the EASGD strategies (easgd, sync-easgd); "
                         f"{job.strategy} exchanges every step (drop --tau, or use "
                         "--accumulation for steps between reductions)")
    if job.gpus > MAX_GPUS:
        raise ValueError(f"--gpus {job.gpus} is beyond what the replay handles: at most "
                         f"{MAX_GPUS} (its time and memory grow with the square of the ranks; "
                         "2048 take about a minute)")
    if job.allreduce_bytes not in (2, 4):
        raise ValueError(f"allreduce element size {job.allreduce_bytes} bytes is not 4 "
                         "(float32) or 2 (float16, bfloat16)")
    if job.accumulation < 1:
        raise ValueError(f"--accumulation {job.accumulation} must be >= 1 (micro-batches per "
                         "optimizer step)")
    if job.accumulation > 1 and not timing.gradients:
        raise ValueError(f"--accumulation {job.accumulation} applies to synchronous "
                         f"strategies; {job.strategy} steps locally already (use --tau)")
    if job.mixed_precision:
        _check_mixed_precision(job)
    if job.channels_last and job.ideal:
        raise ValueError("--channels-last does not apply to --ideal: the ideal model prices "
                         "FLOPs only, in no layout (drop one of them)")
    if job.channels_last and job.profile_path is not None:
        raise ValueError("--channels-last does not apply to --profile: a measured profile has "
                         "the layout it was measured in (`scaledl simulate profile "
                         "--channels-last` measures NHWC)")
    if job.compute_time is not None and not 0 < job.compute_time < math.inf:
        raise ValueError(f"--compute-time {job.compute_time} must be a finite number of "
                         "seconds > 0")
    if job.update_time is not None and not 0 <= job.update_time < math.inf:
        raise ValueError(f"--update-time {job.update_time} must be a finite number of "
                         "seconds >= 0")
    if job.efficiency is not None and not 0 < job.efficiency <= 1:
        raise ValueError(f"--device-efficiency {job.efficiency} must be in (0, 1]")
    if not 0 < job.bucket_mb < math.inf or job.bucket_mb * 2**20 < 1:
        raise ValueError(f"--bucket-mb {job.bucket_mb} must be a finite number of MiB, at "
                         "least one byte (e.g. 25, DDP's default)")
    for option, value in (("--inter-latency", job.inter_latency_us),
                          ("--intra-latency", job.intra_latency_us)):
        if value is not None and not 0 <= value < math.inf:
            raise ValueError(f"{option} {value} must be a finite number of microseconds >= 0")
    if job.ideal:
        _check_ideal(job)
    if not job.overlap and timing.no_overlap_why is not None:
        raise ValueError(f"--no-overlap does not apply to {job.strategy}: "
                         f"{timing.no_overlap_why} (drop it)")
    if job.allreduce_bytes != 4 and not timing.gradients:
        raise ValueError(f"--allreduce-dtype puts gradients on the wire at 2 bytes; "
                         f"{job.strategy} exchanges weights, not gradients (drop it)")
    _check_unread(job)
    if job.socket_gbps is not None and not 0 < job.socket_gbps < math.inf:
        raise ValueError(f"--socket-bandwidth {job.socket_gbps} must be a finite number of "
                         "GB/s > 0 (for RDMA, name an RDMA network such as 25gbe-roce)")
    if job.cores is not None and job.cores < 1:
        raise ValueError(f"--cores {job.cores} must be >= 1")
    if job.input_rate is not None and not 0 < job.input_rate < math.inf:
        raise ValueError(f"--input-rate {job.input_rate} must be a finite number of "
                         "samples per second > 0")
    if job.stack is not None:
        stack(job.stack)
    for option, value, unit, zero in (("--cycle-ms", job.cycle_ms, "ms", True),
                                       ("--fusion-mb", job.fusion_mb, "MiB", False)):
        if value is not None:
            _check_cycle_option(job, option, value, unit, zero)
    _check_buckets(job, timing.name == "bucketed")
    if job.profile_path is not None:
        _check_profile_device(job)


def _check_unread(job: Job) -> None:
    """Options that price what the job does not have are refused: the rack uplink without two
    racks, the inter-host link on one host, a socket rate where no byte goes through a socket
    (RDMA between GPU hosts), preset links that a calibration replaces, shared cores on GPUs,
    a device efficiency that measured compute replaces."""
    if job.cores is not None and device(job.device).is_gpu:
        raise ValueError(f"--cores {job.cores} prices ranks that share one machine's CPU cores "
                         f"(a cluster emulated with --device cpu), and {job.device} ranks are "
                         "GPUs; drop it")
    for option, preset in (("--intra", job.intra), ("--uplink", job.uplink)):
        if job.calibration is not None and preset is not None:
            raise ValueError(f"{option} {preset} names a preset link, and --calibration "
                             f"{job.calibration} replaces the links with its fitted ones; drop "
                             f"{option} (or --calibration)")
    axes = job.topology_value().axes
    rack = job.uplink is not None or job.oversubscription != 1.0
    if rack and (len(axes) < 3 or axes[2] < 2):
        raise ValueError(f"--uplink and --oversubscription price the links between racks, and "
                         f"topology {job.topology_value().spec} has no two racks; give a third "
                         "axis of 2 or more (GPUs per host x hosts per rack x racks, e.g. 4x8x2)")
    inter = (("--inter-bandwidth", job.inter_gbps), ("--inter-latency", job.inter_latency_us))
    for option, value in inter:
        if value is not None and job.topology_value().num_nodes == 1:
            raise ValueError(f"{option} {value} prices the links between hosts, and topology "
                             f"{job.topology_value().spec} is one host; drop it (or give "
                             "--topology several hosts)")
    if (job.socket_gbps is not None and job.calibration is None and device(job.device).is_gpu
            and link(job.network).name not in TCP_LINKS):
        raise ValueError(f"--socket-bandwidth {job.socket_gbps} prices bytes through TCP "
                         f"sockets, and {job.device} GPUs on {job.network} move them by RDMA; "
                         f"drop it (or name a TCP network: {', '.join(sorted(TCP_LINKS))})")
    measured = "--compute-time" if job.compute_time is not None else \
        "--profile" if job.profile_path is not None else None
    if job.efficiency is not None and measured is not None:
        raise ValueError(f"--device-efficiency {job.efficiency} prices compute from FLOPs, and "
                         f"{measured} gives it measured; drop one of them")


def _check_buckets(job: Job, bucketed: bool) -> None:
    """Buckets, and Horovod's cycle and fusion buffer, shape allreduce's gradient reductions
    only; on a stack with a cycle the fusion buffer replaces the buckets.  Set where nothing
    reads them, they are refused."""
    given = [(option, value) for option, value in (
        ("--bucket-mb", None if job.bucket_mb == BUCKET_MB else job.bucket_mb),
        ("--cycle-ms", job.cycle_ms), ("--fusion-mb", job.fusion_mb)) if value is not None]
    if given and not bucketed:
        option, value = given[0]
        raise ValueError(f"{option} {value} shapes allreduce's gradient reductions, and "
                         f"{job.strategy} has none of them; drop it")
    if job.bucket_mb != BUCKET_MB and not job.ideal and stack(job.stack_name()).cycle is not None:
        raise ValueError(f"--bucket-mb {job.bucket_mb}: stack {job.stack_name()!r} fuses "
                         "gradients in its fusion buffer instead of buckets; drop it (or set "
                         "the buffer with --fusion-mb)")


def _check_profile_device(job: Job) -> None:
    """A measured profile's times are its device's: a CPU profile predicts cpu ranks (not
    knl's, whose preset is another CPU), a CUDA one the GPU presets that name its GPU (any GPU
    preset when none does), never silently another device's (``scaledl simulate`` defaults
    ``--device`` to the profile's).  ``--ideal`` prices FLOPs, not a profile's times: refused
    beside one."""
    if job.ideal:
        raise ValueError(f"--ideal prices FLOPs at a constant rate and would not read the "
                         f"profile {job.profile_path}; drop one of them")
    measured = job.measured()
    assert measured is not None
    dev, named = device(job.device), measured.device_presets()
    if measured.on_cpu:
        fits, where = dev.name in named, "a CPU"
    else:
        gpu = str(measured.device.get("name", "an unnamed GPU"))
        fits = dev.name in named if named else dev.is_gpu
        where = f"{gpu} ({', '.join(named)})" if named else gpu
    if not fits:
        use = (f"drop --device ({named[0]} is used)" if named else
               "give the GPU preset closest to it")
        measure = "--on cuda" if dev.is_gpu else "--on cpu"
        raise ValueError(f"--device {job.device} but the profile {job.profile_path} was "
                         f"measured on {where}; {use}, or profile the model on "
                         f"{job.device} hardware (`scaledl simulate profile {measure}`)")


def _check_ideal(job: Job) -> None:
    """The ideal model has no input pipeline and no negotiation cycle: options that set them
    would be ignored, so they are refused."""
    for option, value, lacks in (("--input-rate", job.input_rate, "input pipeline"),
                                 ("--cycle-ms", job.cycle_ms, "negotiation cycle"),
                                 ("--cores", job.cores, "shared cores"),
                                 ("--socket-bandwidth", job.socket_gbps, "host TCP cost")):
        if value is not None:
            raise ValueError(f"{option} {value} does not apply to --ideal: the ideal model has "
                             f"no {lacks} (drop one of them)")


def _check_mixed_precision(job: Job) -> None:
    """``--mixed-precision`` prices tensor-core FP16/BF16 from a device preset: the device needs
    one, and neither the ideal model nor a measured profile (its own precision) takes it."""
    if not device(job.device).mixed_tflops > 0:
        choices = ", ".join(name for name, dev in DEVICES.items() if dev.mixed_tflops > 0)
        raise ValueError(f"--mixed-precision needs a device with tensor cores; {job.device} has "
                         f"none (choose one of {choices}, or drop it and give the measured "
                         "--compute-time)")
    if job.ideal:
        raise ValueError("--mixed-precision does not apply to --ideal: the ideal model has one "
                         "rate per device (drop one of them)")
    if job.profile_path is not None:
        raise ValueError("--mixed-precision does not apply to --profile: a measured profile has "
                         "the precision it was measured in (drop one of them)")


def _check_cycle_option(job: Job, option: str, value: float, unit: str, zero: bool) -> None:
    """``--cycle-ms`` and ``--fusion-mb`` set a negotiation cycle's: the stack must have one,
    and the value must be finite and positive (or zero where ``zero``)."""
    name = job.stack_name()
    if stack(name).cycle is None:
        raise ValueError(f"{option} {value} needs a stack with a negotiation cycle; "
                         f"stack {name!r} has none (use --stack horovod-0.21, or horovod "
                         "for releases before 0.21)")
    if not ((value >= 0 if zero else value > 0) and value < math.inf):
        raise ValueError(f"{option} {value} must be a finite number of {unit} "
                         f"{'>= 0' if zero else '> 0'}")
