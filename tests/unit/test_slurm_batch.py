"""SLURM: a task of an ``srun`` step is a rank; the ``sbatch`` script itself is not.

Slurm exports ``SLURM_PROCID=0``, ``SLURM_NTASKS`` and friends to the batch script too; only a
step id below Slurm's special ids (``SLURM_STEP_ID``, set by srun) marks a launched rank.
"""

from __future__ import annotations

import pytest

from scaledl.bootstrap import LaunchEnv, detect_launcher, in_srun_step, read_launch_env
from scaledl.launch.local import under_launcher

BATCH = {
    "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node[01]",
}
"""The batch script of ``sbatch -n2``: rank variables, but no step id."""
SRUN = {**BATCH, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0"}
"""Task 1 of ``srun -n2`` inside that job."""


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, False),                                              # batch step, Slurm <= 25.11
    ({"SLURM_STEP_ID": "-5", "SLURM_STEPID": "-5"}, False),   # batch step, Slurm 26.05 (%d)
    ({"SLURM_STEP_ID": "-6"}, False),                         # interactive step
    ({"SLURM_STEP_ID": str(0xFFFFFFFB)}, False),              # SLURM_BATCH_SCRIPT as unsigned
    ({"SLURM_STEP_ID": str(0xFFFFFFF0)}, False),              # SLURM_MAX_NORMAL_STEP_ID
    ({"SLURM_STEP_ID": " "}, False),
    ({"SLURM_STEP_ID": "0"}, True),
    ({"SLURM_STEP_ID": "17"}, True),
    ({"SLURM_STEPID": "3"}, True),                            # the older name alone
])
def test_in_srun_step(extra: dict[str, str], expected: bool) -> None:
    assert in_srun_step({**BATCH, **extra}) is expected


def test_batch_script_is_not_a_rank() -> None:
    assert detect_launcher(BATCH) == "none"
    assert not under_launcher(BATCH)
    assert read_launch_env(BATCH) == LaunchEnv(0, 1, 0, 1, None, 29500, "none", 0)


def test_batch_script_of_26_05_is_not_a_rank() -> None:
    environ = {**BATCH, "SLURM_STEP_ID": "-5", "SLURM_STEPID": "-5"}
    assert not under_launcher(environ) and read_launch_env(environ).launcher == "none"


def test_srun_task_is_a_rank() -> None:
    assert detect_launcher(SRUN) == "slurm"
    assert under_launcher(SRUN)
    # no MASTER_PORT: a port of this job and step (20000 + (4242 * 131 + 0) % 10000)
    assert read_launch_env(SRUN) == LaunchEnv(1, 2, 1, 2, "node01", 25702, "slurm", 0)


def test_torchrun_inside_a_batch_script_wins() -> None:
    environ = {**BATCH, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    assert read_launch_env(environ).launcher == "torchrun" and under_launcher(environ)


@pytest.mark.parametrize(("extra", "pattern"), [
    ({"SLURM_TASKS_PER_NODE": "0"}, "SLURM_TASKS_PER_NODE='0'"),
    ({"SLURM_TASKS_PER_NODE": "2,0"}, "SLURM_TASKS_PER_NODE='2,0'"),
    ({"SLURM_TASKS_PER_NODE": "2(x0)"}, "SLURM_TASKS_PER_NODE='2\\(x0\\)'"),
    ({"SLURM_NTASKS_PER_NODE": "0"}, "SLURM_NTASKS_PER_NODE='0'"),
])
def test_zero_tasks_per_node_is_a_one_line_value_error(
    extra: dict[str, str], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern) as caught:
        read_launch_env({**SRUN, **extra})
    assert "\n" not in str(caught.value)


def test_srun_steps_of_one_job_get_their_own_port_unless_master_port_is_set() -> None:
    first = read_launch_env(SRUN).master_port
    second = read_launch_env({**SRUN, "SLURM_STEP_ID": "1"}).master_port
    assert first != second and 20000 <= min(first, second) and max(first, second) < 30000
    assert read_launch_env({**SRUN, "MASTER_PORT": "31337"}).master_port == 31337
