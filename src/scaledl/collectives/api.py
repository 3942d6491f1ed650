"""The public collectives: in place, like ``torch.distributed``, with a choice of algorithm.

Each call validates its arguments in the caller (so a mistake raises at once, on every rank),
then runs as a job of the group's :class:`~scaledl.collectives.communicator.Communicator`:
synchronously, or in order on its worker thread with ``async_op=True`` (returning a handle with
``wait()``).  A job flattens the tensor (copying only if it is not contiguous, or if it lives on a
GPU and the backend is Gloo), resolves ``auto`` with the cost model, plans (cached) and executes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaledl.collectives import native
from scaledl.collectives.auto import CostModel, Fabric, check_paths, choose, choose_paths
from scaledl.collectives.communicator import (
    CollectiveHandle, Communicator, communicator_for, existing_communicator,
)
from scaledl.collectives.executor import (
    Workspace, execute, execute_allgather, execute_reduce_scatter,
)
from scaledl.collectives.ops import SUPPORTED_DTYPES, ReduceOp, check_dtype
from scaledl.collectives.registry import (
    ALGORITHMS, AUTO, lookup, parse_algorithm, parse_collective, plan,
)
from scaledl.collectives.schedule import Collective, Schedule, Stage
from scaledl.faults import at_collective
from scaledl.topology import TOPOLOGY_ENV, Topology, current_job, host_digest
from scaledl.transport.shm_open import shm_supported
from scaledl.transport.torch_p2p import TorchTransport, resolve_group

__all__ = [
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "explain",
    "resolve_topology",
]

Group = dist.ProcessGroup | None


@dataclass(frozen=True)
class _Call:
    comm: Communicator
    collective: Collective
    algorithm: str
    topology: Topology
    op: ReduceOp
    root: int

    def begin(self, numel: int, dtype: torch.dtype) -> None:
        """Start a job: in debug mode, check that every rank agrees on the call."""
        at_collective()  # fault-injection hook point (SCALEDL_FAULT, see scaledl.faults)
        if self.comm.check and self.comm.world_size > 1:
            _check_agreement(self, numel, dtype)

    def resolve(self, numel: int, itemsize: int) -> str:
        """The algorithm to run: the one asked for, ``auto``'s (cached) choice, or for a
        levelled algorithm given without paths, its best paths per level (cached)."""
        base, paths = parse_algorithm(self.algorithm)
        levelled = ALGORITHMS[base].levels if base in ALGORITHMS else False
        if self.algorithm != AUTO and (paths or not levelled):
            return self.algorithm
        key = (self.algorithm, self.collective, numel, itemsize, self.root, self.topology)
        name = self.comm.choices.get(key)
        if name is None:
            comm = self.comm
            if self.algorithm == AUTO:
                name = choose(self.collective, self.topology, numel, itemsize, comm.cost_model,
                              self.root, fabric=comm.fabric).algorithm
            else:
                name = choose_paths(base, self.collective, self.topology, numel, itemsize,
                                    comm.cost_model, comm.fabric, self.root)[0]
            comm.choices[key] = name
        return name

    def run(
        self, buffer: torch.Tensor, shard: torch.Tensor | None = None, name: str | None = None
    ) -> str:
        """Run on the flat working ``buffer``; return the algorithm used."""
        numel = buffer.numel() if shard is None else shard.numel()
        name = name if name is not None else self.resolve(numel, buffer.element_size())
        if self.comm.world_size == 1:
            return name
        if name == "native":
            native.run(self.collective, buffer, self.op, self.comm.channel, self.root, shard)
            return name
        schedule = plan(name, self.collective, self.topology, self.comm.rank, numel, self.root)
        rounds = schedule.rounds
        if len(rounds) == 1 and rounds[0].stage is not None:  # one stage: no dataflow to run
            self.comm.stages.run(rounds[0].stage, buffer, self.op)
        else:
            execute(schedule, buffer, *self.executor_args(buffer), self.comm.stages)
        return name

    def executor_args(
        self, like: torch.Tensor
    ) -> tuple[TorchTransport, ReduceOp, int, Workspace]:
        """Transport, op, chunk length and workspace for the executor."""
        chunk_numel = max(1, self.comm.chunk_bytes // like.element_size())
        return self.comm.transport, self.op, chunk_numel, self.comm.workspace


_DTYPE_CODES = {dtype: code for code, dtype in enumerate(SUPPORTED_DTYPES)}
_COLLECTIVE_CODES = {collective: code for code, collective in enumerate(Collective)}
_OP_CODES = {op: code for code, op in enumerate(ReduceOp)}


def _text_code(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "little") >> 1


def _check_agreement(call: _Call, numel: int, dtype: torch.dtype) -> None:
    """Debug mode: every rank compares the whole call (collective, element count, dtype, root,
    op, algorithm, layout) before running, and raises naming both calls on every rank."""
    fingerprint = [
        _COLLECTIVE_CODES[call.collective], numel, _DTYPE_CODES[dtype], call.root,
        _OP_CODES[call.op], _text_code(call.algorithm), call.topology.fingerprint,
    ]
    rows = call.comm.channel.exchange(fingerprint)
    for rank, row in enumerate(rows):
        if row != rows[0]:
            raise ValueError(
                f"collective mismatch: rank 0 called {_describe(rows[0], call)} but rank {rank} "
                f"called {_describe(row, call)}; every rank must call the same collective with "
                "the same element count, dtype, root, op, algorithm and topology"
            )


def _describe(row: list[int], call: _Call) -> str:
    collective, numel, dtype, root, op, algorithm, topology = row
    name = list(Collective)[collective].value
    mine = [_text_code(call.algorithm), call.topology.fingerprint]
    algorithm_text = call.algorithm if algorithm == mine[0] else f"other ({algorithm:x})"
    layout = call.topology.spec if topology == mine[1] else f"other ({topology:x})"
    return (f"{name} of {numel} {str(SUPPORTED_DTYPES[dtype]).removeprefix('torch.')} "
            f"(root {root}, op {list(ReduceOp)[op].value}, algorithm {algorithm_text}, "
            f"topology {layout})")


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
    return _GroupView(len(ranks), rank, job.topology_for(ranks, rank), CostModel.load(), True,
                      fabric)


def _topology(topology: Topology | None, view: _GroupView | Communicator) -> Topology:
    p = view.world_size
    if topology is None:
        return view.default_topology
    if topology.world_size != p:
        raise ValueError(
            f"topology {topology.spec} describes {topology.world_size} ranks but the group has "
            f"{p}; give axes whose product is {p}"
        )
    return topology.with_rank(view.rank)


def _prepare(
    collective: Collective, tensors: list[torch.Tensor], op: str | ReduceOp, algorithm: str,
    topology: Topology | None, group: Group, root: int = 0,
) -> _Call:
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
    if not 0 <= root < comm.world_size:
        raise ValueError(f"root rank {root} is outside the group of {comm.world_size} ranks")
    return _Call(comm, collective, algorithm, topo, reduce_op, root)


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


def _whole_group_stage(schedule: Schedule) -> Stage | None:
    """The stage of a schedule that is one stage of every rank in rank order (e.g. ``shm``),
    which then runs from the caller's tensors without the executor's working copy."""
    rounds = schedule.rounds
    stage = rounds[0].stage if len(rounds) == 1 else None
    if stage is None or schedule.layout is not None:
        return None
    return stage if stage.members == tuple(range(schedule.world_size)) else None


def _stage(tensor: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, bool]:
    """A flat contiguous working view of ``tensor`` and whether it must be copied back."""
    needs_host = tensor.is_cuda and comm.backend != "nccl"
    if tensor.is_contiguous() and not needs_host:
        return tensor.detach().view(-1), False
    flat = tensor.detach().reshape(-1)
    flat = flat.cpu() if needs_host else flat.clone()
    return flat.contiguous(), True


def allreduce(
    tensor: torch.Tensor, op: str | ReduceOp = "sum", algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``tensor`` over all ranks of ``group``, in place on every rank."""
    call = _prepare(Collective.ALLREDUCE, [tensor], op, algorithm, topology, group)

    def job() -> None:
        call.begin(tensor.numel(), tensor.dtype)
        buffer, copy_back = _stage(tensor, call.comm)
        call.run(buffer)
        call.op.finish(buffer, call.comm.world_size)
        if copy_back:
            tensor.detach().copy_(buffer.view_as(tensor))

    return call.comm.submit(job, async_op)


def broadcast(
    tensor: torch.Tensor, src: int = 0, algorithm: str = AUTO, topology: Topology | None = None,
    group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Copy ``tensor`` of group rank ``src`` into ``tensor`` on every rank."""
    call = _prepare(Collective.BROADCAST, [tensor], "sum", algorithm, topology, group, src)

    def job() -> None:
        call.begin(tensor.numel(), tensor.dtype)
        buffer, copy_back = _stage(tensor, call.comm)
        call.run(buffer)
        if copy_back:
            tensor.detach().copy_(buffer.view_as(tensor))

    return call.comm.submit(job, async_op)


def reduce(
    tensor: torch.Tensor, dst: int = 0, op: str | ReduceOp = "sum", algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``tensor`` over all ranks into ``tensor`` on group rank ``dst``.

    Other ranks' tensors are left unchanged.
    """
    call = _prepare(Collective.REDUCE, [tensor], op, algorithm, topology, group, dst)

    def job() -> None:
        call.begin(tensor.numel(), tensor.dtype)
        is_root = call.comm.rank == dst
        buffer, copy_back = _stage(tensor, call.comm)
        if not is_root:  # work on a reused copy: other ranks' tensors stay unchanged
            buffer = call.comm.workspace.scratch(buffer.numel(), buffer, "reduce").copy_(buffer)
            copy_back = False
        call.run(buffer)
        if is_root:
            call.op.finish(buffer, call.comm.world_size)
            if copy_back:
                tensor.detach().copy_(buffer.view_as(tensor))

    return call.comm.submit(job, async_op)


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

    def job() -> None:
        call.begin(output.numel(), output.dtype)
        m, p = output.numel(), call.comm.world_size
        source, _ = _stage(input, call.comm)
        out, copy_back = _stage(output, call.comm)
        name = call.resolve(m, output.element_size())
        if p == 1:
            out.copy_(source)
        elif name == "native":
            call.run(source, out, name)
        else:
            schedule = plan(name, call.collective, call.topology, call.comm.rank, m, call.root)
            stage = _whole_group_stage(schedule)
            if stage is not None:
                call.comm.stages.scatter(stage, source, out, call.op)
            else:
                execute_reduce_scatter(schedule, source, out, *call.executor_args(source),
                                       call.comm.stages)
        call.op.finish(out, p)
        if copy_back:
            output.detach().copy_(out.view_as(output))

    return call.comm.submit(job, async_op)


def allgather(
    output: torch.Tensor, input: torch.Tensor, algorithm: str = AUTO,
    topology: Topology | None = None, group: Group = None, async_op: bool = False,
) -> CollectiveHandle | None:
    """Concatenate every rank's ``input`` into ``output`` (rank ``r``'s at block ``r``)."""
    call = _prepare(Collective.ALLGATHER, [output, input], "sum", algorithm, topology, group)
    _check_sizes("allgather", input, output, call.comm.world_size)

    def job() -> None:
        call.begin(input.numel(), input.dtype)
        m, p, rank = input.numel(), call.comm.world_size, call.comm.rank
        shard, _ = _stage(input, call.comm)
        out, copy_back = _stage(output, call.comm)
        name = call.resolve(m, input.element_size())
        if p == 1:
            out.copy_(shard)
        elif name == "native":
            call.run(out, shard, name)
        else:
            schedule = plan(name, call.collective, call.topology, rank, m, call.root)
            stage = _whole_group_stage(schedule)
            if stage is not None:
                call.comm.stages.gather(stage, shard, out)
            else:
                transport, _, chunk_numel, workspace = call.executor_args(shard)
                execute_allgather(schedule, shard, out, transport, chunk_numel, workspace,
                                  call.comm.stages)
        if copy_back:
            output.detach().copy_(out.view_as(output))

    return call.comm.submit(job, async_op)


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
    itemsize = torch.empty(0, dtype=dtype).element_size()
    text = choose(wanted, topo, numel, itemsize, view.cost_model, fabric=view.fabric).explain()
    if not view.agreed:
        text += ("\n  (this rank's own view: the group's layout and cost model are agreed at "
                 "scaledl.init() or at the group's first collective)")
    return text
