"""Restarts: how a restarted worker finds its job's checkpoints, and what the restart cost.

A job has an identity that survives restarts (:func:`job_id`): ``SCALEDL_LAUNCH_ID``, which
``scaledl train``'s launcher gives every worker, else torchrun's run id (``--rdzv-id``, or the
random one of ``--standalone``; torchrun's placeholder ``none`` is no identity).  Every
checkpoint and the ``run`` record of ``metrics.jsonl`` carry it.  A worker that starts and finds
a checkpoint of its own job in the run directory is a restarted worker: it resumes from the
newest good one, whatever ``--resume`` says (a fresh job never resumes by accident, since its
identity is new).

Rank 0 then records the restart in ``metrics.jsonl`` before it drops the records of the steps
that will be redone:

- ``steps_redone``: steps the failed attempt had finished after the checkpoint (its last step
  record minus the step resumed from);
- ``time_lost_s``: from the end of the step resumed from (its record's time) to now, when the
  restarted attempt is ready to train: what the failure added to the run's wall time (the
  work thrown away, detecting the failure, restarting and resuming).

The summary adds up every ``restart`` record of the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scaledl.launchers import LAUNCH_ID_ENV
from scaledl.train.metrics import read_metrics

__all__ = ["job_id", "restart_record", "restart_totals", "RESTART_KIND"]

RESTART_KIND = "restart"
"""``kind`` of a restart record in ``metrics.jsonl``."""


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """This job's identity across restarts, or None when the launcher gives none."""
    env = os.environ if environ is None else environ
    for name in (LAUNCH_ID_ENV, "TORCHELASTIC_RUN_ID"):
        value = env.get(name, "").strip()
        if value and value != "none":
            return value
    return None


def _same_job(records: list[dict[str, Any]], job: str) -> bool:
    runs = [record for record in records if record.get("kind") == "run"]
    return bool(runs) and runs[-1].get("launch_id") == job


def restart_record(metrics: Path, job: str | None, resumed_step: int, world_size: int,
                   previous_world_size: int | None) -> dict[str, Any] | None:
    """The ``restart`` record of an attempt that starts at ``resumed_step`` (0: from scratch),
    from the metrics the failed attempts of job ``job`` left; None when this is no restart."""
    if job is None or not metrics.is_file():
        return None
    try:
        records = read_metrics(metrics)
    except ValueError:
        return None
    if not _same_job(records, job):
        return None
    steps = [r for r in records if r.get("kind") == "step" and isinstance(r.get("step"), int)]
    last = max((r["step"] for r in steps), default=0)
    ended = [r["time"] for r in steps if r["step"] == resumed_step]
    if not ended:  # resumed from scratch (or the step's record was lost): the run's start
        ended = [r["time"] for r in records if r.get("kind") == "run"][-1:]
    now = time.time()
    return {
        "kind": RESTART_KIND, "time": now, "resumed_step": resumed_step,
        "failed_after_step": last, "steps_redone": max(0, last - resumed_step),
        "time_lost_s": max(0.0, now - float(ended[0])) if ended else None,
        "world_size": world_size, "previous_world_size": previous_world_size or world_size,
    }


def restart_totals(metrics: Path) -> dict[str, Any]:
    """``restarts``, ``steps_redone``, ``time_lost_s`` and ``world_sizes`` (the world size
    before the first restart, then after each) of every restart recorded in ``metrics``."""
    records = read_metrics(metrics, kind=RESTART_KIND) if metrics.is_file() else []
    sizes = [int(r["previous_world_size"]) for r in records[:1]]
    return {
        "restarts": len(records),
        "steps_redone": sum(int(r.get("steps_redone") or 0) for r in records),
        "time_lost_s": sum(float(r.get("time_lost_s") or 0.0) for r in records),
        "world_sizes": sizes + [int(r["world_size"]) for r in records],
    }
