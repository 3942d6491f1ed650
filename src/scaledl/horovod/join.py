"""join and barrier.

``hvd.join()`` lets ranks that ran out of data stop early while the others go on: a joined rank
keeps answering the negotiation rounds of the others with ``JOIN`` rows, and takes part in every
collective they start with a neutral contribution (zeros for Sum and Average, whose divisor stays
the whole set's size as in Horovod; the largest value for Min, the smallest for Max, one for
Product).  That covers allreduce, grouped_allreduce of one dtype, barrier and the gradient
reductions of a DistributedOptimizer; any other collective started while ranks are joined raises
:class:`~scaledl.horovod.errors.MismatchError` on the ranks that started it, as in Horovod.  When
every rank has joined, ``join`` returns on all of them the rank that joined last (the highest of
those that joined in the same round).
"""

from __future__ import annotations

import torch

from scaledl.horovod.errors import HorovodInternalError
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Agreement, Kind, Request, negotiate, op_of
from scaledl.horovod.dispatch import launch_allreduce
from scaledl.horovod.process_sets import ProcessSet, SetContext, context_of, global_process_set
from scaledl.horovod.reduce_ops import identity
from scaledl.horovod.tensors import work_dtype
from scaledl.signature import Signature

__all__ = ["join", "barrier", "serve"]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every member has called ``barrier`` (ranks inside ``join`` count as there)."""
    negotiate(context_of(process_set), Request(Kind.BARRIER))


def join(device: int = -1) -> int:
    """Wait for every rank to join, serving the others' collectives meanwhile; return the rank
    that joined last.  ``device`` is accepted for compatibility (buffers go where the group's
    backend needs them)."""
    context = context_of(global_process_set)
    rounds = 0
    while True:
        agreement = negotiate(context, Request(Kind.JOIN, rounds=rounds))
        if not agreement.active:
            newest = [i for i, row in enumerate(agreement.rows) if row.data[0] == 0]
            return context.ranks[max(newest)] if newest else context.ranks[-1]
        rounds += 1
        if agreement.verdict() is None:
            serve(context, agreement)


def serve(context: SetContext, agreement: Agreement) -> None:
    """Take part, with a neutral contribution, in the collective the active ranks agreed on."""
    row = agreement.rows[agreement.active[0]]
    if row.kind is Kind.OPTIMIZER_STEP:
        server = context.servers.get(row.digest("detail"))
        if server is None:
            raise HorovodInternalError(
                "a DistributedOptimizer step of the other ranks has no counterpart on this "
                "joined rank; build the same DistributedOptimizer on every rank")
        server.serve_joined(context)
        return
    if row.kind not in (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE):
        return
    dtype = Signature.from_word(row.word).dtype
    assert dtype is not None  # a grouped call of mixed dtypes was refused by the verdict
    work = work_dtype(dtype)
    assert work is not None
    op = op_of(row)
    buffer = torch.full((row.numel,), identity(op, work), dtype=work, device=context.device)
    divide_here = not buffer.is_floating_point()
    handle = launch_allreduce(context, buffer, op, divide_here, blocking=True)
    Handle([handle], lambda: None, f"{row.kind.value} for the ranks still running").wait()
