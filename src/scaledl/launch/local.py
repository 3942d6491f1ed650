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
launch.  :mod:`scaledl.cli.agents` runs one agent per worker instead, for jobs that drop a dead
worker or go on with fewer.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scaledl.bootstrap import detect_launcher
from scaledl.processes import die_with_parent
from scaledl.train.restarts import LAUNCH_ID_ENV

__all__ = [
    "under_launcher", "launch_local", "run_distributed", "run_agent", "JobOutcome",
    "FaultPolicy", "die_with_launcher", "launch_environment",
    "LAUNCH_ID_ENV", "INTERRUPTED", "SHUTDOWN_GRACE_S", "supported_options",
]

log = logging.getLogger(__name__)

INTERRUPTED = 130
SHUTDOWN_GRACE_S = 5
"""Seconds a worker gets between SIGTERM and SIGKILL when the agent stops it on Ctrl-C or
SIGTERM (torch releases without the ``shutdown_timeout`` option give it their own default,
30 s).  When a worker fails, torch's agent stops the others with its own 30 s, which this
option does not reach: a worker that ignores SIGTERM then holds the launch 30 s."""
SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1: every attempt's rank 0 hosts a fresh store for the workers.  torch's agent would
otherwise hand every attempt the same store, where a restarted worker finds the process-group
addresses of the attempt before it and connects to dead peers."""


@dataclass(frozen=True)
class FaultPolicy:
    """What a launch does when a worker fails."""

    max_restarts: int = 0
    """Restart every worker (from the last checkpoint) after a failure, up to this many times."""
    min_workers: int | None = None
    """Go on with fewer workers, down to this many, when one does not come back (elastic)."""
    drop_dead_workers: bool = False
    """A dead worker is dropped and the others go on (asynchronous strategies)."""
    essential_ranks: tuple[int, ...] = (0,)
    """Ranks whose death a job that drops dead workers cannot survive (rank 0, servers)."""


@dataclass(frozen=True)
class JobOutcome:
    """How a launched job ended."""

    code: int
    """0 when it finished; else the exit code of the first worker that failed (``128 + N``
    when signal ``N`` ended it), or 130 when interrupted."""
    rank: int | None = None
    """The first worker that failed, when one did."""
    cause: str = ""
    """``died (SIGKILL)``, ``exited with code 1``, ... (empty when it finished)."""
    dropped: tuple[int, ...] = ()
    """Workers that died and were dropped while the others finished."""


def supported_options(target: Callable[..., object], **options: Any) -> dict[str, Any]:
    """The ``options`` that ``target`` (a class or function of torch's elastic API) accepts.

    torch's elastic agent gains keywords between releases (``shutdown_timeout`` is in 2.13 and
    not in 2.11), and scaledl declares torch >= 2.8: an option the installed release lacks is
    left to that release's default instead of failing every launch.
    """
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(options)
    return {name: value for name, value in options.items() if name in parameters}


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """True when a launcher started this process (it is one worker of a job).

    Raises ``ValueError`` for a half-written launcher environment (a rank without a world size).
    """
    return detect_launcher(environ) != "none"


def _check_nproc(nproc: int) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--ranks {nproc!r} must be a whole number of processes >= 1")


def die_with_launcher() -> None:
    """In a process of a local launch (a worker, or a per-worker agent): be killed when the
    process that started it dies (Linux), so that a killed launcher leaves nothing running."""
    if LAUNCH_ID_ENV in os.environ:
        die_with_parent()


@contextlib.contextmanager
def launch_environment(updates: Mapping[str, str]) -> Iterator[None]:
    """Set ``updates`` in ``os.environ`` (which the agent hands to the workers) for the block."""
    saved = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _failure(error: BaseException) -> JobOutcome:
    """The outcome of a ``ChildFailedError``: its first failure's rank and cause."""
    rank, failure = error.get_first_failure()  # type: ignore[attr-defined]
    if failure.exitcode < 0:
        name = failure.signal_name()
        return JobOutcome(128 - failure.exitcode, rank, f"died ({name})")
    return JobOutcome(failure.exitcode, rank, f"exited with code {failure.exitcode}")


def run_agent(nproc: int, entrypoint: str, args: Sequence[str], max_restarts: int = 0,
              env: Mapping[str, str] | None = None) -> JobOutcome:
    """Run ``entrypoint args`` as ``nproc`` local workers under one torch elastic agent (a
    standalone rendezvous on this machine) and return how the job ended.  The workers get this
    process's environment with ``env`` added."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _check_nproc(nproc)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    launch_id = uuid.uuid4().hex
    updates = {LAUNCH_ID_ENV: launch_id, SHARED_STORE_ENV: "1", **(env or {})}
    updates.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory(prefix="scaledl-launch-") as logs, \
            launch_environment(updates):
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=launch_id,
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
            monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=logs),
            **supported_options(LaunchConfig, shutdown_timeout=SHUTDOWN_GRACE_S))
        try:
            elastic_launch(config, entrypoint)(*args)
        except ChildFailedError as error:
            return _failure(error)
        except SignalException as error:
            return JobOutcome(128 + int(error.sigval), cause=f"stopped by {error.sigval.name}")
        except KeyboardInterrupt:
            return JobOutcome(INTERRUPTED, cause="interrupted")
    return JobOutcome(0)


def launch_local(
    nproc: int, module_argv: Sequence[str], env: Mapping[str, str] | None = None,
    policy: FaultPolicy | None = None,
) -> JobOutcome:
    """Run ``scaledl <module_argv>`` as ``nproc`` local workers and return how they ended.

    Workers get this environment with ``env`` added, and ``OMP_NUM_THREADS=1`` unless one of
    them sets it.  ``policy``
    says what a failure does; dropping dead workers or going on with fewer needs one agent per
    worker (:func:`scaledl.cli.agents.launch_agents`).
    """
    policy = policy or FaultPolicy()
    args = ["-m", "scaledl.cli.main", *module_argv]
    elastic = policy.min_workers is not None and policy.min_workers < nproc
    with worker_scratch(env) as worker_env:
        if elastic or policy.drop_dead_workers:
            from scaledl.cli.agents import launch_agents

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
    _check_nproc(nproc)
    if under_launcher():
        return worker()
    outcome = launch_local(nproc, module_argv, env, policy)
    if outcome.rank is not None:
        log.error("worker rank %d %s; the other workers were stopped", outcome.rank,
                  outcome.cause)
    return outcome.code
