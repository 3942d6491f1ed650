"""Build what a training run needs from a :class:`TrainConfig`: data, model, optimizer, strategy.

Everything a user can get wrong is checked by :func:`validate_config` before any worker starts
(the CLI calls it in the launching process), so a bad name or a topology that does not match
the workers fails once, with one line, instead of on every rank after start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scaledl import collectives
from scaledl.collectives.registry import AUTO
from scaledl.data import (
    ArrayDataset, ShardedLoader, ShardedSampler, available_datasets, load_dataset,
)
from scaledl.models import available_models, build_model
from scaledl.strategies import Strategy, build_strategy
from scaledl.strategies.catalogue import strategy_class
from scaledl.strategies.elastic import check_beta
from scaledl.sync.propagation import ROOTED_ALGORITHMS
from scaledl.sync.stats import SpanRecorder
from scaledl.topology import Topology, parse_axes
from scaledl.train.config import TrainConfig

__all__ = ["validate_config", "RunParts", "build_run", "algorithms_for", "elastic_alpha"]


def algorithms_for(strategy: str, easgd_form: str = "tree") -> tuple[str, ...]:
    """Algorithm names a strategy accepts (for Sync EASGD, in its ``easgd_form``): the kind of
    collectives it declares (:attr:`~scaledl.strategies.base.Strategy.collectives`)."""
    kind = strategy_class(strategy).collective_kind(easgd_form)
    if kind == "none":  # point to point: a server, or a round-robin master
        return (AUTO,)
    if kind == "rooted":
        return ROOTED_ALGORITHMS
    return tuple(collectives.available("allreduce"))


def elastic_alpha(config: TrainConfig, workers: int) -> float:
    """The elastic moving rate: ``alpha``, else ``lr * rho``, else ``0.9 / workers``."""
    parallel = config.parallel
    if parallel.alpha is not None:
        return parallel.alpha
    if parallel.rho is not None:
        alpha = config.optim.lr * parallel.rho
        if not 0 < alpha < 1:
            raise ValueError(f"alpha = lr * rho = {config.optim.lr} * {parallel.rho} = "
                             f"{alpha:g} must be in (0, 1); lower --rho or give --alpha")
        return alpha
    return 0.9 / max(1, workers)


def training_workers(config: TrainConfig, world_size: int) -> int:
    """Ranks that train: the world size less the dedicated parameter-server ranks."""
    return world_size - config.parallel.servers


def validate_config(config: TrainConfig, workers: int) -> None:
    """Raise ``ValueError`` (one line: the value and the fix) for anything that cannot run."""
    if config.model.name not in available_models():
        raise ValueError(f"unknown model {config.model.name!r}; use one of: "
                         f"{', '.join(available_models())}")
    dataset = config.data.dataset.split(":")[0]
    if dataset not in available_datasets():
        raise ValueError(f"unknown dataset {config.data.dataset!r}; use one of: "
                         f"{', '.join(available_datasets())}")
    strategy = config.parallel.strategy
    strategy_class(strategy)  # a one-line error naming the known ones
    _check_servers(config, workers)
    _check_beta(config, training_workers(config, workers))
    allowed = algorithms_for(strategy, config.parallel.easgd_form or "tree")
    if config.parallel.algorithm not in allowed:
        raise ValueError(f"algorithm {config.parallel.algorithm!r} does not work with strategy "
                         f"{strategy!r}; use one of: {', '.join(allowed)}")
    if config.parallel.topology:
        axes = parse_axes(config.parallel.topology)
        if math.prod(axes) != workers:
            raise ValueError(
                f"topology {config.parallel.topology!r} describes {math.prod(axes)} ranks but "
                f"{workers} workers were asked for; give --workers {math.prod(axes)} or a "
                f"topology whose axes multiply to {workers}"
            )


def _check_beta(config: TrainConfig, workers: int) -> None:
    """Sync EASGD's stability condition, checked before launch (the strategy checks it too)."""
    alpha = elastic_alpha(config, workers)
    if config.parallel.strategy == "sync-easgd":
        check_beta(alpha, workers)


def _check_servers(config: TrainConfig, workers: int) -> None:
    servers = config.parallel.servers
    if servers >= workers:
        raise ValueError(f"servers {servers} leaves no worker among {workers} ranks; give "
                         f"--workers {servers + 1} or more, or fewer --servers")


@dataclass
class RunParts:
    """The pieces of one rank's training run."""

    train_set: ArrayDataset
    test_set: ArrayDataset
    sampler: ShardedSampler
    loader: ShardedLoader
    model: nn.Module
    optimizer: torch.optim.Optimizer
    strategy: Strategy


IDLE_FACTOR, IDLE_FLOOR_S = 10.0, 300.0
"""A parameter server drops a worker silent for max(300 s, 10 x timeout): hung, not dead (a
dead one is dropped at once), so the other workers finish the run."""

def _strategy_options(config: TrainConfig, topology: Topology | None,
                      timeline: SpanRecorder | None, world_size: int) -> dict[str, Any]:
    parallel = config.parallel
    strategy = parallel.strategy
    wanted = strategy_class(strategy).keywords
    values: dict[str, Any] = {
        "algorithm": parallel.algorithm, "topology": topology, "timeline": timeline,
        "bucket_mb": parallel.bucket_mb, "tau": parallel.tau or 1,
        "form": parallel.easgd_form or "tree", "servers": parallel.servers,
        "timeout_s": parallel.timeout_s, "momentum": config.optim.momentum,
        # a worker silent for this long (hung, not dead) is dropped so the others finish
        "idle_timeout_s": max(IDLE_FLOOR_S, IDLE_FACTOR * parallel.timeout_s),
    }
    if "alpha" in wanted:
        values["alpha"] = elastic_alpha(config, training_workers(config, world_size))
    return {key: values[key] for key in wanted}


def build_run(
    config: TrainConfig, rank: int, world_size: int, topology: Topology | None,
    timeline: SpanRecorder | None, model_state: dict[str, Any] | None = None,
) -> RunParts:
    """Data, sampler, loader, model (with ``model_state`` loaded), optimizer and strategy."""
    data = config.data
    train_set = load_dataset(data.dataset, data.data_dir, "train", config.run.seed,
                             data.synthetic_size)
    test_set = load_dataset(data.dataset, data.data_dir, "test", config.run.seed,
                            data.synthetic_size)
    torch.manual_seed(config.run.seed)
    model = build_model(config.model.name, train_set.input_shape, train_set.num_classes)
    if model_state is not None:
        model.load_state_dict(model_state)
    optim = config.optim
    optimizer = torch.optim.SGD(model.parameters(), lr=optim.lr, momentum=optim.momentum,
                                weight_decay=optim.weight_decay)
    strategy = build_strategy(config.parallel.strategy, model, optimizer,
                              **_strategy_options(config, topology, timeline, world_size))
    shard = strategy.worker_rank if strategy.is_worker else 0  # a server rank reads no data
    sampler = ShardedSampler(len(train_set), shard, strategy.num_workers,
                             config.run.seed, shuffle=True, drop_last=data.drop_last)
    loader = ShardedLoader(train_set, data.batch_size, sampler, data.prefetch,
                           drop_last=data.drop_last)
    return RunParts(train_set, test_set, sampler, loader, model, optimizer, strategy)
