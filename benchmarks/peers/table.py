"""The peers' table of docs/benchmarks.md from ``scaledl bench collectives --peers`` JSON files.

    python benchmarks/peers/table.py benchmarks/peers/raw/peers-*.json [--algorithm auto]

Groups the runs by world size and thread setting (``OMP_NUM_THREADS``, "unset" when it was),
and prints per group a markdown table: per size, the median over the runs of scaledl's median
time, each peer's, each peer's time over scaledl's (> 1: scaledl faster; the median of the
runs' ratios, each ratio taken inside one run), scaledl's busbw and its share of the memory
bound measured in the same run (``CopyBound``: twice the time of every rank copying the
message at once).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from scaledl.bench.report import format_bytes


def _group(path: Path) -> tuple[int, str, dict[str, Any]]:
    data = json.loads(path.read_text())
    env = data["environment"]
    return env["world_size"], env.get("omp_num_threads") or "unset", data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--algorithm", default="auto", help="scaledl's row (default auto)")
    args = parser.parse_args()
    runs: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for path in args.files:
        ranks, threads, data = _group(path)
        runs[(ranks, threads)].append(data)
    for (ranks, threads), datas in sorted(runs.items()):
        labels = {name: label for data in datas for name, label in data["peers"].items()}
        names = list(labels)
        rows: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        resolved: dict[int, set[str]] = defaultdict(set)
        for data in datas:
            for row in data["peer_rows"]:
                if row["algorithm"] != args.algorithm or row["collective"] != "allreduce":
                    continue
                cell = rows[row["nbytes"]]
                resolved[row["nbytes"]].add(row["resolved"] or row["algorithm"])
                cell["us"].append(row["median_us"])
                cell["busbw"].append(row["busbw_gbps"])
                if row["bound_fraction"] is not None:
                    cell["bound"].append(row["bound_fraction"])
                for name in names:
                    if name in row["vs"]:
                        cell[f"{name} us"].append(row["peer_us"][name])
                        cell[f"vs {name}"].append(row["vs"][name])
        print(f"\n{ranks} ranks, OMP_NUM_THREADS={threads}, {len(datas)} run(s); peers: "
              + "; ".join(f"{name} = {label}" for name, label in labels.items()))
        head = ["size", f"scaledl {args.algorithm}", *(f"{n}" for n in names),
                *(f"vs {n}" for n in names), "busbw GB/s", "of bound"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for nbytes, cell in sorted(rows.items()):
            ran = ",".join(sorted(resolved[nbytes]))
            values = [format_bytes(nbytes), f"{_us(cell['us'])} ({ran})",
                      *(_us(cell.get(f"{n} us", [])) for n in names),
                      *(_ratio(cell.get(f"vs {n}", [])) for n in names),
                      f"{statistics.median(cell['busbw']):.2f}",
                      f"{statistics.median(cell['bound']):.0%}" if cell["bound"] else "-"]
            print("| " + " | ".join(values) + " |")


def _us(values: list[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    return f"{median / 1000:.2f} ms" if median >= 1000 else f"{median:.1f} µs"


def _ratio(values: list[float]) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):.2f}x"
    return text if len(values) == 1 else f"{text} [{min(values):.2f}-{max(values):.2f}]"


if __name__ == "__main__":
    main()
