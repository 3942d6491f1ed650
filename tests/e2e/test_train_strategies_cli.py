"""``scaledl train --strategy ...`` end to end for the EASGD family and the parameter server:
accuracy, staleness in the summary, an exact resume, and the one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaledl.cli.main import main
from scaledl.train.checkpoint import latest_checkpoint, load_checkpoint
from scaledl.train.metrics import read_metrics

pytestmark = pytest.mark.distributed


def _train(out: Path, *args: str, timeout: float = 180) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "train", "--out", str(out), "--no-progress",
         "--lr", "0.1", *args], env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads((out / "summary.json").read_text())["result"]
    return result


@pytest.mark.timeout(400)
def test_async_easgd_with_a_server_rank_trains_and_reports_staleness(tmp_path: Path) -> None:
    result = _train(tmp_path, "--strategy", "hogwild-easgd", "--workers", "3", "--servers", "1",
                    "--epochs", "3", "--eval-every", "10")
    assert result["test_accuracy"] >= 0.85  # type: ignore[operator]
    assert result["workers"] == 2 and result["world_size"] == 3
    staleness = result["staleness_per_worker"]
    assert isinstance(staleness, list) and staleness[2] is None, "the server rank pushes nothing"
    assert all(value is not None and value >= 0 for value in staleness[:2])
    records = read_metrics(tmp_path / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r for r in records if r["kind"] == "step"]
    assert len(evals) >= len(steps) // 10, "--eval-every 10 evaluates every 10 steps"
    assert all("staleness" in r for r in steps)


@pytest.mark.timeout(400)
def test_sync_easgd_resume_is_exact(tmp_path: Path) -> None:
    args = ("--strategy", "sync-easgd", "--workers", "2", "--tau", "2",
            "--easgd-form", "allreduce", "--algorithm", "ring")
    straight = _train(tmp_path / "straight", *args, "--epochs", "2")
    _train(tmp_path / "resumed", *args, "--epochs", "1")
    resumed = _train(tmp_path / "resumed", *args, "--epochs", "2", "--resume", "auto")
    assert resumed["test_accuracy"] == straight["test_accuracy"]
    assert straight["test_accuracy"] >= 0.85  # type: ignore[operator]
    assert straight["staleness_per_worker"] is None
    ends = [load_checkpoint(latest_checkpoint(tmp_path / run)) for run in ("straight", "resumed")]
    assert ends[0]["step"] == ends[1]["step"]
    _assert_bitwise_equal(ends[0]["strategy"], ends[1]["strategy"])


def _assert_bitwise_equal(first: object, second: object, where: str = "state") -> None:
    """Every tensor in two nested checkpoint states is bitwise equal (model, center, workers)."""
    if isinstance(first, torch.Tensor):
        assert isinstance(second, torch.Tensor) and torch.equal(first, second), where
    elif isinstance(first, dict):
        assert isinstance(second, dict) and first.keys() == second.keys(), where
        for key in first:
            _assert_bitwise_equal(first[key], second[key], f"{where}.{key}")
    elif isinstance(first, list | tuple):
        assert isinstance(second, list | tuple) and len(first) == len(second), where
        for index, (a, b) in enumerate(zip(first, second)):
            _assert_bitwise_equal(a, b, f"{where}[{index}]")


@pytest.mark.parametrize(("args", "needle"), [
    (["--strategy", "sync-easgd", "--alpha", "1.5"], "alpha 1.5 must be in (0, 1)"),
    (["--strategy", "easgd", "--tau", "0"], "tau 0 must be at least 1"),
    (["--strategy", "async-sgd", "--workers", "2", "--servers", "2"],
     "servers 2 leaves no worker among 2 ranks"),
    (["--strategy", "local-sgd", "--servers", "1"], "servers 1 does not apply"),
    (["--strategy", "sync-easgd", "--workers", "4", "--alpha", "0.5"], "beta = workers * alpha"),
    (["--strategy", "async-msgd", "--momentum", "1.0"], "momentum 1.0 must be in [0, 1)"),
    (["--strategy", "async-easgd", "--algorithm", "ring"], "does not work with strategy"),
    (["--strategy", "easgd", "--lr", "0.5", "--rho", "4"], "alpha = lr * rho"),
])
def test_bad_strategy_options_are_one_line_and_exit_code_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["train", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("scaledl: error:") and "\n" not in err
    assert needle in err
