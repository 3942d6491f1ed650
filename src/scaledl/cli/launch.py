"""Local launch: run a command's workers through torch's elastic launcher.

``scaledl <command> --ranks N`` started by hand re-runs itself as ``N`` workers under
``python -m torch.distributed.run --standalone`` (torchrun), so the same worker code runs under
torchrun across hosts, ``mpirun`` or ``srun``: a process that a launcher started (the rule of
:func:`scaledl.bootstrap.detect_launcher`) is a worker and runs directly.  An ``sbatch`` script
is not a worker although Slurm gives it ``SLURM_PROCID=0``: only a task of an ``srun`` step is.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from scaledl.bootstrap import detect_launcher
from scaledl.processes import stop_process_groups

__all__ = ["under_launcher", "launch_local", "run_distributed", "LAUNCHER_VARIABLES"]

log = logging.getLogger(__name__)

LAUNCHER_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
"""The launchers' rank variables (torchrun, mpirun, hydra, srun); a process without any of them
was not started by a launcher."""
TIMED_OUT = 124
INTERRUPTED = 130


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """True when a launcher started this process (it is one worker of a job).

    Raises ``ValueError`` for a half-written launcher environment (a rank without a world size).
    """
    return detect_launcher(environ) != "none"


def _check_nproc(nproc: int) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--ranks {nproc!r} must be a whole number of processes >= 1")


def launch_local(
    nproc: int, module_argv: Sequence[str], env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> int:
    """Run ``scaledl <module_argv>`` as ``nproc`` local workers under torchrun; return its code.

    Workers get ``OMP_NUM_THREADS=1`` unless ``env`` (default: this environment) sets it.  After
    ``timeout`` seconds the launcher and workers are stopped and 124 is returned.
    """
    _check_nproc(nproc)
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "scaledl.cli.main", *module_argv,
    ]
    log.debug("launching %s", shlex.join(command))
    proc = subprocess.Popen(command, env=child_env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.error("the %d workers did not finish within %.0f s; stopping them", nproc, timeout)
        stop_process_groups([proc])
        return TIMED_OUT
    except KeyboardInterrupt:
        stop_process_groups([proc])
        return INTERRUPTED


def run_distributed(
    nproc: int, module_argv: Sequence[str], worker: Callable[[], int],
    env: Mapping[str, str] | None = None, timeout: float | None = None,
) -> int:
    """Run ``worker()`` here when under a launcher, else launch ``nproc`` local workers."""
    _check_nproc(nproc)
    if under_launcher(env):
        return worker()
    return launch_local(nproc, module_argv, env, timeout)
