"""The sweep's runs as one markdown table: per configuration, epochs to target (mean ± sd over
the seeds that reached it, and how many did), that mean over the first configuration's (the
synchronous baseline, "x sync"), and the accuracy at steps 20, 40 and 60 (each seed), read from
``sweep-<split>.json`` files written by ``sweep.py`` (the split from the file's name).

    python benchmarks/algorithms/diloco/summarize.py benchmarks/algorithms/diloco/sweep-test.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

STEPS_PER_EPOCH = {"test": 45, "validation": 36}
"""Steps per worker and epoch of the job: the full train split (1,437 digits / 4 workers / 8),
or the 80 % that the validation split leaves (1,149 / 4 / 8)."""


def main() -> None:
    runs: dict[str, list[dict[str, object]]] = defaultdict(list)
    per_epoch = STEPS_PER_EPOCH["test"]
    for path in sys.argv[1:]:
        per_epoch = STEPS_PER_EPOCH["validation" if "validation" in Path(path).name else "test"]
        for line in json.loads(Path(path).read_text()):
            runs[str(line["name"])].append(line)
    print("| configuration | reached | epochs to target | x sync "
          "| accuracy at steps 20 / 40 / 60 |")
    print("|---|---|---|---|---|")
    baseline: float | None = None
    for name, lines in runs.items():
        epochs = [float(e) for line in lines
                  if (e := line["epochs_to_target"]) is not None]  # type: ignore[arg-type]
        mean = f"{statistics.fmean(epochs):.2f}" if epochs else "-"
        if len(epochs) > 1:
            mean += f" ± {statistics.stdev(epochs):.2f}"
        ratio = "-"
        if epochs:
            baseline = baseline or statistics.fmean(epochs)
            ratio = f"{statistics.fmean(epochs) / baseline:.2f}"
        at = []
        for line in sorted(lines, key=lambda item: int(item["seed"])):  # type: ignore[arg-type]
            curve = {round(float(e) * per_epoch): a
                     for e, a in line["curve"]}  # type: ignore[union-attr]
            at.append(" / ".join(f"{curve[s]:.3f}" if s in curve else "-"
                                 for s in (20, 40, 60)))
        print(f"| {name} | {len(epochs)}/{len(lines)} | {mean} | {ratio} | {'; '.join(at)} |")


if __name__ == "__main__":
    main()
