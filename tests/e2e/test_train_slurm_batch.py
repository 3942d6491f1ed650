"""``scaledl train`` inside an ``sbatch`` script starts its own workers; under srun it is one.

The environment is the one Slurm gives (SLURM_PROCID=0 and SLURM_NTASKS in the batch script, a
step id only in srun's tasks); no real Slurm is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT"}
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_", "SCALEDL_")


def _slurm_env(ntasks: int, step_id: str | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in LAUNCHER_NAMES and not name.startswith(LAUNCHER_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", SLURM_JOB_ID="4242", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_NODEID="0", SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks),
               SLURM_TASKS_PER_NODE=str(ntasks), SLURM_JOB_NODELIST="localhost")
    if step_id is not None:
        env.update(SLURM_STEP_ID=step_id, SLURM_STEPID=step_id)
    return env


def _train(env: dict[str, str], out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "train", "--epochs", "1", "--timeout-s", "20",
         "--no-progress", "--out", str(out), *args],
        env=env, capture_output=True, text=True, timeout=180,
    )


@pytest.mark.parametrize("ntasks", [1, 2])
def test_batch_script_launches_its_own_workers(tmp_path: Path, ntasks: int) -> None:
    done = _train(_slurm_env(ntasks, None), tmp_path, "--workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result"]["world_size"] == 2
    assert summary["config"]["parallel"]["workers"] == 2


def test_srun_task_is_one_worker(tmp_path: Path) -> None:
    done = _train(_slurm_env(1, "0"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["result"]["world_size"] == 1


def test_srun_with_other_worker_count_is_one_line(tmp_path: Path) -> None:
    done = _train(_slurm_env(1, "0"), tmp_path, "--workers", "2")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert lines[-1].startswith("scaledl: error: --workers 2 but slurm started 1 rank")
    assert "Traceback" not in done.stderr
