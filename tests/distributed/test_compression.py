"""Gradient compression on real ranks: the codecs' exact semantics, PowerSGD against a
single-process implementation of Vogels et al.'s algorithm, training close to uncompressed, and
the same compressions through torch's DDP (``ddp_hook``) and Horovod's optimizer.

The references here are written from the algorithms' definitions, not from scaledl's code: the
bf16/fp16 reference casts each rank's contribution and sums them in the wire dtype (with two
ranks one addition, so the result is exact whatever the collective's order); the PowerSGD
reference orthogonalises with ``torch.linalg.qr`` where scaledl runs Gram-Schmidt (the column
signs may differ, the approximation ``P P^T M`` does not) and takes only the initial ``Q`` from
scaledl (``PowerSGD.initial_q``), since only its column span matters.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import scaledl
from scaledl.sync import BucketLayout, PowerSGD, resolve_compression
from scaledl.sync.compression import fp16_scale
from scaledl.sync.wire import Wire
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed
ENV = {"SCALEDL_TIMEOUT": "30"}
SHAPES = [(12, 40), (40,), (7, 3, 2, 2), (5,)]
"""A bucket: a matrix, a bias, a small conv weight, a bias; three flags after them."""


def _contribution(rank: int, magnitude: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(10 + rank)
    numel = sum(torch.Size(s).numel() for s in SHAPES)
    values = torch.randn(numel, generator=generator) * magnitude
    flags = torch.tensor([1.0, float(rank == 0), 0.0])
    return torch.cat([values, flags])


def _reference(codec: str, magnitude: float, world: int) -> torch.Tensor:
    """Each rank's contribution cast to the wire dtype (scaled for fp16), summed in it, cast
    back and divided; the flags summed unscaled."""
    parts = [_contribution(rank, magnitude) for rank in range(world)]
    count = parts[0].numel() - 3
    dtype = torch.bfloat16 if codec == "bf16" else torch.float16
    scale = 1.0
    if codec == "fp16":
        scale = fp16_scale(max(float(p[:count].abs().max()) for p in parts), world)
    total = (parts[0][:count] * scale).to(dtype)
    flags = parts[0][count:].to(dtype)
    for part in parts[1:]:
        total = total + (part[:count] * scale).to(dtype)
        flags = flags + part[count:].to(dtype)
    return torch.cat([total.float() * (1.0 / scale) / world, flags.float() / world])


def _codecs(rank: int, world: int) -> list[str]:
    wire = Wire("ring")
    layout = BucketLayout.packed(SHAPES, tail=3)
    checked = []
    for codec, magnitude in (("bf16", 1.0), ("fp16", 1.0), ("fp16", 1e6), ("fp16", 1e-7),
                             ("bf16", 1e30)):
        compression = resolve_compression(codec)
        buffer = _contribution(rank, magnitude)
        compression.start(0, buffer, layout, wire).wait()
        expected = _reference(codec, magnitude, world)
        assert torch.equal(buffer, expected), (codec, magnitude)
        exact = sum(_contribution(r, magnitude) for r in range(world)) / world
        assert torch.isfinite(buffer).all(), (codec, magnitude)
        error = float((buffer - exact).abs().max() / exact.abs().max())
        assert error < 1e-2, (codec, magnitude, error)  # large and tiny gradients survive fp16
        checked.append(f"{codec}@{magnitude:g}")
    # without the scale, float16 would have lost both: inf at 1e6, zeros at 1e-7
    assert torch.isinf(_contribution(rank, 1e6).half()).any()
    assert (_contribution(rank, 1e-7)[:-3].half() == 0).float().mean() > 0.2
    # a bucket that overflowed already in float32 keeps its inf (a GradScaler must see it)
    buffer = _contribution(rank, 1.0)
    buffer[0] = float("inf")
    resolve_compression("fp16").start(1, buffer, layout, wire).wait()
    assert buffer[0].item() == float("inf") and torch.isfinite(buffer[1:]).all()
    return checked


def test_bf16_and_fp16_codecs_equal_a_single_process_cast() -> None:
    results = run_ranks(2, _codecs, timeout=60, env=ENV)
    assert results[0] == results[1] and len(results[0]) == 5


# -- PowerSGD against a single-process reference --------------------------------------------

STEPS, PER_RANK, RANK = 4, 8, 2


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 16), nn.Tanh(),
                         nn.Linear(16, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(PER_RANK, 10, generator=generator), torch.randint(
        0, 3, (PER_RANK,), generator=generator)


def _compressed(shape: tuple[int, ...], rank: int) -> bool:
    if len(shape) < 2:
        return False
    rows, cols = shape[0], torch.Size(shape).numel() // shape[0]
    r = min(rank, rows, cols)
    return (rows + cols) * r * 2 < rows * cols


def _initial_qs(buckets: list[scaledl.sync.Bucket], shapes: dict[str, tuple[int, ...]],
                ) -> dict[str, torch.Tensor]:
    """The starting ``Q`` of every compressed parameter, by name, from DataParallel's
    buckets (each bucket's draw depends on its index)."""
    found = {}
    for bucket in buckets:
        layout = BucketLayout(tuple(shapes[n] for n in bucket.names), bucket.offsets,
                              tail=len(bucket.names))
        qs = iter(PowerSGD(rank=RANK).initial_q(bucket.index, layout))
        found.update({n: next(qs) for n in bucket.names if _compressed(shapes[n], RANK)})
    return found


def _powersgd_reference(world: int, initial: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Vogels et al.'s Algorithm 2 on ``world`` simulated ranks."""
    model = _net()
    names = [name for name, _ in reversed(list(model.named_parameters()))]
    params = list(reversed(list(model.parameters())))
    q = {i: initial[name] for i, name in enumerate(names) if name in initial}
    errors = {(i, r): torch.zeros_like(params[i]).reshape(params[i].shape[0], -1)
              for i in q for r in range(world)}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for step in range(STEPS):
        grads = []
        for r in range(world):
            model.zero_grad()
            x, y = _batch(step, r)
            nn.functional.cross_entropy(model(x), y).backward()
            grads.append([p.grad.clone() for p in params])  # type: ignore[union-attr]
        for i, param in enumerate(params):
            if i not in q:
                param.grad = sum(g[i] for g in grads) / world  # type: ignore[assignment]
                continue
            ms = [grads[r][i].reshape(param.shape[0], -1) + errors[i, r] for r in range(world)]
            p_sum = sum(m @ q[i] for m in ms)
            p_orth = torch.linalg.qr(p_sum).Q  # type: ignore[union-attr]
            q[i] = sum(m.t() @ p_orth for m in ms) / world
            approximation = p_orth @ q[i].t()
            for r in range(world):
                errors[i, r] = ms[r] - approximation
            param.grad = approximation.reshape(param.shape)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _powersgd(rank: int, world: int, bucket_mb: float) -> list[float]:
    model = scaledl.DataParallel(_net(), algorithm="ring", compression=PowerSGD(rank=RANK),
                                 bucket_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for step in range(STEPS):
        x, y = _batch(step, rank)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    shapes = {name: tuple(p.shape) for name, p in model.module.named_parameters()}
    expected = _powersgd_reference(world, _initial_qs(model.buckets, shapes))
    return [float((got - want).abs().max()) for got, want in
            zip(model.module.parameters(), expected)] + [model.stats.bytes / STEPS]


@pytest.mark.parametrize("bucket_mb", [25.0, 0.002])  # one bucket; one per parameter or two
def test_powersgd_equals_the_algorithm_run_in_one_process(bucket_mb: float) -> None:
    # stats count what went on the wire: P and Q of the compressed matrices, the rest as it
    # is, and a used-flag per parameter (they counted the uncompressed bucket, 2,884 bytes)
    shapes = [tuple(p.shape) for p in _net().parameters()]
    floats = sum((s[0] + s[1]) * min(RANK, *s) if _compressed(s, RANK) else math.prod(s)
                 for s in shapes) + len(shapes)
    for *differences, sent in run_ranks(2, _powersgd, bucket_mb, timeout=60, env=ENV):
        assert max(differences) < 1e-6, differences
        assert sent == 4 * floats == 980


# -- training with each compression, DataParallel and DDP -----------------------------------

def _blobs(rank: int, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four Gaussian classes in 16 dimensions (a fixed task: centres from seed 0)."""
    centres = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 2
    generator = torch.Generator().manual_seed(1000 * step + rank)
    labels = torch.randint(0, 4, (32,), generator=generator)
    return centres[labels] + torch.randn(32, 16, generator=generator), labels


def _accuracy(model: nn.Module) -> float:
    x, y = _blobs(99, 1, 99)
    return float((model(x).argmax(1) == y).float().mean())


def _classifier() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def _train(rank: int, world: int, compression: str, ddp: bool) -> float:
    model: nn.Module
    if ddp:
        model = nn.parallel.DistributedDataParallel(_classifier())
        model.register_comm_hook(None, scaledl.ddp_hook(compression=compression))
    else:
        model = scaledl.DataParallel(_classifier(), compression=compression)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(25):
        x, y = _blobs(rank, world, step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return _accuracy(model)


def _training(rank: int, world: int) -> dict[str, float]:
    results = {}
    for compression in ("none", "bf16", "fp16", "powersgd:1"):
        results[compression] = _train(rank, world, compression, ddp=False)
    for compression in ("bf16", "powersgd:1"):
        results[f"ddp {compression}"] = _train(rank, world, compression, ddp=True)
    return results


def test_each_compression_trains_as_well_as_uncompressed() -> None:
    results = run_ranks(2, _training, timeout=90, env=ENV)
    assert results[0] == results[1]  # every rank holds the same model
    accuracy = results[0]
    assert accuracy["none"] > 0.8, accuracy
    assert min(accuracy.values()) >= accuracy["none"] - 0.05, accuracy


def _bf16_step(rank: int, world: int) -> bool:
    """One step of DDP with the bf16 hook, and of DataParallel with bf16 (its wire buffers in
    shared memory, reduced in place), gives exactly the cast-and-sum average of the ranks'
    gradients (computed here for every rank)."""
    local = []
    for r in range(world):
        model = _classifier()
        x, y = _blobs(r, world, 0)
        nn.functional.cross_entropy(model(x), y).backward()
        local.append([p.grad for p in model.parameters()])
    ddp = nn.parallel.DistributedDataParallel(_classifier())
    ddp.register_comm_hook(None, scaledl.ddp_hook(algorithm="ring", compression="bf16"))
    wrapped = scaledl.DataParallel(_classifier(), compression="bf16", bucket_mb=0.01)
    assert len(wrapped.buckets) > 1
    for model in (ddp, wrapped):
        x, y = _blobs(rank, world, 0)
        nn.functional.cross_entropy(model(x), y).backward()
        for index, param in enumerate(model.module.parameters()):
            expected = sum((g[index].to(torch.bfloat16) for g in local[1:]),
                           local[0][index].to(torch.bfloat16)).float() / world  # type: ignore
            assert torch.equal(param.grad, expected), (type(model).__name__, index)
    return True


def test_ddp_hook_and_data_parallel_bf16_are_the_cast_average() -> None:
    assert run_ranks(2, _bf16_step, timeout=60, env=ENV) == [True, True]


# -- Horovod ------------------------------------------------------------------------------

def _horovod_bf16(rank: int, world: int) -> bool:
    import scaledl.horovod as hvd

    hvd.init()
    local = []
    for r in range(world):
        model = _classifier()
        x, y = _blobs(r, world, 0)
        nn.functional.cross_entropy(model(x), y).backward()
        local.append([p.grad for p in model.parameters()])
    model = _classifier()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.bf16)
    x, y = _blobs(rank, world, 0)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.synchronize()
    for index, param in enumerate(model.parameters()):
        total = sum((g[index].to(torch.bfloat16) for g in local[1:]),
                    local[0][index].to(torch.bfloat16))
        assert torch.equal(param.grad, (total / world).float()), index  # type: ignore
    hvd.shutdown()
    return True


def test_horovod_distributed_optimizer_with_bf16() -> None:
    assert run_ranks(2, _horovod_bf16, timeout=60, env=ENV) == [True, True]


# -- bad input across ranks ------------------------------------------------------------------

def _different_compressions(rank: int, world: int) -> str:
    try:
        scaledl.DataParallel(_classifier(), compression="bf16" if rank == 0 else "fp16")
    except ValueError as error:
        return str(error)
    return "no error"


def test_ranks_with_different_compressions_raise_on_every_rank() -> None:
    for message in run_ranks(2, _different_compressions, timeout=60, env=ENV):
        assert "setting compression bf16" in message and "fp16" in message, message
