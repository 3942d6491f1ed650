"""``scaledl train --max-restarts``: a synchronous run that loses a worker (killed, or hung past
the timeout) at an injected step restarts from its last checkpoint and ends bitwise equal to
the same run without the fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaledl.faults import FAULT_ENV
from scaledl.train.checkpoint import latest_checkpoint, load_checkpoint
from scaledl.train.metrics import read_metrics

pytestmark = pytest.mark.distributed

STRATEGIES = {
    "allreduce": ["--algorithm", "ring"],
    "reduce-broadcast": ["--algorithm", "tree"],
    "sync-easgd": ["--tau", "2"],
}
COMMON = ["--workers", "2", "--epochs", "2", "--checkpoint-every", "8", "--timeout-s", "5",
          "--seed", "3", "--no-progress"]


def train(out: Path, *args: str, fault: str | None = None,
          timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """``scaledl train`` in a subprocess, with ``SCALEDL_FAULT`` set to ``fault``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
    return subprocess.run([sys.executable, "-m", "scaledl.cli.main", "train", "--out", str(out),
                           *args], env=env, capture_output=True, text=True, timeout=timeout)


def final_state(out: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the run's last checkpoint, by name."""
    state = load_checkpoint(latest_checkpoint(out))
    tensors = {f"model.{k}": v for k, v in state["strategy"]["model"].items()}
    optimizer = state["strategy"]["optimizer"]["state"]
    for index, buffers in optimizer.items():
        tensors.update({f"optim.{index}.{k}": v for k, v in buffers.items()
                        if isinstance(v, torch.Tensor)})
    tensors["step"] = torch.tensor(state["step"])
    return tensors


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    """The uninterrupted run of each strategy, computed once."""
    found = {}
    for strategy, extra in STRATEGIES.items():
        out = tmp_path_factory.mktemp(f"baseline-{strategy}")
        done = train(out, "--strategy", strategy, *extra, *COMMON)
        assert done.returncode == 0, done.stderr[-3000:]
        found[strategy] = final_state(out)
    return found


def _assert_bitwise(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize(("strategy", "fault"), [
    ("allreduce", "rank:1,step:13,kind:crash"),
    ("reduce-broadcast", "rank:0,step:20,kind:raise"),
    ("sync-easgd", "rank:1,collective:30,kind:crash"),
    ("allreduce", "rank:1,step:13,kind:hang"),
])
def test_a_failed_worker_restarts_and_ends_bitwise_equal(
    tmp_path: Path, baselines: dict[str, dict[str, torch.Tensor]], strategy: str, fault: str
) -> None:
    done = train(tmp_path, "--strategy", strategy, *STRATEGIES[strategy], *COMMON,
                 "--max-restarts", "1", fault=fault)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_bitwise(final_state(tmp_path), baselines[strategy])
    summary = json.loads((tmp_path / "summary.json").read_text())["result"]
    assert summary["restarts"] == 1 and summary["steps_redone"] >= 0
    assert summary["time_lost_s"] > 0
    restarts = read_metrics(tmp_path / "metrics.jsonl", kind="restart")
    assert len(restarts) == 1 and restarts[0]["resumed_step"] % 8 == 0
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", kind="step")]
    assert steps == list(range(1, steps[-1] + 1)), "redone steps are recorded once"
