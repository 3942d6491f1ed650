"""Where a run starts: a checkpoint of its own job (a restart), the one ``--resume`` names, or
nothing (a fresh run, which then owns its directory).

Every rank decides alone, from the run directory (which must be shared between hosts): the
processes of a failed attempt have all stopped before a restarted one starts, so every rank
sees the same files and makes the same choice.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaledl.train.checkpoint import (
    LATEST_NAME, checkpoint_file, list_checkpoints, load_checkpoint, load_latest,
)
from scaledl.train.config import TrainConfig
from scaledl.train.finish import REPORTS_DIR
from scaledl.train.metrics import METRICS_NAME, SUMMARY_NAME
from scaledl.train.model_file import MODEL_NAME
from scaledl.train.plots import PLOTS
from scaledl.train.sample_log import SAMPLES_DIR
from scaledl.train.timeline import TIMELINE_NAME

__all__ = ["Resume", "find_resume", "clear_old_run", "check_resumable", "tidy_run_dir",
           "JOB_KEY"]

log = logging.getLogger(__name__)

JOB_KEY = "launch_id"
"""Checkpoint key holding the identity of the job that wrote it
(:func:`scaledl.train.restarts.job_id`)."""


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run starts from."""

    path: Path | None
    """Its file (None: a fresh run)."""
    state: dict[str, Any] | None
    """Its loaded state (None: a fresh run)."""
    restarted: bool = False
    """Whether it was written by this very job: the run is a restart."""


def find_resume(config: TrainConfig, out: Path, job: str | None) -> Resume:
    """A restart's newest good checkpoint; else ``--resume`` (a path, or ``auto``: the newest
    good one in ``out``, skipping corrupt ones); else nothing."""
    resume = config.run.resume
    latest = load_latest(out) if job is not None or resume == "auto" else None
    if latest is not None and job is not None and latest[1].get(JOB_KEY) == job:
        log.info("restarted: resuming from %s, this job's newest good checkpoint",
                 latest[0].name)
        return Resume(latest[0], latest[1], restarted=True)
    if not resume:
        return Resume(None, None)
    if resume == "auto":
        return Resume(None, None) if latest is None else Resume(*latest)
    path = checkpoint_file(resume)  # a file, a run directory or its 'latest' pointer
    return Resume(path, load_checkpoint(path))


def clear_old_run(out: Path) -> None:
    """A fresh run owns its directory: an older run's checkpoints would outrank its own, its
    metrics would mix with the new ones, and its summary, timeline, plots and sample log would
    stand beside them as if this run's (a run that fails before it ends writes none of its
    own)."""
    old = list_checkpoints(out)
    for _, path in old:
        path.unlink(missing_ok=True)
    outputs = [LATEST_NAME, METRICS_NAME, SUMMARY_NAME, TIMELINE_NAME, MODEL_NAME,
               *(f"{stem}.png" for stem, _, _ in PLOTS)]
    for name in outputs:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / SAMPLES_DIR, ignore_errors=True)
    if old:
        log.info("fresh run: removed %d checkpoints of an earlier run from %s (use --resume "
                 "auto to continue a run instead)", len(old), out)


def tidy_run_dir(out: Path) -> list[str]:
    """Remove what killed processes may leave in a run directory: temporary files of checkpoint
    and metrics writes (``.tmp-*``, ``.metrics.jsonl.tmp``) and the asynchronous ranks' report
    directory.  The launcher calls it when a job has ended, however it ended; returns the names
    removed."""
    if not out.is_dir():
        return []
    removed = []
    for entry in out.iterdir():
        if entry.name.startswith(".tmp-") or entry.name == f".{METRICS_NAME}.tmp":
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
        elif entry.name == REPORTS_DIR and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def check_resumable(config: TrainConfig, state: dict[str, Any], path: Path | None,
                    world_size: int) -> None:
    """``ValueError`` when the checkpoint was trained with another model, data set or strategy;
    a log line when its world size differs (the data order goes on from the same point)."""
    check_same_training(config, state, path)
    if state.get("world_size") != world_size:
        log.warning("resuming %s written by %s workers with %d workers: the rest of the "
                    "epoch is shared exactly among the new workers", path,
                    state.get("world_size"), world_size)


def check_same_training(config: TrainConfig, state: dict[str, Any], path: Path | None) -> None:
    """``ValueError`` when the checkpoint ``state`` (read from ``path``) was trained with
    another model, data set or strategy than ``config``'s: the launcher checks it before any
    worker starts, each worker again on what it loads."""
    saved = state.get("config", {})
    for section, key in (("model", "name"), ("data", "dataset"), ("parallel", "strategy")):
        theirs = saved.get(section, {}).get(key)
        ours = getattr(getattr(config, section), key)
        if theirs is not None and theirs != ours:
            raise ValueError(f"checkpoint {path} was trained with {section}.{key}="
                             f"{theirs!r}, not {ours!r}; resume with the same {key}")
