"""Local launch: run a command's workers under torch's elastic agent, and say how they ended.

``scaledl <command> --ranks N`` started by hand re-runs itself as ``N`` workers under torch's
elastic agent (the machinery of ``torchrun --standalone``, run in this process), so the same
worker code runs under torchrun across hosts, ``mpirun`` or ``srun``: a process that a launcher
started (the rule of :func:`scaledl.bootstrap.detect_launcher`) is a worker and runs directly.
An ``sbatch`` script is not a worker although Slurm gives it ``SLURM_PROCID=0``: only a task of
an ``srun`` step is.

When a worker fails (it dies, raises, or its peers time out waiting for it), the agent stops the
others; with ``max_restarts`` it then starts every worker again, up to that many times (torch's
``--max-restarts``).  Every worker gets ``SCALEDL_LAUNCH_ID``, the same on every restart, by
which a restarted worker recognises the checkpoints of its own job.  The agent's logs go to a
temporary directory removed at the end (torch would otherwise leave ``/tmp/torchelastic_*``
behind), and a worker dies with its agent (``PR_SET_PDEATHSIG``), so no process outlives the
launch (:mod:`scaledl.launch.shared_agent`).  :mod:`scaledl.launch.agents` runs one agent per
worker instead, for jobs that drop a dead worker or go on with fewer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence

from scaledl.bootstrap import detect_launcher
from scaledl.launch.agents import launch_agents
from scaledl.launch.shared_agent import run_agent
from scaledl.launch.policy import FaultPolicy, JobOutcome, check_nproc

__all__ = ["under_launcher", "launch_local", "run_distributed", "worker_scratch"]

log = logging.getLogger(__name__)


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """True when a launcher started this process (it is one worker of a job).

    Raises ``ValueError`` for a half-written launcher environment (a rank without a world size).
    """
    return detect_launcher(environ) != "none"


def launch_local(
    nproc: int, module_argv: Sequence[str], env: Mapping[str, str] | None = None,
    policy: FaultPolicy | None = None,
) -> JobOutcome:
    """Run ``scaledl <module_argv>`` as ``nproc`` local workers and return how they ended.

    Workers get this environment with ``env`` added, and ``OMP_NUM_THREADS=1`` unless one of
    them sets it.  ``policy``
    says what a failure does; dropping dead workers or going on with fewer needs one agent per
    worker (:func:`scaledl.launch.agents.launch_agents`).
    """
    policy = policy or FaultPolicy()
    args = ["-m", "scaledl.cli.main", *module_argv]
    elastic = policy.min_workers is not None and policy.min_workers < nproc
    with worker_scratch(env) as worker_env:
        if elastic or policy.drop_dead_workers:
            return launch_agents(nproc, sys.executable, args, policy, worker_env)
        return run_agent(nproc, sys.executable, args, policy.max_restarts, worker_env)


@contextlib.contextmanager
def worker_scratch(env: Mapping[str, str] | None) -> Iterator[dict[str, str]]:
    """``env`` plus a ``TMPDIR`` of the workers' own, removed with all it holds when the block
    ends, however the workers ended.

    A worker killed by a signal cannot remove its temporary files, and torch makes some without
    being asked (torch 2.8 creates a directory when the first optimizer is built). torch's
    compile cache stays where it would have been (``TORCHINDUCTOR_CACHE_DIR``), so compiled
    kernels outlive the run as usual.
    """
    updates = dict(env or {})
    base = updates.get("TMPDIR") or tempfile.gettempdir()
    updates.setdefault("TORCHINDUCTOR_CACHE_DIR", os.environ.get(
        "TORCHINDUCTOR_CACHE_DIR", os.path.join(base, f"torchinductor_{_user()}")))
    with tempfile.TemporaryDirectory(prefix="scaledl-workers-", dir=base) as scratch:
        yield {**updates, "TMPDIR": scratch}


def _user() -> str:
    """The user name torch's compile cache is named after: ``getpass.getuser``, sanitised, or
    ``uid_N`` where no name can be read, as torch's
    ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` names it (importing that
    module would add about a second to every launch, so its rule is repeated here and a unit
    test holds the two equal)."""
    import getpass

    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = f"uid_{os.getuid()}"
    return re.sub(r"[\\/:*?\"<>|]", "_", name)


def run_distributed(
    nproc: int, module_argv: Sequence[str], worker: Callable[[], int],
    env: Mapping[str, str] | None = None, policy: FaultPolicy | None = None,
) -> int:
    """Run ``worker()`` here when under a launcher, else launch ``nproc`` local workers with
    ``env`` added to their environment; return the exit code (a failed launch logs the rank
    that failed first and why)."""
    check_nproc(nproc)
    if under_launcher():
        return worker()
    outcome = launch_local(nproc, module_argv, env, policy)
    if outcome.rank is not None:
        log.error("worker rank %d %s; the other workers were stopped", outcome.rank,
                  outcome.cause)
    return outcome.code
