"""The sample log (``scaledl train --log-samples``): which samples every step trained on.

Every rank appends one line per step to ``<run>/samples/rank-NNNNN.jsonl``: the step, epoch,
world size and the dataset indices of its batch, with the *attempt* (the time the attempt
started) and the step it resumed from.  Steps redone after a restart appear once per attempt
that ran them; :func:`effective_samples` keeps, for every step, the records of the last attempt
that ran it, which is the history the final model went through.  It lets anyone check the data
coverage of a run that lost workers: every sample of every epoch read exactly once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import torch

__all__ = ["SampleLog", "effective_samples", "SAMPLES_DIR"]

SAMPLES_DIR = "samples"


class SampleLog:
    """This rank's sample log for one attempt."""

    def __init__(self, out: Path, rank: int, world_size: int, attempt: float,
                 resumed_step: int | None, job: str | None) -> None:
        """``resumed_step``: the step resumed from, None for a run from scratch (which starts
        this rank's file over); ``job``: the job's identity, kept in every record."""
        directory = out / SAMPLES_DIR
        directory.mkdir(parents=True, exist_ok=True)
        mode = "w" if resumed_step is None else "a"
        self._file: IO[str] = (directory / f"rank-{rank:05d}.jsonl").open(mode, encoding="utf-8")
        self._fixed = {"rank": rank, "world_size": world_size, "attempt": attempt,
                       "resumed_step": resumed_step or 0, "job": job}

    def record(self, step: int, epoch: int, indices: torch.Tensor) -> None:
        """Step ``step`` (1-based) of ``epoch`` trained on ``indices``."""
        line = {**self._fixed, "step": step, "epoch": epoch, "indices": indices.tolist()}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def effective_samples(out: Path) -> dict[int, list[int]]:
    """Per epoch, the indices trained on by the steps the final model went through (every
    step's records from the last attempt that ran it, all ranks together; records of another
    job than the newest attempt's are left out)."""
    records = []
    for path in sorted((out / SAMPLES_DIR).glob("rank-*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        records += [json.loads(line) for line in lines if line.strip()]
    if not records:
        return {}
    job = max(records, key=lambda record: float(record["attempt"]))["job"]
    by_step: dict[int, dict[float, list[dict[str, Any]]]] = defaultdict(dict)
    for record in records:
        if record["job"] == job:
            attempts = by_step[int(record["step"])]
            attempts.setdefault(float(record["attempt"]), []).append(record)
    epochs: dict[int, list[int]] = defaultdict(list)
    for step in sorted(by_step):
        attempts = by_step[step]
        for record in attempts[max(attempts)]:
            epochs[int(record["epoch"])] += [int(i) for i in record["indices"]]
    return dict(epochs)
