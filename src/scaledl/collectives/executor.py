"""The executor: runs any :class:`~scaledl.collectives.schedule.Schedule` over a transport.

It cuts every transfer into chunks of at most ``chunk_numel`` elements and runs them as a
dataflow (:mod:`scaledl.collectives.dataflow`): a chunk is posted as soon as the data it reads
has arrived, even if that was in an earlier round, and received chunks are reduced as they are
waited for, so the reduction of chunk ``j`` overlaps the transfer of chunk ``j+1`` and the rounds
of a ring flow into each other.  On this project's 2-core machine that overlap is what lets the
ring beat Gloo's own allreduce (see docs/benchmarks.md).  Received data to be reduced lands in a
scratch buffer that a :class:`Workspace` keeps between calls: allocating fresh large tensors
costs page faults on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scaledl.collectives.dataflow import DEFAULT_WINDOW, StageRunner, compile_schedule, run_ops
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Schedule
from scaledl.transport.base import Transport

__all__ = ["Workspace", "execute", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 1 << 20
"""Pipelining chunk: 1 MiB was the fastest of 256 KiB..8 MiB for 64 MiB on 2 ranks here."""


@dataclass
class Workspace:
    """Scratch buffers reused across collective calls, one per (dtype, device)."""

    _buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = field(
        default_factory=dict
    )

    def scratch(self, numel: int, like: torch.Tensor, name: str = "recv") -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements of ``like``'s dtype and device, kept as ``name``."""
        key = (name, like.dtype, like.device)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[key] = buffer
        return buffer[:numel]


def execute(
    schedule: Schedule, buffer: torch.Tensor, transport: Transport, op: ReduceOp = ReduceOp.SUM,
    chunk_numel: int = DEFAULT_CHUNK_BYTES // 4, workspace: Workspace | None = None,
    stages: StageRunner | None = None,
) -> None:
    """Run ``schedule`` on the 1-D contiguous ``buffer`` (no final AVG division); ``stages``
    runs the schedule's stage steps, if it has any."""
    if buffer.dim() != 1 or not buffer.is_contiguous() or buffer.numel() != schedule.numel:
        raise ValueError(
            f"the working buffer must be 1-D, contiguous and hold {schedule.numel} elements; "
            f"got shape {tuple(buffer.shape)}"
        )
    if chunk_numel < 1:
        raise ValueError(f"chunk_numel {chunk_numel} must be >= 1")
    workspace = workspace if workspace is not None else Workspace()
    program = compile_schedule(schedule, chunk_numel, transport.ordered_by_peer)
    window = max(1, min(DEFAULT_WINDOW, len(program.reduces)))
    scratch = workspace.scratch(window * program.slot_numel, buffer)
    run_ops(program, buffer, transport, op, scratch, window, stages)


def execute_reduce_scatter(
    schedule: Schedule, source: torch.Tensor, output: torch.Tensor, transport: Transport,
    op: ReduceOp = ReduceOp.SUM, chunk_numel: int = DEFAULT_CHUNK_BYTES // 4,
    workspace: Workspace | None = None, stages: StageRunner | None = None,
) -> None:
    """Reduce-scatter the flat ``source`` (``p`` blocks) into this rank's flat ``output``.

    ``source`` is left untouched: its blocks are copied into a working buffer in the schedule's
    layout (torus and hierarchical end with rank ``r`` owning a block other than ``r``).
    """
    workspace = workspace if workspace is not None else Workspace()
    m, p = output.numel(), schedule.world_size
    work = workspace.scratch(p * m, source, "work")
    for r in range(p):
        block = schedule.block_of(r)
        work[block * m:(block + 1) * m].copy_(source[r * m:(r + 1) * m])
    execute(schedule, work, transport, op, chunk_numel, workspace, stages)
    mine = schedule.block_of(schedule.rank)
    output.copy_(work[mine * m:(mine + 1) * m])


def execute_allgather(
    schedule: Schedule, shard: torch.Tensor, output: torch.Tensor, transport: Transport,
    chunk_numel: int = DEFAULT_CHUNK_BYTES // 4, workspace: Workspace | None = None,
    stages: StageRunner | None = None,
) -> None:
    """Allgather every rank's flat ``shard`` into the flat ``output`` (rank r at block r)."""
    workspace = workspace if workspace is not None else Workspace()
    m, p = shard.numel(), schedule.world_size
    identity = schedule.layout is None
    work = output if identity else workspace.scratch(p * m, shard, "work")
    mine = schedule.block_of(schedule.rank)
    work[mine * m:(mine + 1) * m].copy_(shard)
    execute(schedule, work, transport, ReduceOp.SUM, chunk_numel, workspace, stages)
    if not identity:
        for r in range(p):
            block = schedule.block_of(r)
            output[r * m:(r + 1) * m].copy_(work[block * m:(block + 1) * m])
