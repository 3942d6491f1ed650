"""Where the seconds of a ``scaledl bench algorithms`` job go, run by run, from each run
directory's files.

A run that was its own ``scaledl train`` process (``--no-pool``) is cut by rank 0's timestamped
log lines (second resolution) into four phases:

1. *launch*: the run's process starts (``command.txt`` written) until ``scaledl train`` has
   checked its configuration and loaded the data once (its ``config:`` log line);
2. *ranks up*: until the ranks have joined the process group (``scaledl init``: torchrun
   starts every rank, each imports torch and scaledl and meets at the store);
3. *train*: until the last step's log line (training and evaluations);
4. *finish*: until ``summary.json`` is written (final evaluation, checkpoint, reports, exit).

A run in a pool of ranks (its ``command.txt`` says so) has no process of its own; its phases
come from the run's files, to the millisecond:

1. *start*: ``command.txt`` written until the run record of ``metrics.jsonl`` (the pool's
   start-up when the run is a pool's first, the ranks reading the job, and building the data,
   model and strategy);
2. *train*: until the last step record (training and evaluations);
3. *finish*: until ``summary.json`` is written (final evaluation, checkpoint, reports).

    python benchmarks/algorithms/phases.py runs/bench-algorithms
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

_STAMP = re.compile(r"^\[rank 0\] (\d\d:\d\d:\d\d) INFO (\S+): (.*)$")
POOLED = "# run in a pool"
"""How ``command.txt`` of a run in a pool begins."""


def _seconds(clock: str) -> int:
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return hours * 3600 + minutes * 60 + seconds


def _clock(path: Path) -> int:
    stamp = datetime.fromtimestamp(path.stat().st_mtime)
    return stamp.hour * 3600 + stamp.minute * 60 + stamp.second


def phases(run: Path) -> tuple[float, float, float, float] | None:
    """The four phases of one run of its own process in seconds, or ``None`` when it did not
    finish."""
    if not (run / "summary.json").is_file():
        return None
    config = init = last_step = None
    for line in (run / "stderr.txt").read_text(errors="replace").splitlines():
        match = _STAMP.match(line)
        if match is None:
            continue
        clock, logger, text = match.groups()
        if logger == "scaledl.cli.train" and text.startswith("config:") and config is None:
            config = _seconds(clock)
        elif logger == "scaledl.bootstrap" and "scaledl init" in text and init is None:
            init = _seconds(clock)
        elif logger == "scaledl.train.progress":
            last_step = _seconds(clock)
    if config is None or init is None or last_step is None:
        return None
    start, end = _clock(run / "command.txt"), _clock(run / "summary.json")
    return (config - start, init - config, last_step - init, end - last_step)


def pooled_phases(run: Path) -> tuple[float, float, float] | None:
    """The three phases of one run in a pool in seconds, or ``None`` when it did not finish."""
    summary, metrics = run / "summary.json", run / "metrics.jsonl"
    if not summary.is_file() or not metrics.is_file():
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    starts = [r["time"] for r in records if r.get("kind") == "run"]
    steps = [r["time"] for r in records if r.get("kind") == "step"]
    if not starts or not steps:
        return None
    begin = (run / "command.txt").stat().st_mtime
    end = summary.stat().st_mtime
    return (starts[0] - begin, steps[-1] - starts[0], end - steps[-1])


def _print(title: str, names: tuple[str, ...], found: list[tuple[float, ...]]) -> None:
    totals = [sum(phase[i] for phase in found) for i in range(len(names))]
    whole = sum(totals)
    print(f"{title}, {whole / 60:.1f} min in all")
    for i, name in enumerate(names):
        median = statistics.median(phase[i] for phase in found)
        print(f"  {name:9s} {totals[i] / 60:6.1f} min  {totals[i] / whole:5.1%}  "
              f"median {median:.1f} s per run")


def main() -> None:
    runs = sorted(p.parent for p in Path(sys.argv[1]).rglob("command.txt"))
    pooled = [run for run in runs if (run / "command.txt").read_text().startswith(POOLED)]
    alone = [run for run in runs if run not in pooled]
    own = [phase for run in alone if (phase := phases(run)) is not None]
    in_pool = [phase for run in pooled if (phase := pooled_phases(run)) is not None]
    if not own and not in_pool:
        raise SystemExit(f"no finished run under {sys.argv[1]}")
    if own:
        _print(f"{len(own)} finished runs of {len(alone)} as their own process",
               ("launch", "ranks up", "train", "finish"), list(own))
    if in_pool:
        _print(f"{len(in_pool)} finished runs of {len(pooled)} in pools of ranks",
               ("start", "train", "finish"), list(in_pool))


if __name__ == "__main__":
    main()
