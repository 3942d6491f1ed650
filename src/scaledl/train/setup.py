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
from scaledl.collectives.registry import ALGORITHMS, AUTO
from scaledl.data import (
    ArrayDataset, ShardedLoader, ShardedSampler, available_datasets, declared_shape, load_dataset,
)
from scaledl.data.datasets import is_dataset_name
from scaledl.models import available_models, build_model
from scaledl.strategies import Strategy, build_strategy
from scaledl.strategies.catalogue import strategies, strategy_class
from scaledl.strategies.options import ElasticOptions
from scaledl.sync.propagation import ROOTED_ALGORITHMS
from scaledl.sync.stats import SpanRecorder
from scaledl.topology import Topology, parse_axes
from scaledl.train.config import DataConfig, OptimConfig, TrainConfig
from scaledl.train.optim import build_optimizer, check_optim_for_strategy
from scaledl.train.parallel_config import ParallelConfig
from scaledl.train.precision import check_precision
from scaledl.train.user_model import build_train_model, is_user_model

__all__ = ["validate_config", "check_model_fits", "trainable_models", "Sample", "RunParts",
           "build_run", "load_split", "algorithms_for", "elastic_alpha"]


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
    """The elastic moving rate on ``workers`` training ranks: ``alpha``, else ``lr * rho``,
    else ``0.9 / workers`` (:meth:`ElasticOptions.moving_rate`)."""
    parallel = config.parallel
    return ElasticOptions(alpha=parallel.alpha, rho=parallel.rho).moving_rate(workers,
                                                                             config.optim.lr)


def _check_run_values(config: TrainConfig) -> None:
    """A bucket size or momentum set for a strategy that does not read it is refused, not
    ignored (set: other than the default, as for the strategies' own options; a momentum of 0
    says what such a strategy does, and is accepted)."""
    cls, parallel = strategy_class(config.parallel.strategy), config.parallel
    bucket_default = ParallelConfig.__dataclass_fields__["bucket_mb"].default
    if parallel.bucket_mb != bucket_default and "bucket_mb" not in cls.keywords:
        takers = [name for name in strategies() if "bucket_mb" in strategy_class(name).keywords]
        raise ValueError(f"bucket_mb {parallel.bucket_mb} sizes the gradient buckets of "
                         f"{', '.join(takers)}, and {cls.name} has none; drop it")
    if parallel.compression != "none" and "compression" not in cls.keywords:
        takers = [name for name in strategies() if "compression" in strategy_class(name).keywords]
        raise ValueError(f"compression {parallel.compression!r} compresses the gradient buckets "
                         f"of {', '.join(takers)}, and {cls.name} has none; drop it or use "
                         f"--strategy {takers[0]}")
    unset = (0.0, OptimConfig.__dataclass_fields__["momentum"].default)  # none, or the default
    if config.optim.momentum not in unset and not cls.applies_momentum:
        served = [name for name in strategies() if strategy_class(name).server
                  and strategy_class(name).applies_momentum]
        raise ValueError(f"momentum {config.optim.momentum} is not applied by {cls.name}, whose "
                         f"update takes none; drop it (of the server strategies, "
                         f"{', '.join(served)} apply momentum)")


Sample = tuple[tuple[int, ...], int]
"""A data set's sample shape (no batch dim) and its number of classes."""


def _reads_token_ids(model: nn.Module) -> bool:
    """Whether ``model`` starts from token ids (an embedding table): no data set of
    ``scaledl train`` has any, they all hold float features."""
    return any(isinstance(module, nn.Embedding) for module in model.modules())


def _fits(name: str, sample: Sample) -> bool:
    """Whether model ``name`` trains on ``sample``: it builds for it and reads float features."""
    try:
        with torch.device("meta"):  # no memory, no weights drawn: only the shapes are checked
            return not _reads_token_ids(build_model(name, *sample))
    except (ValueError, TypeError):
        return False


def trainable_models(sample: Sample) -> list[str]:
    """The models ``scaledl train`` can train on samples of ``sample``'s shape and classes."""
    return [name for name in available_models() if _fits(name, sample)]


def check_model_fits(config: TrainConfig, sample: Sample) -> None:
    """Raise the one-line ``ValueError`` of a model that cannot train on the data set's samples
    (the model's own message for a shape it cannot take), before any worker starts."""
    name, dataset = config.model.name, config.data.dataset
    if is_user_model(name):  # the user's code may read files or weights: build it for real
        model = build_train_model(name, *sample)
    else:
        with torch.device("meta"):
            model = build_model(name, *sample)
    if _reads_token_ids(model):
        raise ValueError(
            f"model {name!r} reads token ids and dataset {dataset!r} holds float features of "
            f"shape {sample[0]}; train one of: {', '.join(trainable_models(sample))} (or "
            f"predict {name} with `scaledl simulate --model {name}`)"
        )
    config.parallel.strategy_options().check_model(model)  # e.g. fragments vs tensors


def validate_config(config: TrainConfig, workers: int, sample: Sample | None = None) -> None:
    """Raise ``ValueError`` (one line: the value and the fix) for anything that cannot run.

    ``sample`` is the data set's sample shape and classes when already loaded; otherwise the
    one its name declares is used, and a data set whose files alone tell it (``npz``) leaves
    the model to :func:`check_model_fits` once they are read.
    """
    if not is_dataset_name(config.data.dataset):
        raise ValueError(f"unknown dataset {config.data.dataset!r}; use one of: "
                         f"{', '.join(available_datasets())}, or your own as "
                         "package.module:factory")
    sample = sample if sample is not None else declared_shape(config.data.dataset)
    if config.model.name not in available_models() and not is_user_model(config.model.name):
        fitting = available_models() if sample is None else trainable_models(sample)
        which = "" if sample is None else \
            f" (the models that train on {config.data.dataset}: samples of shape {sample[0]})"
        raise ValueError(f"unknown model {config.model.name!r}; use one of: "
                         f"{', '.join(fitting)}{which}, or your own as package.module:factory")
    if sample is not None:
        check_model_fits(config, sample)
    strategy = config.parallel.strategy
    strategy_class(strategy)  # a one-line error naming the known ones
    config.parallel.strategy_options().check_job(workers, config.optim.lr)
    _check_run_values(config)
    check_optim_for_strategy(config)
    check_precision(config.run.precision, config.run.device, strategy)
    allowed = algorithms_for(strategy, config.parallel.easgd_form or "tree")
    if config.parallel.algorithm not in allowed:
        known = config.parallel.algorithm.partition("[")[0] in (AUTO, *ALGORITHMS)
        problem = f"does not work with strategy {strategy!r}" if known else "is unknown"
        raise ValueError(f"algorithm {config.parallel.algorithm!r} {problem}; use one of: "
                         f"{', '.join(allowed)}")
    if config.parallel.topology:
        axes = parse_axes(config.parallel.topology)
        if math.prod(axes) != workers:
            raise ValueError(
                f"topology {config.parallel.topology!r} describes {math.prod(axes)} ranks but "
                f"{workers} workers were asked for; give --workers {math.prod(axes)} or a "
                f"topology whose axes multiply to {workers}"
            )


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
    """The constructor keywords: the run values the strategy declares (``keywords``) and those
    of its options dataclass."""
    parallel = config.parallel
    values: dict[str, Any] = {
        "algorithm": parallel.algorithm, "topology": topology, "timeline": timeline,
        "bucket_mb": parallel.bucket_mb, "timeout_s": parallel.timeout_s,
        "momentum": config.optim.momentum, "compression": parallel.compression,
        # a worker silent for this long (hung, not dead) is dropped so the others finish
        "idle_timeout_s": max(IDLE_FLOOR_S, IDLE_FACTOR * parallel.timeout_s),
    }
    wanted = {key: values[key] for key in strategy_class(parallel.strategy).keywords}
    return {**wanted, **parallel.strategy_options().keywords(world_size, config.optim.lr)}


def load_split(data: DataConfig, split: str, seed: int) -> ArrayDataset:
    """Split ``split`` of the run's data set."""
    return load_dataset(data.dataset, data.data_dir, split, seed, data.synthetic_size,
                        data.image_size)


def build_run(
    config: TrainConfig, rank: int, world_size: int, topology: Topology | None,
    timeline: SpanRecorder | None, model_state: dict[str, Any] | None = None,
    device: torch.device | None = None,
) -> RunParts:
    """Data, sampler, loader, model (with ``model_state`` loaded, on ``device``: the CPU by
    default), optimizer and strategy."""
    data = config.data
    train_set = load_split(data, "train", config.run.seed)
    test_set = load_split(data, "test", config.run.seed)
    torch.manual_seed(config.run.seed)
    model = build_train_model(config.model.name, train_set.input_shape, train_set.num_classes)
    if model_state is not None:
        model.load_state_dict(model_state)
    model.to(device or torch.device("cpu"))  # before the optimizer and the strategy see it
    optimizer = build_optimizer(model, config.optim)
    strategy = build_strategy(config.parallel.strategy, model, optimizer,
                              **_strategy_options(config, topology, timeline, world_size))
    shard = strategy.worker_rank if strategy.is_worker else 0  # a server rank reads no data
    sampler = ShardedSampler(len(train_set), shard, strategy.num_workers,
                             config.run.seed, shuffle=True, drop_last=data.drop_last)
    loader = ShardedLoader(train_set, data.batch_size, sampler, data.prefetch,
                           drop_last=data.drop_last)
    return RunParts(train_set, test_set, sampler, loader, model, optimizer, strategy)
