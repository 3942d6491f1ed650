"""Side-by-side table of an A/B run of ``benchmarks/paths/ab_commits.sh``.

    python benchmarks/paths/ab_table.py OUT_DIR [ALGORITHM]

For every thread setting and message size: the median over rounds of each side's median time
per call (microseconds, the slowest rank), old/new (> 1: the new commit is faster), and the
same ratio for torch's own allreduce, which both sides run too: on a shared machine it shows
how much the load moved between the two sides' runs.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def _medians(out: Path) -> dict[tuple[str, str, str, int], float]:
    runs: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    for path in sorted(out.glob("ab-*-*-*.json")):
        _, side, threads, _ = path.stem.split("-")
        for row in json.loads(path.read_text())["results"]:
            runs[(side, threads, row["algorithm"], row["nbytes"])].append(row["median_us"])
    return {key: statistics.median(values) for key, values in runs.items()}


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main() -> None:
    out = Path(sys.argv[1])
    algorithm = sys.argv[2] if len(sys.argv) > 2 else "shm"
    medians = _medians(out)
    sizes = sorted({key[3] for key in medians})
    print(f"| threads | size | old {algorithm} us | new {algorithm} us | old/new | "
          "torch old/new |")
    print("|---|---|---|---|---|---|")
    for threads in ("1", "default"):
        for nbytes in sizes:
            old = medians.get(("old", threads, algorithm, nbytes))
            new = medians.get(("new", threads, algorithm, nbytes))
            torch_old = medians.get(("old", threads, "torch", nbytes))
            torch_new = medians.get(("new", threads, "torch", nbytes))
            if old is None or new is None:
                continue
            control = f"{torch_old / torch_new:.2f}" if torch_old and torch_new else "-"
            print(f"| {threads} | {_size(nbytes)} | {old:.1f} | {new:.1f} | {old / new:.2f} | "
                  f"{control} |")


if __name__ == "__main__":
    main()
