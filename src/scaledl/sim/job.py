"""A simulated job: what ``scaledl simulate`` takes (a frozen spec of model, cluster, network,
strategy and software) and what it refuses before predicting anything (one :class:`JobError`
naming the fields and the fix, for every impossible combination: :func:`check_job`).

What the fields resolve to (the topology, the network, the device, the losses, the compute
model and the profile) is a :class:`~scaledl.sim.scenario.Scenario`
(:func:`scaledl.sim.scenario.resolve`), and the prediction runs on it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from scaledl.collectives.auto import Fabric, check_paths
from scaledl.collectives.registry import ALGORITHMS, parse_algorithm
from scaledl.collectives.schedule import Collective
from scaledl.profiling.profile_file import MeasuredProfile, load_profile
from scaledl.sim.iteration import timing_of
from scaledl.sim.losses import stack
from scaledl.sim.presets import DEVICES, TCP_LINKS, device, link, measured_presets
from scaledl.sim.profile import layer_names
from scaledl.sim.timings import timing_model
from scaledl.topology import Topology

__all__ = ["Job", "JobError", "default_topology", "simulated_algorithms", "check_job",
           "MAX_GPUS", "BUCKET_MB"]


class JobError(ValueError):
    """An impossible job.  Its message names :class:`Job` fields (``tau 0 must be >= 1``); a
    front end that takes the fields under other names renders it with them
    (:meth:`named`: ``scaledl simulate`` says ``--tau 0 must be >= 1``)."""

    def __init__(self, template: str) -> None:
        self.template = template
        """The message with each field written ``<field>``."""
        super().__init__(self.named({}))

    def named(self, names: Mapping[str, str]) -> str:
        """The message with each field written as ``names`` maps it (else by its own name)."""
        return _FIELD_MARK.sub(lambda mark: names.get(mark[1], mark[1]) if mark[1] in _FIELDS
                               else mark[0], self.template)


_FIELD_MARK = re.compile(r"<([a-z_]+)>")

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
        raise JobError(
            f"<algorithm> {job.algorithm} cannot be simulated for {job.strategy}; choose "
            f"one of: {', '.join(simulated_algorithms(collective))}")
    topo = job.topology_value()  # hosts as it says; every host's ranks share its memory
    hosts = tuple(topo.node(rank) for rank in range(topo.world_size))
    check_paths(job.algorithm, collective, topo, Fabric(hosts, native_stages=True),
                alternatives="ring, tree, ..., or shm inside a level (e.g. "
                             "hierarchical[shm,ring])")
    if job.tau < 1:
        raise JobError(f"<tau> {job.tau} must be >= 1 (exchange every tau steps)")
    if job.tau > 1 and not timing.every_tau:
        raise JobError(f"<tau> {job.tau} applies to the EASGD strategies (easgd, sync-easgd); "
                       f"{job.strategy} exchanges every step (drop <tau>, or use "
                       "<accumulation> for steps between reductions)")
    if job.gpus > MAX_GPUS:
        raise JobError(f"<gpus> {job.gpus} is beyond what the replay handles: at most "
                       f"{MAX_GPUS} (its time and memory grow with the square of the ranks; "
                       "2048 take about a minute)")
    if job.allreduce_bytes not in (2, 4):
        raise JobError(f"allreduce element size {job.allreduce_bytes} bytes is not 4 "
                       "(float32) or 2 (float16, bfloat16)")
    if job.accumulation < 1:
        raise JobError(f"<accumulation> {job.accumulation} must be >= 1 (micro-batches per "
                       "optimizer step)")
    if job.accumulation > 1 and not timing.gradients:
        raise JobError(f"<accumulation> {job.accumulation} applies to synchronous "
                       f"strategies; {job.strategy} steps locally already (use <tau>)")
    if job.mixed_precision:
        _check_mixed_precision(job)
    if job.channels_last and job.lossless:
        raise JobError("<channels_last> does not apply to <lossless>: the ideal model prices "
                       "FLOPs only, in no layout (drop one of them)")
    if job.channels_last and job.profile_path is not None:
        raise JobError("<channels_last> does not apply to <profile_path>: a measured profile has "
                       "the layout it was measured in (`scaledl simulate profile "
                       "--channels-last` measures NHWC)")
    if job.compute_time is not None and not 0 < job.compute_time < math.inf:
        raise JobError(f"<compute_time> {job.compute_time} must be a finite number of "
                       "seconds > 0")
    if job.update_time is not None and not 0 <= job.update_time < math.inf:
        raise JobError(f"<update_time> {job.update_time} must be a finite number of "
                       "seconds >= 0")
    if job.efficiency is not None and not 0 < job.efficiency <= 1:
        raise JobError(f"<efficiency> {job.efficiency} must be in (0, 1]")
    if not 0 < job.bucket_mb < math.inf or job.bucket_mb * 2**20 < 1:
        raise JobError(f"<bucket_mb> {job.bucket_mb} must be a finite number of MiB, at "
                       "least one byte (e.g. 25, DDP's default)")
    for option, value in (("<inter_latency_us>", job.inter_latency_us),
                          ("<intra_latency_us>", job.intra_latency_us)):
        if value is not None and not 0 <= value < math.inf:
            raise JobError(f"{option} {value} must be a finite number of microseconds >= 0")
    if job.lossless:
        _check_lossless(job)
    if not job.overlap and timing.no_overlap_why is not None:
        raise JobError(f"<overlap> does not apply to {job.strategy}: "
                       f"{timing.no_overlap_why} (drop it)")
    if job.allreduce_bytes != 4 and not timing.gradients:
        raise JobError(f"<allreduce_bytes> puts gradients on the wire at 2 bytes; "
                       f"{job.strategy} exchanges weights, not gradients (drop it)")
    _check_unread(job)
    if job.socket_gbps is not None and not 0 < job.socket_gbps < math.inf:
        raise JobError(f"<socket_gbps> {job.socket_gbps} must be a finite number of "
                       "GB/s > 0 (for RDMA, name an RDMA network such as 25gbe-roce)")
    if job.cores is not None and job.cores < 1:
        raise JobError(f"<cores> {job.cores} must be >= 1")
    if job.input_rate is not None and not 0 < job.input_rate < math.inf:
        raise JobError(f"<input_rate> {job.input_rate} must be a finite number of "
                       "samples per second > 0")
    if job.stack is not None:
        stack(job.stack)
    for option, value, unit, zero in (("<cycle_ms>", job.cycle_ms, "ms", True),
                                       ("<fusion_mb>", job.fusion_mb, "MiB", False)):
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
        raise JobError(f"<cores> {job.cores} prices ranks that share one machine's CPU cores "
                       f"(a cluster emulated with <device> cpu), and {job.device} ranks are "
                       "GPUs; drop it")
    for option, preset in (("<intra>", job.intra), ("<uplink>", job.uplink)):
        if job.calibration is not None and preset is not None:
            raise JobError(f"{option} {preset} names a preset link, and <calibration> "
                             f"{job.calibration} replaces the links with its fitted ones; drop "
                             f"{option} (or <calibration>)")
    axes = job.topology_value().axes
    rack = job.uplink is not None or job.oversubscription != 1.0
    if rack and (len(axes) < 3 or axes[2] < 2):
        raise JobError(f"<uplink> and <oversubscription> price the links between racks, and "
                       f"topology {job.topology_value().spec} has no two racks; give a third "
                       "axis of 2 or more (GPUs per host x hosts per rack x racks, e.g. 4x8x2)")
    inter = (("<inter_gbps>", job.inter_gbps), ("<inter_latency_us>", job.inter_latency_us))
    for option, value in inter:
        if value is not None and job.topology_value().num_nodes == 1:
            raise JobError(f"{option} {value} prices the links between hosts, and topology "
                             f"{job.topology_value().spec} is one host; drop it (or give "
                             "<topology> several hosts)")
    if (job.socket_gbps is not None and job.calibration is None and device(job.device).is_gpu
            and link(job.network).name not in TCP_LINKS):
        raise JobError(f"<socket_gbps> {job.socket_gbps} prices bytes through TCP "
                       f"sockets, and {job.device} GPUs on {job.network} move them by RDMA; "
                       f"drop it (or name a TCP network: {', '.join(sorted(TCP_LINKS))})")
    measured = "<compute_time>" if job.compute_time is not None else \
        "<profile_path>" if job.profile_path is not None else None
    if job.efficiency is not None and measured is not None:
        raise JobError(f"<efficiency> {job.efficiency} prices compute from FLOPs, and "
                       f"{measured} gives it measured; drop one of them")


def _check_buckets(job: Job, bucketed: bool) -> None:
    """Buckets, and Horovod's cycle and fusion buffer, shape allreduce's gradient reductions
    only; on a stack with a cycle the fusion buffer replaces the buckets.  Set where nothing
    reads them, they are refused."""
    given = [(option, value) for option, value in (
        ("<bucket_mb>", None if job.bucket_mb == BUCKET_MB else job.bucket_mb),
        ("<cycle_ms>", job.cycle_ms), ("<fusion_mb>", job.fusion_mb)) if value is not None]
    if given and not bucketed:
        option, value = given[0]
        raise JobError(f"{option} {value} shapes allreduce's gradient reductions, and "
                       f"{job.strategy} has none of them; drop it")
    if (job.bucket_mb != BUCKET_MB and not job.lossless
            and stack(job.stack_name()).cycle is not None):
        raise JobError(f"<bucket_mb> {job.bucket_mb}: stack {job.stack_name()!r} fuses "
                       "gradients in its fusion buffer instead of buckets; drop it (or set "
                       "the buffer with <fusion_mb>)")


def _check_profile_device(job: Job) -> None:
    """A measured profile's times are its device's: a CPU profile predicts cpu ranks (not
    knl's, whose preset is another CPU), a CUDA one the GPU presets that name its GPU (any GPU
    preset when none does), never silently another device's (``scaledl simulate`` defaults
    ``device`` to the profile's).  ``lossless`` prices FLOPs, not a profile's times: refused
    beside one."""
    if job.lossless:
        raise JobError(f"<lossless> prices FLOPs at a constant rate and would not read the "
                       f"profile {job.profile_path}; drop one of them")
    measured = job.measured()
    assert measured is not None
    dev, named = device(job.device), measured_presets(measured)
    if measured.on_cpu:
        fits, where = dev.name in named, "a CPU"
    else:
        gpu = str(measured.device.get("name", "an unnamed GPU"))
        fits = dev.name in named if named else dev.is_gpu
        where = f"{gpu} ({', '.join(named)})" if named else gpu
    if not fits:
        use = (f"drop <device> ({named[0]} is used)" if named else
               "give the GPU preset closest to it")
        measure = "--on cuda" if dev.is_gpu else "--on cpu"
        raise JobError(f"<device> {job.device} but the profile {job.profile_path} was "
                       f"measured on {where}; {use}, or profile the model on "
                       f"{job.device} hardware (`scaledl simulate profile {measure}`)")


def _check_lossless(job: Job) -> None:
    """The ideal model has no input pipeline and no negotiation cycle: options that set them
    would be ignored, so they are refused."""
    for option, value, lacks in (("<input_rate>", job.input_rate, "input pipeline"),
                                 ("<cycle_ms>", job.cycle_ms, "negotiation cycle"),
                                 ("<cores>", job.cores, "shared cores"),
                                 ("<socket_gbps>", job.socket_gbps, "host TCP cost")):
        if value is not None:
            raise JobError(f"{option} {value} does not apply to <lossless>: the ideal model has "
                             f"no {lacks} (drop one of them)")


def _check_mixed_precision(job: Job) -> None:
    """``mixed_precision`` prices tensor-core FP16/BF16 from a device preset: the device needs
    one, and neither the ideal model nor a measured profile (its own precision) takes it."""
    if not device(job.device).mixed_tflops > 0:
        choices = ", ".join(name for name, dev in DEVICES.items() if dev.mixed_tflops > 0)
        raise JobError(f"<mixed_precision> needs a device with tensor cores; {job.device} has "
                       f"none (choose one of {choices}, or drop it and give the measured "
                       "<compute_time>)")
    if job.lossless:
        raise JobError("<mixed_precision> does not apply to <lossless>: the ideal model has one "
                       "rate per device (drop one of them)")
    if job.profile_path is not None:
        raise JobError("<mixed_precision> does not apply to <profile_path>: a measured profile has "
                       "the precision it was measured in (drop one of them)")


def _check_cycle_option(job: Job, option: str, value: float, unit: str, zero: bool) -> None:
    """``cycle_ms`` and ``fusion_mb`` set a negotiation cycle's: the stack must have one,
    and the value must be finite and positive (or zero where ``zero``)."""
    name = job.stack_name()
    if stack(name).cycle is None:
        raise JobError(f"{option} {value} needs a stack with a negotiation cycle; "
                       f"stack {name!r} has none (use <stack> horovod-0.21, or horovod "
                       "for releases before 0.21)")
    if not ((value >= 0 if zero else value > 0) and value < math.inf):
        raise JobError(f"{option} {value} must be a finite number of {unit} "
                       f"{'>= 0' if zero else '> 0'}")


_PROFILES: dict[tuple[Path, int, int], MeasuredProfile] = {}


def _load_cached(path: Path) -> MeasuredProfile:
    """The profile at ``path``, parsed once per file version (path, size, mtime)."""
    try:
        stat = path.stat()
    except OSError:
        return load_profile(path, layer_names)  # raises the one-line error
    key = (path.resolve(), stat.st_size, stat.st_mtime_ns)
    if key not in _PROFILES:
        _PROFILES[key] = load_profile(path, layer_names)
    return _PROFILES[key]


def default_topology(gpus: int) -> str:
    """Four GPUs per host: one host of up to four, else ``4xN``; other counts need a topology."""
    if gpus < 1:
        raise JobError(f"<gpus> {gpus} must be >= 1")
    if gpus <= 4:
        return str(gpus)
    if gpus % 4:
        raise JobError(f"<gpus> {gpus} does not fill hosts of 4 GPUs; give <topology> "
                       f"(e.g. {_example_topology(gpus)}) to say how they sit on hosts")
    return f"4x{gpus // 4}"


def _example_topology(gpus: int) -> str:
    per_host = next(d for d in (8, 6, 5, 3, 2, 1) if gpus % d == 0)
    return f"{per_host}x{gpus // per_host}"


@dataclass(frozen=True)
class Job:
    """One training job to predict (see ``scaledl simulate --help`` for each field)."""

    model: str = "resnet50"
    input_shape: tuple[int, ...] | None = None
    """Sample shape (no batch dim); None: ImageNet 3x224x224 (3x299x299 for Inception v3) or
    the model's small default."""
    gpus: int = 8
    topology: str | None = None
    algorithm: str = "ring"
    strategy: str = "allreduce"
    device: str = "p100"
    network: str = "ib-edr"
    intra: str | None = None
    uplink: str | None = None
    oversubscription: float = 1.0
    batch: int = 32
    bucket_mb: float = BUCKET_MB
    """Gradient bucket size, MiB (DDP's ``bucket_cap_mb``); a stack with a negotiation cycle
    fuses at ``fusion_mb`` instead."""
    tau: int = 1
    overlap: bool = True
    compute_time: float | None = None
    efficiency: float | None = None
    update_time: float | None = None
    inter_latency_us: float | None = None
    inter_gbps: float | None = None
    intra_latency_us: float | None = None
    intra_gbps: float | None = None
    calibration: Path | None = None
    socket_gbps: float | None = None
    """GB/s one host thread moves through a TCP socket at each end (``Network.cpu_beta``);
    None: the device preset's (2.06 on GPU hosts, NVIDIA/nccl#209)."""
    lossless: bool = False
    """Nothing lost (``--ideal``): FLOPs at a constant device efficiency, and none of the losses
    of :mod:`scaledl.sim.losses` (stack costs, input pipeline, negotiation cycle, host CPU)."""
    stack: str | None = None
    """Software stack preset (default: ``scaledl`` on the cpu device, ``nccl`` on GPUs)."""
    profile_path: Path | None = None
    """A ``scaledl simulate profile`` file: measured per-layer times instead of FLOPs."""
    cores: int | None = None
    """CPU cores shared by every rank (one machine emulating the cluster); None: dedicated."""
    input_rate: float | None = None
    """Samples per second one host's input pipeline delivers (measured: its data loader
    alone); None: input is never the bottleneck.  See
    :func:`~scaledl.sim.iteration.fed_by_pipeline`."""
    cycle_ms: float | None = None
    """Horovod's negotiation cycle (``HOROVOD_CYCLE_TIME``), milliseconds; None: the stack's."""
    fusion_mb: float | None = None
    """Horovod's fusion buffer (``HOROVOD_FUSION_THRESHOLD``), MiB; None: the stack's."""
    allreduce_bytes: int = 4
    """Bytes per gradient element on the wire: 4 (float32), or 2 for a float16 allreduce
    (``allreduce_bytes float16``; ``ModelProfile.reduced_as``); compute keeps its own precision
    (``mixed_precision``) and the update runs on float32 weights either way."""
    accumulation: int = 1
    """Micro-batches of ``batch`` per optimizer step (gradient accumulation): the gradients are
    reduced once, after the last (:func:`~scaledl.sim.iteration.accumulated`)."""
    channels_last: bool = False
    """The model runs on NHWC tensors (``torch.channels_last``), so convolutions on tensor cores
    need no transposes (``Device.nhwc_convolutions``); PyTorch's default is NCHW."""
    mixed_precision: bool = False
    """Compute in FP16/BF16 on tensor cores (autocast, apex amp): the device's mixed-precision
    peak and tensor-core efficiency, tensors at 2 bytes; gradients on the wire stay float32
    unless ``allreduce_bytes`` says otherwise, and the update runs on float32 weights."""

    def topology_value(self) -> Topology:
        """The topology, checked against ``gpus``."""
        spec = self.topology if self.topology is not None else default_topology(self.gpus)
        return Topology.parse(spec, self.gpus)

    def check(self) -> None:
        """Raise ValueError for an impossible combination of options (:func:`check_job`)."""
        check_job(self)

    def stack_name(self) -> str:
        """The software stack preset: ``stack``, else ``scaledl`` on the cpu device, ``mpi`` on
        a device whose collectives are MPI's (knl) and ``nccl`` on GPUs."""
        if self.stack:
            return self.stack
        dev = device(self.device)
        return "scaledl" if dev.name == "cpu" else "mpi" if dev.backend == "mpi" else "nccl"

    def measured(self) -> MeasuredProfile | None:
        """The measured profile, if ``profile_path`` names one (read once per file version:
        the checks read it, and so does :func:`scaledl.sim.scenario.resolve`)."""
        if self.profile_path is None:
            return None
        return _load_cached(Path(self.profile_path))


_FIELDS = frozenset(field.name for field in fields(Job))
"""The names a :class:`JobError` message may mark."""
