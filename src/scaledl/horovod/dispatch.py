"""Dispatch: the scaledl collective (or torch.distributed operation) that runs each Horovod call.

Every call is a job of the communicator of its process set's data group, so calls issued one
after another keep their order on every rank.  The ``*_async`` calls return while their job
runs on the communicator's thread; the blocking calls (``allreduce_``, ``allgather``, ...) run
their job in the caller's thread when nothing is queued, which saves a thread hand-off.

* allreduce (Average, Sum, Min, Max), broadcast, allgather and reduce-scatter run scaledl's
  collectives with the algorithm chosen at ``hvd.init`` and the job's topology;
* Product and alltoall, which scaledl has no algorithm for, run torch.distributed's own
  ``all_reduce`` / ``all_to_all_single`` on the group, as a job of the same communicator (so
  they stay in order with the rest).

A failure inside a collective (a peer died or timed out) becomes a
:class:`~scaledl.horovod.errors.HorovodInternalError`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.backend_errors import attempt, raise_in_words
from scaledl.collectives import CollectiveHandle
from scaledl.collectives.communicator import communicator_for
from scaledl.horovod.errors import HorovodInternalError
from scaledl.horovod.process_sets import SetContext
from scaledl.horovod.reduce_ops import ReduceOperation, scaledl_op

__all__ = ["launch_allreduce", "launch_broadcast", "launch_allgather", "launch_reduce_scatter",
           "submit_native"]

Start = Callable[[bool], "CollectiveHandle | None"]


def _start(what: str, start: Start, blocking: bool) -> CollectiveHandle | None:
    """``start(async_op)``; a failure becomes Horovod's ``HorovodInternalError`` (what elastic
    training catches), judged outside any ``except`` block so that a Ctrl-C pending meanwhile
    surfaces as a bare ``KeyboardInterrupt`` (:func:`~scaledl.backend_errors.attempt`), naming
    a lost or late peer in words and any other failure by its first line."""
    outcome = attempt(lambda: start(not blocking))
    if not isinstance(outcome, RuntimeError):
        return outcome
    if isinstance(outcome, HorovodInternalError):
        raise outcome
    raise_in_words(outcome, lambda failure: HorovodInternalError(
        f"{what} failed: {failure.reason or failure.line}"))


def submit_native(
    context: SetContext, job: Callable[[], None], blocking: bool = False
) -> CollectiveHandle | None:
    """Run ``job`` (torch.distributed calls on the data group) in the communicator's order."""
    comm = communicator_for(context.group)
    return _start("torch.distributed collective",
                  lambda async_op: comm.submit(job, async_op=async_op), blocking)


def launch_allreduce(
    context: SetContext, buffer: torch.Tensor, op: ReduceOperation, divide_here: bool,
    blocking: bool = False,
) -> CollectiveHandle | None:
    """Reduce the flat ``buffer`` in place (Average divides unless ``divide_here``)."""
    name = scaledl_op(op, divide_here)
    if name is None:
        group = context.group

        def product() -> None:
            dist.all_reduce(buffer, op=dist.ReduceOp.PRODUCT, group=group)

        return submit_native(context, product, blocking)
    return _start("allreduce", lambda async_op: collectives.allreduce(
        buffer, op=name, algorithm=context.algorithms.allreduce, topology=context.topology,
        group=context.group, async_op=async_op), blocking)


def launch_broadcast(
    context: SetContext, buffer: torch.Tensor, root: int, blocking: bool = False
) -> CollectiveHandle | None:
    """Copy global rank ``root``'s ``buffer`` to every member's."""
    return _start("broadcast", lambda async_op: collectives.broadcast(
        buffer, src=context.ranks.index(root), algorithm=context.algorithms.broadcast,
        topology=context.topology, group=context.group, async_op=async_op), blocking)


def launch_allgather(
    context: SetContext, output: torch.Tensor, shard: torch.Tensor, blocking: bool = False
) -> CollectiveHandle | None:
    """Gather every member's equal-sized ``shard`` into ``output`` (by set rank)."""
    return _start("allgather", lambda async_op: collectives.allgather(
        output, shard, algorithm=context.algorithms.allgather, topology=context.topology,
        group=context.group, async_op=async_op), blocking)


def launch_reduce_scatter(
    context: SetContext, output: torch.Tensor, source: torch.Tensor, op: str,
    blocking: bool = False,
) -> CollectiveHandle | None:
    """Reduce ``source`` (equal blocks) so member ``r`` gets block ``r`` in ``output``."""
    return _start("reducescatter", lambda async_op: collectives.reduce_scatter(
        output, source, op=op, algorithm=context.algorithms.reduce_scatter,
        topology=context.topology, group=context.group, async_op=async_op), blocking)
