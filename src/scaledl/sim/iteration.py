"""The iteration model: one training step of data-parallel SGD at ``P`` GPUs, in virtual time.

Inputs: a :class:`~scaledl.sim.profile.ModelProfile` (per-layer gradient bytes and compute
time), a :class:`~scaledl.sim.collective.CollectiveSimulator` (collective times from replayed
plans) and a strategy:

- ``allreduce``: gradients in DataParallel's buckets; a bucket's allreduce starts when backward
  has produced its last gradient and the previous bucket's allreduce is done (one stream); the
  step ends when backward and the last allreduce are done, then the optimizer updates.
- ``reduce-broadcast`` (S-Caffe): per layer, a reduce to the root as soon as backward produced the
  layer's gradient; the root updates; per layer, a broadcast that the next forward pass of that
  layer waits for (so later layers' broadcasts hide behind earlier layers' compute).
- ``sync-easgd`` (You et al.): workers compute locally; every ``tau`` steps the packed model is
  exchanged by a reduce plus a broadcast with the chosen algorithm (or one allreduce), overlapped
  with the next steps' compute unless ``overlap`` is off.
- ``easgd`` (the round-robin original, Algorithm 1 of You et al.): every ``tau`` steps a worker
  exchanges its model with the master; the master serves the ``P - 1`` workers one after
  another, and a worker waits only for its own turn, so a cycle of ``tau`` steps lasts
  ``max(tau x step + e, (P - 1) x e)`` with ``e`` one master<->worker exchange (the mean over
  workers).

Weak scaling: the per-GPU batch is fixed, so scaling efficiency is the one-GPU iteration time
over the ``P``-GPU one (throughput per GPU at ``P`` over that at 1).  Every strategy's step is at
least its compute plus update (communication only adds time), so efficiency never exceeds 1;
nothing clamps it, and a unit test checks it on random inputs.  Collectives on 64 ranks or more
are simulated on ``numel`` rounded up to a multiple of ``P`` (at most ``P - 1`` extra
elements), which makes ring-like plans rotations of one another (see :mod:`scaledl.sim.collective`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scaledl.collectives.schedule import Action, Collective, Round, Schedule, Transfer
from scaledl.sim.collective import ROTATION_MIN_RANKS, CollectiveSimulator
from scaledl.sim.compiled import compile_schedules
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.profile import ModelProfile

__all__ = ["STRATEGIES", "IterationResult", "simulate_iteration", "round_robin_schedules"]

STRATEGIES = ("allreduce", "reduce-broadcast", "sync-easgd", "easgd")


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
    communication_s: float
    """Time collectives are busy per iteration (overlapped or not)."""
    exposed_s: float
    """Iteration time beyond compute and update: communication not hidden."""
    single_gpu_s: float

    @property
    def communication_share(self) -> float:
        """Fraction of the iteration spent waiting for communication."""
        return self.exposed_s / self.iteration_s if self.iteration_s > 0 else 0.0

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


def _numel(sim: CollectiveSimulator, numel: int) -> int:
    p = sim.topology.world_size
    if p >= ROTATION_MIN_RANKS and numel % p:
        return numel + p - numel % p
    return numel


def _allreduce(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float], overlap: bool,
) -> tuple[float, float]:
    """(end of the step before the update, busy communication time)."""
    t_forward = sum(forward)
    ready = [0.0] * len(forward)
    clock = t_forward
    for i in reversed(range(len(forward))):
        clock += backward[i]
        ready[i] = clock
    compute_end = clock
    comm_end, busy = 0.0, 0.0
    for numel, owners in profile.buckets:
        duration = sim.time(algorithm, Collective.ALLREDUCE, _numel(sim, numel))
        start = max(max(ready[i] for i in owners) if overlap else compute_end, comm_end)
        comm_end = start + duration
        busy += duration
    return max(compute_end, comm_end), busy


def _reduce_broadcast(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float],
) -> tuple[float, float]:
    """(end of the last reduction and of backward, busy communication time)."""
    busy = 0.0
    link_end, clock = 0.0, 0.0
    for layer, f in zip(profile.layers, forward):
        duration = sim.time(algorithm, Collective.BROADCAST,
                            _numel(sim, layer.parameter_bytes // profile.itemsize))
        link_end += duration
        busy += duration
        clock = max(clock, link_end) + f
    reduce_end = 0.0
    for i in reversed(range(len(profile.layers))):
        clock += backward[i]
        duration = sim.time(algorithm, Collective.REDUCE,
                            _numel(sim, profile.layers[i].parameter_bytes // profile.itemsize))
        reduce_end = max(reduce_end, clock) + duration
        busy += duration
    return max(reduce_end, clock), busy


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
    profile: ModelProfile, sim: CollectiveSimulator, strategy: str, algorithm: str
) -> float:
    numel = profile.parameter_bytes // profile.itemsize
    p = sim.topology.world_size
    if p == 1 or numel == 0:
        return 0.0
    if strategy == "easgd":
        compiled = compile_schedules(round_robin_schedules(p, numel), p, profile.itemsize)
        return makespan(compiled, cost(compiled, sim.topology, sim.network))
    numel = _numel(sim, numel)
    from scaledl.collectives.registry import ALGORITHMS

    if Collective.REDUCE in ALGORITHMS[algorithm].supports:
        return (sim.time(algorithm, Collective.REDUCE, numel)
                + sim.time(algorithm, Collective.BROADCAST, numel))
    return sim.time(algorithm, Collective.ALLREDUCE, numel)


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
    update_s: float = 0.0, tau: int = 1, overlap: bool = True,
) -> IterationResult:
    """Predict one iteration of ``strategy`` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if tau < 1:
        raise ValueError(f"tau {tau} must be >= 1 (exchange every tau steps)")
    if update_s < 0:
        raise ValueError(f"update time {update_s} s must be >= 0")
    forward, backward = profile.compute_times(batch, flops, compute_time)
    compute = sum(forward)
    for seconds in reversed(backward):  # summed in the timelines' order: no rounding gap
        compute += seconds
    if strategy == "allreduce":
        end, busy = _allreduce(profile, sim, algorithm, forward, backward, overlap)
        iteration = end + update_s
    elif strategy == "reduce-broadcast":
        end, busy = _reduce_broadcast(profile, sim, algorithm, forward, backward)
        iteration = end + update_s
    elif strategy == "easgd":
        iteration, busy = _round_robin_iteration(
            _easgd_exchange(profile, sim, strategy, algorithm), sim.topology.world_size,
            compute + update_s, tau)
    else:
        busy = _easgd_exchange(profile, sim, strategy, algorithm) / tau
        iteration = (max(compute, busy) if overlap else compute + busy) + update_s
    single = compute + update_s
    return IterationResult(strategy, algorithm, sim.topology.world_size, batch, iteration,
                           compute, update_s, busy, iteration - single, single)
