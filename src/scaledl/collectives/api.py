"""The public collectives: in place, like ``torch.distributed``, with a choice of algorithm.

Each call validates its arguments in the caller (so a mistake raises at once, on every rank),
then runs as a job of the group's :class:`~scaledl.collectives.communicator.Communicator`:
synchronously, or in order on its worker thread with ``async_op=True`` (returning a handle with
``wait()``).  A job flattens the tensor (copying only if it is not contiguous, or if it lives on a
GPU and the backend is Gloo) and runs the one call path of every collective
(:meth:`scaledl.collectives.call.Call.run`): resolve ``auto`` with the cost model, plan (cached),
execute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaledl.collectives import shm_direct
from scaledl.collectives.auto import CostModel, Fabric, check_paths, choose
from scaledl.collectives.call import Call
from scaledl.collectives.communicator import (
    CollectiveHandle, Communicator, communicator_for, existing_communicator,
)
from scaledl.collectives.ops import ReduceOp, check_dtype
from scaledl.collectives.registry import AUTO, lookup, parse_collective
from scaledl.collectives.schedule import Collective
from scaledl.topology import TOPOLOGY_ENV, Topology, current_job, host_digest
from scaledl.transport.shm_open import shm_supported
from scaledl.transport.torch_p2p import resolve_group

__all__ = [
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "explain",
    "resolve_topology", "resolve_algorithm",
]

Group = dist.ProcessGroup | None


@dataclass(frozen=True)
class _GroupView:
    """What a call needs to know of a group before running: its size, our rank, its default
    layout and the cost model, taken from its communicator or, without one, from the layout
    ``scaledl.init()`` agreed on, so that asking never communicates."""

    world_size: int
    rank: int
    default_topology: Topology
    cost_model: CostModel
    agreed: bool
    """False when no rank has been asked yet (no communicator, no ``scaledl.init()``)."""
    fabric: Fabric = Fabric()
    """The paths the group can use (unknown, so none, before its communicator exists)."""


def _view(group: Group) -> _GroupView:
    comm = existing_communicator(group)
    if comm is not None:
        return _GroupView(comm.world_size, comm.rank, comm.default_topology, comm.cost_model,
                          True, comm.fabric)
    resolved = resolve_group(group)
    ranks = dist.get_process_group_ranks(resolved)
    rank = dist.get_rank(resolved)
    job = current_job()
    if job is None:
        return _GroupView(len(ranks), rank, Topology.flat(len(ranks), rank), CostModel.load(),
                          False)
    backend = str(dist.get_backend(resolved))
    hosts = tuple(host_digest(job.hosts[g]) for g in ranks)
    fabric = Fabric(hosts if shm_supported(backend) else None,
                    native_stages=backend in ("gloo", "nccl"))
    return _GroupView(len(ranks), rank, job.topology_for(ranks, rank),
                      CostModel.load().for_backend(backend), True, fabric)


def _topology(topology: Topology | None, view: _GroupView | Communicator) -> Topology:
    p = view.world_size
    if topology is None:
        return view.default_topology
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a scaledl.Topology (scaledl.Topology.parse('RxH', "
                        f"{p}): R ranks per host, H hosts) or None, got "
                        f"{type(topology).__name__} {topology!r}")
    if topology.world_size != p:
        raise ValueError(
            f"topology {topology.spec} describes {topology.world_size} ranks but the group has "
            f"{p}; give axes whose product is {p}"
        )
    return topology.with_rank(view.rank)


def _prepare(
    collective: Collective, tensors: list[torch.Tensor], op: str | ReduceOp, algorithm: str,
    topology: Topology | None, group: Group, root: int = 0,
) -> Call:
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        check_dtype(tensor)
    if len({t.dtype for t in tensors}) > 1:
        raise TypeError(f"input and output dtypes differ: {[t.dtype for t in tensors]}")
    reduce_op = ReduceOp.parse(op)
    comm = communicator_for(group)
    key = (algorithm, collective, topology)
    topo = comm.checked.get(key)
    if topo is None:  # checks that depend only on the arguments: once per combination
        topo = _checked_topology(algorithm, collective, topology, comm)
        comm.checked[key] = topo
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError(f"the root rank (src or dst) must be an int, got {type(root).__name__} "
                        f"{root!r}")
    if not 0 <= root < comm.world_size:
        raise ValueError(f"root rank {root} is outside the group of {comm.world_size} ranks")
    return Call(comm, collective, algorithm, topo, reduce_op, root)


def _checked_topology(
    algorithm: str, collective: Collective, topology: Topology | None,
    view: _GroupView | Communicator,
) -> Topology:
    algo = lookup(algorithm, collective) if algorithm != AUTO else None
    topo = _topology(topology, view)
    if algo is not None and isinstance(view, Communicator):
        check_paths(algorithm, collective, topo, view.fabric)
    if algo is not None and algo.needs_topology and not topo.explicit:
        raise ValueError(
            f"algorithm {algorithm!r} needs the network layout: pass "
            f"topology=scaledl.Topology.parse('RxH', {view.world_size}) "
            "(R ranks per host, H hosts), "
            f"set {TOPOLOGY_ENV}=RxH, or launch with torchrun --nproc-per-node R"
        )
    return topo


def resolve_topology(
    algorithm: str, collective: str | Collective, topology: Topology | None = None,
    group: Group = None,
) -> Topology:
    """The layout ``algorithm`` will use for ``collective`` on ``group``, checked now: an
    unknown algorithm, a topology of the wrong size, or a missing one that the algorithm needs
    raises ``ValueError``.  Wrappers call this once when they are built.

    It communicates only when the group's layout has not been agreed yet, neither by
    ``scaledl.init()`` nor by an earlier scaledl call on the group: then, like a group's first
    scaledl call, it must be made on every rank of the group.
    """
    view: _GroupView | Communicator = _view(group)
    if not isinstance(view, Communicator) and not view.agreed:
        view = communicator_for(group)
    return _checked_topology(algorithm, parse_collective(collective), topology, view)


def allreduce(
    tensor: torch.Tensor, op: str | ReduceOp = "sum", algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``tensor`` over all ranks of ``group``, in place on every rank."""
    # an allreduce seen before goes straight to shared memory (shm_direct's docstring)
    if not async_op and shm_direct.allreduce(tensor, op, algorithm, topology, group):
        return None
    call = _prepare(Collective.ALLREDUCE, [tensor], op, algorithm, topology, group)
    handle = call.comm.submit(call.job(tensor), async_op)
    if not async_op:
        shm_direct.learn(call, tensor, op, topology)
    return handle


def broadcast(
    tensor: torch.Tensor, src: int = 0, algorithm: str = AUTO, topology: Topology | None = None,
    group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Copy ``tensor`` of group rank ``src`` into ``tensor`` on every rank."""
    call = _prepare(Collective.BROADCAST, [tensor], "sum", algorithm, topology, group, src)
    return call.comm.submit(call.job(tensor), async_op)


def reduce(
    tensor: torch.Tensor, dst: int = 0, op: str | ReduceOp = "sum", algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``tensor`` over all ranks into ``tensor`` on group rank ``dst``.

    Other ranks' tensors are left unchanged.
    """
    call = _prepare(Collective.REDUCE, [tensor], op, algorithm, topology, group, dst)
    return call.comm.submit(call.job(tensor), async_op)


def _check_sizes(name: str, small: torch.Tensor, large: torch.Tensor, world_size: int) -> None:
    if large.numel() != small.numel() * world_size:
        raise ValueError(
            f"{name}: the full tensor has {large.numel()} elements but must have world size "
            f"({world_size}) x shard ({small.numel()}) = {small.numel() * world_size}"
        )


def reduce_scatter(
    output: torch.Tensor, input: torch.Tensor, op: str | ReduceOp = "sum",
    algorithm: str = AUTO, topology: Topology | None = None, group: Group = None,
    async_op: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``input`` (``p`` equal blocks) over all ranks; rank ``r`` gets block ``r``."""
    call = _prepare(Collective.REDUCE_SCATTER, [output, input], op, algorithm, topology, group)
    _check_sizes("reduce_scatter", output, input, call.comm.world_size)
    return call.comm.submit(call.job(output, input), async_op)


def allgather(
    output: torch.Tensor, input: torch.Tensor, algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Concatenate every rank's ``input`` into ``output`` (rank ``r``'s at block ``r``)."""
    call = _prepare(Collective.ALLGATHER, [output, input], "sum", algorithm, topology, group)
    _check_sizes("allgather", input, output, call.comm.world_size)
    return call.comm.submit(call.job(output, input), async_op)


def explain(
    collective: str, numel: int, dtype: torch.dtype = torch.float32,
    topology: Topology | None = None, group: Group = None,
) -> str:
    """Why ``auto`` picks what it picks for this collective and size (a short table).

    It never communicates, so one rank may call it alone.  Before the group's layout is agreed
    (no ``scaledl.init()`` and no scaledl call on the group yet) it reasons from this rank's own
    view, and says so.
    """
    wanted = parse_collective(collective)
    check_dtype(torch.empty(0, dtype=dtype))
    view = _view(group)
    topo = _checked_topology(AUTO, wanted, topology, view)
    if topo.world_size == 1:
        return (f"auto: a group of one rank has nothing to communicate ({wanted.value} of "
                f"{numel} elements returns at once, whatever the algorithm)")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    text = choose(wanted, topo, numel, itemsize, view.cost_model, fabric=view.fabric).explain()
    if not view.agreed:
        text += ("\n  (this rank's own view: the group's layout and cost model are agreed at "
                 "scaledl.init() or at the group's first collective)")
    return text


def resolve_algorithm(
    collective: str, numel: int, dtype: torch.dtype = torch.float32, algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, root: int = 0,
) -> str:
    """The algorithm a call with these arguments runs on ``group``: ``algorithm`` itself,
    ``auto``'s choice, or a levelled algorithm with its paths per level (for example
    ``hierarchical[shm,ring]``), the same decision (and cache) the call itself uses.

    ``numel`` counts the whole tensor, or one rank's block for reduce_scatter and allgather.
    Like a group's first scaledl call, it opens the group's communicator if there is none yet,
    and must then be made on every rank.
    """
    wanted = parse_collective(collective)
    probe = torch.empty(0, dtype=dtype)
    call = _prepare(wanted, [probe], "sum", algorithm, topology, group, root)
    return call.resolve(numel, probe.element_size())
