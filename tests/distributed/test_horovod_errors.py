"""scaledl.horovod's errors: calls that do not match across ranks raise the same MismatchError on
every rank (naming the mismatch) and leave the group usable; unsupported parts of horovod.torch
raise UnsupportedError naming them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed
ENV = {"SCALEDL_TIMEOUT": "30"}


def _mismatches(rank: int) -> list[tuple[Callable[[], object], str]]:
    import scaledl.horovod as hvd

    other = torch.float32 if rank == 0 else torch.float64
    return [
        (lambda: hvd.allreduce(torch.zeros(2 + rank)),
         r"of shape \[2\] float32 \(avg\) but rank 1 called allreduce of shape \[3\]"),
        (lambda: hvd.allreduce(torch.zeros(2, dtype=other)),
         r"float32 .* rank 1 called allreduce of shape \[2\] float64"),
        (lambda: hvd.allreduce(torch.zeros(2), op=hvd.Sum if rank == 0 else hvd.Max),
         r"\(sum\) but rank 1 called allreduce of shape \[2\] float32 \(max\)"),
        (lambda: hvd.broadcast(torch.zeros(2), root_rank=rank),
         r"\(root 0\) but rank 1 called broadcast of shape \[2\] float32 \(root 1\)"),
        (lambda: hvd.allgather(torch.zeros(2, 1 + rank)), "only the first dimension may differ"),
        (lambda: hvd.allreduce(torch.zeros(2)) if rank == 0 else hvd.broadcast(torch.zeros(2), 0),
         r"rank 0 called allreduce of shape \[2\] float32 \(avg\) but rank 1 called broadcast"),
        (lambda: hvd.allreduce(torch.zeros(2), name=f"loss{rank}"),
         "rank 0 named it 'loss0' but rank 1 'loss1'"),
        (lambda: hvd.alltoall(torch.zeros(4), splits=[2, 2] if rank == 0 else [1, 1]),
         "rank 1 passed splits that .* do not add up"),
        (lambda: hvd.allgather(torch.tensor(1.0) if rank == 1 else torch.zeros(1)),
         "rank 1 passed a 0-d tensor"),
        (lambda: hvd.allreduce(torch.zeros(2, dtype=torch.complex64)), "tensor of complex64"),
        (lambda: hvd.broadcast(torch.zeros(2), root_rank=5),
         "passed root_rank=5, which is not a rank of the process set"),
        (lambda: hvd.broadcast(torch.zeros(2), root_rank=torch.tensor(0) if rank else 0),
         "rank 1 passed a root_rank that is not an int"),
        (lambda: hvd.grouped_allreduce([torch.zeros(2)] * (1 + rank)),
         r"grouped_allreduce of 2 float32 \(avg\) but rank 1 called grouped_allreduce of 4"),
        (lambda: hvd.grouped_allreduce([torch.zeros(3), torch.zeros(3 if rank == 0 else (1, 3))]),
         r"entry 1 is 'tensor 1: float32 \[3\]' on rank 0 but 'tensor 1: float32 \[1, 3\]'"),
        (lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(nn.Linear(2, 2 + rank).parameters(), lr=0.1)),
         "DistributedOptimizer construction"),
    ]


def _unsupported() -> list[tuple[Callable[[], object], str]]:
    import scaledl.horovod as hvd

    params = nn.Linear(2, 2).parameters()
    return [
        (lambda: hvd.allreduce(torch.zeros(2), op=hvd.Adasum), "Adasum"),
        (lambda: hvd.elastic.run, r"hvd\.elastic\.run"),
        (lambda: hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=2), "groups"),
        (lambda: hvd.start_timeline("t.json"), "start_timeline"),
        (lambda: hvd.ProcessSet(object()), "MPI communicator"),  # type: ignore[arg-type]
    ]


def _errors_worker(rank: int, world: int) -> int:
    import scaledl.horovod as hvd

    with pytest.raises(ValueError, match=r"not initialized; call hvd\.init\(\)"):
        hvd.rank()
    hvd.init()
    checked = 0
    for call, pattern in _mismatches(rank):
        with pytest.raises(hvd.MismatchError, match=pattern):
            call()
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [2.0, 2.0]  # still usable
        checked += 1
    for call, pattern in _unsupported():
        with pytest.raises(hvd.UnsupportedError, match=pattern):
            call()
        checked += 1
    # process sets are added collectively: a rank that adds another set fails on every rank
    # (it left the others inside torch's new_group), and the job goes on
    with pytest.raises(ValueError, match=r"ranks disagree on the details of "
                       r"hvd.add_process_set: entry 0 is 'ranks \[0\]' on rank 0 but 'ranks "
                       r"\[1\]' on rank 1"):
        hvd.add_process_set([rank])
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [2.0, 2.0]
    checked += 1
    # Horovod's own pattern: the others pass None (their names came from the object's type)
    assert hvd.broadcast_object({"epoch": 3} if rank == 0 else None, root_rank=0) == {"epoch": 3}
    assert hvd.allgather_object(None if rank == 0 else [1]) == [None, [1]]
    with pytest.raises(TypeError, match="allreduce takes a torch.Tensor, got list"):
        hvd.allreduce([1.0, 2.0])  # type: ignore[arg-type]
    model = nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.full((1, 2), float(rank))).sum().backward()
    assert model.weight.grad is not None and model.weight.grad.tolist() == [[0.5, 0.5]]
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1"):
        model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="before wrapping"):
        optimizer.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})
    # a rank calling something else during a DistributedOptimizer step
    optimizer.zero_grad()
    with pytest.raises(hvd.MismatchError, match="rank 0 called DistributedOptimizer gradient "
                       "reduction of .* but rank 1 called allreduce"):
        if rank == 0:
            model(torch.ones(1, 2)).sum().backward()
        else:
            hvd.allreduce(torch.zeros(1))
    # the step's buckets had not left: the set stays usable, and training goes on
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [2.0, 2.0]
    optimizer.zero_grad()
    model(torch.full((1, 2), float(rank))).sum().backward()
    assert model.weight.grad is not None and model.weight.grad.tolist() == [[0.5, 0.5]]
    optimizer.step()
    return checked


def test_mismatches_raise_on_every_rank_and_unsupported_parts_are_named() -> None:
    expected = len(_mismatches(0)) + len(_unsupported()) + 1
    assert run_ranks(2, _errors_worker, timeout=90, env=ENV) == [expected, expected]
