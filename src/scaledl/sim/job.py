"""A simulated job: what ``scaledl simulate`` takes (a frozen spec of model, cluster, network,
strategy and software), what it refuses before predicting anything (one ValueError naming the
option and the fix, for every impossible combination: :func:`check_job`), the network it runs on
(the preset or calibrated links with the job's overrides, the stack's share of their rates and
the host CPU's costs of TCP: :func:`job_network`) and its prediction (:meth:`Job.run`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from scaledl.collectives.auto import CostModel, Fabric, check_paths
from scaledl.collectives.cost import reduce_scatter_is_allreduce
from scaledl.collectives.registry import ALGORITHMS, parse_algorithm
from scaledl.collectives.schedule import Collective
from scaledl.profiling.profile_file import MeasuredProfile, load_profile
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
from scaledl.sim.losses import IDEAL, Cycle, Losses, stack
from scaledl.sim.network import LinkClass, Network, on_cores, ranks_per_core
from scaledl.sim.presets import (
    DEVICES, TCP_LINKS, build_network, burst_bytes, device, link, measured_presets)
from scaledl.sim.profile import ModelProfile, default_input, layer_names, profile_model
from scaledl.sim.timings import timing_model
from scaledl.topology import Topology

__all__ = ["Job", "JobError", "default_topology", "simulated_algorithms", "check_job",
           "job_network", "job_record", "UPDATE_PASSES", "MAX_GPUS", "BUCKET_MB"]


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


FLOAT32_BYTES = 4
"""A traced profile's gradient element size; ``allreduce_bytes`` is the wire's."""

UPDATE_PASSES = 5
"""Memory passes over the parameters per optimizer step (SGD with momentum: read weight,
gradient, momentum; write weight, momentum)."""


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
    alone); None: input is never the bottleneck.  See :meth:`fed`."""
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

    def network_value(self) -> Network:
        """Preset or calibrated links with any overrides applied, at the stack's measured
        share of their rates (:func:`job_network`)."""
        return job_network(self)

    def measured(self) -> MeasuredProfile | None:
        """The measured profile, if ``profile_path`` names one (read once per job)."""
        if self.profile_path is None:
            return None
        return _load_cached(Path(self.profile_path))

    def contention(self, world_size: int) -> float:
        """Ranks per core when ``cores`` is given and the ranks outnumber them, else 1."""
        if self.cores is None or self.lossless:
            return 1.0
        return ranks_per_core(world_size, self.cores)

    def stretch(self, world_size: int) -> float:
        """How much longer a rank's compute and update take when ``cores`` is given and the
        ranks outnumber them: the fair share ``c = ranks / cores`` times ``1 + timeshare *
        (1 - 1 / c)``, the device's time-sharing loss for the share of time the rank waits for a
        core (1 with ``lossless`` or dedicated cores).  Collectives' CPU work uses
        :meth:`contention` and TCP's own measured factor (``Network.cpu_timeshare``) instead."""
        share = self.contention(world_size)
        if share == 1.0:
            return 1.0
        return share * (1.0 + device(self.device).timeshare * (1.0 - 1.0 / share))

    def device_value(self) -> Device:
        """The device preset, the efficiency in use (the tensor-core one under mixed precision)
        overridden by ``efficiency``."""
        dev = device(self.device)
        if self.efficiency is not None and self.mixed_precision:
            dev = replace(dev, tensor_efficiency=self.efficiency)
        elif self.efficiency is not None:
            dev = replace(dev, compute_efficiency=self.efficiency)
        return dev

    def cycle(self) -> Cycle | None:
        """The stack's negotiation cycle with this job's ``cycle_ms`` and ``fusion_mb`` (its
        HOROVOD_CYCLE_TIME and HOROVOD_FUSION_THRESHOLD); None for a stack without one."""
        cycle = stack(self.stack_name()).cycle
        if cycle is None:
            return None
        if self.cycle_ms is not None:
            cycle = replace(cycle, cycle_s=self.cycle_ms * 1e-3)
        if self.fusion_mb is not None:
            cycle = replace(cycle, fusion_bytes=max(1, round(self.fusion_mb * (1 << 20))))
        return cycle

    def bucket_bytes(self) -> int:
        """Gradient bytes per bucket: ``bucket_mb``, or a cycle's fusion buffer on a stack with
        one (the ideal model, which has no cycle, buckets at it).  Horovod fuses the tensors it
        is handed, already compressed to the wire's dtype (``Compression.fp16``), so a buffer
        holds ``fusion_bytes`` of wire bytes: the bucket is those elements' float32 gradients
        (DDP's ``bucket_cap_mb`` counts the gradients before its compression hook)."""
        cycle = self.cycle()
        if cycle is None:
            return int(self.bucket_mb * (1 << 20))
        return cycle.fusion_bytes * FLOAT32_BYTES // self.allreduce_bytes

    def losses(self) -> Losses:
        """The loss terms: the device's (or the profile's measured) interference and jitter, and
        the stack's per-call overhead and cycle; none with ``lossless``.

        A profile measured on CUDA keeps the device's interference: its own comes from a
        reduction kernel over the whole GPU beside the model, where NCCL's kernels take a few
        of its multiprocessors (0.41-0.43 on an H100 against 0.189 measured with real
        collectives; docs/simulation.md, "Measured profiles"), so it is an upper bound."""
        if self.lossless:
            return IDEAL
        dev, measured = device(self.device), self.measured()
        software = replace(stack(self.stack_name()), cycle=self.cycle())
        if measured is not None:
            on_gpu = measured.device.get("type") == "cuda"
            return Losses(dev.interference if on_gpu else measured.interference,
                          measured.jitter_cv, software)
        return Losses(dev.interference, dev.jitter_cv, software)

    def compute_model(self, profile: ModelProfile) -> ComputeModel:
        """FLOPs at a constant rate (``lossless``), the measured profile, or the roofline."""
        if self.lossless:
            dev = device(self.device)
            return FlopsCompute(dev.peak_tflops * 1e12 * (self.efficiency or dev.efficiency))
        measured = self.measured()
        if measured is not None:
            return measured_compute(measured, profile)
        return RooflineCompute(self.device_value(), self.channels_last, self.mixed_precision)

    def layer_times(self, profile: ModelProfile, world_size: int = 1) -> Times:
        """Per-layer forward and backward seconds on one device of this job, stretched by CPU
        contention when ``cores`` is given (:meth:`stretch`, as the update is in :meth:`run`)."""
        times = self.compute_model(profile).layer_times(profile, self.batch)
        if self.compute_time is not None:
            times = scaled(times, self.compute_time)
        factor = self.stretch(world_size)
        if factor != 1.0:
            times = ([f * factor for f in times[0]], [b * factor for b in times[1]])
        return times

    def profile(self) -> ModelProfile:
        """The model profile with this job's bucketing (the measured profile's model and input
        shape when one is given)."""
        by_layer = timing_of(self.strategy) == "per-layer"
        measured = self.measured()
        if measured is not None:
            return profile_model(measured.model, self.bucket_bytes(), measured.input_shape,
                                 measured.num_classes, by_layer=by_layer)
        return profile_model(self.model, self.bucket_bytes(), self.input_shape,
                             by_layer=by_layer)

    def update_seconds(self, profile: ModelProfile) -> float:
        """The optimizer step: given, or memory passes over the parameters."""
        if self.update_time is not None:
            if self.update_time < 0:
                raise JobError(f"<update_time> {self.update_time} must be >= 0")
            return self.update_time
        measured = self.measured()
        if measured is not None and not self.lossless:
            return measured.update_seconds
        dev = device(self.device)
        return UPDATE_PASSES * profile.parameter_bytes / (dev.memory_gbps * 1e9)

    def run(
        self, topology: Topology | None = None, profile: ModelProfile | None = None,
        network: Network | None = None,
    ) -> IterationResult:
        """Predict one iteration on ``topology`` (default: this job's)."""
        self.check()
        topo = topology if topology is not None else self.topology_value()
        prof = profile if profile is not None else self.profile()
        net = network if network is not None else self.network_value()
        net = on_cores(net, topo.world_size, None if self.lossless else self.cores)
        wire = prof.reduced_as(self.allreduce_bytes)  # compute and update stay float32's
        sim = CollectiveSimulator(topo, net, wire.itemsize)
        update = self.update_seconds(prof) * self.stretch(topo.world_size)
        result = simulate_iteration(
            wire, sim, self.batch, self.strategy, self.algorithm,
            update_s=update, tau=self.tau, overlap=self.overlap,
            times=self.layer_times(prof, topo.world_size), losses=self.losses(),
        )
        shared = against_one_rank(accumulated(result, self.accumulation),
                                  self.stretch(topo.world_size))
        if self.input_rate is None or self.lossless:
            return shared
        return fed_by_pipeline(shared, topo.ranks_per_node, self.input_rate)



_FIELDS = frozenset(field.name for field in fields(Job))
"""The names a :class:`JobError` message may mark."""


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
