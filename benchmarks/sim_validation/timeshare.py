"""What time-sharing the cores costs a training step: K processes, each one torch thread
running the same model's forward, backward and update, on a machine of C cores.

    python benchmarks/sim_validation/timeshare.py [--model resnet20] [--ranks 4,6] [--steps 12]
                                                  [--sync]

Prints one JSON line per measurement: the step alone (one process, before and after), and with
K processes at once, each process's median step.  ``ratio`` is the median of those over the
fair share ``alone * K / C``; ``slowdown`` is ``(ratio - 1) / (1 - C / K)``, the cpu device's
time-sharing constant (presets.py CPU_TIMESHARE) if every slice a rank gets after another rank
ran costs it the same fraction.  ``--sync`` makes the K processes meet at a barrier after every
step, as data-parallel ranks do, and times the step up to the barrier.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.synchronize import Barrier

SHAPES = {"resnet20": (3, 32, 32), "mlp": (1, 28, 28)}
BATCH = {"resnet20": 32, "mlp": 64}


def _steps(model_name: str, steps: int, start: Barrier, out: mp.Queue,  # type: ignore[type-arg]
           sync: bool) -> None:
    import torch

    from scaledl.models.registry import build_model
    from scaledl.profiling.measure import _Step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(model_name, SHAPES[model_name], 10)
    model.train()
    step = _Step(model, SHAPES[model_name], 10, BATCH[model_name], torch.device("cpu"))
    for _ in range(2):
        step.run()
    start.wait()
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        step.run()
        if sync:
            start.wait()
        times.append(time.perf_counter() - begin)
    out.put(statistics.median(times))


def _together(model: str, ranks: int, steps: int, sync: bool = False) -> list[float]:
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(ranks)
    procs = [ctx.Process(target=_steps, args=(model, steps, start, out, sync))
             for _ in range(ranks)]
    for proc in procs:
        proc.start()
    medians = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return sorted(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20", choices=sorted(SHAPES))
    parser.add_argument("--ranks", default="4,6")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sync", action="store_true", help="a barrier after every step")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    for ranks in (int(k) for k in args.ranks.split(",")):
        before = _together(args.model, 1, args.steps)[0]
        medians = _together(args.model, ranks, args.steps, args.sync)
        after = _together(args.model, 1, args.steps)[0]
        alone = (before + after) / 2
        ratio = statistics.median(medians) / (alone * max(1.0, ranks / cores))
        share = 1 - cores / ranks
        print(json.dumps({"model": args.model, "cores": cores, "ranks": ranks, "sync": args.sync,
                          "alone_s": [before, after], "medians_s": medians, "ratio": ratio,
                          "slowdown": (ratio - 1) / share if share > 0 else None}), flush=True)


if __name__ == "__main__":
    main()
