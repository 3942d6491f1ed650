"""A finished run's ``summary.json`` has one writer, :func:`scaledl.train.in_group.write_summary`,
reached through :func:`~scaledl.train.in_group.train_in_group` by ``scaledl train``'s ranks and by
the bench's pooled ranks alike: its shape (the config with the worker count filled in, and rank
0's result), which rank writes it, and that a run that raises writes none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from scaledl.topology import Topology
from scaledl.train.config import TrainConfig, build_config
from scaledl.train.in_group import train_in_group, write_summary
from scaledl.train.metrics import SUMMARY_NAME


def _result(out: Path) -> dict[str, Any]:
    """A result as ``Trainer.run`` returns it, with a path among its values."""
    return {"out": out, "test_accuracy": 0.875, "steps": 12, "world_size": 3, "workers": 3,
            "hidden_fraction": None, "world_sizes": [3, 2], "checkpoint": out / "latest"}


def test_summary_is_the_config_and_the_result_in_json(tmp_path: Path) -> None:
    config = build_config({}, {"out": str(tmp_path), "model": "lenet", "lr": 0.05,
                               "strategy": "local-sgd"}).with_workers(3)
    path = write_summary(_result(tmp_path), config)
    assert path == tmp_path / SUMMARY_NAME == tmp_path / "summary.json"
    summary = json.loads(path.read_text())
    assert summary == {
        "config": json.loads(json.dumps(config.to_dict())),
        "result": {**_result(tmp_path), "out": str(tmp_path),
                   "checkpoint": str(tmp_path / "latest")},
    }
    assert summary["config"]["parallel"]["workers"] == 3
    assert summary["config"]["model"]["name"] == "lenet"


def test_a_diverged_loss_is_written_as_null_so_the_file_stays_json(tmp_path: Path) -> None:
    """``json.dumps`` writes a NaN loss as ``NaN``, which JSON readers (``jq``, browsers,
    ``json.loads(..., parse_constant=...)``-free tools) refuse; metrics.jsonl writes null."""
    config = build_config({}, {"out": str(tmp_path)}).with_workers(2)
    result = {**_result(tmp_path), "final_loss": float("nan"), "losses": [1.5, float("inf")],
              "test_accuracy": torch.tensor(0.5)}
    text = write_summary(result, config).read_text()
    summary = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert summary["result"]["final_loss"] is None
    assert summary["result"]["losses"] == [1.5, None]
    assert summary["result"]["test_accuracy"] == 0.5


class _FakeTrainer:
    """Stands in for :class:`~scaledl.train.trainer.Trainer` (no process group needed): records
    the config it was given and returns a fixed result, or raises."""

    configs: list[TrainConfig] = []
    error: Exception | None = None

    def __init__(self, config: TrainConfig, topology: Topology, progress: object,
                 device: torch.device | None) -> None:
        self.config = config
        _FakeTrainer.configs.append(config)

    def run(self) -> dict[str, Any]:
        if _FakeTrainer.error is not None:
            raise _FakeTrainer.error
        return _result(Path(self.config.run.out))


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_writes_the_summary_with_the_launched_worker_count(
        rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaledl.train.trainer as trainer

    monkeypatch.setattr(trainer, "Trainer", _FakeTrainer)
    monkeypatch.setattr(_FakeTrainer, "configs", [])
    config = build_config({}, {"out": str(tmp_path)})
    assert config.parallel.workers is None  # left to the launch
    result = train_in_group(config, Topology.flat(2, rank))
    assert result["test_accuracy"] == 0.875
    assert [c.parallel.workers for c in _FakeTrainer.configs] == [2]
    summary = tmp_path / SUMMARY_NAME
    assert summary.is_file() == (rank == 0)
    if rank == 0:
        assert json.loads(summary.read_text())["config"]["parallel"]["workers"] == 2


def test_a_run_that_raises_or_a_refused_config_writes_no_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaledl.train.trainer as trainer

    monkeypatch.setattr(trainer, "Trainer", _FakeTrainer)
    monkeypatch.setattr(_FakeTrainer, "configs", [])
    monkeypatch.setattr(_FakeTrainer, "error", RuntimeError("peer died"))
    with pytest.raises(RuntimeError, match="peer died"):
        train_in_group(build_config({}, {"out": str(tmp_path)}), Topology.flat(2))
    monkeypatch.setattr(_FakeTrainer, "error", None)
    with pytest.raises(ValueError, match="precision 'fp16' is not done on the CPU"):
        train_in_group(build_config({}, {"out": str(tmp_path), "precision": "fp16"}),
                       Topology.flat(2))
    assert len(_FakeTrainer.configs) == 1  # the refused config never reached the trainer
    assert not (tmp_path / SUMMARY_NAME).exists()
