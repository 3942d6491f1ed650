"""The iteration model: one training step of data-parallel SGD at ``P`` GPUs, in virtual time.

Inputs: a :class:`~scaledl.sim.profile.ModelProfile` (per-layer gradient bytes and compute
time), a :class:`~scaledl.sim.collective.CollectiveSimulator` (collective times from replayed
plans) and a strategy of the catalogue that declares which of these models its iteration
follows (``Strategy.timing``; the package's strategy of each model named):

- ``bucketed`` (``allreduce``): gradients in DataParallel's buckets; a bucket's allreduce
  starts when backward has produced its last gradient and the previous bucket's allreduce is
  done (one stream); the step ends when backward and the last allreduce are done, then the
  optimizer updates.
- ``per-layer`` (``reduce-broadcast``, S-Caffe): per layer, a reduce to the root as soon as
  backward produced the layer's gradient; the root updates; per layer, a broadcast that the
  next forward pass of that layer waits for (so later layers' broadcasts hide behind earlier
  layers' compute).
- ``periodic`` (``sync-easgd``, You et al.): workers compute locally; every ``tau`` steps the
  packed model is exchanged by a reduce plus a broadcast with the chosen algorithm (or one
  allreduce), overlapped with the next steps' compute unless ``overlap`` is off.
- ``round-robin`` (``easgd``, the round-robin original, Algorithm 1 of You et al.): every
  ``tau`` steps a worker exchanges its model with the master; the master serves the ``P - 1``
  workers one after another, and a worker waits only for its own turn, so a cycle of ``tau``
  steps lasts ``max(tau x step + e, (P - 1) x e)`` with ``e`` one master<->worker exchange (the
  mean over workers).

What real clusters lose (:mod:`scaledl.sim.losses`): every collective call pays the stack's
per-call overhead; compute that runs beside a collective is slowed by the interference
``kappa`` (:mod:`scaledl.sim.overlap`); a synchronous step waits for the slowest rank, so
compute is stretched by ``1 + cv e_P`` (``cv / sqrt(tau)`` for the periodic model, whose
ranks meet every ``tau`` steps; the round robin has no global barrier); a Horovod stack
replaces the buckets by its negotiation cycle and fused buffers.  With
:data:`~scaledl.sim.losses.IDEAL`
(``--ideal``) none of this applies: the model of earlier releases.

Weak scaling: the per-GPU batch is fixed, so scaling efficiency is the one-GPU iteration time
over the ``P``-GPU one (throughput per GPU at ``P`` over that at 1).  Every strategy's step is at
least its compute plus update (communication, stragglers and interference only add time), so
efficiency never exceeds 1;
nothing clamps it, and a unit test checks it on random inputs.  Collectives on 64 ranks or more
are simulated on ``numel`` rounded up to a multiple of ``P`` (at most ``P - 1`` extra
elements), which makes ring-like plans rotations of one another (see :mod:`scaledl.sim.collective`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from scaledl.collectives.schedule import Action, Collective, Round, Schedule, Transfer
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.compiled import compile_schedules
from scaledl.sim.compute import Times
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.losses import IDEAL, Losses, advance, straggler_factor
from scaledl.sim.overlap import bucketed_allreduce, call_time, cycled_allreduce, reduce_broadcast
from scaledl.sim.profile import ModelProfile
from scaledl.strategies.catalogue import strategies

__all__ = ["simulated_strategies", "timing_of", "IterationResult", "simulate_iteration",
           "against_one_rank", "fed_by_pipeline", "round_robin_schedules", "accumulated"]

def simulated_strategies() -> tuple[str, ...]:
    """The strategies of the catalogue that declare a timing model, in catalogue order."""
    return tuple(name for name, cls in strategies().items() if cls.timing is not None)


def timing_of(strategy: str) -> str:
    """The timing model ``strategy`` declares; a one-line error for one the simulator lacks."""
    cls = strategies().get(strategy)
    if cls is None or cls.timing is None:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of: "
                         f"{', '.join(simulated_strategies())}")
    return cls.timing


@dataclass(frozen=True)
class IterationResult:
    """Predicted time of one iteration and where it goes."""

    strategy: str
    algorithm: str
    world_size: int
    batch_per_gpu: int
    iteration_s: float
    compute_s: float
    """Forward plus backward on one GPU."""
    update_s: float
    """The optimizer step of one GPU (of one rank with a core of its own where ranks share
    cores: :func:`against_one_rank`)."""
    communication_s: float
    """Time collectives are busy per iteration (overlapped or not)."""
    exposed_s: float
    """Iteration time beyond one GPU's compute and update: communication not hidden,
    stragglers, interference."""
    single_gpu_s: float
    straggler_s: float = 0.0
    """Expected wait for the slowest rank's compute per iteration (inside ``exposed_s``)."""
    software_s: float = 0.0
    """The stack's per-gradient-tensor work during backward (inside ``exposed_s``)."""
    interference_s: float = 0.0
    """Compute time lost to overlapped collectives per iteration (inside ``exposed_s``)."""
    input_s: float = 0.0
    """Time the iteration waits for the host's input pipeline (inside ``exposed_s``)."""
    timeshare_s: float = 0.0
    """Compute and update time lost to ranks sharing CPU cores (``--cores``) against one rank
    with a core of its own, the one-GPU baseline (inside ``exposed_s``)."""

    @property
    def communication_share(self) -> float:
        """Fraction of the iteration spent waiting for communication (not for stragglers,
        per-tensor software, interference, input or shared cores)."""
        waiting = (self.exposed_s - self.straggler_s - self.software_s - self.interference_s
                   - self.input_s - self.timeshare_s)
        return max(waiting, 0.0) / self.iteration_s if self.iteration_s > 0 else 0.0

    @property
    def efficiency(self) -> float:
        """Per-GPU throughput at P over that at one GPU (weak scaling)."""
        return self.single_gpu_s / self.iteration_s if self.iteration_s > 0 else 1.0

    @property
    def samples_per_s(self) -> float:
        """Training throughput of all GPUs together."""
        return self.world_size * self.batch_per_gpu / self.iteration_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with the derived metrics."""
        data = asdict(self)
        data.update(communication_share=self.communication_share, efficiency=self.efficiency,
                    samples_per_s=self.samples_per_s)
        return data


def round_robin_schedules(world_size: int, numel: int) -> list[Schedule]:
    """Original EASGD's exchange as schedules: rank 0 (the master) sends the center to worker
    ``w`` and receives its weights, for ``w = 1 .. P-1`` in order; a worker waits its turn."""
    master: list[Round] = []
    for worker in range(1, world_size):
        master.append(Round((Transfer(Action.SEND, worker, 0, numel),)))
        master.append(Round((Transfer(Action.RECV_COPY, worker, 0, numel),)))
    schedules = [Schedule(Collective.REDUCE, "round_robin", 0, world_size, numel, tuple(master))]
    for worker in range(1, world_size):
        rounds = (Round((Transfer(Action.RECV_COPY, 0, 0, numel),)),
                  Round((Transfer(Action.SEND, 0, 0, numel),)))
        schedules.append(Schedule(Collective.REDUCE, "round_robin", worker, world_size, numel,
                                  rounds))
    return schedules


def _easgd_exchange(
    profile: ModelProfile, sim: CollectiveSimulator, timing: str, algorithm: str,
    losses: Losses,
) -> float:
    numel = profile.parameter_bytes // profile.itemsize
    p = sim.topology.world_size
    if p == 1 or numel == 0:
        return 0.0
    if timing == "round-robin":
        compiled = compile_schedules(round_robin_schedules(p, numel), p, profile.itemsize)
        # the master's sends and receives, each a call (not stretched by contention)
        calls = 2 * (p - 1) * losses.stack.call_seconds(1.0, sim.network.cores_per_rank)
        return makespan(compiled, cost(compiled, sim.topology, sim.network)) + calls
    from scaledl.collectives.registry import ALGORITHMS

    if Collective.REDUCE in ALGORITHMS[algorithm].supports:
        return (call_time(sim, algorithm, Collective.REDUCE, numel, losses)
                + call_time(sim, algorithm, Collective.BROADCAST, numel, losses))
    return call_time(sim, algorithm, Collective.ALLREDUCE, numel, losses)


def _round_robin_iteration(
    round_s: float, world_size: int, step_s: float, tau: int
) -> tuple[float, float]:
    """(steady-state seconds per step, master busy seconds per step) of round-robin EASGD.

    ``round_s`` is the master's whole round of ``P - 1`` exchanges, so one exchange takes
    ``e = round_s / (P - 1)`` (every worker is assumed to pay the mean).  A worker computes
    ``tau`` steps, then waits only for its own exchange, not for the others'; the master serves
    one worker at a time.  A cycle therefore lasts ``max(tau * step + e, (P - 1) * e)``: the
    worker's own loop, or the master's round when the master is the bottleneck.
    """
    if world_size < 2 or round_s == 0:
        return step_s, 0.0
    exchange = round_s / (world_size - 1)
    return max(step_s + exchange / tau, round_s / tau), round_s / tau


def simulate_iteration(
    profile: ModelProfile, sim: CollectiveSimulator, batch: int, strategy: str = "allreduce",
    algorithm: str = "ring", flops: float | None = None, compute_time: float | None = None,
    update_s: float = 0.0, tau: int = 1, overlap: bool = True, times: Times | None = None,
    losses: Losses = IDEAL,
) -> IterationResult:
    """Predict one iteration of ``strategy`` (see the module docstring).

    Per-layer compute comes from ``times`` (a :mod:`~scaledl.sim.compute` model's output) or,
    without it, from the ideal rule on ``flops`` or ``compute_time``; ``losses`` adds per-call
    overheads, interference, stragglers and Horovod's cycle (:data:`IDEAL`: none).
    """
    timing = timing_of(strategy)
    if tau < 1:
        raise ValueError(f"tau {tau} must be >= 1 (exchange every tau steps)")
    if update_s < 0:
        raise ValueError(f"update time {update_s} s must be >= 0")
    forward, backward = times if times is not None else profile.compute_times(
        batch, flops, compute_time)
    compute = sum(forward)
    for seconds in reversed(backward):  # summed in the timelines' order: no rounding gap
        compute += seconds
    p = sim.topology.world_size
    jitter = losses.jitter_cv / (math.sqrt(tau) if timing == "periodic" else 1.0)
    stretch = straggler_factor(jitter, p) if timing != "round-robin" else 1.0
    if stretch != 1.0:
        forward, backward = [f * stretch for f in forward], [b * stretch for b in backward]
    software = 0.0
    if p > 1 and losses.tensor_overhead_s and timing in ("bucketed", "per-layer"):
        backward = [b + layer.tensors * losses.tensor_overhead_s
                    for b, layer in zip(backward, profile.layers)]
        software = sum(layer.tensors for layer in profile.layers) * losses.tensor_overhead_s
    compute_end = compute * stretch
    if timing == "bucketed":
        if losses.cycle is not None and p > 1:  # one GPU negotiates nothing
            end, busy, compute_end = cycled_allreduce(profile, sim, algorithm, forward, backward,
                                                      losses, losses.cycle, overlap)
        else:
            end, busy, compute_end = bucketed_allreduce(profile, sim, algorithm, forward,
                                                        backward, overlap, losses)
        iteration = end + update_s
    elif timing == "per-layer":
        end, busy, compute_end = reduce_broadcast(profile, sim, algorithm, forward, backward,
                                                  losses)
        iteration = end + update_s
    elif timing == "round-robin":
        iteration, busy = _round_robin_iteration(
            _easgd_exchange(profile, sim, timing, algorithm, losses), p, compute + update_s,
            tau)
    else:
        busy = _easgd_exchange(profile, sim, timing, algorithm, losses) / tau
        if overlap:
            compute_end = advance(0.0, compute * stretch, [(0.0, busy)], losses.interference)
            iteration = max(compute_end, busy) + update_s
        else:
            iteration = compute * stretch + busy + update_s
    single = compute + update_s
    return IterationResult(strategy, algorithm, p, batch, iteration, compute,
                           update_s, busy, iteration - single, single,
                           straggler_s=compute * (stretch - 1), software_s=software,
                           interference_s=max(compute_end - compute * stretch - software, 0.0))


def accumulated(result: IterationResult, steps: int) -> IterationResult:
    """One optimizer step that accumulates gradients over ``steps`` micro-batches of
    ``result``'s: ``steps - 1`` forward and backward passes with no communication (DDP's
    ``no_sync``, Horovod's ``backward_passes_per_step``), then the step ``result`` describes,
    whose collectives overlap only the last backward pass.

    The ranks meet once per optimizer step, so the wait for the slowest is that of the sum of
    ``steps`` independent micro-batch times: ``sqrt(steps)`` times one micro-batch's (its
    standard deviation), where a barrier per micro-batch would cost ``steps`` times.  Samples
    per step (``batch_per_gpu``) and compute grow ``steps``-fold; the update is paid once.
    """
    if steps < 1:
        raise ValueError(f"gradient accumulation over {steps} micro-batches must be >= 1")
    if steps == 1:
        return result
    local = (steps - 1) * result.compute_s
    straggler = result.straggler_s * math.sqrt(steps)
    iteration = result.iteration_s + local + (straggler - result.straggler_s)
    single = result.single_gpu_s + local
    return replace(result, batch_per_gpu=result.batch_per_gpu * steps, iteration_s=iteration,
                   compute_s=result.compute_s * steps, exposed_s=iteration - single,
                   single_gpu_s=single, straggler_s=straggler)


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
