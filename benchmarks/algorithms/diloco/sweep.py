"""DiLoCo's own settings against synchronous SGD on the tuned MLP job (docs/benchmarks.md,
"DiLoCo and streaming DiLoCo"): every configuration of CONFIGS as a real ``scaledl train`` run,
two at a time, on the held-out validation split (``--split validation``) or the test split with
several seeds (``--split test``).  Prints one line per run and writes ``sweep-<split>.json``.

    nice -n 10 python benchmarks/algorithms/diloco/sweep.py --split validation --out /tmp/sweep

The job is the one of the tuned comparison: digits, MLP, 4 workers, batch 8, 6 epochs, an
evaluation every 5 steps, target 0.95.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from scaledl.bench.methods import METHODS, BenchSpec, Method
from scaledl.bench.methods_data import write_validation_split
from scaledl.bench.methods_run import Runs
from scaledl.strategies.catalogue import option_fields

SPEC = BenchSpec(workers=4, epochs=6, dataset="digits", batch_size=8, eval_every=5, target=0.95)

# name: (method, lr, extra train options)
CONFIGS: dict[str, tuple[str, float, tuple[tuple[str, str], ...]]] = {
    "allreduce lr 0.4": ("allreduce", 0.4, ()),
    "diloco lr 0.05 outer 0.7/0.9 (bench)": ("diloco", 0.05, ()),
}


def add(name: str, method: str, lr: float, **options: object) -> None:
    """One configuration; ``options`` are ``scaledl train`` flags (``outer_lr=1.0``)."""
    CONFIGS[name] = (method, lr, tuple((k, str(v)) for k, v in options.items()))


for inner in (0.05, 0.1, 0.2):
    for outer_lr, outer_mu in ((0.7, 0.9), (1.0, 0.0), (1.0, 0.5), (0.7, 0.5), (0.5, 0.9)):
        for inner_mu in (0.9, 0.0):
            add(f"diloco lr {inner} mu {inner_mu} outer {outer_lr}/{outer_mu}", "diloco", inner,
                outer_lr=outer_lr, outer_momentum=outer_mu, momentum=inner_mu)
add("diloco lr 0.05 mu 0.9 outer 1.0/0.9", "diloco", 0.05, outer_lr=1.0, outer_momentum=0.9)
add("diloco lr 0.1 mu 0.9 outer 1.0/0.9", "diloco", 0.1, outer_lr=1.0, outer_momentum=0.9)
for h in (10, 15):  # the anchor moves every H steps: what H does to epochs to target
    add(f"diloco lr 0.05 outer 0.7/0.9 H {h}", "diloco", 0.05, tau=h)
    add(f"diloco adamw 0.003 outer 0.7/0.9 H {h}", "diloco", 0.003, optimizer="adamw", tau=h)
for inner in (0.001, 0.003, 0.01):
    for outer_lr, outer_mu in ((0.7, 0.9), (1.0, 0.5)):
        add(f"diloco adamw {inner} outer {outer_lr}/{outer_mu}", "diloco", inner,
            optimizer="adamw", outer_lr=outer_lr, outer_momentum=outer_mu)
# A synchronous warm-up (post-local SGD, Lin et al. 2020): W steps of averaged gradients first.
# Within 6 epochs (270 steps) the >= 10x byte target allows W <= 14.
for warmup in (5, 10, 14):
    add(f"diloco lr 0.05 outer 0.7/0.9 warm-up {warmup}", "diloco", 0.05,
        sync_warmup_steps=warmup)
    add(f"diloco lr 0.1 mu 0.9 outer 0.5/0.9 warm-up {warmup}", "diloco", 0.1,
        outer_lr=0.5, outer_momentum=0.9, sync_warmup_steps=warmup)
    add(f"diloco adamw 0.003 outer 0.7/0.9 warm-up {warmup}", "diloco", 0.003,
        optimizer="adamw", sync_warmup_steps=warmup)
# The warm-up steps run at the inner lr, which the outer step's amplification keeps small
# (0.05, an eighth of synchronous SGD's 0.4): larger inner rates with a milder outer step.
# ... or the warm-up at synchronous SGD's own rate (0.4 = 8 x 0.05), DiLoCo's inner rate after.
for scale, warmup in ((8, 5), (8, 10), (8, 14), (4, 10), (4, 14)):
    add(f"diloco lr 0.05 outer 0.7/0.9 warm-up {warmup} at x{scale}", "diloco", 0.05,
        sync_warmup_steps=warmup, sync_warmup_lr_scale=scale)
for inner in (0.2, 0.4):
    add(f"diloco lr {inner} outer 1.0/0.0 warm-up 10", "diloco", inner, outer_lr=1.0,
        outer_momentum=0.0, sync_warmup_steps=10)
    add(f"diloco lr {inner} outer 0.7/0.5 warm-up 10", "diloco", inner, outer_lr=0.7,
        outer_momentum=0.5, sync_warmup_steps=10)


TABLE = (
    "allreduce lr 0.4", "diloco lr 0.05 outer 0.7/0.9 (bench)",
    "diloco lr 0.1 mu 0.9 outer 1.0/0.0", "diloco lr 0.1 mu 0.9 outer 0.7/0.5",
    "diloco lr 0.1 mu 0.9 outer 0.5/0.9", "diloco lr 0.05 mu 0.9 outer 1.0/0.9",
    "diloco adamw 0.003 outer 0.7/0.9", "diloco lr 0.05 outer 0.7/0.9 H 10",
    "diloco adamw 0.003 outer 0.7/0.9 H 10", "diloco lr 0.05 outer 0.7/0.9 H 15",
    "diloco adamw 0.003 outer 0.7/0.9 H 15",
)
"""The configurations of docs/benchmarks.md's table (``--only table``)."""


def method_of(name: str, options: tuple[tuple[str, str], ...]) -> Method:
    base = METHODS[name]
    return Method(name, replace(base.row, options=base.row.options + options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--split", choices=("validation", "test"), default="validation")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--only", default=None, help="comma list of substrings of names, or "
                        "'table': the configurations of docs/benchmarks.md")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    args = parser.parse_args()
    spec = SPEC
    if args.split == "validation":
        spec = write_validation_split(spec, args.out / "validation")
    if args.only == "table":
        names = list(TABLE)
    else:
        names = [n for n in CONFIGS if args.only is None
                 or any(part in n for part in args.only.split(","))]
    jobs = [(n, s) for s in range(args.seeds) for n in names]

    def one(job: tuple[str, int]) -> dict[str, object]:
        name, seed = job
        method, lr, options = CONFIGS[name]
        folder = args.out / args.split / name.replace(" ", "_").replace("/", "-") / f"seed-{seed}"
        # The pools take strategy options only; a run that sets the optimizer or its momentum
        # runs as its own scaledl train process.
        pooled = all(key in option_fields() for key, _ in options)
        runner = runs if pooled else alone
        result = runner.run(method_of(method, options), replace(spec, lr=lr, seed=seed), folder)
        curve = [(round(p["epoch"], 2), round(p["accuracy"], 3)) for p in result.curve]
        line = {"name": name, "seed": seed, "status": result.status, "reason": result.reason,
                "epochs_to_target": result.epochs_to_target,
                "best": result.best_accuracy, "final": result.final_accuracy, "curve": curve}
        print(f"{name:48s} seed {seed}: {result.status} epochs "
              f"{result.epochs_to_target} best {result.best_accuracy} "
              f"final {result.final_accuracy}", flush=True)
        return line

    # Pools of rank processes kept between runs (scaledl.bench.methods_pool): a run gives what
    # it gives as its own process, without 30-45 s of start-up each.
    runs, alone = Runs(), Runs(pool=False)
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            lines = list(pool.map(one, jobs))
    finally:
        runs.close()
    (args.out / f"sweep-{args.split}.json").write_text(json.dumps(lines, indent=1))


if __name__ == "__main__":
    main()
