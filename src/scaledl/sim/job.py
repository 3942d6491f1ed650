"""A simulated job: everything ``scaledl simulate`` takes, turned into a prediction."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.compute import ComputeModel, FlopsCompute, RooflineCompute, Times, scaled
from scaledl.sim.iteration import IterationResult, accumulated, simulate_iteration, timing_of
from scaledl.sim.job_checks import BUCKET_MB, check_job, simulated_algorithms
from scaledl.sim.job_network import job_network
from scaledl.sim.job_result import against_one_rank, fed_by_pipeline
from scaledl.sim.losses import IDEAL, Cycle, Losses, stack
from scaledl.sim.network import Network, on_cores, ranks_per_core
from scaledl.sim.presets import Device, device
from scaledl.sim.profile import ModelProfile, profile_model
from scaledl.sim.profile_file import MeasuredProfile, load_profile
from scaledl.topology import Topology

__all__ = ["Job", "default_topology", "simulated_algorithms", "UPDATE_PASSES"]

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
        return load_profile(path)  # raises the one-line error
    key = (path.resolve(), stat.st_size, stat.st_mtime_ns)
    if key not in _PROFILES:
        _PROFILES[key] = load_profile(path)
    return _PROFILES[key]


def default_topology(gpus: int) -> str:
    """Four GPUs per host: one host of up to four, else ``4xN``; other counts need a topology."""
    if gpus < 1:
        raise ValueError(f"--gpus {gpus} must be >= 1")
    if gpus <= 4:
        return str(gpus)
    if gpus % 4:
        raise ValueError(f"--gpus {gpus} does not fill hosts of 4 GPUs; give --topology "
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
    ideal: bool = False
    """The optimistic model of earlier releases: constant device efficiency, no losses."""
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
    (``--allreduce-dtype float16``; ``ModelProfile.reduced_as``); compute keeps its own precision
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
        share of their rates (:func:`~scaledl.sim.job_network.job_network`)."""
        return job_network(self)

    def measured(self) -> MeasuredProfile | None:
        """The measured profile, if ``profile_path`` names one (read once per job)."""
        if self.profile_path is None:
            return None
        return _load_cached(Path(self.profile_path))

    def contention(self, world_size: int) -> float:
        """Ranks per core when ``cores`` is given and the ranks outnumber them, else 1."""
        if self.cores is None or self.ideal:
            return 1.0
        return ranks_per_core(world_size, self.cores)

    def stretch(self, world_size: int) -> float:
        """How much longer a rank's compute and update take when ``cores`` is given and the
        ranks outnumber them: the fair share ``c = ranks / cores`` times ``1 + timeshare *
        (1 - 1 / c)``, the device's time-sharing loss for the share of time the rank waits for a
        core (1 with ``ideal`` or dedicated cores).  Collectives' CPU work uses
        :meth:`contention` and TCP's own measured factor (``Network.cpu_timeshare``) instead."""
        share = self.contention(world_size)
        if share == 1.0:
            return 1.0
        return share * (1.0 + device(self.device).timeshare * (1.0 - 1.0 / share))

    def device_value(self) -> Device:
        """The device preset, the efficiency in use (the tensor-core one under mixed precision)
        overridden by ``--device-efficiency``."""
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
        the stack's per-call overhead and cycle; none with ``ideal``.

        A profile measured on CUDA keeps the device's interference: its own comes from a
        reduction kernel over the whole GPU beside the model, where NCCL's kernels take a few
        of its multiprocessors (0.41-0.43 on an H100 against 0.189 measured with real
        collectives; docs/simulation.md, "Measured profiles"), so it is an upper bound."""
        if self.ideal:
            return IDEAL
        dev, measured = device(self.device), self.measured()
        software = replace(stack(self.stack_name()), cycle=self.cycle())
        if measured is not None:
            on_gpu = measured.device.get("type") == "cuda"
            return Losses(dev.interference if on_gpu else measured.interference,
                          measured.jitter_cv, software)
        return Losses(dev.interference, dev.jitter_cv, software)

    def compute_model(self, profile: ModelProfile) -> ComputeModel:
        """FLOPs at a constant rate (``ideal``), the measured profile, or the roofline."""
        if self.ideal:
            dev = device(self.device)
            return FlopsCompute(dev.peak_tflops * 1e12 * (self.efficiency or dev.efficiency))
        measured = self.measured()
        if measured is not None:
            return measured.compute_for(profile)
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
                raise ValueError(f"--update-time {self.update_time} must be >= 0")
            return self.update_time
        measured = self.measured()
        if measured is not None and not self.ideal:
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
        net = on_cores(net, topo.world_size, None if self.ideal else self.cores)
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
        if self.input_rate is None or self.ideal:
            return shared
        return fed_by_pipeline(shared, topo.ranks_per_node, self.input_rate)
