"""One training run inside a process group that is already joined, and its ``summary.json``.

Every finished run's ``summary.json`` is written here, by :func:`write_summary`, whoever
started the run.  ``scaledl train`` joins a fresh group per run and then calls
:func:`train_in_group` once; a caller that keeps its rank processes alive across many runs
(``scaledl bench algorithms``' pool of ranks) calls it once per run: every run builds its own
data, model, optimizer, strategy and seed (:class:`~scaledl.train.trainer.Trainer` does, from
the config alone), so nothing of one run reaches the next but the group and the data sets
already read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scaledl.topology import Topology
from scaledl.train.config import TrainConfig
from scaledl.train.metrics import SUMMARY_NAME, json_ready
from scaledl.train.progress import StepProgress

__all__ = ["check_rank_config", "train_in_group", "write_summary"]


def write_summary(result: dict[str, Any], config: TrainConfig) -> Path:
    """Write a finished run's ``summary.json`` into its run directory (``result["out"]``) and
    return its path: ``{"config": config.to_dict(), "result": result}``, where ``result`` is
    rank 0's :meth:`~scaledl.train.trainer.Trainer.run`; values JSON has no type for (paths)
    are written as strings, and a non-finite number (a diverged loss) as null.  Pass the
    config with its worker count filled in (:meth:`TrainConfig.with_workers`), as
    :func:`train_in_group` does."""
    path = Path(result["out"]) / SUMMARY_NAME
    record = json_ready({"config": config.to_dict(), "result": result}, unknown=str)
    path.write_text(json.dumps(record, indent=2, allow_nan=False))
    return path


def check_rank_config(config: TrainConfig) -> None:
    """The checks a rank makes of its config on its own (optimizer against strategy, precision,
    device): a one-line ``ValueError``, alike on every rank.  Pure and cheap, so ``scaledl
    train`` makes them before joining the group (a bad device would otherwise fail inside the
    backend's set-up) and :func:`train_in_group` again for callers already joined."""
    from scaledl.train.device import check_device
    from scaledl.train.optim import check_optim_for_strategy
    from scaledl.train.precision import check_precision

    check_optim_for_strategy(config)
    check_precision(config.run.precision, config.run.device, config.parallel.strategy)
    check_device(config)


def train_in_group(config: TrainConfig, topology: Topology, device: torch.device | None = None,
                   progress: StepProgress | None = None) -> dict[str, Any]:
    """Train ``config`` on this rank of the joined group described by ``topology`` and return
    the run's result; rank 0 also writes ``summary.json`` (:func:`write_summary`), once
    training has ended and before the caller leaves the group.  :func:`check_rank_config` runs
    first, on every rank, so a bad config fails alike everywhere before any collective.  A run
    that raises writes no summary."""
    from scaledl.train.trainer import Trainer

    check_rank_config(config)
    config = config.with_workers(topology.world_size)
    result = Trainer(config, topology, progress, device).run()
    if topology.rank == 0:
        write_summary(result, config)
    return result
