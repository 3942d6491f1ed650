"""Allreduce of a tensor that already lives in shared memory: no copy in, half the copies out.

:class:`~scaledl.sync.data_parallel.DataParallel` keeps its gradient buckets in an *arena*, a
shared-memory segment of each rank that its host peers have mapped
(:meth:`~scaledl.collectives.communicator.Communicator.shared_buffers`).  A bucket then needs no
window: every rank reads its peers' buckets where they are.  Steps, for ``L`` ranks and a slice
cut into ``L`` parts:

1. announce the bucket (its arena and offset, which must match on every rank);
2. reduce part ``k`` of every peer's bucket into part ``k`` of one's own (peers read only the
   other parts of it meanwhile) and announce it;
3. copy the other ranks' reduced parts into one's own bucket, and announce that one is done
   reading;
4. wait until every peer is done reading one's bucket before returning, since the caller may
   write into it as soon as the call returns (the next backward pass does).

Against the windowed path this saves the copy in (``n`` bytes) and the copy of one's own part
out; it costs one more wait (step 4).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.shm_ops import collect, reduce_part
from scaledl.transport.shm import RELEASED, ShmGroup

__all__ = ["allreduce"]


def allreduce(
    group: ShmGroup, members: Sequence[int], buffer: torch.Tensor, lo: int, hi: int,
    op: ReduceOp, where: tuple[int, int],
) -> None:
    """Reduce ``buffer[lo:hi]``, which lies in this rank's arena at ``where``, over ``members``
    in place on each."""
    numel = hi - lo
    mine = buffer[lo:hi]
    counts = group.begin_shared(members)
    group.publish_shared(counts, where)
    views = {group.index: mine}
    for peer, count in counts.items():
        group.arrived_shared(peer, count, where)
        views[peer] = group.arena_of(peer, where, buffer.dtype, numel)
    parts = reduce_part(group, members, views, counts, op, numel)
    collect(group, members, views, counts, parts, mine)
    group.publish(RELEASED, counts)
    for peer, count in counts.items():
        group.reached(peer, RELEASED, count, "finish reading this rank's bucket")
