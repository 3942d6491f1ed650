"""One collective call, the path every public collective takes (:mod:`scaledl.collectives.api`).

A job of the group's communicator runs :meth:`Call.run` on flat working tensors
(:func:`flat_view`):

1. :meth:`Call.begin`: the fault-injection hook point and, in debug mode (``SCALEDL_DEBUG``),
   a check that every rank makes the same call;
2. :meth:`Call.resolve`: the algorithm asked for, ``auto``'s cached choice, or a levelled
   algorithm's best paths per level;
3. the backend's own collective for ``native``, else the plan (cached), run by the executor,
   or straight on its path when the schedule is one stage (for reduce_scatter and allgather,
   one stage of the whole group in rank order, which runs from the caller's tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from scaledl.collectives import native
from scaledl.collectives.auto import choose, choose_paths
from scaledl.collectives.communicator import Communicator
from scaledl.collectives.executor import (
    Workspace, execute, execute_allgather, execute_reduce_scatter,
)
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.registry import ALGORITHMS, AUTO, parse_algorithm, plan
from scaledl.collectives.schedule import Collective, Schedule, Stage
from scaledl.faults import at_collective
from scaledl.signature import Kind, Signature, agree
from scaledl.topology import Topology
from scaledl.transport.torch_p2p import TorchTransport

__all__ = ["Call", "flat_view", "whole_group_stage"]


@dataclass(frozen=True)
class Call:
    """One validated call: the group's communicator, the collective, the algorithm as asked
    (maybe ``auto``), the checked layout, the op and the root."""

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

    def job(self, output: torch.Tensor, input: torch.Tensor | None = None) -> Callable[[], None]:
        """The communicator job of this call: flat working views of the caller's tensors,
        :meth:`run`, the op's final step (AVG divides), and the result copied back where the
        view is a copy.

        ``output`` alone: an in-place collective (a rank other than reduce's root works on a
        scratch copy, so its tensor stays unchanged); with ``input``: reduce_scatter or
        allgather.
        """
        def run_job() -> None:
            scatter = self.collective is Collective.REDUCE_SCATTER
            counted = output if input is None or scatter else input
            self.begin(counted.numel(), counted.dtype)
            out, copy_back = flat_view(output, self.comm)
            writes = self.collective is not Collective.REDUCE or self.comm.rank == self.root
            if input is not None:
                given, _ = flat_view(input, self.comm)
                if scatter:
                    self.run(given, out)
                else:
                    self.run(out, given)
            elif writes:
                self.run(out)
            else:  # reduce off the root: work on a reused copy
                self.run(self.comm.workspace.scratch(out.numel(), out, "reduce").copy_(out))
            if writes:
                self.op.finish(out, self.comm.world_size)
                if copy_back:
                    output.detach().copy_(out.view_as(output))

        return run_job

    def run(self, buffer: torch.Tensor, shard: torch.Tensor | None = None) -> str:
        """Run on the flat working ``buffer``; return the algorithm used.

        For reduce_scatter and allgather ``buffer`` holds the ``p`` blocks (the input, resp.
        the output) and ``shard`` this rank's block (the output, resp. the input).
        """
        numel = buffer.numel() if shard is None else shard.numel()
        name = self.resolve(numel, buffer.element_size())
        if self.comm.world_size == 1:
            if shard is not None and self.collective is Collective.REDUCE_SCATTER:
                shard.copy_(buffer)
            elif shard is not None:  # allgather
                buffer.copy_(shard)
        elif name == "native":
            native.run(self.collective, buffer, self.op, self.comm.channel, self.root, shard)
        else:
            schedule = plan(name, self.collective, self.topology, self.comm.rank, numel,
                            self.root)
            self._execute(schedule, buffer, shard)
        return name

    def _execute(
        self, schedule: Schedule, buffer: torch.Tensor, shard: torch.Tensor | None
    ) -> None:
        """Run ``schedule``: a whole-group stage straight on its path, else the executor."""
        stages = self.comm.stages
        transport, op, chunk_numel, workspace = self.executor_args(buffer)
        if shard is None:
            rounds = schedule.rounds
            if len(rounds) == 1 and rounds[0].stage is not None:  # one stage: no dataflow
                stages.run(rounds[0].stage, buffer, op)
            else:
                execute(schedule, buffer, transport, op, chunk_numel, workspace, stages)
            return
        stage = whole_group_stage(schedule)
        if self.collective is Collective.REDUCE_SCATTER:
            if stage is not None:
                stages.scatter(stage, buffer, shard, op)
            else:
                execute_reduce_scatter(schedule, buffer, shard, transport, op, chunk_numel,
                                       workspace, stages)
        elif stage is not None:
            stages.gather(stage, shard, buffer)
        else:
            execute_allgather(schedule, shard, buffer, transport, chunk_numel, workspace, stages)

    def executor_args(
        self, like: torch.Tensor
    ) -> tuple[TorchTransport, ReduceOp, int, Workspace]:
        """Transport, op, chunk length and workspace for the executor."""
        chunk_numel = max(1, self.comm.chunk_bytes // like.element_size())
        return self.comm.transport, self.op, chunk_numel, self.comm.workspace


def _check_agreement(call: Call, numel: int, dtype: torch.dtype) -> None:
    """Debug mode: every rank compares the whole call (collective, element count, dtype, root,
    op, algorithm, layout) before running, and raises naming both calls on every rank."""
    rooted = call.collective in (Collective.BROADCAST, Collective.REDUCE)
    reducing = call.collective not in (Collective.BROADCAST, Collective.ALLGATHER)
    mine = Signature(Kind(call.collective.value), numel, dtype,
                     call.op.value if reducing else None, call.root if rooted else -1,
                     call.algorithm, call.topology.layout)
    agree(mine, call.comm.channel.exchange, ranks=call.comm.channel.global_ranks,
          fix="every rank must call the same collective with the same element count, dtype, "
              "root, op, algorithm and topology")


def whole_group_stage(schedule: Schedule) -> Stage | None:
    """The stage of a schedule that is one stage of every rank in rank order (e.g. ``shm``),
    which then runs from the caller's tensors without the executor's working copy."""
    rounds = schedule.rounds
    stage = rounds[0].stage if len(rounds) == 1 else None
    if stage is None or schedule.layout is not None:
        return None
    return stage if stage.members == tuple(range(schedule.world_size)) else None


def flat_view(tensor: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, bool]:
    """A flat contiguous working view of ``tensor`` and whether it must be copied back.

    A tensor whose negation or conjugation is still lazy (``x.conj().imag``: torch's negative
    and conjugate bits) is worked on as a resolved copy: its memory holds the values' negatives,
    which the transports (NumPy views, the backend's buffers) would read as they are."""
    needs_host = tensor.is_cuda and comm.backend != "nccl"
    lazy = tensor.is_neg() or tensor.is_conj()
    if tensor.is_contiguous() and not needs_host and not lazy:
        return tensor.detach().view(-1), False
    flat = tensor.detach().reshape(-1)
    if needs_host:
        flat = flat.cpu()
    if flat.is_neg() or flat.is_conj():
        flat = flat.resolve_conj().resolve_neg()
    elif not needs_host:
        flat = flat.clone()
    return flat.contiguous(), True
