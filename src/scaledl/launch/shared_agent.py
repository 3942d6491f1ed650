"""One torch elastic agent for all the local workers (the machinery of ``torchrun
--standalone``, run in this process): when a worker fails the agent stops the others and, with
``max_restarts``, starts every worker again.  The agent's logs go to a temporary directory removed
at the end (torch would otherwise leave ``/tmp/torchelastic_*`` behind).
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence

from scaledl.launchers import LAUNCH_ID_ENV
from scaledl.launch.policy import (
    INTERRUPTED, SHARED_STORE_ENV, SHUTDOWN_GRACE_S, JobOutcome, check_nproc,
    launch_environment, supported_options,
)

__all__ = ["run_agent"]


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

    check_nproc(nproc)
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
