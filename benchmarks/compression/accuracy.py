"""The README's job (``scaledl train`` defaults: the MLP on scikit-learn's digits) trained under
DataParallel with each gradient compression, beside torch's DDP and its ``powerSGD_hook``.

Run with two ranks (``torchrun --nproc-per-node 2 benchmarks/compression/accuracy.py``).  The
job is ``scaledl train``'s defaults, reproduced with the library so that torch's hook can run
the same job: the ``mlp`` model (64-256-10), digits split as ``scaledl train`` splits it, 32
samples per rank per step drawn by scaledl's ``ShardedSampler``, SGD with learning rate 0.05
and momentum 0.9, 10 epochs; test accuracy at the end.  Each method runs with the same seeds
(initial weights and sample order); the digits' test split has 360 samples, so one sample is
0.28 points, and the methods are compared on the mean over the seeds.

Methods: ``scaledl:<compression>`` is ``scaledl.DataParallel(compression=...)``;
``scaledl:powersgd:R:start2`` is PowerSGD with ``start_iter=2``, as torch's hook must use
(its minimum with error feedback); ``scaledl:powersgd:R:flat`` and
``scaledl:powersgd:R:hosts`` are PowerSGD with ``placement="flat"`` and ``"hosts"``;
``torch:ddp`` is plain DDP and ``torch:powersgd:R`` DDP with ``powerSGD_hook`` (rank R, error
feedback, warm start, ``start_powerSGD_iter=2``).

``--topology 2x2`` (with 4 ranks) lays the ranks out as 2 hosts of 2 for scaledl's methods
(``hierarchical``), so ``scaledl:powersgd:R:hosts`` runs PowerSGD's host placement (exact
inside each host, compressed across) beside ``scaledl:powersgd:R:flat``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

import scaledl
from scaledl.data.datasets import load_dataset
from scaledl.data.sharding import ShardedSampler
from scaledl.models.registry import build_model
from scaledl.sync import PowerSGD

METHODS = ("scaledl:none", "scaledl:bf16", "scaledl:fp16", "scaledl:powersgd:1",
           "scaledl:powersgd:4", "scaledl:powersgd:1:start2", "scaledl:powersgd:4:start2",
           "torch:ddp", "torch:powersgd:1", "torch:powersgd:4")
BATCH, LR, MOMENTUM, EPOCHS = 32, 0.05, 0.9, 10


def wrap(method: str, model: nn.Module, seed: int,
         topology: scaledl.Topology | None = None) -> nn.Module:
    """``model`` wrapped as ``method`` says (scaledl's on ``topology`` when given)."""
    family, _, spec = method.partition(":")
    if family == "scaledl":
        placed = {"algorithm": "hierarchical", "topology": topology} if topology else {}
        parts = spec.split(":")
        if parts[0] == "powersgd":
            placement = parts[2] if parts[2:3] in (["flat"], ["hosts"]) else "auto"
            start = int(parts[2].removeprefix("start")) if len(parts) > 2 and \
                placement == "auto" else 0
            return scaledl.DataParallel(model, compression=PowerSGD(
                rank=int(parts[1]), start_iter=start, seed=seed, placement=placement),
                **placed)  # type: ignore[arg-type]
        return scaledl.DataParallel(model, compression=spec, **placed)  # type: ignore[arg-type]
    ddp = nn.parallel.DistributedDataParallel(model)
    if spec.startswith("powersgd"):
        state = torch_powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(spec.split(":")[1]),
            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True, random_seed=seed)
        ddp.register_comm_hook(state, torch_powersgd.powerSGD_hook)
    return ddp


def train(method: str, seed: int, rank: int, world: int,
          topology: scaledl.Topology | None = None) -> dict[str, float]:
    """One run; test accuracy (%) and the last epoch's mean training loss."""
    train_set, test_set = load_dataset("digits", split="train"), load_dataset("digits",
                                                                            split="test")
    torch.manual_seed(seed)
    model = wrap(method, build_model("mlp", train_set.input_shape, train_set.num_classes), seed,
                 topology)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sampler = ShardedSampler(len(train_set), rank, world, seed=seed)
    losses: list[float] = []
    started = time.perf_counter()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        indices = torch.tensor(list(sampler), dtype=torch.int64)
        losses = []
        for start in range(0, len(indices), BATCH):
            x, y = train_set.gather(indices[start:start + BATCH])
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    seconds = time.perf_counter() - started
    inner = model.module if hasattr(model, "module") else model
    with torch.no_grad():
        x, y = test_set.features, test_set.labels
        accuracy = 100.0 * float((inner(x).argmax(1) == y).float().mean())  # type: ignore
    return {"accuracy": accuracy, "loss": statistics.mean(losses), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--topology", default=None,
                        help="lay scaledl's ranks out as RxH (R ranks per host, H hosts)")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    topology = scaledl.Topology.parse(args.topology, world, rank) if args.topology else None
    runs: dict[str, list[dict[str, float]]] = {}
    methods = args.methods.split(",")
    for seed in range(args.seeds):
        for method in methods:  # interleaved, so the machine's load hits every method alike
            runs.setdefault(method, []).append(train(method, seed, rank, world, topology))
    summary = {
        method: {"accuracy_mean": statistics.mean(r["accuracy"] for r in results),
                 "accuracy_per_seed": [r["accuracy"] for r in results],
                 "loss_mean": statistics.mean(r["loss"] for r in results),
                 "loss_per_seed": [r["loss"] for r in results],
                 "seconds_median": statistics.median(r["seconds"] for r in results)}
        for method, results in runs.items()
    }
    report = {"job": "mlp on digits, scaledl train defaults", "world_size": world,
              "topology": args.topology,
              "seeds": args.seeds, "epochs": EPOCHS, "batch_per_rank": BATCH, "lr": LR,
              "momentum": MOMENTUM, "torch": torch.__version__,
              "threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
              "methods": summary}
    if rank == 0:
        text = json.dumps(report, indent=1)
        print(text)
        if args.json:
            with open(args.json, "w") as handle:
                handle.write(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
