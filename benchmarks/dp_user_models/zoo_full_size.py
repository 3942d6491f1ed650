"""DataParallel on the zoo's models at their published sizes, against the same references as
``tests/distributed/test_dp_user_models.py`` (one process on the global batch, or torch's DDP
for models with batch norm).

The test module trains small configurations of most architectures; the ones without a small
configuration (``FULL_SIZE_ONLY``: AlexNet, GoogLeNet, Inception v3) and, with ``--all``, every
registry model at its smallest input run here, being seconds to minutes each on two cores.
GPT-2 XL and Megatron's 1536x16 need tens of GiB (two copies of the model with gradients and
momentum per rank), so ``--all`` is for a large host.

    python benchmarks/dp_user_models/zoo_full_size.py [--ranks 2] [--algorithm auto] [--all]

One step by default: from their initialisation, a few steps of these deep batch-norm networks
on two samples per rank are chaotic in float32 (the same computation in float64 ends 1.6 apart
after three steps of GoogLeNet on 3 ranks, a 1e-7 nudge of the weights 11 apart), so only the
first step's update can be compared to a reference; the test module's small configurations
are well conditioned and train three.

Prints one line per model (max difference, tolerance, seconds) and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.distributed import test_dp_user_models as matrix  # noqa: E402
from tests.distributed.dp_user_models import FULL_SIZE_ONLY, full_size_case  # noqa: E402
from tests.harness import run_ranks  # noqa: E402

SMALLEST_INPUTS: dict[str, tuple[int, ...]] = {
    "mlp": (1, 8, 8), "lenet": (1, 28, 28), "resnet20": (3, 32, 32), "resnet56": (3, 32, 32),
    "resnet50": (3, 64, 64), "resnet101": (3, 64, 64), "resnext101_32x4d": (3, 64, 64),
    "se_resnext101_32x4d": (3, 64, 64), "nvidia_se_resnext101_32x4d": (3, 64, 64),
    "vgg16": (3, 32, 32), "efficientnet_b0": (3, 64, 64), "efficientnet_b4": (3, 64, 64),
    **FULL_SIZE_ONLY,
}
"""Image models only: the token models (BERT, GPT) are built by the test module's cases."""


def _worker(rank: int, world_size: int, names: list[str], algorithm: str, steps: int
            ) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    matrix.STEPS = steps
    rows = []
    for name in names:
        case = full_size_case(name, SMALLEST_INPUTS[name])
        start = time.perf_counter()
        want = (matrix._ddp(case, rank, world_size, None) if case.reference == "ddp"
                else matrix._single(case, world_size))
        got = matrix._data_parallel(case, algorithm, 25.0, rank, world_size, None)
        diff = max(((g.double() - w.double()).abs().max().item()
                    for g, w in ((got[k], want[k]) for k in want) if w.numel()), default=0.0)
        rows.append({"model": name, "reference": case.reference, "max_diff": diff,
                     "failures": matrix._compare(got, want, case.atol),
                     "seconds": round(time.perf_counter() - start, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--all", action="store_true", help="every image model of the registry")
    parser.add_argument("--steps", type=int, default=1,
                        help="training steps (default 1: see the module docstring)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args()
    names = list(SMALLEST_INPUTS) if args.all else list(FULL_SIZE_ONLY)
    rows = run_ranks(args.ranks, _worker, names, args.algorithm, args.steps, timeout=3600)[0]
    for row in rows:
        verdict = "ok" if not row["failures"] else f"{len(row['failures'])} tensors differ"
        print(f"{row['model']:28s} vs {row['reference']:6s} max diff {row['max_diff']:.2e} "
              f"{verdict:20s} {row['seconds']:7.1f} s")
    report = {"ranks": args.ranks, "algorithm": args.algorithm, "steps": args.steps,
              "torch": torch.__version__, "host": platform.platform(),
              "processor": platform.processor(), "rows": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
