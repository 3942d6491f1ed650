"""Every asynchronous strategy learns sklearn digits, and resumes from its state_dict.

One set of processes (3 ranks) runs all six strategies in turn, half of them with a dedicated
server rank (2 workers + 1 server) and half with the server thread beside rank 0 (3 workers).
For each: train a few epochs, check the test accuracy of ``evaluation_module()`` (counted over
the worker group, as the trainer does), take rank 0's ``state_dict()``, finish, build the
strategy again on every rank, load the checkpoint everywhere, and check that the restored
server state, step counter and accuracy are the saved ones.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scaledl.data import ArrayDataset, load_dataset
from scaledl.models import build_model
from scaledl.strategies.async_easgd import AsyncEASGD, AsyncMEASGD, HogwildEASGD
from scaledl.strategies.async_sgd import AsyncMSGD, AsyncSGD, HogwildSGD
from scaledl.strategies.parameter_server import ParameterServerStrategy
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

STRATEGIES: dict[str, type[ParameterServerStrategy]] = {
    cls.name: cls for cls in (AsyncSGD, AsyncMSGD, HogwildSGD, AsyncEASGD, AsyncMEASGD,
                              HogwildEASGD)
}
SERVERS = {"async-sgd": 0, "async-msgd": 1, "hogwild-sgd": 1, "async-easgd": 0,
           "async-measgd": 1, "hogwild-easgd": 1}
OPTIONS: dict[str, Any] = {"momentum": 0.5, "tau": 1, "timeout_s": 60.0, "timeline": None}
"""Values of the keywords the trainer passes (alpha: the strategy's default)."""
MIN_ACCURACY = 0.85
EPOCHS, BATCH, LR = 3, 32, 0.1


@functools.cache
def dataset(name: str, split: str) -> ArrayDataset:
    """A split of ``name`` (512 training samples for synthetic data)."""
    return load_dataset(name, None, split, 0, 512 if name.startswith("synthetic") else None)


def build(name: str, servers: int, seed: int = 0, data: str = "digits", mark: float = 0.0,
          **extra: Any) -> ParameterServerStrategy:
    """The strategy ``name`` around an MLP for ``data`` (plus a buffer filled with ``mark``),
    built with exactly the keywords the trainer passes."""
    torch.manual_seed(seed)
    train_set = dataset(data, "train")
    model = build_model("mlp", train_set.input_shape, train_set.num_classes)
    model.register_buffer("mark", torch.full((3,), float(mark)))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    options = {key: OPTIONS[key] for key in STRATEGIES[name].keywords if key in OPTIONS}
    return STRATEGIES[name](model, optimizer, **{**options, "servers": servers, **extra})


def train(strategy: ParameterServerStrategy, epochs: int, seed: int = 0, data_name: str = "digits",
          stop_after: int | None = None, on_stop: Any = None) -> None:
    """Train this worker on its shard of ``data_name`` for ``epochs`` epochs."""
    data = dataset(data_name, "train")
    generator = torch.Generator().manual_seed(seed)
    steps = 0
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        mine = order[strategy.worker_rank::strategy.num_workers]
        for batch in mine.split(BATCH):
            x, y = data.gather(batch)
            strategy.zero_grad()
            nn.functional.cross_entropy(strategy.model(x), y).backward()
            strategy.step()
            steps += 1
            if stop_after is not None and steps == stop_after:
                on_stop()


@torch.no_grad()
def accuracy(strategy: ParameterServerStrategy, collective: bool = True,
             data_name: str = "digits") -> float:
    """Test accuracy of the evaluation module, counted over the workers (or locally)."""
    test = dataset(data_name, "test")
    model = strategy.evaluation_module()
    if collective:
        indices = torch.arange(strategy.worker_rank, len(test), strategy.num_workers)
    else:
        indices = torch.arange(len(test))
    x, y = test.gather(indices)
    counts = torch.tensor([int((model(x).argmax(dim=1) == y).sum()), len(indices)])
    if collective:
        dist.all_reduce(counts, group=strategy.worker_group)
    return int(counts[0]) / int(counts[1])


def _server_state(strategy: ParameterServerStrategy) -> dict[str, Any]:
    return strategy.state_dict()["strategy"]


def _round_trip(rank: int, world_size: int, name: str, path: str) -> dict[str, Any]:
    servers = SERVERS[name]
    start = time.perf_counter()
    groups = len(dist.distributed_c10d._world.pg_map)
    strategy = build(name, servers, mark=rank)
    result: dict[str, Any] = {"worker": strategy.is_worker,
                              "mark": strategy.module.mark.tolist()}  # type: ignore[operator]
    if strategy.is_worker:
        train(strategy, EPOCHS)
        result["accuracy"] = accuracy(strategy)
        result["pushes"] = strategy.stats.pushes
        result["final"] = accuracy(strategy)  # every worker has stopped pushing by now
        if rank == 0:
            torch.save(strategy.state_dict(), path)
        strategy.finish()
    else:
        strategy.serve()
    strategy.close()
    result["groups_left"] = len(dist.distributed_c10d._world.pg_map) - groups
    result["seconds"] = time.perf_counter() - start
    dist.barrier()
    saved = torch.load(path, weights_only=False)
    resumed = build(name, servers, seed=1)  # other initial weights: the checkpoint must win
    resumed.load_state_dict(saved)
    if resumed.is_worker:
        result["resumed_accuracy"] = accuracy(resumed)
        if rank == 0:
            now, before = _server_state(resumed), saved["strategy"]
            result["same_server"] = bool(torch.equal(now["server"]["params"],
                                                     before["server"]["params"]))
            result["same_versions"] = now["server"]["versions"] == before["server"]["versions"]
            result["same_steps"] = now["steps"] == before["steps"] > 0
            velocity = now["server"]["velocity"]
            result["server_momentum"] = velocity is not None and bool(torch.equal(
                velocity, before["server"]["velocity"]))
        dist.barrier(group=resumed.worker_group)  # no worker pushes before rank 0 has read it
        train(resumed, 1)  # and it trains on
        result["after_resume"] = accuracy(resumed)
        resumed.finish()
    else:
        resumed.serve()
    resumed.close()
    return result


def _all_strategies(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    return {name: _round_trip(rank, world_size, name, str(Path(directory) / f"{name}.pt"))
            for name in STRATEGIES}


@pytest.mark.timeout(300)
def test_every_async_strategy_learns_digits_and_resumes(tmp_path: Path) -> None:
    results = run_ranks(3, _all_strategies, str(tmp_path), timeout=270)
    for name in STRATEGIES:
        ranks = [r[name] for r in results]
        workers = [r for r in ranks if r["worker"]]
        assert len(workers) == 3 - SERVERS[name], name
        assert all(r["mark"] == [0.0] * 3 for r in ranks), name  # buffers start as rank 0's
        assert all(r["groups_left"] == 0 for r in ranks), name  # close() destroyed its groups
        for worker in workers:
            assert worker["accuracy"] >= MIN_ACCURACY, (name, worker)
            assert worker["pushes"] > 0 and worker["seconds"] < 120, (name, worker)
            assert worker["resumed_accuracy"] == worker["final"], (name, worker)
            assert worker["after_resume"] >= MIN_ACCURACY, (name, worker)
        chief = ranks[0]
        assert chief["same_server"] and chief["same_versions"] and chief["same_steps"], name
        assert chief["server_momentum"] == (name == "async-msgd"), name
