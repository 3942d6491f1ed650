"""The seed papers' scaling results beside scaledl's predictions (docs/simulation.md).

Each :class:`Case` states what the paper measured, the assumptions the simulation makes where
the paper does not say (network, batch, device efficiency) and how the prediction is derived
from :class:`~scaledl.sim.job.Job` runs.  ``scaledl simulate reproduce`` prints the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from scaledl.sim.job import Job

__all__ = ["Case", "CASES", "run_cases", "IMAGENET_TRAIN_IMAGES"]

IMAGENET_TRAIN_IMAGES = 1_281_167
"""ILSVRC-2012 training set size."""


@dataclass(frozen=True)
class Case:
    """One published result and how scaledl predicts it."""

    name: str
    published: str
    assumptions: str
    predict: Callable[[], str]


def _ddl() -> str:
    job = Job(model="resnet50", gpus=256, topology="4x16x4", algorithm="torus", device="p100",
              network="ib-edr", intra="nvlink1", batch=32)
    result = job.run()
    minutes = 90 * IMAGENET_TRAIN_IMAGES / result.samples_per_s / 60
    return (f"{result.efficiency:.1%} efficiency; 90 epochs in {minutes:.0f} min "
            f"({result.samples_per_s / 256:.0f} images/s/GPU, comm share "
            f"{result.communication_share:.1%})")


def _scaffe() -> str:
    base = Job(model="googlenet", device="k80", network="ib-fdr", intra="pcie3",
               strategy="reduce-broadcast", algorithm="hierarchical")
    small = replace(base, gpus=32, topology="16x2", batch=80).run()
    large = replace(base, gpus=160, topology="16x10", batch=16).run()
    speedup = small.iteration_s / large.iteration_s
    return (f"{speedup:.2f}x from 32 to 160 GPUs ({speedup / 5:.0%} of linear); "
            f"comm share {small.communication_share:.0%} -> {large.communication_share:.0%}")


def _horovod(model: str, images_per_s: float) -> Callable[[], str]:
    def predict() -> str:
        job = Job(model=model, gpus=512, topology="4x128", algorithm="ring", device="p100",
                  network="25gbe", intra="pcie3", batch=64, bucket_mb=64.0,
                  compute_time=64 / images_per_s)
        result = job.run()
        return (f"{result.efficiency:.1%} efficiency (comm busy "
                f"{result.communication_s * 1e3:.0f} ms vs compute {result.compute_s * 1e3:.0f} "
                f"ms per step)")
    return predict


def _you() -> str:
    parts = []
    for side in (64, 224):
        base = Job(model="alexnet", input_shape=(3, side, side), gpus=8, topology="8",
                   device="k80", intra="pcie3", batch=64)
        original = replace(base, strategy="easgd").run()
        sync = replace(base, strategy="sync-easgd", algorithm="tree", overlap=True).run()
        parts.append(f"{side}x{side} inputs ({original.compute_s * 1e3:.0f} ms compute): "
                     f"{original.communication_share:.0%} vs {sync.communication_share:.0%}, "
                     f"{original.iteration_s / sync.iteration_s:.1f}x faster")
    return "; ".join(parts)


CASES = (
    Case("PowerAI DDL, ResNet-50, 256 P100",
         "95% scaling efficiency (Caffe); 90 epochs in 50 min (Torch)",
         "64 hosts x 4 P100 (topology 4x16x4), torus (DDL's multi-dimensional ring), one EDR "
         "InfiniBand port per host, NVLink inside, 32 images/GPU (8k global batch), P100 at 45% "
         "of FP32 peak", _ddl),
    Case("S-Caffe, GoogLeNet, 32 -> 160 K80",
         "2.5x speedup (strong scaling, ideal 5x)",
         "16 K80 GPUs per host (16x2 and 16x10), FDR InfiniBand, PCIe inside, per-layer "
         "hierarchical reduce and broadcast overlapped (S-Caffe's HR and multi-stage "
         "propagation), global batch 2560 (80 -> 16 per GPU), K80 at 30% of peak at every batch",
         _scaffe),
    Case("Horovod, ResNet-101, 512 GPUs",
         "90% scaling efficiency",
         "128 servers x 4 Pascal GPUs (4x128), ring allreduce, 25 GbE RoCE, PCIe inside, 64 "
         "images/GPU, 64 MiB fusion buffer, one GPU at Horovod's measured 119.4 images/s",
         _horovod("resnet101", 119.4)),
    Case("Horovod, VGG-16, 512 GPUs",
         "68% scaling efficiency",
         "as above, one GPU at Horovod's measured 130.9 images/s", _horovod("vgg16", 130.9)),
    Case("You et al., EASGD on 8 GPUs, AlexNet",
         "communication 87% of time (original EASGD) vs 14% (Sync EASGD3)",
         "one host of 8 K80 GPUs on PCIe 3.0, AlexNet (233 MiB of weights at 224x224 and at "
         "64x64, scaledl's smallest AlexNet input; the paper: 249 MB, CIFAR 32x32), 64 "
         "images/GPU, exchange every step (tau = 1); original (Algorithm 1): the master serves "
         "workers in rank order and a worker waits only for its own exchange e, so a step takes "
         "max(compute + update + e, 7e); Sync EASGD: tree reduce + broadcast overlapped with "
         "compute", _you),
)


def run_cases(cases: tuple[Case, ...] = CASES) -> list[tuple[Case, str]]:
    """Every case with its prediction."""
    return [(case, case.predict()) for case in cases]
