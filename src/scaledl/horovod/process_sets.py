"""Process sets: Horovod's subsets of ranks, each backed by two torch process groups.

A registered :class:`ProcessSet` owns a *data* group, on which its collectives run (scaledl's
communicator for that group keeps asynchronous ones in order), and a Gloo *control* group on
which every collective first exchanges a few integers of metadata (see
:mod:`scaledl.horovod.negotiation`).  Keeping the two apart lets the metadata of the next call
travel while earlier asynchronous collectives still run.  The global set uses the default group
for data.

Like ``torch.distributed.new_group``, creating or removing a set is collective: every rank calls
``hvd.add_process_set`` (or ``hvd.init(process_sets=...)``) with the same sets in the same order,
members or not.  As in Horovod, ranks given to collectives of a set (``root_rank`` of broadcast)
are global ranks; ``ProcessSet.rank()`` is the position within the set.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.collectives.communicator import forget_communicator
from scaledl.horovod import runtime
from scaledl.horovod.errors import unsupported
from scaledl.horovod.runtime import AUTO, ALGORITHM_ENV, Algorithms
from scaledl.signature import Kind, Signature, agree, over_group
from scaledl.topology import Topology

__all__ = ["ProcessSet", "SetContext", "JoinServer", "global_process_set", "add_process_set",
           "remove_process_set", "context_of", "bind_global", "release_all"]


class JoinServer(Protocol):
    """Something whose collectives a joined rank can take part in (a DistributedOptimizer)."""

    def serve_joined(self, context: SetContext) -> None:
        """Run this object's collectives with neutral contributions."""
        ...


@dataclass
class SetContext:
    """Where the collectives of one process set run, seen from one member."""

    ranks: tuple[int, ...]
    """Global ranks of the members, ascending."""
    rank: int
    """This process's position in :attr:`ranks`."""
    group: dist.ProcessGroup | None
    """The data group (``None``: the default group)."""
    control: dist.ProcessGroup
    """The Gloo group that carries the metadata exchange."""
    topology: Topology | None
    """Layout for the algorithms (the job's for the global set, none for the others)."""
    algorithms: Algorithms
    """The algorithm of each collective."""
    device: torch.device
    """Where buffers of a joined rank live: the current GPU under NCCL, else the CPU."""
    servers: weakref.WeakValueDictionary[int, JoinServer] = field(
        default_factory=weakref.WeakValueDictionary)
    """Optimizers by plan signature, so a joined rank can join their gradient reductions."""

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)


class ProcessSet:
    """A set of ranks that run collectives together (``hvd.ProcessSet([0, 2])``)."""

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        if not isinstance(ranks_or_comm, Iterable):
            raise unsupported("a process set made from an MPI communicator",
                              "pass the list of its global ranks instead")
        ranks = sorted(ranks_or_comm)
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError(f"process set ranks {ranks!r} must be integers")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"process set ranks {ranks} list a rank twice")
        self.ranks: list[int] | None = ranks
        self.process_set_id: int | None = None
        self._context: SetContext | None = None

    def size(self) -> int | None:
        """Number of members, or ``None`` before the set is registered."""
        return None if self.process_set_id is None or self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's position in the set (``-1`` if not a member); ``None`` unregistered."""
        if self.process_set_id is None or self.ranks is None:
            return None
        me = runtime.current().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process is a member; ``None`` before ``hvd.init()``."""
        state = runtime.peek()
        return None if state is None or self.ranks is None else state.rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
"""All ranks (id 0); its ranks are filled in by ``hvd.init()``."""


def context_of(process_set: ProcessSet) -> SetContext:
    """The context of a set this rank belongs to; ``ValueError`` otherwise."""
    state = runtime.current()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be an hvd.ProcessSet, got {type(process_set).__name__}")
    set_id = process_set.process_set_id
    if set_id is None or state.sets.get(set_id) is not process_set:
        raise ValueError(f"{process_set!r} is not registered; pass it to hvd.init(process_sets="
                         "[...]) or hvd.add_process_set() on every rank first")
    if process_set._context is None:
        raise ValueError(f"rank {state.rank} is not in process set {process_set.ranks}; call its "
                         "collectives only on its members")
    return process_set._context


def _device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")


def bind_global(state: runtime.Runtime) -> None:
    """Register the global set (id 0) over the default group; called by ``hvd.init()``."""
    everyone = list(range(state.size))
    control = dist.new_group(everyone, timeout=state.timeout, backend="gloo")
    global_process_set.ranks = everyone
    global_process_set.process_set_id = 0
    global_process_set._context = SetContext(
        tuple(everyone), state.rank, None, control, state.topology, state.algorithms,
        _device(state.backend))
    state.sets[0] = global_process_set


def _check_algorithms(algorithms: Algorithms, ranks: list[int]) -> None:
    for collective, name in algorithms.items():
        if name != AUTO and collectives.lookup(name, collective).needs_topology:
            raise ValueError(
                f"process set {ranks}: algorithm {name!r} ({collective}) needs the hosts' layout, "
                f"which process sets do not have; choose another with hvd.init(algorithm=...) or "
                f"{ALGORITHM_ENV}")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a set on every rank (collective: all ranks call it in the same order)."""
    state = runtime.current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks or []
    problem = None
    if process_set.process_set_id is not None:
        problem = f"passed {process_set!r}, which is already registered"
    elif not ranks or ranks[0] < 0 or ranks[-1] >= state.size:
        problem = f"passed ranks {ranks}, not a non-empty subset of 0..{state.size - 1}"
    elif any(existing.ranks == ranks for existing in state.sets.values()):
        problem = f"asked for a process set with ranks {ranks}, which already exists; reuse it"
    _agree(state, Signature(Kind.ADD_PROCESS_SET, detail=f"ranks {ranks}", problem=problem))
    _check_algorithms(state.algorithms, ranks)
    group = dist.new_group(ranks, timeout=state.timeout)
    control = dist.new_group(ranks, timeout=state.timeout, backend="gloo")
    process_set.process_set_id = state.next_set_id
    state.next_set_id += 1
    state.sets[process_set.process_set_id] = process_set
    if state.rank in ranks:
        process_set._context = SetContext(
            tuple(ranks), ranks.index(state.rank), group, control, None, state.algorithms,
            _device(state.backend))
    return process_set


def _agree(state: runtime.Runtime, mine: Signature) -> None:
    """Check on the global control group that every rank adds (removes) the same set, so a
    rank that differs fails on every rank instead of leaving the others in new_group."""
    if state.size > 1:
        context = global_process_set._context
        assert context is not None, "hvd.init() registers the global process set first"
        agree(mine, over_group(context.control),
              fix="every rank must add and remove the same process sets in the same order")


def _release(process_set: ProcessSet, destroy_data: bool) -> None:
    context, process_set._context = process_set._context, None
    process_set.process_set_id = None
    if context is None:
        return
    if destroy_data and context.group is not None:
        forget_communicator(context.group)
        _destroy(context.group)
    _destroy(context.control)


def _destroy(group: dist.ProcessGroup) -> None:
    """Destroy ``group`` unless the default group (and with it every group) is already gone."""
    if dist.is_initialized():
        dist.destroy_process_group(group)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set (collective); ``False`` for the global set or an unknown one."""
    state = runtime.current()
    set_id = process_set.process_set_id
    _agree(state, Signature(Kind.REMOVE_PROCESS_SET, detail=f"ranks {process_set.ranks}"))
    if set_id is None or set_id == 0 or state.sets.get(set_id) is not process_set:
        return False
    del state.sets[set_id]
    _release(process_set, destroy_data=True)
    return True


def release_all(state: runtime.Runtime) -> None:
    """Destroy every set's groups (``hvd.shutdown()``); the default group is left alone."""
    for set_id, process_set in sorted(state.sets.items(), reverse=True):
        _release(process_set, destroy_data=set_id != 0)
    state.sets.clear()
