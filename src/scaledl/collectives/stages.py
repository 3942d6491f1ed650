"""Running a schedule's stages on their paths (the executor's stage runner).

A :class:`~scaledl.collectives.schedule.Stage` is a whole collective of some members of the
group on one path.  :class:`Paths` runs it:

- ``shm``: through the windows of the host's :class:`~scaledl.transport.shm.ShmGroup`
  (:mod:`scaledl.collectives.shm_ops`);
- ``native``: the backend's own collective on a sub-channel among the members (opened by them at
  the stage's first run).  The backend's reduce-scatter and allgather need equal blocks, so a
  slice that does not divide evenly goes through a padded copy.

AVG is run as SUM here; the caller divides once at the end, as for every other step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaledl.collectives import shm_inplace, shm_ops
from scaledl.collectives.shm_calls import announce
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.transport.channel import Channel
from scaledl.transport.shm import ShmGroup

__all__ = ["Paths"]


def _torch_op(op: ReduceOp) -> dist.ReduceOp:
    return (ReduceOp.SUM if op is ReduceOp.AVG else op).to_torch()


class Paths:
    """The stage runner of one communicator."""

    def __init__(self, channel: Channel, shm: ShmGroup | None) -> None:
        self.channel = channel
        self.shm = shm

    def run(self, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
        """Run ``stage`` on the flat working ``buffer`` (blocking)."""
        if stage.path is Path.SHM:
            self._shm(stage, buffer, op)
        else:
            self._native(stage, buffer, op)

    def _shm(self, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
        group = self.shm
        if group is None:
            raise ValueError("this group has no shared-memory path (its ranks do not share a "
                             "host, or /dev/shm was too small); choose another algorithm")
        members = [group.local_index(member) for member in stage.members]
        announce(group, members, stage, buffer.dtype, op)
        self._guarded(lambda shm: _run_shm(shm, members, stage, buffer, op))

    def scatter(
        self, stage: Stage, source: torch.Tensor, output: torch.Tensor, op: ReduceOp
    ) -> None:
        """A whole-group reduce_scatter stage from ``source`` straight into ``output`` (no
        working copy of the input)."""
        if stage.path is Path.SHM and self.shm is not None:
            members = [self.shm.local_index(member) for member in stage.members]
            announce(self.shm, members, stage, source.dtype, op)
            self._guarded(lambda group: shm_ops.reduce_scatter(
                group, members, source, stage.lo, stage.hi, op, output))
        else:
            self.channel.subchannel(stage.members).reduce_scatter(output, source, _torch_op(op))

    def gather(self, stage: Stage, shard: torch.Tensor, output: torch.Tensor) -> None:
        """A whole-group allgather stage of ``shard`` into ``output``."""
        if stage.path is Path.SHM and self.shm is not None:
            members = [self.shm.local_index(member) for member in stage.members]
            announce(self.shm, members, stage, output.dtype, ReduceOp.SUM)
            self._guarded(lambda group: shm_ops.allgather(
                group, members, output, stage.lo, stage.hi, shard))
        else:
            self.channel.subchannel(stage.members).allgather(output, shard)

    def _guarded(self, run: Callable[[ShmGroup], None]) -> None:
        group = self.shm
        assert group is not None
        try:
            run(group)
        except BaseException as error:
            group.abort(f"{type(error).__name__}: {error}")
            raise

    def _native(self, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
        sub = self.channel.subchannel(stage.members)
        piece = buffer[stage.lo:stage.hi]
        collective = stage.collective
        if collective is Collective.ALLREDUCE:
            sub.allreduce(piece, _torch_op(op))
        elif collective is Collective.BROADCAST:
            sub.broadcast(piece, stage.members.index(stage.root))
        elif collective is Collective.REDUCE:
            sub.reduce(piece, stage.members.index(stage.root), _torch_op(op))
        else:
            _blocked(sub, stage, buffer, op)


def _run_shm(
    group: ShmGroup, members: list[int], stage: Stage, buffer: torch.Tensor, op: ReduceOp
) -> None:
    lo, hi, collective = stage.lo, stage.hi, stage.collective
    if collective is Collective.ALLREDUCE:
        where = group.locate(buffer[lo:hi])
        if where is not None:
            shm_inplace.allreduce(group, members, buffer, lo, hi, op, where)
        else:
            shm_ops.allreduce(group, members, buffer, lo, hi, op)
    elif collective is Collective.REDUCE_SCATTER:
        shm_ops.reduce_scatter(group, members, buffer, lo, hi, op)
    elif collective is Collective.ALLGATHER:
        shm_ops.allgather(group, members, buffer, lo, hi)
    elif collective is Collective.BROADCAST:
        shm_ops.broadcast(group, members, buffer, lo, hi, group.local_index(stage.root))
    else:
        shm_ops.reduce(group, members, buffer, lo, hi, op, group.local_index(stage.root))


def _blocked(sub: Channel, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
    """reduce_scatter / allgather on the backend, through equal (padded) blocks."""
    parts = stage.parts()
    width = parts[0][1] - parts[0][0]
    count = len(parts)
    equal = all(hi - lo == width for lo, hi in parts)
    mine = sub.rank  # the sub-channel numbers the members in stage order
    own_lo, own_hi = parts[mine]
    if equal:
        padded = buffer[stage.lo:stage.hi]
    else:
        padded = torch.zeros(width * count, dtype=buffer.dtype, device=buffer.device)
        for index, (lo, hi) in enumerate(parts):
            padded[index * width:index * width + hi - lo].copy_(buffer[lo:hi])
    if stage.collective is Collective.REDUCE_SCATTER:
        out = torch.empty(width, dtype=buffer.dtype, device=buffer.device)
        sub.reduce_scatter(out, padded, _torch_op(op))
        buffer[own_lo:own_hi].copy_(out[:own_hi - own_lo])
        return
    shard = padded[mine * width:(mine + 1) * width].clone()
    gathered = padded if equal else torch.empty_like(padded)
    sub.allgather(gathered, shard)
    if not equal:
        for index, (lo, hi) in enumerate(parts):
            buffer[lo:hi].copy_(gathered[index * width:index * width + hi - lo])

