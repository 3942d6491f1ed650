"""A backward that raises must not stop gradient averaging, and ``no_sync`` follows DDP's rule
(the forward decides).  Both failed before their fixes: after one failed backward the reducer
never queued its end-of-backward callback again, so replicas drifted apart silently; and
``no_sync`` was read when the hooks fired, the opposite of DDP for a forward inside the block
and a backward outside it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import scaledl
from tests.harness import run_ranks
from tests.helpers_backward import FailingBackward

pytestmark = pytest.mark.distributed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.last = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(FailingBackward.apply(self.first(x))).sum()


def _averaged_after_failure(rank: int, world_size: int, wrapper: str, who_fails: str) -> list[bool]:
    scaledl.init()
    torch.manual_seed(0)
    net = Net()
    if wrapper == "data-parallel":
        model: nn.Module = scaledl.DataParallel(net, algorithm="ring", bucket_mb=1e-5)
    else:
        model = scaledl.ReduceBroadcast(net, algorithm="tree")
    x = torch.ones(2, 4) * (rank + 1)
    FailingBackward.fail = who_fails == "all" or rank == 0
    try:
        model(x).backward()
    except RuntimeError:
        pass
    FailingBackward.fail = False
    verdicts = []
    for _ in range(3):
        for p in net.parameters():
            p.grad = None
        model(x).backward()
        local = torch.autograd.grad(net(x), net.last.weight)[0]
        reference = local.clone()
        dist.all_reduce(reference)
        reference /= world_size
        if wrapper == "data-parallel" or rank == 0:
            verdicts.append(torch.allclose(net.last.weight.grad, reference))
    return verdicts


@pytest.mark.parametrize("who_fails", ["all", "one"])
@pytest.mark.parametrize("wrapper", ["data-parallel", "reduce-broadcast"])
def test_gradients_are_averaged_after_a_backward_raised(wrapper: str, who_fails: str) -> None:
    for verdicts in run_ranks(2, _averaged_after_failure, wrapper, who_fails, timeout=90):
        assert all(verdicts), verdicts


def _no_sync_rule(rank: int, world_size: int, pattern: str) -> tuple[list[float], list[float]]:
    """Gradients after one accumulation pattern, with scaledl and with torch DDP."""
    scaledl.init()
    results = []
    for kind in ("scaledl", "ddp"):
        torch.manual_seed(0)
        net = nn.Linear(3, 1)
        if kind == "scaledl":
            model: nn.Module = scaledl.DataParallel(net, algorithm="ring")
        else:
            model = nn.parallel.DistributedDataParallel(net)
        x = torch.ones(2, 3) * (rank + 1)
        if pattern == "forward inside, backward outside":
            with model.no_sync():  # type: ignore[operator]
                loss = model(x).sum()
            loss.backward()
        else:  # forward outside, backward inside
            loss = model(x).sum()
            with model.no_sync():  # type: ignore[operator]
                loss.backward()
        results.append(net.weight.grad.flatten().tolist())
    return results[0], results[1]


@pytest.mark.parametrize("pattern", ["forward inside, backward outside",
                                     "forward outside, backward inside"])
def test_no_sync_is_decided_at_forward_time_as_in_ddp(pattern: str) -> None:
    for ours, ddp in run_ranks(2, _no_sync_rule, pattern, timeout=90):
        assert ours == ddp
