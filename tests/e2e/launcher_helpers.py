"""Shared parts of the real-launcher tests: a clean environment, a job run with a hard timeout
that leaves nothing behind, and the checks on what every rank of ``launcher_probe.py`` reported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaledl.processes import group_alive, stop_process_groups
from tests.harness import free_port

PROBE = Path(__file__).with_name("launcher_probe.py")
"""The script every rank of a probe job runs."""
JOB_TIMEOUT_S = 150
"""Hard limit of one launched job: a hang fails the test instead of blocking the suite."""
CLEARED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "SCALEDL_TOPOLOGY", "SCALEDL_HOSTNAME"}
CLEARED_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "SLURM_", "TORCHELASTIC_")

__all__ = ["PROBE", "JOB_TIMEOUT_S", "Job", "clean_env", "run_job", "read_reports",
           "check_collectives", "survivors_name", "step_losses", "train_args", "train_summary",
           "probe_command", "require", "free_port"]


def require(binary: str) -> str | None:
    """The reason to skip when ``binary`` is not installed, else ``None``."""
    if shutil.which(binary) is None:
        return f"{binary} is not installed (CI installs it: see .ci/run)"
    return None


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, one thread per rank, and ``extra``."""
    env = {name: value for name, value in os.environ.items()
           if name not in CLEARED_NAMES and not name.startswith(CLEARED_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()), PROBE_TIMEOUT_S="60")
    env.update(extra)
    return env


@dataclass(frozen=True)
class Job:
    """What a launched job left: its exit code and its merged output."""

    returncode: int
    output: str
    left_running: bool
    """Whether something of the launcher's process group still ran after it exited."""


def run_job(command: Sequence[str], env: dict[str, str], cwd: Path,
            timeout: float = JOB_TIMEOUT_S) -> Job:
    """Run a launcher in a session of its own; past ``timeout`` its whole group is stopped and
    the test fails (a hang is a failure, and nothing may be left running)."""
    proc = subprocess.Popen(list(command), env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process_groups([proc], grace_s=5.0)
        output, _ = proc.communicate()
        raise AssertionError(
            f"{command[0]} did not finish within {timeout} s:\n"
            + output.decode(errors="replace")[-4000:]
        ) from None
    finally:
        left_running = group_alive(proc.pid)
        stop_process_groups([proc], grace_s=5.0, include_finished=True)
    return Job(proc.returncode, output.decode(errors="replace"), left_running)


def probe_command(out: Path, *args: str) -> list[str]:
    """The per-rank command of a probe job."""
    return [sys.executable, str(PROBE), str(out), *args]


def train_args(out: Path) -> list[str]:
    """A small ``scaledl train`` (MLP on digits, one epoch: 23 steps at 2 ranks)."""
    return [sys.executable, "-m", "scaledl.cli.main", "train", "--model", "mlp", "--epochs", "1",
            "--no-progress", "--timeout-s", "60", "--out", str(out)]


def read_reports(out: Path, world_size: int, job: Job) -> list[dict[str, Any]]:
    """Every rank's report, in rank order; fails naming the missing ranks and the output."""
    missing = [r for r in range(world_size) if not (out / f"rank{r}.json").exists()]
    assert job.returncode == 0 and not missing, (
        f"exit code {job.returncode}, no report from ranks {missing}:\n{job.output[-4000:]}")
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert [report["rank"] for report in reports] == list(range(world_size))
    assert {report["world_size"] for report in reports} == {world_size}
    return reports


def check_collectives(reports: list[dict[str, Any]]) -> None:
    """Closed forms: ranks contribute ``rank + 1`` to every allreduce (sum ``p(p+1)/2``), their
    rank to the allgather, and the last rank broadcasts its rank."""
    world_size = len(reports)
    gathered = [float(rank) for rank in range(world_size) for _ in range(3)]
    for report in reports:
        sums = report["allreduce"]
        assert sums and all(value == [world_size * (world_size + 1) / 2]
                            for value in sums.values()), sums
        assert report["allgather"] == gathered
        assert report["broadcast"] == [float(world_size - 1)]
    algorithms = {tuple(sorted(report["allreduce"])) for report in reports}
    assert len(algorithms) == 1, f"ranks ran different algorithms: {algorithms}"


def survivors_name(output: str, rank: int) -> bool:
    """Whether a surviving rank's scaledl error names the dead ``rank`` (``TransportError: send
    of ... to rank R failed`` / ``recv ... from rank R failed``)."""
    return any(f"rank {rank} failed" in line for line in output.splitlines()
               if "TransportError:" in line)


def step_losses(run_dir: Path) -> list[float]:
    """Rank 0's loss at every step of a ``scaledl train`` run, from its metrics file."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [row["loss"] for row in rows if row.get("kind") == "step"]


def train_summary(run_dir: Path, job: Job) -> dict[str, Any]:
    """The result of a ``scaledl train`` run; fails with its output when there is none."""
    summary = run_dir / "summary.json"
    assert job.returncode == 0 and summary.exists(), (
        f"exit code {job.returncode}:\n{job.output[-4000:]}")
    recorded = json.loads(summary.read_text())
    result: dict[str, Any] = recorded["result"]
    # the launcher chose the ranks: the config records how many ran, not null
    assert recorded["config"]["parallel"]["workers"] == result["world_size"]
    return result
