"""The data path: the scaledl collective (or torch.distributed operation) behind each call.

Every call runs asynchronously on the communicator of its process set's data group, so calls
issued one after another keep their order on every rank and overlap with the caller:

* allreduce (Average, Sum, Min, Max), broadcast, allgather and reduce-scatter run scaledl's
  collectives with the algorithm chosen at ``hvd.init`` and the job's topology;
* Product and alltoall, which scaledl has no algorithm for, run torch.distributed's own
  ``all_reduce`` / ``all_to_all_single`` on the group, as a job of the same communicator (so
  they stay in order with the rest).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.collectives import CollectiveHandle
from scaledl.collectives.communicator import communicator_for
from scaledl.horovod.process_sets import SetContext
from scaledl.horovod.reduce_ops import ReduceOperation, scaledl_op

__all__ = ["launch_allreduce", "launch_broadcast", "launch_allgather", "launch_reduce_scatter",
           "submit_native"]


def submit_native(context: SetContext, job: Callable[[], None]) -> CollectiveHandle:
    """Run ``job`` (torch.distributed calls on the data group) in the communicator's order."""
    handle = communicator_for(context.group).submit(job, async_op=True)
    assert handle is not None
    return handle


def launch_allreduce(
    context: SetContext, buffer: torch.Tensor, op: ReduceOperation, divide_here: bool
) -> CollectiveHandle | None:
    """Start reducing the flat ``buffer`` in place (Average divides unless ``divide_here``)."""
    name = scaledl_op(op, divide_here)
    if name is None:
        group = context.group

        def product() -> None:
            dist.all_reduce(buffer, op=dist.ReduceOp.PRODUCT, group=group)

        return submit_native(context, product)
    return collectives.allreduce(
        buffer, op=name, algorithm=context.algorithms.allreduce, topology=context.topology,
        group=context.group, async_op=True)


def launch_broadcast(
    context: SetContext, buffer: torch.Tensor, root: int
) -> CollectiveHandle | None:
    """Start copying global rank ``root``'s ``buffer`` to every member's."""
    return collectives.broadcast(
        buffer, src=context.ranks.index(root), algorithm=context.algorithms.broadcast,
        topology=context.topology, group=context.group, async_op=True)


def launch_allgather(
    context: SetContext, output: torch.Tensor, shard: torch.Tensor
) -> CollectiveHandle | None:
    """Start gathering every member's equal-sized ``shard`` into ``output`` (by set rank)."""
    return collectives.allgather(
        output, shard, algorithm=context.algorithms.allgather, topology=context.topology,
        group=context.group, async_op=True)


def launch_reduce_scatter(
    context: SetContext, output: torch.Tensor, source: torch.Tensor, op: str
) -> CollectiveHandle | None:
    """Start reducing ``source`` (equal blocks) so member ``r`` gets block ``r`` in ``output``."""
    return collectives.reduce_scatter(
        output, source, op=op, algorithm=context.algorithms.reduce_scatter,
        topology=context.topology, group=context.group, async_op=True)
