"""Side-by-side ratios for `auto` on Gloo once native reduce_scatter stages are priced as the
whole allreduce Gloo runs (docs/benchmarks.md, "auto across emulated hosts").

    python benchmarks/cluster/auto-native-stages/summarize.py

Per run (files auto-omp{1,default}-run{1,2,3}.json, `scaledl bench collectives --json` on a 2x2
emulated cluster at 1 Gbit/s), per point: the earlier auto choice over the new one, and torch's
own collective over the new auto; prints the median of the runs and their range.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
OLD = {"reduce_scatter": "hierarchical[shm,native]", "allreduce": "torus[shm,native]"}
"""What auto chose before the change (its predictions, replayed with the old stage price)."""
POINTS = [("reduce_scatter", 4 << 10 << 2 * k) for k in range(5)] + [("allreduce", 4 << 10)]


Run = dict[tuple[str, int, str], dict[str, object]]


def _us(run: Run, collective: str, nbytes: int, name: str) -> float:
    return float(str(run[(collective, nbytes, name)]["median_us"]))


def main() -> None:
    print("| threads | collective | bytes | new auto ran | earlier choice / new auto | "
          "torch / new auto |")
    print("|---|---|---:|---|---:|---:|")
    for omp in ("1", "default"):
        runs: list[Run] = []
        for path in sorted(HERE.glob(f"auto-omp{omp}-run*.json")):
            data = json.loads(path.read_text())
            runs.append({(r["collective"], r["nbytes"], r["algorithm"]): r
                         for r in data["results"]})
        for collective, nbytes in POINTS:
            old = [_us(r, collective, nbytes, OLD[collective]) / _us(r, collective, nbytes, "auto")
                   for r in runs]
            torch = [_us(r, collective, nbytes, "native") / _us(r, collective, nbytes, "auto")
                     for r in runs]
            ran = {str(r[(collective, nbytes, "auto")].get("resolved")) for r in runs}
            print(f"| {omp} | {collective} | {nbytes} | {', '.join(sorted(ran))} | "
                  f"{statistics.median(old):.2f}x ({min(old):.2f}-{max(old):.2f}) | "
                  f"{statistics.median(torch):.2f}x ({min(torch):.2f}-{max(torch):.2f}) |")


if __name__ == "__main__":
    main()
