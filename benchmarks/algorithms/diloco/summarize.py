"""The sweep's runs as one markdown table: per configuration, epochs to target (mean ± sd over
the seeds that reached it, and how many did), and the test accuracy at steps 20, 40 and 60
(each seed), read from ``sweep-<split>.json`` files written by ``sweep.py``.

    python benchmarks/algorithms/diloco/summarize.py benchmarks/algorithms/diloco/sweep-test.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

STEPS_PER_EPOCH = 45
"""Steps per worker and epoch of the job on the test split (1,437 digits / 4 workers / 8)."""


def main() -> None:
    runs: dict[str, list[dict[str, object]]] = defaultdict(list)
    for path in sys.argv[1:]:
        for line in json.loads(Path(path).read_text()):
            runs[str(line["name"])].append(line)
    print("| configuration | reached | epochs to target | accuracy at steps 20 / 40 / 60 |")
    print("|---|---|---|---|")
    for name, lines in runs.items():
        epochs = [float(e) for line in lines
                  if (e := line["epochs_to_target"]) is not None]  # type: ignore[arg-type]
        mean = f"{statistics.fmean(epochs):.2f}" if epochs else "-"
        if len(epochs) > 1:
            mean += f" ± {statistics.stdev(epochs):.2f}"
        at = []
        for line in sorted(lines, key=lambda item: int(item["seed"])):  # type: ignore[arg-type]
            curve = {round(float(e) * STEPS_PER_EPOCH): a
                     for e, a in line["curve"]}  # type: ignore[union-attr]
            at.append(" / ".join(f"{curve[s]:.3f}" if s in curve else "-"
                                 for s in (20, 40, 60)))
        print(f"| {name} | {len(epochs)}/{len(lines)} | {mean} | {'; '.join(at)} |")


if __name__ == "__main__":
    main()
