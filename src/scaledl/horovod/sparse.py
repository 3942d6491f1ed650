"""sparse_allreduce_async: reduce a sparse COO tensor by gathering its entries.

A sparse tensor's nonzeros sit at different places on every rank, so there is nothing to add
position by position.  Instead every member's entries are gathered (two allgathers: the indices,
one row per nonzero, and the values), and the result is the sparse tensor holding all of them:
duplicate coordinates add up when the result is coalesced or made dense, which is the sum.
Average divides the gathered values by the set's size.  Traffic is ``size * nnz`` entries per
rank instead of the dense numel, the better deal while fewer than ``numel / size`` entries are
nonzero (embedding gradients, say).  This is how Horovod reduces sparse gradients too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from scaledl.horovod.allgather import start_allgather
from scaledl.horovod.process_sets import ProcessSet, context_of, global_process_set
from scaledl.horovod.reduce_ops import Average, ReduceOperation, Sum, resolve_op

__all__ = ["sparse_allreduce_async"]


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None = None, op: ReduceOperation | None = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Start reducing the sparse COO ``tensor`` over ``process_set`` (op Average or Sum).

    Returns a function that waits and gives the reduced sparse tensor (uncoalesced: entries of
    different ranks at one coordinate are separate entries that add up).
    """
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        layout = tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"sparse_allreduce_async takes a sparse COO tensor, got {layout}; use "
                        "allreduce_async for dense tensors")
    resolved = resolve_op(op)
    if resolved not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async reduces with hvd.Average or hvd.Sum, got "
                         f"{resolved.label}; pass tensor.to_dense() to allreduce_async for "
                         "other ops")
    size = len(context_of(process_set).ranks)
    local = tensor.coalesce()
    # one row per nonzero, so unequal nonzero counts are allgather's unequal first dimensions
    indices = start_allgather(local.indices().t().contiguous(),
                              None if name is None else f"{name}.indices", process_set)
    values = start_allgather(local.values().contiguous(),
                             None if name is None else f"{name}.values", process_set)

    def result() -> torch.Tensor:
        gathered = values.wait()
        if resolved is Average:
            gathered = (gathered / size if gathered.is_floating_point()
                        else torch.div(gathered, size, rounding_mode="trunc"))
        return torch.sparse_coo_tensor(indices.wait().t(), gathered, tensor.shape)

    return result
