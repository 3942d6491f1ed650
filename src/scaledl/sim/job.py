"""A simulated job: everything ``scaledl simulate`` takes, turned into a prediction."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from scaledl.collectives.auto import CostModel
from scaledl.collectives.registry import ALGORITHMS
from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.iteration import STRATEGIES, IterationResult, simulate_iteration
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import build_network, device
from scaledl.sim.profile import ModelProfile, profile_model
from scaledl.topology import Topology

__all__ = ["Job", "default_topology", "simulated_algorithms", "UPDATE_PASSES"]

UPDATE_PASSES = 5
"""Memory passes over the parameters per optimizer step (SGD with momentum: read weight,
gradient, momentum; write weight, momentum)."""


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


def simulated_algorithms(collective: Collective) -> list[str]:
    """Algorithms the simulator can replay for ``collective`` (scheduled ones: not native/auto)."""
    return [name for name, algo in ALGORITHMS.items()
            if algo.scheduled and collective in algo.supports]


def _override(link: LinkClass, latency_us: float | None, gbps: float | None) -> LinkClass:
    if latency_us is not None and (not math.isfinite(latency_us) or latency_us < 0):
        raise ValueError(f"latency {latency_us} us must be >= 0")
    alpha = link.alpha if latency_us is None else latency_us * 1e-6
    if gbps is None:
        return replace(link, alpha=alpha)
    return LinkClass.from_bandwidth(link.name, alpha, gbps)


@dataclass(frozen=True)
class Job:
    """One training job to predict (see ``scaledl simulate --help`` for each field)."""

    model: str = "resnet50"
    input_shape: tuple[int, ...] | None = None
    """Sample shape (no batch dim); None: ImageNet 3x224x224 or the model's small default."""
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
    bucket_mb: float = 25.0
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

    def topology_value(self) -> Topology:
        """The topology, checked against ``gpus``."""
        return Topology.parse(self.topology or default_topology(self.gpus), self.gpus)

    def check(self) -> None:
        """Raise ValueError for an impossible combination of options."""
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of: "
                             f"{', '.join(STRATEGIES)}")
        needed = {"allreduce": Collective.ALLREDUCE, "reduce-broadcast": Collective.REDUCE}
        collective = needed.get(self.strategy, Collective.ALLREDUCE)
        if self.algorithm not in simulated_algorithms(collective):
            raise ValueError(
                f"--algorithm {self.algorithm} cannot be simulated for {self.strategy}; choose "
                f"one of: {', '.join(simulated_algorithms(collective))}")
        if self.tau < 1:
            raise ValueError(f"--tau {self.tau} must be >= 1 (exchange every tau steps)")
        if self.compute_time is not None and not 0 < self.compute_time < math.inf:
            raise ValueError(f"--compute-time {self.compute_time} must be a finite number of "
                             "seconds > 0")
        if self.update_time is not None and not 0 <= self.update_time < math.inf:
            raise ValueError(f"--update-time {self.update_time} must be a finite number of "
                             "seconds >= 0")
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise ValueError(f"--device-efficiency {self.efficiency} must be in (0, 1]")
        if self.bucket_mb <= 0:
            raise ValueError(f"--bucket-mb {self.bucket_mb} must be > 0")

    def network_value(self) -> Network:
        """Preset or calibrated links with any overrides applied."""
        dev = device(self.device)
        if self.calibration is not None:
            try:
                model = CostModel.from_json(Path(self.calibration).read_text())
            except (OSError, ValueError, TypeError, KeyError) as error:
                raise ValueError(f"cannot read calibration {self.calibration}: {error}; "
                                 "write one with `scaledl simulate calibrate`") from None
            net = replace(Network.from_cost_model(model), oversubscription=self.oversubscription)
        else:
            net = build_network(self.network, self.intra or dev.intra, dev.gamma,
                                self.oversubscription, self.uplink)
        inter = _override(net.inter, self.inter_latency_us, self.inter_gbps)
        intra = _override(net.intra, self.intra_latency_us, self.intra_gbps)
        uplink = net.uplink
        if uplink is not None and (self.inter_latency_us is not None or self.inter_gbps):
            uplink = _override(uplink, self.inter_latency_us, self.inter_gbps)
        return replace(net, inter=inter, intra=intra, uplink=uplink)

    def profile(self) -> ModelProfile:
        """The model profile with this job's bucketing."""
        by_layer = self.strategy == "reduce-broadcast"
        return profile_model(self.model, int(self.bucket_mb * (1 << 20)), self.input_shape,
                             by_layer=by_layer)

    def update_seconds(self, profile: ModelProfile) -> float:
        """The optimizer step: given, or memory passes over the parameters."""
        if self.update_time is not None:
            if self.update_time < 0:
                raise ValueError(f"--update-time {self.update_time} must be >= 0")
            return self.update_time
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
        dev = device(self.device)
        flops = dev.peak_tflops * 1e12 * (self.efficiency or dev.efficiency)
        sim = CollectiveSimulator(topo, net, prof.itemsize)
        return simulate_iteration(
            prof, sim, self.batch, self.strategy, self.algorithm, flops=flops,
            compute_time=self.compute_time, update_s=self.update_seconds(prof), tau=self.tau,
            overlap=self.overlap,
        )
