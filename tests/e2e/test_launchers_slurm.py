"""scaledl under a real Slurm: ``srun`` tasks are ranks, an ``sbatch`` script is not.

One single-node Slurm (munged, slurmctld, slurmd; :mod:`tests.e2e.slurm_local`) serves the
whole module and is stopped, its directory removed, also when a test fails.  ``srun`` starts
``scaledl train`` (which must train exactly as 2 local workers do) and ``launcher_probe.py``
(what ``scaledl.init()`` detected, collectives against closed forms); an ``sbatch`` script runs
the probe through ``srun`` and ``scaledl train --workers 2`` directly, where scaledl must start
its own workers (Slurm gives the script ``SLURM_PROCID=0`` too).  A task killed with SIGKILL
must end the step promptly, with srun naming the task and the survivors naming the rank.

Skipped, with the reason, where Slurm or munge is not installed (.ci/run installs them) or the
tests do not run as root.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.launcher_helpers import (
    JOB_TIMEOUT_S, check_collectives, clean_env, probe_command, read_reports, run_job,
    step_losses, survivors_name, train_args, train_summary,
)
from tests.e2e.slurm_local import local_slurm, missing_slurm

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(200)]


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    """The module's Slurm: ``SLURM_CONF`` to hand to every client command."""
    reason = missing_slurm()
    if reason:
        pytest.skip(reason)
    with local_slurm() as env:
        yield {"SLURM_CONF": env["SLURM_CONF"]}


def _node(slurm: dict[str, str]) -> str:
    for line in Path(slurm["SLURM_CONF"]).read_text().splitlines():
        if line.startswith("NodeName="):
            return line.split()[0].removeprefix("NodeName=")
    raise AssertionError("no node in slurm.conf")


def test_srun_train_matches_local_workers(
    slurm: dict[str, str], tmp_path: Path, local_training: list[float]
) -> None:
    job = run_job(["srun", "--ntasks=2", *train_args(tmp_path / "run")], clean_env(**slurm),
                  tmp_path)
    result = train_summary(tmp_path / "run", job)
    assert result["world_size"] == 2 and result["steps"] == 23
    assert "launcher=slurm rank=0 world_size=2" in job.output
    assert step_losses(tmp_path / "run") == pytest.approx(local_training, rel=1e-5, abs=1e-6)


def test_srun_three_tasks(slurm: dict[str, str], tmp_path: Path) -> None:
    job = run_job(["srun", "--ntasks=3", *probe_command(tmp_path)], clean_env(**slurm), tmp_path)
    reports = read_reports(tmp_path, 3, job)
    node = _node(slurm)
    for rank, report in enumerate(reports):
        assert report["launcher"] == "slurm"
        assert (report["local_rank"], report["local_world_size"]) == (rank, 3)
        assert report["node_rank"] == 0
        assert report["master_addr"] == node  # the first host of SLURM_JOB_NODELIST
        assert len(set(report["hosts"])) == 1 and report["topology"] == "3"
    check_collectives(reports)


BATCH_SCRIPT = """#!/bin/sh
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=3
set -e
srun --ntasks=2 {probe}
{train} --workers 2
"""
"""A step smaller than the allocation: its tasks inherit ``SLURM_NTASKS_PER_NODE=3`` from the
script (srun reads it as ``--ntasks-per-node``), while the step has 2 tasks on the node."""


def test_sbatch_script(slurm: dict[str, str], tmp_path: Path,
                       local_training: list[float]) -> None:
    (tmp_path / "probe").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(BATCH_SCRIPT.format(
        probe=" ".join(probe_command(tmp_path / "probe")),
        train=" ".join(train_args(tmp_path / "run")),
    ))
    output = tmp_path / "batch.out"
    job = run_job(["sbatch", "--parsable", f"--output={output}", str(script)],
                  clean_env(**slurm), tmp_path)
    assert job.returncode == 0, job.output
    state = _wait_for_job(slurm, job.output.strip().split(";")[0])
    log = output.read_text() if output.exists() else "(no batch output)"
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + log[-4000:]
    reports = read_reports(tmp_path / "probe", 2, job)
    for rank, report in enumerate(reports):
        assert report["launcher"] == "slurm"
        assert (report["local_rank"], report["local_world_size"]) == (rank, 2)
    check_collectives(reports)
    # the script itself is no rank: scaledl train started 2 workers of its own (torchrun)
    result = train_summary(tmp_path / "run", job)
    assert result["world_size"] == 2
    assert "launcher=torchrun rank=0 world_size=2" in log
    assert step_losses(tmp_path / "run") == pytest.approx(local_training, rel=1e-5, abs=1e-6)


def _wait_for_job(slurm: dict[str, str], job_id: str) -> str:
    """Poll until the job has ended (``sbatch --wait`` polls every few seconds); its record."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    env = {**os.environ, **slurm}
    while time.monotonic() < deadline:
        record = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                                capture_output=True, text=True, timeout=30).stdout
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)",
                     record):
            return record
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)
    raise AssertionError(f"batch job {job_id} did not end within {JOB_TIMEOUT_S} s")


def test_killed_task_ends_the_step(slurm: dict[str, str], tmp_path: Path) -> None:
    job = run_job(["srun", "--ntasks=3", *probe_command(tmp_path, "--kill-rank", "1")],
                  clean_env(**slurm), tmp_path)
    assert job.returncode != 0, job.output[-4000:]
    assert not list(tmp_path.glob("rank*.json")), "a rank went on after its peer died"
    assert "task 1: Killed" in job.output, job.output[-4000:]  # srun reports every task
    survivors = [line for line in job.output.splitlines() if "TransportError:" in line]
    assert not survivors or survivors_name(job.output, 1), job.output[-4000:]
    queue = subprocess.run(["squeue", "-h"], env={**os.environ, **slurm}, capture_output=True,
                           text=True, timeout=30)
    assert queue.stdout.strip() == "", f"jobs left: {queue.stdout}"
