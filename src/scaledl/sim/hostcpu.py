"""The host CPU in the replay: where bytes pass through TCP, a round and a stage are CPU work.

Every byte through a socket costs ``cpu_beta`` at each end (the copies through the socket
buffers).  A byte that leaves its host costs the sender ``cpu_beta_link`` more per flow of the
host leaving it in the same round: Linux carries a packet through a veth, the bridge and the
qdisc in the sending context, and flows through one shaped interface contend for its queue.
With more ranks than cores (``Network.cpu_contention`` ranks per core, ``scaledl simulate
--cores``), the rounds of one index share the cores by processor sharing
(:func:`shared_cores`).  A stage is CPU work too: a shared-memory stage entirely (copies and
adds), a stage on the backend's own collective (Gloo over TCP) for the bytes it moves
(:func:`stage_seconds`).  The constants of the cpu device are fitted on the emulated cluster
(docs/simulation.md, "Validation here").
"""

from __future__ import annotations

import numpy as np

from scaledl.collectives.cost import CostModel, stage_time
from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.sim.compiled import Compiled
from scaledl.sim.network import Network

__all__ = ["tcp_work", "shared_cores", "stage_seconds", "native_stage_bytes"]

Arr = np.ndarray


def tcp_work(compiled: Compiled, network: Network, off_host: Arr, host_share: Arr) -> Arr:
    """Per node: CPU seconds its transfers cost where bytes pass through host CPUs (TCP).

    Every socket byte costs ``cpu_beta`` at each end (the copies through the socket buffers):
    every byte with ``Network.tcp_inside``, else only those that leave the host.  A byte
    that leaves the host costs its sender ``cpu_beta_link`` more per flow of the host that
    leaves in the same round: the sender's CPU carries a packet through the host's network path
    (on the emulated cluster a veth, the bridge and the tbf qdisc, all in the sending context),
    and flows that share that path contend for its queue and lock.
    """
    work = np.zeros(compiled.nodes, dtype=np.float64)
    if network.cpu_beta == 0 and network.cpu_beta_link == 0:
        return work
    scale = network.tcp_scale()
    inside = network.cpu_beta * scale if network.tcp_inside else 0.0
    beta = np.where(off_host, network.cpu_beta * scale, inside)
    extra = np.where(off_host, network.cpu_beta_link * scale * host_share, 0.0)
    np.add.at(work, compiled.send_node, compiled.send_bytes * (beta + extra))
    np.add.at(work, compiled.recv_node, compiled.recv_bytes * beta[compiled.match])
    return work


def shared_cores(work: Arr, world_size: int, max_rounds: int, contention: float) -> Arr:
    """Per node: when its CPU ``work`` (seconds on a core of its own) is done, the ranks'
    rounds of one index sharing ``world_size / contention`` cores.

    Processor sharing: while ``n`` rounds still have work, each runs at ``min(1, cores / n)``
    of a core, so the lightest finish first and the rest speed up (water-filling over the
    works sorted per round index).  Equal works all finish at ``work x contention`` (the
    fixed stretch); unequal ones cost what the cores can do: a ring on the emulated cluster,
    whose ranks that cross hosts carry far more CPU work per byte than those on loopback,
    takes ``max(heaviest, total / cores)``-like time instead of the heaviest stretched by the
    contention.  With ``contention == 1`` every rank has a core and ``work`` comes back as it
    is.
    """
    if contention <= 1.0 or world_size < 2:
        return work
    grid = work.reshape(world_size, max_rounds)
    order = np.argsort(grid, axis=0, kind="stable")
    ranked = np.take_along_axis(grid, order, axis=0)
    steps = np.diff(ranked, axis=0, prepend=0.0)
    cores = world_size / contention
    active = world_size - np.arange(world_size, dtype=np.float64)
    done = np.cumsum(steps * np.maximum(1.0, active / cores)[:, None], axis=0)
    finish = np.empty_like(grid)
    np.put_along_axis(finish, order, done, axis=0)
    result: Arr = finish.reshape(-1)
    return result


def native_stage_bytes(stage: Stage, itemsize: int, whole_allreduce: bool) -> float:
    """Bytes each member of a stage on the backend's own collective sends (and receives): a
    ring's ``2 (L-1)/L`` of the buffer for allreduce (and for reduce_scatter where the backend
    runs it as a whole allreduce), ``(L-1)/L`` for reduce_scatter and allgather, the buffer once
    for broadcast and reduce."""
    members = len(stage.members)
    nbytes = float(stage.numel * itemsize)
    share = (members - 1) / members
    collective = stage.collective
    if collective is Collective.ALLREDUCE or (
            collective is Collective.REDUCE_SCATTER and whole_allreduce):
        return 2 * share * nbytes
    if collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER):
        return share * nbytes
    return nbytes


def stage_seconds(stage: Stage, itemsize: int, model: CostModel, network: Network,
                  sharers: int) -> float:
    """Seconds a stage takes once its members are there, with the host CPU's part.

    Shared memory is CPU work alone, so its :func:`~scaledl.collectives.cost.stage_time`
    stretches by the contention.  A stage on the backend's own collective lasts its link time
    or, where bytes pass through TCP, the CPU time of the bytes each member moves (sent at
    ``cpu_beta`` plus, across hosts, ``cpu_beta_link`` per leaving flow; received at
    ``cpu_beta``) stretched by the contention, whichever is longer.
    """
    seconds = stage_time(stage, itemsize, model, sharers)
    if stage.path == Path.SHM:
        return seconds * network.cpu_contention
    no_sockets = network.cpu_beta == 0 and network.cpu_beta_link == 0 or (
        stage.level == 0 and not network.tcp_inside)
    if no_sockets or len(stage.members) < 2:
        return seconds
    moved = native_stage_bytes(stage, itemsize, model.native_reduce_scatter_allreduce)
    link = network.cpu_beta_link * sharers if stage.level > 0 else 0.0
    cpu = moved * (2 * network.cpu_beta + link) * network.tcp_scale()
    return max(seconds, cpu * network.cpu_contention)
