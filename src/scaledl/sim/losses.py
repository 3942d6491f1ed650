"""What real clusters lose beyond the ideal model: per-call software costs, stragglers, overlap
interference and Horovod's negotiation cycle (docs/simulation.md, "What real clusters lose").

Each loss is a physical mechanism with parameters from a preset (with its source) or from a
measured profile, never fitted to a scaling result:

- **Per-call software overhead** (:attr:`Stack.call_overhead_s`): every collective call pays the
  framework's dispatch and the library's launch once, however small the message, so a strategy
  that issues one collective per layer pays it per layer (host CPU work: stretched by the
  network's CPU contention where ranks outnumber cores; a call on shared memory alone pays
  only its stages, :func:`scaledl.sim.overlap.call_time`; the scaledl stack's cost is the
  sharing of cores itself, none with :data:`BUSY_THREADS` cores per rank,
  :meth:`Stack.call_seconds`); and per gradient tensor
  (:attr:`Stack.tensor_overhead_s`) the wrapper's hook and bucket copy, on the backward pass.
- **Interference** (:attr:`Losses.interference`, ``kappa``): while a collective runs, compute on
  the same device runs at ``1 / (1 + kappa)`` of its speed (NCCL kernels take SMs and memory
  bandwidth; on a CPU the executor's thread takes cycles).  :func:`advance` integrates that.
- **Stragglers** (:attr:`Losses.jitter_cv`): a rank's compute time per iteration is
  ``T (1 + cv Z)`` with ``Z`` standard normal, independent across ranks; a synchronous step waits
  for the slowest of ``N`` ranks, ``T (1 + cv e_N)`` with ``e_N = E[max of N standard normals]``
  (:func:`expected_max_normal`: the exact integral ``int x N phi(x) Phi(x)^(N-1) dx``, evaluated
  numerically; ``e_1 = 0``, ``e_2 = 1 / sqrt(pi)``).  One GPU pays nothing (its mean is the
  baseline).
- **A library's share of the link** (:attr:`Stack.link_efficiency`): where a collective
  library was measured on a machine, the share of the link preset's rate its large transfers
  reach (NCCL 1.x: 0.74 on a DGX-1's NVLink); every link's rate is scaled by it.
- **Negotiation and fusion cycle** (:class:`Cycle`, Horovod): a background thread wakes every
  ``cycle_s``; tensors that became ready since the last wake-up are negotiated (the ranks' ready
  lists gathered at a coordinator, its answer broadcast: ``2 ceil(log2 N)`` latency rounds) and
  then reduced in fused buffers of at most ``fusion_bytes``; the next wake-up comes ``cycle_s``
  after this one or when the reductions end, whichever is later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

__all__ = [
    "Cycle", "Stack", "STACKS", "NCCL1_LINK_EFFICIENCY", "stack", "Losses", "IDEAL",
    "expected_max_normal", "straggler_factor", "advance",
]


@dataclass(frozen=True)
class Cycle:
    """Horovod's background loop: negotiation every ``cycle_s``, tensors fused into buffers."""

    cycle_s: float
    """Seconds between wake-ups of the background thread (``HOROVOD_CYCLE_TIME``)."""
    fusion_bytes: int
    """Largest fused buffer (``HOROVOD_FUSION_THRESHOLD``)."""

    def __post_init__(self) -> None:
        if not (self.cycle_s >= 0 and math.isfinite(self.cycle_s)) or self.fusion_bytes < 1:
            raise ValueError(f"cycle {self.cycle_s} s must be >= 0 and fusion buffer "
                             f"{self.fusion_bytes} bytes >= 1")


@dataclass(frozen=True)
class Stack:
    """The software between the training loop and the wire: framework plus collective library."""

    name: str
    call_overhead_s: float
    """Seconds every collective call costs beyond its schedule (dispatch, launch, bookkeeping)."""
    tensor_overhead_s: float = 0.0
    """Seconds of the training loop per gradient tensor when training is distributed (DDP's
    autograd hook and copy into its bucket, Horovod's op and enqueue), paid during backward."""
    cycle: Cycle | None = None
    """Negotiation/fusion cycle (Horovod); None: collectives start when their bucket is ready."""
    source: str = ""
    link_efficiency: float = 1.0
    """The share of a link preset's rate the library's transfers reach on large messages, where
    measured for this library (1: the preset's rate)."""
    shared_cores_only: bool = False
    """The per-call cost is what ranks pay whose threads share cores (the hand-off from the
    caller to the communicator's thread waiting for a time slice): with two cores per rank or
    more it is none (:meth:`call_seconds`)."""

    def __post_init__(self) -> None:
        for what, value in (("call", self.call_overhead_s),
                            ("tensor", self.tensor_overhead_s)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"stack {self.name!r}: {what} overhead {value} s must be "
                                 "finite and >= 0")
        if not 0 < self.link_efficiency <= 1:
            raise ValueError(f"stack {self.name!r}: link efficiency {self.link_efficiency} "
                             "must be in (0, 1]")

    def call_seconds(self, contention: float, cores_per_rank: float = 0.0) -> float:
        """Software seconds of one collective call with ``contention`` ranks per core (1: a
        core each or more) and ``cores_per_rank`` (0: not known): the per-call cost stretched
        by the contention, or none where that cost is the sharing of cores
        (:attr:`shared_cores_only`) and every rank has :data:`BUSY_THREADS` cores."""
        if self.shared_cores_only and cores_per_rank >= BUSY_THREADS:
            return 0.0
        return self.call_overhead_s * contention


BUSY_THREADS = 2
"""Threads of one rank busy during a collective call: the caller's, which hands the call over,
and its communicator's, which runs it (``scaledl.collectives.communicator``).  The scaledl
stack's per-call cost appears with one core per rank (two ranks on this project's 2-core VM:
0.7-1.0 ms where the replay without it gives 0.2-0.7 ms), fits to 0 with four (four ranks on a
16-core host, benchmarks/sim_validation/raw-h100's calibration files), and its six ranks' held-out
points (2.7 cores each) agree better without it (53 of 72 within 15%, 44 with it)."""

TENSOR_OVERHEAD = 23e-6
"""PyTorch 1.4 DDP on one V100 against no DDP (pytorch/pytorch
benchmarks/distributed/ddp/README.md): ResNet-50 0.100 vs 0.097 s per step over its 161
gradient tensors (19 us each), ResNet-101 0.171 vs 0.162 s over 314 (29 us): 23 us on average,
work the training loop does per gradient once it is distributed, with no communication yet."""

NCCL1_LINK_EFFICIENCY = (14.55 + 15.81 + 14.25) / 3 / 20.0
"""NCCL 1.x's allreduce bus bandwidth on 2, 3 and 4 P100 of a DGX-1, every hop one 20 GB/s
NVLink (the ``nvlink1-dgx1`` preset): 14.55, 15.81 and 14.25 GB/s at 1 GiB, nccl-tests
``all_reduce_perf`` (uuudown/Tartan microbenchmark/scale_up_cl/nccl-v1/bandwidth.txt, the data of
Li et al., IISWC 2018), 0.74 of the link on average."""

STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("ideal", 0.0, 0.0, None, "no software cost beyond the network's per-round overhead"),
    Stack("nccl", 10e-6, TENSOR_OVERHEAD, None,
          "a framework collective over NCCL (PyTorch DDP, TensorFlow): one CUDA launch and "
          "NCCL's enqueue, 3.5 us measured for a small allreduce without CUDA graphs "
          "(NVIDIA/nccl#1984), plus the framework's dispatch of the op (assumed 6.5 us); "
          "per gradient tensor: TENSOR_OVERHEAD"),
    Stack("horovod", 10e-6, TENSOR_OVERHEAD, Cycle(5e-3, 64 << 20),
          "Horovod 0.9-0.20 over NCCL (2017 to November 2020; its 512-GPU benchmark ran 0.9): "
          "HOROVOD_CYCLE_TIME default 5 ms and HOROVOD_FUSION_THRESHOLD default 64 MiB "
          "(horovod/common/operations.cc of those releases); per call as nccl, per tensor "
          "assumed as DDP's"),
    Stack("horovod-0.21", 10e-6, TENSOR_OVERHEAD, Cycle(1e-3, 128 << 20),
          "Horovod 0.21 and later (from November 2020): the defaults lowered to a 1 ms cycle "
          "and raised to a 128 MiB fusion buffer (horovod/horovod#2468); costs as horovod's"),
    Stack("tf-replicated", 0.290 / 161, TENSOR_OVERHEAD, None,
          "TensorFlow 1.x tf_cnn_benchmarks, variable_update=replicated, one NCCL allreduce "
          "per gradient tensor: its own all-reduce benchmark measured 0.290 s per step for "
          "ResNet-50's 161 gradients on 8 GPUs without repacking (tensorflow/benchmarks commit "
          "3777598, 'gpu' row), 1.8 ms per call; per tensor as nccl; NCCL 1.x reaches 0.74 of "
          "a link's rate (NCCL1_LINK_EFFICIENCY)", NCCL1_LINK_EFFICIENCY),
    Stack("mpi", 20e-6, 0.0, None,
          "Caffe over CUDA-aware MPI (S-Caffe on MVAPICH2-GDR): an MPI call on GPU buffers, "
          "assumed 20 us of software per call (pointer checks, CUDA stream sync)"),
    Stack("scaledl", 1.444e-3, 0.0, None,
          "scaledl's executor over Gloo on this project's 2-core VM: 1.44 ms per call and per "
          "rank per core (thread hand-offs, Python, waiting for a core), fitted with the cpu "
          "device's TCP costs to the 2x2 run 6 files of benchmarks/sim_validation/raw "
          "(presets.py, CPU_TCP_BETA); none with two cores per rank or more, where a 16-core "
          "host's four ranks fit it to 0 (benchmarks/sim_validation/raw-h100)",
          shared_cores_only=True),
)}


def stack(name: str) -> Stack:
    """The software stack preset ``name``."""
    found = STACKS.get(name.lower())
    if found is None:
        raise ValueError(f"unknown stack {name!r}; choose one of: {', '.join(STACKS)}")
    return found


@dataclass(frozen=True)
class Losses:
    """Every loss term of one job, resolved from the device, the stack and a profile."""

    interference: float = 0.0
    """kappa: compute runs at 1 / (1 + kappa) of its speed while a collective runs."""
    jitter_cv: float = 0.0
    """Coefficient of variation of one rank's compute time per iteration."""
    stack: Stack = field(default_factory=lambda: STACKS["ideal"])

    def __post_init__(self) -> None:
        for what, value in (("interference", self.interference), ("jitter cv", self.jitter_cv)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{what} {value} must be finite and >= 0")

    @property
    def call_overhead_s(self) -> float:
        """Software seconds per collective call."""
        return self.stack.call_overhead_s

    @property
    def tensor_overhead_s(self) -> float:
        """Software seconds per gradient tensor during backward (distributed runs)."""
        return self.stack.tensor_overhead_s

    @property
    def cycle(self) -> Cycle | None:
        """The negotiation/fusion cycle, if the stack has one."""
        return self.stack.cycle


IDEAL = Losses()
"""No losses: the ideal model (``scaledl simulate --ideal``)."""


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """``E[max(Z_1 .. Z_n)]`` for independent standard normals (0 for ``n = 1``)."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    if n == 1:
        return 0.0
    # imported here: the CLI, which every training process imports, need not load SciPy
    from scipy.special import ndtr  # type: ignore[import-untyped]

    x = np.linspace(-9.0, 9.0 + math.sqrt(2 * math.log(n)), 20001)
    density = n * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * ndtr(x) ** (n - 1)
    y = x * density
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)  # trapezoid rule (numpy < 2 too)


def straggler_factor(cv: float, ranks: int) -> float:
    """Expected slowest-rank compute time over the mean, ``1 + cv e_N``."""
    return 1.0 + cv * expected_max_normal(ranks)


def advance(start: float, work: float, busy: Sequence[tuple[float, float]], kappa: float
            ) -> float:
    """When compute of ``work`` seconds (at full speed) started at ``start`` ends, if it runs at
    ``1 / (1 + kappa)`` speed inside the sorted, disjoint ``busy`` intervals."""
    clock, left = start, work
    if kappa == 0 or left <= 0:
        return start + max(left, 0.0)
    for lo, hi in busy:
        if hi <= clock:
            continue
        if lo > clock:  # full speed until the interval starts
            step = min(left, lo - clock)
            clock, left = clock + step, left - step
            if left <= 0:
                return clock
        slow = (hi - clock) / (1 + kappa)  # work done if compute spans the rest of the interval
        if left <= slow:
            return clock + left * (1 + kappa)
        clock, left = hi, left - slow
    return clock + left
