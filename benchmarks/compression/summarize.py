"""The tables of docs/benchmarks.md's Compression section, from this folder's JSON files.

``python benchmarks/compression/summarize.py [TAG]`` prints markdown: the allreduce step per
thread setting (median over the runs of each run's median, min-max of the runs' medians, the
speed-up over uncompressed computed within each run, then its median), and the README job's
accuracy per thread setting.  ``summarize.py compact TAG...`` prints one table of the median
speed-ups of several sets of runs side by side, with the load averages of each set.
``summarize.py placement TAG...`` compares PowerSGD's host and flat placements measured in the
same runs: per set, thread setting and rank, the step and arithmetic-alone times of each
(medians over the runs) and the ratio host / flat taken within each run, then its median and
range.  In the sets ``hosts`` and ``hosts2`` the host placement is named ``powersgd:R`` (the
benchmark's names before ``powersgd:R:hosts``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def steps(tag: str) -> str:
    lines = []
    for threads in (1, 2):
        runs = [json.loads(path.read_text()) for path in
                sorted(HERE.glob(f"step-2h2r-1gbit-{tag}-threads{threads}-run*.json"))]
        if not runs:
            continue
        lines += [f"**{threads} torch thread{'s' if threads > 1 else ''} per rank**, "
                  f"{len(runs)} runs:", "",
                  "| compression | step, s: median of runs (min-max) | speed-up over fp32 "
                  "(min-max of runs) | arithmetic alone, s | MB into the collectives per rank "
                  "| error vs exact average |",
                  "|---|---:|---:|---:|---:|---:|"]
        for method in runs[0]["methods"]:
            medians = [r["methods"][method]["median_s"] for r in runs]
            ratios = [r["methods"][method]["speedup_vs_first"] for r in runs]
            computes = [r["methods"][method]["compute_only_median_s"] for r in runs]
            first = runs[0]["methods"][method]
            name = "fp32 (none)" if method == "none" else method
            lines.append(
                f"| {name} | {statistics.median(medians):.3f} ({min(medians):.3f}-"
                f"{max(medians):.3f}) | **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-"
                f"{max(ratios):.2f}) | {statistics.median(computes):.3f} | "
                f"{first['bytes_sent_per_rank_input'] / 1e6:.1f} | "
                f"{first['relative_error']:.2g} |")
        lines.append("")
    return "\n".join(lines)


def accuracy() -> str:
    lines = []
    for path in sorted(HERE.glob("accuracy-2ranks-threads*.json")):
        report = json.loads(path.read_text())
        methods = report["methods"]
        base = methods["scaledl:none"]["accuracy_mean"]
        lines += [f"`{path.name}` ({report['seeds']} seeds, {report['threads']} torch "
                  f"thread(s) per rank):", "",
                  "| method | test accuracy, mean % | per seed | vs fp32 (points) |",
                  "|---|---:|---|---:|"]
        for method, values in methods.items():
            seeds = ", ".join(f"{a:.2f}" for a in values["accuracy_per_seed"])
            lines.append(f"| {method} | {values['accuracy_mean']:.2f} | {seeds} | "
                         f"{values['accuracy_mean'] - base:+.2f} |")
        for rank in (1, 4):
            for ours in (f"scaledl:powersgd:{rank}", f"scaledl:powersgd:{rank}:start2"):
                theirs = methods.get(f"torch:powersgd:{rank}")
                if ours in methods and theirs:
                    gap = methods[ours]["accuracy_mean"] - theirs["accuracy_mean"]
                    lines.append(f"\n{ours} minus torch's powerSGD_hook at rank {rank}: "
                                 f"{gap:+.2f} points")
        lines.append("")
    return "\n".join(lines)


def _load_range(tag: str) -> str:
    values = [float(line.split(": ")[1].split()[0])
              for line in (HERE / "load.txt").read_text().splitlines() if f"-{tag}-" in line]
    return f"{min(values):.0f}-{max(values):.0f}" if values else "?"


def compact(tags: list[str]) -> str:
    columns, table = [], {}
    for tag in tags:
        for threads in (1, 2):
            runs = [json.loads(path.read_text()) for path in
                    sorted(HERE.glob(f"step-2h2r-1gbit-{tag}-threads{threads}-run*.json"))]
            if not runs:
                continue
            columns.append(f"{tag}, {threads} thr., {len(runs)} runs, load {_load_range(tag)}")
            for method in runs[0]["methods"]:
                ratio = statistics.median(r["methods"][method]["speedup_vs_first"] for r in runs)
                step = statistics.median(r["methods"][method]["median_s"] for r in runs)
                table.setdefault(method, []).append(f"{ratio:.2f}x ({step:.2f} s)")
    lines = ["| compression | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += [f"| {'fp32 (none)' if m == 'none' else m} | " + " | ".join(cells) + " |"
              for m, cells in table.items()]
    return "\n".join(lines)


def placement(tags: list[str]) -> str:
    lines = ["| set, threads, runs, load | rank | step host / flat, s | ratio host / flat "
             "(min-max) | arithmetic alone host / flat, s | speed-up over fp32 host / flat |",
             "|---|---:|---:|---:|---:|---:|"]
    for tag in tags:
        for threads in (1, 2):
            runs = [json.loads(path.read_text()) for path in
                    sorted(HERE.glob(f"step-2h2r-1gbit-{tag}-threads{threads}-run*.json"))]
            for rank in (4, 1):
                flat = f"powersgd:{rank}:flat"
                hosts = next((m for m in (f"powersgd:{rank}:hosts", f"powersgd:{rank}")
                              if runs and m in runs[0]["methods"]), None)
                if not runs or hosts is None or flat not in runs[0]["methods"]:
                    continue

                def median(method: str, key: str, runs: list[dict] = runs) -> float:
                    return statistics.median(r["methods"][method][key] for r in runs)
                ratios = [r["methods"][hosts]["median_s"] / r["methods"][flat]["median_s"]
                          for r in runs]
                lines.append(
                    f"| {tag}, {threads}, {len(runs)}, {_load_range(tag)} | {rank} | "
                    f"{median(hosts, 'median_s'):.3f} / {median(flat, 'median_s'):.3f} | "
                    f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f})"
                    f" | {median(hosts, 'compute_only_median_s'):.3f} / "
                    f"{median(flat, 'compute_only_median_s'):.3f} | "
                    f"{median(hosts, 'speedup_vs_first'):.2f}x / "
                    f"{median(flat, 'speedup_vs_first'):.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "compact":
        print(compact(sys.argv[2:]))
    elif len(sys.argv) > 1 and sys.argv[1] == "placement":
        print(placement(sys.argv[2:]))
    else:
        print(steps(sys.argv[1] if len(sys.argv) > 1 else "final"))
        print(accuracy())
