"""Where the seconds of a ``scaledl bench algorithms`` job go, run by run: from each run
directory's files and rank 0's timestamped log lines (second resolution), four phases:

1. *launch*: the run's process starts (``command.txt`` written) until ``scaledl train`` has
   checked its configuration and loaded the data once (its ``config:`` log line);
2. *ranks up*: until the ranks have joined the process group (``scaledl init``: torchrun
   starts every rank, each imports torch and scaledl and meets at the store);
3. *train*: until the last step's log line (training and evaluations);
4. *finish*: until ``summary.json`` is written (final evaluation, checkpoint, reports, exit).

    python benchmarks/algorithms/phases.py runs/bench-algorithms
"""

from __future__ import annotations

import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

_STAMP = re.compile(r"^\[rank 0\] (\d\d:\d\d:\d\d) INFO (\S+): (.*)$")


def _seconds(clock: str) -> int:
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return hours * 3600 + minutes * 60 + seconds


def _clock(path: Path) -> int:
    stamp = datetime.fromtimestamp(path.stat().st_mtime)
    return stamp.hour * 3600 + stamp.minute * 60 + stamp.second


def phases(run: Path) -> tuple[float, float, float, float] | None:
    """The four phases of one run in seconds, or ``None`` when it did not finish."""
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


def main() -> None:
    runs = sorted(p.parent for p in Path(sys.argv[1]).rglob("command.txt"))
    found = [(run, phase) for run in runs if (phase := phases(run)) is not None]
    if not found:
        raise SystemExit(f"no finished run under {sys.argv[1]}")
    names = ("launch", "ranks up", "train", "finish")
    totals = [sum(phase[i] for _, phase in found) for i in range(4)]
    whole = sum(totals)
    print(f"{len(found)} finished runs of {len(runs)}, {whole / 60:.1f} min in all")
    for i, name in enumerate(names):
        median = statistics.median(phase[i] for _, phase in found)
        print(f"  {name:9s} {totals[i] / 60:6.1f} min  {totals[i] / whole:5.1%}  "
              f"median {median:.0f} s per run")


if __name__ == "__main__":
    main()
