"""One torch elastic agent per worker: local jobs that drop a dead worker or go on with fewer.

torch's agent stops *all* its workers when one fails. That is right for synchronous training
(:func:`scaledl.launch.shared_agent.run_agent`, one agent for every worker), but an asynchronous
job can do without a dead worker, and an elastic job wants to go on with the workers it still
has. torch's answer for both is its multi-node design: one agent per node, each with its own
workers, meeting in a c10d rendezvous whose rounds admit ``min..max`` nodes. Here every worker
gets an agent of its own (a *node* of one worker, :mod:`scaledl.launch.agent_main`), and this
process hosts the rendezvous store, so it outlives any agent:

- **elastic** (``min_workers``): the agents restart their workers (torch's ``max_restarts``)
  when one fails; an agent that is gone for good (a lost host: ``kind:lose``) stops sending
  heartbeats, and the next round completes without it once ``min_workers`` agents have joined
  and the last-call wait is over.  The workers resume from the last checkpoint at the new world
  size (:mod:`scaledl.train.resume`).
- **drop dead workers** (asynchronous strategies): the agents never restart a worker, so a dead
  worker's agent just exits and the others train on (the parameter server dropped the worker).
  If the job cannot go on without the dead rank (rank 0, which hosts the server thread, or a
  dedicated server), this launcher stops every agent and, while ``max_restarts`` allows,
  relaunches the whole job, which resumes from its last checkpoint.

Each agent writes a small report (which global ranks failed and how) into the launch's
temporary directory; a missing report means the agent itself was killed (a lost node).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scaledl.launch.policy import (
    INTERRUPTED, SHARED_STORE_ENV, FaultPolicy, JobOutcome, launch_environment,
)
from scaledl.faults import RELAUNCH_ENV
from scaledl.processes import signals_raise, stop_process_groups
from scaledl.launchers import LAUNCH_ID_ENV

__all__ = ["launch_agents"]

log = logging.getLogger(__name__)

_POLL_S = 0.1
STRAGGLER_GRACE_S = 30.0
"""Once rank 0 of an asynchronous job has finished, every worker has said it is done or was
dropped; an agent still running this much later holds a worker the server dropped (hung), and
is stopped."""


class _Stopped(Exception):
    """SIGTERM or SIGHUP reached the launcher: stop every agent."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name}")


def _agent_command(node: int, port: int, run_id: str, nproc: int, policy: FaultPolicy,
                   directory: Path, entrypoint: str, args: Sequence[str]) -> list[str]:
    spec = {
        "node": node, "port": port, "run_id": run_id, "max_nodes": nproc,
        "min_nodes": nproc if policy.drop_dead_workers else (policy.min_workers or nproc),
        "max_restarts": 0 if policy.drop_dead_workers else policy.max_restarts,
        "directory": str(directory), "entrypoint": entrypoint, "args": list(args),
    }
    return [sys.executable, "-m", "scaledl.launch.agent_main", json.dumps(spec)]


def _report(directory: Path, node: int) -> dict[str, Any] | None:
    path = directory / f"agent-{node}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _failures(directory: Path, procs: list[subprocess.Popen[bytes]]
              ) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """``{global rank: {"exitcode", "cause"}}`` of the failed workers reported so far, and the
    nodes whose agent died without a report (lost)."""
    failed: dict[int, dict[str, Any]] = {}
    lost = []
    for node, proc in enumerate(procs):
        report = _report(directory, node)
        if report is not None:
            failed.update({int(rank): failure for rank, failure in report["failures"].items()})
        elif proc.poll() is not None:
            lost.append(node)
    return failed, lost


def _rank0_done(directory: Path, procs: list[subprocess.Popen[bytes]]) -> bool:
    """Whether the agent of rank 0 reported that rank 0 finished."""
    reports = (_report(directory, node) for node in range(len(procs)))
    return any(report is not None and 0 in report.get("succeeded", []) for report in reports)


def _run_once(nproc: int, policy: FaultPolicy, directory: Path, entrypoint: str,
              args: Sequence[str], run_id: str) -> JobOutcome:
    """One launch of every agent; returns once they have all exited (or were stopped because
    an essential rank of an asynchronous job failed)."""
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]  # the stub omits it
        "127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    procs = [subprocess.Popen(_agent_command(node, store.port, run_id, nproc, policy,
                                             directory, entrypoint, args),
                              start_new_session=True) for node in range(nproc)]
    essential = set(policy.essential_ranks)
    finished_at: float | None = None
    try:
        with signals_raise(_Stopped):
            while any(proc.poll() is None for proc in procs):
                failed, _ = _failures(directory, procs)
                if policy.drop_dead_workers and essential & set(failed):
                    break  # the job cannot go on: stop the others below
                if policy.drop_dead_workers and finished_at is None and _rank0_done(directory,
                                                                                   procs):
                    finished_at = time.monotonic()
                if finished_at is not None and time.monotonic() - finished_at > \
                        STRAGGLER_GRACE_S:
                    log.warning("rank 0 finished %.0f s ago; stopping the workers still "
                                "running (dropped by the server)", STRAGGLER_GRACE_S)
                    break
                time.sleep(_POLL_S)
    except KeyboardInterrupt:
        return JobOutcome(INTERRUPTED, cause="interrupted")
    except _Stopped as stop:
        return JobOutcome(INTERRUPTED, cause=str(stop))
    finally:
        stop_process_groups(procs, grace_s=10.0)
        del store
    return _outcome(directory, procs, policy, essential)


def _outcome(directory: Path, procs: list[subprocess.Popen[bytes]], policy: FaultPolicy,
             essential: set[int]) -> JobOutcome:
    failed, lost = _failures(directory, procs)
    if lost:
        log.warning("the agent(s) of node(s) %s died with their worker (a lost host)", lost)
    if policy.drop_dead_workers and failed and not essential & set(failed):
        for rank in sorted(failed):
            log.warning("worker rank %d %s and was dropped; the others finished", rank,
                        failed[rank]["cause"])
        return JobOutcome(0, dropped=tuple(sorted(failed)))
    if not failed and len(lost) < len(procs):
        return JobOutcome(0)
    if not failed:
        return JobOutcome(1, cause="lost every node")
    rank = min(failed, key=lambda r: (r not in essential, failed[r]["time"], r))
    code = int(failed[rank]["exitcode"])
    return JobOutcome(code if code > 0 else 128 - code, rank, failed[rank]["cause"])


def launch_agents(nproc: int, entrypoint: str, args: Sequence[str], policy: FaultPolicy,
                  env: Mapping[str, str] | None = None) -> JobOutcome:
    """Run ``entrypoint args`` as ``nproc`` workers, each under an agent of its own, with
    ``policy`` (see the module docstring); return how the job ended."""
    launch_id = uuid.uuid4().hex
    relaunches = policy.max_restarts if policy.drop_dead_workers else 0
    updates = {LAUNCH_ID_ENV: launch_id, SHARED_STORE_ENV: "1", **(env or {})}
    updates.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    outcome = JobOutcome(1)
    with tempfile.TemporaryDirectory(prefix="scaledl-launch-") as tmp:
        for relaunch in range(relaunches + 1):
            directory = Path(tmp) / f"launch-{relaunch}"
            directory.mkdir()
            with launch_environment({**updates, RELAUNCH_ENV: str(relaunch)}):
                outcome = _run_once(nproc, policy, directory, entrypoint, args,
                                    f"{launch_id}-{relaunch}")
            if outcome.code in (0, INTERRUPTED) or relaunch == relaunches:
                return outcome
            log.warning("worker rank %s %s and the job cannot go on without it; relaunching "
                        "every worker from the last checkpoint (%d of %d)", outcome.rank,
                        outcome.cause, relaunch + 1, relaunches)
    return outcome
