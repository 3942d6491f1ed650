"""NVIDIA's image classification recipe in PyTorch at its mid-2020 release (DeepLearningExamples
``PyTorch/Classification/ConvNets`` for the pytorch:20.06 container): published scaling points of
ResNet-50 v1.5, ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d on one DGX A100 40 GB, one DGX-1
16 GB and one DGX-1 32 GB, added after every preset was set and predicted with none changed
(docs/simulation.md, "Reproducing published results").

Source (``CONVNETS_2020``): the three models' READMEs at commit 46ff370 (June 2020, "Adding
support for Ampere and 20.06 container"), their training performance tables (images/s on 1 and
8 GPUs at mixed precision and at TF32 or FP32) and their benchmark sections; the code at the same
commit.  The recipe then differed from its 21.03 release (:mod:`scaledl.sim.cases_dle_pytorch`)
in everything around the model, which makes these tables a check of how much the software
stack, not the machine, decides a one-node efficiency:

- apex's DistributedDataParallel with its defaults (``image_classification/training.py``:
  ``DDP(self.model)``; buckets of 10 million elements, overlapped with backward), where 21.03
  runs torch DDP;
- ``--amp`` is apex amp at opt level O1 (``main.py``), whose weights and gradients stay float32,
  with a static loss scale of 256 in the benchmark commands;
- DALI decoding on the CPU (``--data-backend`` defaults to ``dali-cpu``; the benchmark commands
  do not set it);
- the batch per GPU of each README's benchmark table: ResNet-50 256 (128 at FP32 on a DGX-1),
  the ResNeXt models 128 (64 at FP32 on a DGX-1).

NCHW tensors everywhere except the ResNeXt models at mixed precision, whose READMEs say they
train NHWC under AMP and whose AMP benchmark commands pass ``--memory-format nhwc`` (ResNet-50's
README calls NHWC work in progress).  For ResNet-50 this is the code DLPerf measured on its own
V100 servers in pytorch:20.03 (:mod:`scaledl.sim.cases_dlperf`; DLPerf names commit 5cc03ca,
whose ``ConvNets`` tree is this one).  Each single-GPU rate is the measured compute.
"""

from __future__ import annotations

from scaledl.sim.cases_bert import APEX_BUCKET_MB, MACHINES
from scaledl.sim.cases_dle import DLE_MODELS, DLE_PYT
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["CONVNETS_2020_CASES", "CONVNETS_2020", "CONVNETS_2020_RUNS"]

CONVNETS_2020 = f"{DLE_PYT} (commit 46ff370, pytorch:20.06 NGC container)"
"""The source, formatted with the README's directory."""
CONVNETS_2020_RUNS = (  # model, machine, precision, batch per GPU, images/s on 1 and 8 GPUs
    ("resnet50", "DGX A100 40 GB", "mixed precision", 256, 1240.81, 9604.92),
    ("resnet50", "DGX A100 40 GB", "TF32", 256, 680.15, 5379.82),
    ("resnet50", "DGX-1 16 GB", "mixed precision", 256, 856.52, 6635.90),
    ("resnet50", "DGX-1 16 GB", "FP32", 128, 373.21, 2899.62),
    ("resnet50", "DGX-1 32 GB", "mixed precision", 256, 816.00, 6347.26),
    ("resnet50", "DGX-1 32 GB", "FP32", 128, 359.76, 2813.23),
    ("resnext101_32x4d", "DGX A100 40 GB", "mixed precision", 128, 908.40, 6887.59),
    ("resnext101_32x4d", "DGX A100 40 GB", "TF32", 128, 300.42, 2380.51),
    ("resnext101_32x4d", "DGX-1 16 GB", "mixed precision", 128, 534.91, 4000.79),
    ("resnext101_32x4d", "DGX-1 16 GB", "FP32", 64, 150.05, 1151.01),
    ("resnext101_32x4d", "DGX-1 32 GB", "mixed precision", 128, 516.07, 3861.95),
    ("resnext101_32x4d", "DGX-1 32 GB", "FP32", 64, 139.80, 1070.94),
    ("nvidia_se_resnext101_32x4d", "DGX A100 40 GB", "mixed precision", 128, 641.57, 4758.40),
    ("nvidia_se_resnext101_32x4d", "DGX A100 40 GB", "TF32", 128, 258.75, 2038.03),
    ("nvidia_se_resnext101_32x4d", "DGX-1 16 GB", "mixed precision", 128, 383.15, 2695.10),
    ("nvidia_se_resnext101_32x4d", "DGX-1 16 GB", "FP32", 64, 130.48, 996.04),
    ("nvidia_se_resnext101_32x4d", "DGX-1 32 GB", "mixed precision", 128, 364.65, 2540.49),
    ("nvidia_se_resnext101_32x4d", "DGX-1 32 GB", "FP32", 64, 123.46, 959.94),
)
"""Every row of the three tables, in the READMEs' order.  SE-ResNeXt is NVIDIA's variant (every
gate squeezes to 16 channels: ``image_classification/resnet.py``, ``SEBottleneck``)."""


def convnets_2020_job(model: str, machine: str, precision: str, batch: int, single: float
                      ) -> Job:
    """The recipe on all 8 GPUs of ``machine`` at ``single`` images/s per GPU alone."""
    device, intra, network, gpus = MACHINES[machine]
    mixed = precision == "mixed precision"
    return Job(model=model, gpus=gpus, topology=str(gpus), algorithm="ring", device=device,
               intra=intra, network=network, batch=batch, bucket_mb=APEX_BUCKET_MB,
               compute_time=batch / single, stack="nccl", mixed_precision=mixed,
               channels_last=mixed and model != "resnet50")


def _case(model: str, machine: str, precision: str, batch: int, single: float,
          every: float) -> Case:
    label, directory = DLE_MODELS[model]
    job = convnets_2020_job(model, machine, precision, batch, single)
    return Case(
        f"NVIDIA {label} (2020), {machine}, {precision}", "efficiency", every / (8 * single),
        f"one {machine} (8 GPUs), apex DDP (10M-element buckets, float32 gradients, "
        f"overlapped), DALI on the CPU, {'NHWC' if job.channels_last else 'NCHW'}, {batch} "
        f"images/GPU, {precision}"
        f"{' (apex amp O1)' if precision == 'mixed precision' else ''}, one GPU at the "
        f"published {single} images/s",
        f"{CONVNETS_2020.format(directory)}, training performance tables: {single} and {every} "
        "images/s",
        weak_scaling(against_one_gpu(job)))


CONVNETS_2020_CASES = tuple(_case(*run) for run in CONVNETS_2020_RUNS)
"""The recipe's 2020 points in the tables' order."""
