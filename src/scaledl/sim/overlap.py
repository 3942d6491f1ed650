"""Timelines of one iteration with communication overlapped with compute (virtual time).

Every function takes per-layer forward and backward seconds (already stretched for stragglers),
a collective simulator and the :class:`~scaledl.sim.losses.Losses`, and returns ``(end of the
step before the update, busy communication seconds, end of compute)``.  While a collective runs,
compute advances at ``1 / (1 + kappa)`` of its speed (:func:`scaledl.sim.losses.advance`); every
collective call pays the stack's per-call overhead (on more than one rank).

- :func:`bucketed_allreduce` (DDP): a bucket's allreduce starts when backward has produced its
  last gradient and the previous bucket is done (one communication stream).
- :func:`cycled_allreduce` (Horovod): a background loop wakes every ``cycle_s``, negotiates the
  gradients that became ready (``2 ceil(log2 P)`` latency rounds through the coordinator) and
  reduces them in fused buffers of at most ``fusion_bytes``; the next wake-up is a cycle later or
  when the reductions end, whichever is later.
- :func:`reduce_broadcast` (S-Caffe): per-layer broadcasts back to back that the forward pass
  waits for layer by layer, and a per-layer reduce as soon as backward produced the gradient.
"""

from __future__ import annotations

import math

from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import ROTATION_MIN_RANKS, CollectiveSimulator
from scaledl.sim.compiled import Compiled
from scaledl.sim.losses import Cycle, Losses, Stack, advance
from scaledl.sim.network import INTER, Network
from scaledl.sim.profile import ModelProfile

__all__ = ["bucketed_allreduce", "cycled_allreduce", "reduce_broadcast", "padded_numel",
           "call_time", "call_software"]

Span = tuple[float, float]


def padded_numel(sim: CollectiveSimulator, numel: int) -> int:
    """``numel`` rounded up to a multiple of ``P`` on 64 ranks or more (rotated plans)."""
    p = sim.topology.world_size
    if p >= ROTATION_MIN_RANKS and numel % p:
        return numel + p - numel % p
    return numel


def call_time(sim: CollectiveSimulator, algorithm: str, collective: Collective, numel: int,
              losses: Losses) -> float:
    """One collective call: its replayed schedule plus the stack's per-call overhead, which a
    call on shared memory alone does not pay (its software is the stage's waits, already in
    the schedule: a 64 KiB ``shm`` allreduce takes 0.06 ms on two ranks of this project's VM,
    docs/simulation.md)."""
    if sim.topology.world_size == 1 or numel == 0:
        return 0.0
    padded = padded_numel(sim, numel)
    software = call_software(sim.compiled(algorithm, collective, padded), losses.stack,
                             sim.network)
    return sim.time(algorithm, collective, padded) + software


def call_software(compiled: Compiled, stack: Stack, network: Network) -> float:
    """``stack``'s software seconds for one call of ``compiled`` on ``network``'s CPU cores
    (:meth:`Stack.call_seconds`), none for a call on shared memory alone."""
    if compiled.shared_memory_only:
        return 0.0
    return stack.call_seconds(network.cpu_contention, network.cores_per_rank)


def bucketed_allreduce(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float], overlap: bool, losses: Losses,
) -> tuple[float, float, float]:
    """DDP's buckets on one stream (see the module docstring)."""
    kappa = losses.interference if overlap else 0.0
    busy: list[Span] = []
    comm_end = total = 0.0
    clock = sum(forward)
    order = [min(owners) for _, owners in profile.buckets]  # complete when this layer is done
    pending = 0
    for i in reversed(range(len(backward))):
        clock = advance(clock, backward[i], busy, kappa)
        while overlap and pending < len(order) and order[pending] >= i:
            duration = call_time(sim, algorithm, Collective.ALLREDUCE,
                                 profile.buckets[pending][0], losses)
            start = max(clock, comm_end)
            busy.append((start, start + duration))
            comm_end, total, pending = start + duration, total + duration, pending + 1
    for numel, _ in profile.buckets[pending:]:  # not overlapped: after backward, in order
        duration = call_time(sim, algorithm, Collective.ALLREDUCE, numel, losses)
        comm_end = max(clock, comm_end) + duration
        total += duration
    return max(clock, comm_end), total, clock


def negotiation_time(sim: CollectiveSimulator) -> float:
    """Horovod's coordinator round: gather the ready lists and broadcast the answer, each a
    binomial tree of small messages over the inter-host link."""
    p = sim.topology.world_size
    if p == 1:
        return 0.0
    link = sim.network.link_of_axis(INTER if len(sim.topology.axes) > 1 else 0)
    return 2 * math.ceil(math.log2(p)) * (link.alpha + sim.network.overhead)


def _fused(ready: list[int], profile: ModelProfile, limit: int) -> list[int]:
    """Element counts of the fused buffers for ``ready`` layers, in order, each <= ``limit``."""
    buffers, current = [], 0
    for i in ready:
        nbytes = profile.layers[i].parameter_bytes
        if current and current + nbytes > limit:
            buffers.append(current)
            current = 0
        current += nbytes
    if current:
        buffers.append(current)
    return [b // profile.itemsize for b in buffers]


def cycled_allreduce(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float], losses: Losses, cycle: Cycle, overlap: bool = True,
) -> tuple[float, float, float]:
    """Horovod's negotiation cycle and tensor fusion (see the module docstring); without
    ``overlap`` every gradient is handed over when backward ends (``hvd.allreduce`` after the
    loop) and waits for the next wake-up like any other."""
    if not overlap:
        return _cycled_after_backward(profile, sim, algorithm, forward, backward, losses, cycle)
    kappa, busy = losses.interference, list[Span]()
    clock, layer = sum(forward), len(backward) - 1
    unsent = [i for i in range(len(backward)) if profile.layers[i].parameter_bytes]
    done: list[int] = []
    tick, comm_end, total = 0.0, 0.0, 0.0
    while unsent:
        next_end = math.inf
        while layer >= 0:
            end = advance(clock, backward[layer], busy, kappa)
            if end > tick:
                next_end = end
                break
            clock, layer = end, layer - 1
            done.append(layer + 1)
        ready = [i for i in done if i in unsent]
        if not ready:
            wait = max(next_end - tick, 0.0)
            tick += cycle.cycle_s * max(1, math.ceil(wait / cycle.cycle_s)) if cycle.cycle_s \
                else wait
            continue
        start = max(tick + negotiation_time(sim), comm_end)
        for numel in _fused(ready, profile, cycle.fusion_bytes):
            duration = call_time(sim, algorithm, Collective.ALLREDUCE, numel, losses)
            busy.append((start, start + duration))
            start, total = start + duration, total + duration
        comm_end = start
        unsent = [i for i in unsent if i not in ready]
        tick = max(tick + cycle.cycle_s, comm_end)
    while layer >= 0:  # layers without gradients
        clock, layer = advance(clock, backward[layer], busy, kappa), layer - 1
    return max(clock, comm_end), total, clock


def _cycled_after_backward(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float], losses: Losses, cycle: Cycle,
) -> tuple[float, float, float]:
    """Every gradient ready when the compute ends: the first wake-up at or after it (the
    cycle runs from the iteration's start, as with overlap), one negotiation, then the fused
    buffers back to back."""
    clock = sum(forward) + sum(backward)
    tick = cycle.cycle_s * math.ceil(clock / cycle.cycle_s) if cycle.cycle_s else clock
    ready = [i for i in reversed(range(len(backward))) if profile.layers[i].parameter_bytes]
    start, total = (tick + negotiation_time(sim) if ready else clock), 0.0
    for numel in _fused(ready, profile, cycle.fusion_bytes):
        duration = call_time(sim, algorithm, Collective.ALLREDUCE, numel, losses)
        start, total = start + duration, total + duration
    return max(clock, start), total, clock


def reduce_broadcast(
    profile: ModelProfile, sim: CollectiveSimulator, algorithm: str, forward: list[float],
    backward: list[float], losses: Losses,
) -> tuple[float, float, float]:
    """S-Caffe's per-layer broadcast before forward and reduce during backward: ``(end, busy,
    compute end)``, the last without the time forward waited for broadcasts (so that what it
    exceeds the compute by is interference alone)."""
    kappa, busy = losses.interference, list[Span]()
    total = link_end = clock = waited = 0.0
    for layer, f in zip(profile.layers, forward):
        duration = call_time(sim, algorithm, Collective.BROADCAST,
                             layer.parameter_bytes // profile.itemsize, losses)
        busy.append((link_end, link_end + duration))
        link_end, total = link_end + duration, total + duration
        waited += max(link_end - clock, 0.0)
        clock = advance(max(clock, link_end), f, busy, kappa)
    reduce_end = 0.0
    for i in reversed(range(len(profile.layers))):
        clock = advance(clock, backward[i], busy, kappa)
        duration = call_time(sim, algorithm, Collective.REDUCE,
                             profile.layers[i].parameter_bytes // profile.itemsize, losses)
        start = max(reduce_end, clock)
        busy.append((start, start + duration))
        reduce_end, total = start + duration, total + duration
    return max(reduce_end, clock), total, clock - waited
