"""One accelerator as the simulator sees it: peak, memory, the roofline's constants and the
loss terms' parameters (the presets with their sources are in :mod:`scaledl.sim.presets`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Device"]


@dataclass(frozen=True)
class Device:
    """One accelerator as the simulator sees it (sources: docs/simulation.md, "Presets")."""

    name: str
    peak_tflops: float
    """Vendor peak at the preset's own training precision (FP32, or TF32 on tensor cores),
    TFLOP/s; the FP16/BF16 peak is ``mixed_tflops``."""
    efficiency: float
    """The ideal model's constant fraction of peak at every batch (``--ideal``)."""
    memory_gbps: float
    """Memory bandwidth, GB/s: a reduction reads two operands and writes one."""
    intra: str
    """Default intra-host link preset."""
    source: str
    compute_efficiency: float = 0.5
    """Fraction of peak that compute-bound kernels sustain (the roofline's flat part)."""
    fill_threads: int = 1
    """Threads in flight that use every core: SMs x resident threads per SM."""
    launch_s: float = 0.0
    """Fixed seconds per layer per forward pass (kernel launches, framework dispatch)."""
    interference: float = 0.0
    """kappa: compute slows to 1 / (1 + kappa) while a collective runs beside it."""
    jitter_cv: float = 0.0
    """Coefficient of variation of one rank's compute time per iteration."""
    tcp_beta: float = 0.0
    """CPU seconds per byte a rank spends at each end of a transfer through a TCP socket:
    every link on a Gloo device, the bytes that cross hosts on a ``TCP_LINKS`` network on the
    others (``Job.network_value``); RDMA and links inside a GPU host cost none."""
    tcp_link_beta: float = 0.0
    """Extra CPU seconds per byte at the sending end when the transfer crosses hosts."""
    tcp_timeshare: tuple[tuple[float, float], ...] = ()
    """``(ranks per core, multiplier)`` of the TCP costs when ranks outnumber ``--cores``
    (``Network.cpu_timeshare``)."""
    timeshare: float = 0.0
    """Fraction of compute lost per unit of the time a rank waits for a core when ranks
    outnumber ``--cores`` (cold caches after another rank's slice); see ``Job.stretch``."""
    nhwc_convolutions: bool = False
    """Its peak is tensor-core math, on which cuDNN runs convolutions on NHWC tensors: an NCHW
    model (PyTorch's default layout) pays a transpose of each convolution's tensors before and
    after it (``scaledl.sim.compute``; none with ``Job.channels_last``)."""
    mixed_tflops: float = 0.0
    """Dense FP16/BF16 tensor-core peak, TFLOP/s, for ``Job.mixed_precision``; 0: the device has
    no mixed-precision preset."""
    tensor_efficiency: float = 0.0
    """The roofline's ``e`` for tensor-core kernels under mixed precision (the same as
    ``compute_efficiency`` where the preset's own precision runs on tensor cores)."""
    backend: str = "nccl"
    """The library of the backend's own collectives on this device ('nccl' on GPUs, 'gloo' on
    the cpu device, 'mpi' on KNL): Gloo's reduce_scatter is a whole allreduce."""
    cuda_names: tuple[str, ...] = ()
    """Words that name this GPU in ``torch.cuda.get_device_name`` (every one must be a word
    of it, in any case: ``("A100", "80GB")``): how a CUDA profile finds its preset; empty off
    GPUs."""

    def names(self, gpu_name: str) -> bool:
        """Whether the CUDA device ``gpu_name`` (``"NVIDIA H100 80GB HBM3"``) is this preset's
        GPU: every one of its ``cuda_names`` is one of its words (``A100`` names neither an
        ``RTX A1000`` nor a ``GH200``'s ``H200``)."""
        words = set(re.split(r"[^0-9A-Z]+", gpu_name.upper()))
        return bool(self.cuda_names) and all(w.upper() in words for w in self.cuda_names)

    @property
    def is_gpu(self) -> bool:
        """A GPU preset: its collectives are NCCL's (cpu and knl run ranks on CPU cores)."""
        return self.backend == "nccl"

    def __post_init__(self) -> None:
        if self.peak_tflops <= 0 or not 0 < self.efficiency <= 1 or self.memory_gbps <= 0:
            raise ValueError(
                f"device {self.name!r} needs peak > 0, efficiency in (0, 1] and memory bandwidth "
                f"> 0; got {self.peak_tflops}, {self.efficiency}, {self.memory_gbps}"
            )
        if self.mixed_tflops < 0 or not 0 <= self.tensor_efficiency <= 1 or (
                self.mixed_tflops > 0) != (self.tensor_efficiency > 0):
            raise ValueError(
                f"device {self.name!r} needs a mixed-precision peak >= 0 and a tensor-core "
                f"efficiency in [0, 1], both set or both 0; got {self.mixed_tflops}, "
                f"{self.tensor_efficiency}")
        if not 0 < self.compute_efficiency <= 1 or self.fill_threads < 1 or min(
                self.launch_s, self.interference, self.jitter_cv, self.tcp_beta,
                self.tcp_link_beta, self.timeshare) < 0:
            raise ValueError(
                f"device {self.name!r} needs compute efficiency in (0, 1], fill threads >= 1 "
                f"and launch, interference, jitter, TCP and time-sharing costs >= 0; got "
                f"{self.compute_efficiency}, {self.fill_threads}, {self.launch_s}, "
                f"{self.interference}, {self.jitter_cv}, {self.tcp_beta}, "
                f"{self.tcp_link_beta}, {self.timeshare}")

    @property
    def flops(self) -> float:
        """Effective training FLOP/s of the ideal model."""
        return self.peak_tflops * 1e12 * self.efficiency

    @property
    def gamma(self) -> float:
        """Seconds per byte of a sum reduction (three memory passes)."""
        return 3.0 / (self.memory_gbps * 1e9)
