"""``auto``'s regret on one host: its time over the best scaledl path's, per collective and size.

    python benchmarks/auto/regret.py run [--out DIR] [--ranks 2,4] [--repeats 1]
        [--calibration FILE] [--target-seconds 0.3] [--sizes 4K,64M] [--step-factor 16]
    python benchmarks/auto/regret.py table DIR/regret-*.json [--calibration FILE]

``run`` times, with ``scaledl bench collectives`` (interleaved per size, medians of samples, the
slowest rank per sample), ``auto`` and every scaledl algorithm that runs on a flat one-host
group (ring, multiring, halving_doubling, tree, chain, shm, native) for allreduce,
reduce_scatter, allgather and broadcast, on each world size of ``--ranks`` over plain loopback,
``--repeats`` times; ``auto`` uses the cost model at ``--calibration`` (the defaults when the file
does not exist; ``scaledl bench collectives --calibrate`` writes one).  Then it prints the
table.

``table`` prints, per world size, collective and size: what ``auto`` ran, its measured median
(the median over repeats of each run's median), the best other path's, and two regrets:

- *measured*: auto's median over the best path's (auto's own noise included: when auto runs the
  best path, this is that path timed twice, and its spread is the measurement's);
- *choice*: the median time of the path auto ran, as timed under its own name, over the best
  path's; 1.00 when auto ran the best path.  This is the regret the cost model is answerable for.

Beside them the model's prediction for auto's pick and for the best path (``predicted``, from
``choose`` on the calibration file given, which should be the one the runs used) and the ratio
of the two: a choice regret above 1.10 with a predicted ratio below 1 is the model's error.
A last table gives, per world size and collective, the worst choice regret and the sizes over
1.10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from scaledl.bench.report import format_bytes
from scaledl.calibration.bench_file import ITEMSIZES
from scaledl.collectives.auto import Fabric, choose
from scaledl.collectives.cost import CALIBRATION_ENV, CostModel
from scaledl.collectives.registry import plan_numel
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast")
ALGORITHMS = ("ring", "multiring", "halving_doubling", "tree", "chain", "shm", "native", "auto")
"""Every scaledl algorithm that runs on a flat group inside one host (hierarchical and torus
need a layout of several hosts; on one flat host they are one of these)."""
LIMIT = 1.10
"""The regret the issue allows."""


def run(args: argparse.Namespace) -> list[Path]:
    """Run the bench per world size and repeat; return the JSON files written."""
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{CALIBRATION_ENV: str(args.calibration)})
    written = []
    for repeat in range(1, args.repeats + 1):
        for ranks in args.ranks:
            path = args.out / f"regret-{ranks}ranks-{repeat}.json"
            command = [
                sys.executable, "-m", "scaledl.cli.main", "bench", "collectives",
                "--ranks", str(ranks), "--collectives", ",".join(COLLECTIVES),
                "--algorithms", ",".join(ALGORITHMS), "--min-bytes", args.sizes[0],
                "--max-bytes", args.sizes[-1], "--step-factor", str(args.step_factor),
                "--target-seconds", str(args.target_seconds), "--json", str(path),
            ]
            log = path.with_suffix(".txt")
            with log.open("w") as out:
                done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      check=False)
            load = os.getloadavg()
            with (args.out / "load.txt").open("a") as out:
                out.write(f"{path.name}: load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
            if done.returncode != 0:
                sys.exit(f"{' '.join(command)} failed ({done.returncode}); see {log}")
            written.append(path)
    return written


def _medians(files: list[Path]) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Per (world size, collective, bytes): each algorithm's medians over the runs, and what
    auto ran in each."""
    cells: dict[tuple[int, str, int], dict[str, Any]] = defaultdict(
        lambda: {"us": defaultdict(list), "ran": [], "dtype": "float32"})
    for path in files:
        data = json.loads(path.read_text())
        for row in data["results"]:
            cell = cells[(row["world_size"], row["collective"], row["nbytes"])]
            cell["us"][row["algorithm"]].append(row["median_us"])
            cell["dtype"] = data["config"]["dtype"]
            if row["algorithm"] == "auto":
                cell["ran"].append(row["resolved"] or "auto")
    return cells


def _predictions(world_size: int, collective: str, nbytes: int, itemsize: int,
                 model: CostModel) -> dict[str, float]:
    """``choose``'s predicted seconds per candidate, as the bench's flat one-host group sees it."""
    topology = Topology.flat(world_size)
    numel = plan_numel(collective, nbytes, world_size, itemsize)
    fabric = Fabric((0,) * world_size, native_stages=True)
    return choose(Collective(collective), topology, numel, itemsize, model,
                  fabric=fabric).predictions


def table(files: list[Path], calibration: Path) -> str:
    """The markdown table of regrets (one row per world size, collective and size)."""
    model = CostModel.load(calibration).for_backend("gloo")
    lines = [
        f"model: {calibration if calibration.is_file() else 'defaults'}; runs: "
        f"{len(files)}; medians of the runs' medians",
        "",
        "| ranks | collective | size | auto ran | auto µs | best other | best µs | measured "
        "regret | choice regret | predicted µs (pick / best) |",
        "|---:|---|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    worst = 0.0
    summary: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    recomputed: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    for (ranks, collective, nbytes), cell in sorted(_medians(files).items()):
        us = {name: statistics.median(times) for name, times in cell["us"].items()}
        if "auto" not in us:
            continue
        others = {name: t for name, t in us.items() if name != "auto"}
        best = min(others, key=lambda name: others[name])
        ran = sorted(set(cell["ran"]))
        picked = ran[0] if len(ran) == 1 else None
        choice = others[picked] / others[best] if picked in others else None
        if choice is not None:
            worst = max(worst, choice)
            summary[(ranks, collective)].append((choice, nbytes))
        predicted = _predictions(ranks, collective, nbytes, ITEMSIZES[cell["dtype"]], model)
        pick_model = min(predicted, key=lambda name: predicted[name])
        if pick_model in others:  # the given model's pick, priced at its measured time
            recomputed[(ranks, collective)].append((others[pick_model] / others[best], nbytes))
        flag = " **>1.10**" if choice is not None and choice > LIMIT else ""
        lines.append(
            f"| {ranks} | {collective} | {format_bytes(nbytes)} | {', '.join(ran)} | "
            f"{us['auto']:.0f} | {best} | {others[best]:.0f} | {us['auto'] / others[best]:.2f} | "
            + (f"{choice:.2f}{flag}" if choice is not None else "-") + " | "
            + f"{predicted[pick_model] * 1e6:.0f} ({pick_model}) / "
            + (f"{predicted[best] * 1e6:.0f}" if best in predicted else "-") + " |")
    lines.append("")
    lines.append(f"worst choice regret: {worst:.2f} (limit {LIMIT:.2f})")
    lines.append("")
    lines.append("| ranks | collective | worst choice regret (size) | sizes over 1.10 |")
    lines.append("|---:|---|---:|---|")
    for (ranks, collective), rows in sorted(summary.items()):
        lines.append(_worst_row(ranks, collective, rows))
    lines.append("")
    lines.append("The same with the choices the model given would make (``--calibration``), each "
                 "priced at that path's measured time:")
    lines.append("")
    lines.append("| ranks | collective | worst choice regret (size) | sizes over 1.10 |")
    lines.append("|---:|---|---:|---|")
    for (ranks, collective), rows in sorted(recomputed.items()):
        lines.append(_worst_row(ranks, collective, rows))
    return "\n".join(lines)


def _worst_row(ranks: int, collective: str, rows: list[tuple[float, int]]) -> str:
    top = max(rows)
    over = ", ".join(format_bytes(n) for r, n in sorted(rows, key=lambda x: x[1]) if r > LIMIT)
    return (f"| {ranks} | {collective} | {top[0]:.2f} ({format_bytes(top[1])}) | "
            f"{over or '-'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="measure, then print the table")
    go.add_argument("--out", type=Path, default=Path("benchmarks/auto/raw"))
    go.add_argument("--ranks", default="2,4", help="comma list of world sizes (default 2,4)")
    go.add_argument("--repeats", type=int, default=1)
    go.add_argument("--target-seconds", type=float, default=0.3)
    go.add_argument("--sizes", default="4K,64M", help="smallest,largest (default 4K,64M)")
    go.add_argument("--step-factor", type=int, default=16, help="size multiplier (default 16)")
    show = commands.add_parser("table", help="print the table of earlier runs")
    show.add_argument("files", nargs="+", type=Path)
    for sub in (go, show):
        sub.add_argument("--calibration", type=Path,
                         default=Path(os.environ.get(CALIBRATION_ENV, "/nonexistent")),
                         help="auto's model (default $SCALEDL_CALIBRATION; none: defaults)")
    args = parser.parse_args()
    if args.command == "run":
        args.ranks = [int(part) for part in args.ranks.split(",")]
        args.sizes = args.sizes.split(",")
        files = run(args)
    else:
        files = args.files
    print(table(files, args.calibration))


if __name__ == "__main__":
    main()
