"""Training throughput: scaledl DataParallel against torch DDP (Gloo), side by side in one job.

Every worker trains the same model on fixed synthetic batches (so the data pipeline does not
add noise); the two wrappers alternate in rounds, each round timing ``steps`` steps after a
warm-up, with the time taken as the slowest rank's.  Before that, rank 0 alone times plain local
training, the one-worker baseline of the scaling efficiency
``throughput(N) / (N * throughput(1))``.  scaledl's rounds also report the share of the step
spent in communication and the share of communication hidden behind backward.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaledl.models import build_model
from scaledl.sync import DataParallel

__all__ = ["TrainBenchConfig", "run_train_benchmark", "default_input_shape"]

MODES = ("ddp", "scaledl")


@dataclass(frozen=True)
class TrainBenchConfig:
    """What to measure."""

    model: str = "resnet50"
    """Model name from scaledl.models."""
    input_shape: tuple[int, ...] = (3, 32, 32)
    """Shape of one synthetic sample."""
    num_classes: int = 10
    """Classes of the synthetic labels."""
    batch_size: int = 16
    """Samples per worker per step."""
    steps: int = 10
    """Timed steps per round."""
    warmup: int = 3
    """Untimed steps before each round."""
    repeats: int = 3
    """Rounds per wrapper (alternating)."""
    algorithm: str = "auto"
    """scaledl's allreduce algorithm."""
    bucket_mb: float = 25.0
    """Bucket size of both wrappers."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.warmup < 0 or self.bucket_mb <= 0:
            raise ValueError(f"--warmup {self.warmup} must be >= 0 and --bucket-mb "
                             f"{self.bucket_mb} > 0")


def default_input_shape(model: str) -> tuple[int, ...]:
    """A sample shape each model accepts: MNIST-sized for small nets, CIFAR- or larger else."""
    if model in ("mlp", "lenet"):
        return (1, 28, 28)
    if model == "alexnet":
        return (3, 64, 64)
    if model == "inception_v3":
        return (3, 75, 75)
    return (3, 32, 32)


def _batch(config: TrainBenchConfig, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(config.batch_size, *config.input_shape, generator=generator)
    y = torch.randint(0, config.num_classes, (config.batch_size,), generator=generator)
    return x, y


def _model(config: TrainBenchConfig) -> nn.Module:
    torch.manual_seed(0)
    return build_model(config.model, config.input_shape, config.num_classes)


def _time_steps(model: nn.Module, config: TrainBenchConfig, batch: tuple[torch.Tensor, ...],
                steps: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = batch
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
    return time.perf_counter() - start


def _slowest(seconds: float) -> float:
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def _wrap(mode: str, model: nn.Module, config: TrainBenchConfig) -> nn.Module:
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=config.bucket_mb)
    return DataParallel(model, algorithm=config.algorithm, bucket_mb=config.bucket_mb)


def _round(mode: str, config: TrainBenchConfig, batch: tuple[torch.Tensor, ...],
           world_size: int) -> dict[str, float]:
    wrapped = _wrap(mode, _model(config), config)
    _time_steps(wrapped, config, batch, config.warmup)
    if isinstance(wrapped, DataParallel):
        wrapped.stats.reset()
    dist.barrier()
    seconds = _slowest(_time_steps(wrapped, config, batch, config.steps))
    result = {"samples_per_s": config.steps * config.batch_size * world_size / seconds,
              "step_s": seconds / config.steps}
    if isinstance(wrapped, DataParallel):
        stats = wrapped.stats.reset()
        result["comm_share"] = stats.comm_s / seconds
        result["hidden_fraction"] = stats.hidden_fraction
    return result


def run_train_benchmark(config: TrainBenchConfig) -> dict[str, Any]:
    """Measure on every rank of the initialised group; the result is the same everywhere."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch = _batch(config, rank)
    single = 0.0
    if rank == 0:
        model = _model(config)
        _time_steps(model, config, batch, config.warmup)
        single = config.steps * config.batch_size / _time_steps(model, config, batch,
                                                                 config.steps)
    single = _slowest(single)  # broadcast rank 0's value (the others contribute 0)
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for repeat in range(config.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for mode in order:
            rounds[mode].append(_round(mode, config, batch, world_size))
    summary = {mode: _median(rows) for mode, rows in rounds.items()}
    for mode in MODES:
        summary[mode]["scaling_efficiency"] = summary[mode]["samples_per_s"] / (
            world_size * single)
    parameters = sum(p.numel() for p in _model(config).parameters())
    return {
        "config": asdict(config), "world_size": world_size, "parameters": parameters,
        "single_worker_samples_per_s": single, "rounds": rounds, "median": summary,
        "scaledl_over_ddp": summary["scaledl"]["samples_per_s"] / summary["ddp"]["samples_per_s"],
    }


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}
