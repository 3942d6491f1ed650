"""scaledl.horovod's DistributedOptimizer against torch's DistributedDataParallel, and join.

After several steps of SGD with momentum, parameters trained with ``hvd.DistributedOptimizer``
equal those trained with DDP on the same per-rank batches: plain, with gradient accumulation
(``backward_passes_per_step=2`` against DDP's ``no_sync``), with a gradient pre-divide factor,
with ``op=hvd.Sum`` (against DDP with the learning rate times the world size), without the
per-step negotiation, with the synchronize / clip / skip_synchronize pattern, and, within
float16's precision, with
``Compression.fp16``.  The join test checks the parameters of ranks with uneven numbers of
batches against a single-process replay of the same steps.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed
ENV = {"SCALEDL_TIMEOUT": "30"}
STEPS = 3


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)


def _loss(model: nn.Module, step: int, rank: int, scale: float = 1.0) -> torch.Tensor:
    x, y = _batch(step, rank)
    return nn.functional.mse_loss(model(x), y) * scale


def _train_ddp(rank: int, passes: int, lr: float, clip: bool) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(passes - 1):
            with model.no_sync():
                _loss(model, step * passes + micro, rank, 1 / passes).backward()
        _loss(model, step * passes + passes - 1, rank, 1 / passes).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _train_hvd(rank: int, passes: int, clip: bool, **options: object) -> list[torch.Tensor]:
    import scaledl.horovod as hvd

    model = _model(seed=rank)  # different on every rank until broadcast_parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, **options)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(passes):
            _loss(model, step * passes + micro, rank, 1 / passes).backward()
        if clip:
            optimizer.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        scheduler.step()
    return [p.detach().clone() for p in model.parameters()]


VARIANTS: list[tuple[str, int, bool, dict[str, object], float]] = [
    ("plain", 1, False, {}, 1e-6),
    ("accumulate", 2, False, {}, 1e-6),
    ("predivide", 1, False, {"gradient_predivide_factor": 2.0}, 1e-6),
    ("clip", 1, True, {}, 1e-6),
    ("fp16", 1, False, {"compression": "fp16"}, 2e-3),
    ("sum", 1, False, {"op": "sum"}, 1e-5),
    ("unnegotiated", 1, False, {"negotiate": "0"}, 1e-6),
]


def _optimizer_worker(rank: int, world: int) -> list[str]:
    import scaledl.horovod as hvd

    hvd.init()
    checked = []
    for name, passes, clip, options, tolerance in VARIANTS:
        lr = 0.1 * world if options.get("op") == "sum" else 0.1
        expected = _train_ddp(rank, passes, lr, clip)
        resolved = dict(options)
        if resolved.get("compression") == "fp16":
            resolved["compression"] = hvd.Compression.fp16
        if resolved.get("op") == "sum":
            resolved["op"] = hvd.Sum
        os.environ["SCALEDL_HOROVOD_STEP_NEGOTIATION"] = str(resolved.pop("negotiate", "1"))
        got = _train_hvd(rank, passes, clip, **resolved)
        for mine, reference in zip(got, expected):
            torch.testing.assert_close(mine, reference, atol=tolerance, rtol=tolerance,
                                       msg=lambda text, variant=name: f"{variant}: {text}")
        if name == "fp16":  # the gradients really travelled as float16
            assert any(not torch.equal(m, r) for m, r in zip(got, expected))
        checked.append(name)
    hvd.shutdown()
    return checked


def test_distributed_optimizer_matches_ddp() -> None:
    names = [variant[0] for variant in VARIANTS]
    assert run_ranks(2, _optimizer_worker, timeout=120, env=ENV) == [names, names]


def _replay(world: int) -> list[list[torch.Tensor]]:
    """Parameters after each step when rank r trains r + 1 batches and joined ranks add zeros."""
    model = nn.Linear(4, 2)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(world):
        optimizer.zero_grad()
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(step, world):
            model.zero_grad()
            x, y = _batch(step, rank)
            nn.functional.mse_loss(model(x[:, :4]), y[:, :2]).backward()
            grads = [g + p.grad for g, p in zip(grads, model.parameters())]
        for param, grad in zip(model.parameters(), grads):
            param.grad = grad / world
        optimizer.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def _join_worker(rank: int, world: int) -> int:
    import scaledl.horovod as hvd

    hvd.init()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for step in range(rank + 1):
        optimizer.zero_grad()
        x, y = _batch(step, rank)
        nn.functional.mse_loss(model(x[:, :4]), y[:, :2]).backward()
        optimizer.step()
    last = hvd.join()
    for mine, expected in zip(model.parameters(), _replay(world)[rank]):
        torch.testing.assert_close(mine.detach(), expected)
    if rank == 0:
        assert hvd.join() == world - 1
    else:
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [world - 1.0] * 3
        assert hvd.allreduce(torch.full((2,), float(rank)), op=hvd.Min).tolist() == [1.0, 1.0]
        assert hvd.grouped_allreduce([torch.ones(2), torch.ones(1)], op=hvd.Sum)[1].item() == \
            world - 1
        hvd.barrier()
        with pytest.raises(hvd.MismatchError, match=r"broadcast cannot run while ranks \[0\]"):
            hvd.broadcast(torch.ones(1), root_rank=1)
        assert hvd.join() == world - 1
    hvd.shutdown()
    return last


def test_join_serves_the_ranks_still_training() -> None:
    assert run_ranks(3, _join_worker, timeout=120, env=ENV) == [2, 2, 2]


def _skipped_backward_worker(rank: int, world: int) -> list[list[float]]:
    """Rank 1 has an empty batch at step 1 and calls step() without backward; then zero_grad
    between backward and step is refused."""
    import scaledl.horovod as hvd

    hvd.init()
    weights = []
    for negotiate in ("1", "0"):
        os.environ["SCALEDL_HOROVOD_STEP_NEGOTIATION"] = negotiate
        model = nn.Linear(1, 1, bias=False)
        nn.init.zeros_(model.weight)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                             named_parameters=model.named_parameters())
        trace = []
        for step in range(4):
            optimizer.zero_grad()
            if not (rank == 1 and step == 1):
                model(torch.ones(1, 1)).sum().backward()
            optimizer.step()
            trace.append(model.weight.item())
        weights.append(trace)
        model(torch.ones(1, 1)).sum().backward()
        with pytest.raises(RuntimeError, match=r"zero_grad\(\) was called after loss.backward"):
            optimizer.zero_grad()
        optimizer.step()
    hvd.shutdown()
    return weights


def test_a_rank_without_backward_still_takes_part_in_the_step() -> None:
    # it took no part: its reductions were paired with the others' next step, off by one
    expected = [-1.0, -1.5, -2.5, -3.5]
    assert run_ranks(2, _skipped_backward_worker, timeout=120, env=ENV) == [[expected] * 2] * 2
