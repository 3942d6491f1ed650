"""Checkpoint-resume reproduces the uninterrupted run bitwise (same world size)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scaledl.topology import Topology
from scaledl.train.checkpoint import latest_checkpoint, load_checkpoint
from scaledl.train.config import build_config
from scaledl.train.trainer import Trainer
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


def _train(rank: int, world_size: int, out: str, epochs: int, resume: str | None,
           strategy: str) -> float:
    config = build_config({}, {"out": out, "epochs": epochs, "resume": resume,
                               "progress": False, "strategy": strategy,
                               "algorithm": "tree" if strategy != "allreduce" else "ring"})
    result = Trainer(config, Topology.flat(world_size, rank)).run()
    return float(result["test_accuracy"])


def _final_model(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(out))["strategy"]["model"]


@pytest.mark.parametrize("strategy", ["allreduce", "reduce-broadcast"])
def test_resume_is_bitwise_identical(tmp_path: Path, strategy: str) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_ranks(2, _train, str(straight), 4, None, strategy, timeout=120)
    run_ranks(2, _train, str(split), 2, None, strategy, timeout=120)
    run_ranks(2, _train, str(split), 4, "auto", strategy, timeout=120)
    a, b = _final_model(straight), _final_model(split)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resume_with_a_different_world_size_continues(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_ranks(2, _train, str(out), 1, None, "allreduce", timeout=120)
    first = load_checkpoint(latest_checkpoint(out))
    accuracy = run_ranks(1, _train, str(out), 2, "auto", "allreduce", timeout=120)[0]
    second = load_checkpoint(latest_checkpoint(out))
    assert first["world_size"] == 2 and second["world_size"] == 1
    assert second["epoch"] == 2 and second["step"] > first["step"]
    assert accuracy > 0.8


def test_resume_auto_skips_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_ranks(2, _train, str(out), 2, None, "allreduce", timeout=120)
    newest = latest_checkpoint(out)
    newest.write_bytes(b"torn write")
    run_ranks(2, _train, str(out), 3, "auto", "allreduce", timeout=120)
    state = load_checkpoint(latest_checkpoint(out))
    assert state["epoch"] == 3
