"""One training run inside a process group that is already joined, and its ``summary.json``.

``scaledl train`` joins a fresh group per run.  A caller that keeps its rank processes alive
across many runs (``scaledl bench algorithms``' pool of ranks) calls :func:`train_in_group`
once per run instead: every run builds its own data, model, optimizer, strategy and seed
(:class:`~scaledl.train.trainer.Trainer` does, from the config alone), so nothing of one run
reaches the next but the group and the data sets already read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scaledl.topology import Topology
from scaledl.train.config import TrainConfig
from scaledl.train.metrics import SUMMARY_NAME
from scaledl.train.progress import StepProgress

__all__ = ["train_in_group", "write_summary"]


def write_summary(result: dict[str, Any], config: TrainConfig) -> Path:
    """Write a finished run's ``summary.json`` (its config and rank 0's result) into the run
    directory; return its path."""
    path = Path(result["out"]) / SUMMARY_NAME
    path.write_text(json.dumps({"config": config.to_dict(), "result": result}, indent=2,
                               default=str))
    return path


def train_in_group(config: TrainConfig, topology: Topology, device: torch.device | None = None,
                   progress: StepProgress | None = None) -> dict[str, Any]:
    """Train ``config`` on this rank of the joined group described by ``topology`` and return
    the run's result; rank 0 also writes ``summary.json``.  The checks a launched rank makes
    (optimizer, precision, device) run first, on every rank, so a bad config fails alike
    everywhere before any collective."""
    from scaledl.train.device import check_device
    from scaledl.train.optim import check_optim_for_strategy
    from scaledl.train.precision import check_precision
    from scaledl.train.trainer import Trainer

    check_optim_for_strategy(config)
    check_precision(config.run.precision, config.run.device, config.parallel.strategy)
    check_device(config)
    config = config.with_workers(topology.world_size)
    result = Trainer(config, topology, progress, device).run()
    if topology.rank == 0:
        write_summary(result, config)
    return result
