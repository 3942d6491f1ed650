"""NVIDIA's image classification recipes with Horovod on one DGX: ResNet-50 v1.5 in TensorFlow and
MXNet, ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d in TensorFlow; published scaling points
(docs/simulation.md, "Reproducing published results"), and what the PyTorch recipe's points
(``cases_dle_pytorch``) share with them.

Every GPU of a DGX A100, a DGX-1 and a DGX-2 against one of them, each single-GPU rate of the
tables as the measured compute (``compute_time``); TensorFlow and MXNet run Horovod over NCCL
(the stack's fusion, and its cycle unless the recipe sets one).
"""

from __future__ import annotations

from collections.abc import Callable

from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["DLE_CASES", "DLE_MODELS", "DLE_MX", "DLE_PYT", "DLE_TF"]

DLE_PYT = "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/{}/README.md"
"""The PyTorch recipe's README of one model (its directory name)."""
DLE_MX = ("NVIDIA/DeepLearningExamples MxNet/Classification/RN50v1.5/README.md (commit "
          "1bd98ac: mxnet-20.12-py3 on the DGX-1 and DGX-2, mxnet-22.10-py3 on the DGX A100 "
          "80 GB), training performance tables")
DLE_TF = ("NVIDIA/DeepLearningExamples TensorFlow/Classification/ConvNets/{}/README.md "
          "(commit 1d4211f, TensorFlow 20.06-tf1-py3 NGC container), training performance "
          "tables")
"""The TensorFlow recipe's README of one model (its directory name)."""
TF_WITHOUT_XLA = frozenset({("resnext101_32x4d", "DGX-1 V100 16 GB"),
                            ("resnext101_32x4d", "DGX-2")})
"""TensorFlow tables whose header does not say XLA (the script measures with and without)."""


def _dle(device: str, intra: str, batch: int, images_per_s: float, stack: str = "nccl",
         gpus: int = 8, cycle_ms: float | None = None, mixed: bool = False,
         model: str = "resnet50", nodes: int = 1) -> Callable[[bool], tuple[Job, Job]]:
    # NVIDIA's image classification recipes on one DGX, one process per GPU: torch DDP over NCCL
    # (25 MB buckets) or, in TensorFlow and MXNet, Horovod over NCCL (the stack's fusion, and
    # its cycle unless the recipe sets one); mixed precision runs NHWC in every recipe
    # (configs.yml's memory_format, MXNet's runner's layouts, TensorFlow's NHWC default); on
    # several ``nodes`` (DGX A100) each has 8 HDR InfiniBand ports, one per GPU (its datasheet)
    topology = str(gpus) if nodes == 1 else f"{gpus // nodes}x{nodes}"
    job = Job(model=model, gpus=gpus, topology=topology, algorithm="ring", device=device,
              intra=intra, network="ib-hdr-x8", batch=batch, stack=stack,
              compute_time=batch / images_per_s, cycle_ms=cycle_ms, mixed_precision=mixed,
              channels_last=mixed)
    return against_one_gpu(job)


DGX = {  # machine: the device preset standing in for its GPUs, the link preset between them, GPUs
    "DGX A100": ("a100", "nvlink3", 8),
    "DGX-1 V100 16 GB": ("v100", "nvlink2", 8),
    "DGX-2": ("v100", "nvswitch-v100", 16),
}
DLE_HOROVOD_RUNS = (  # recipe, model, machine, precision, batch/GPU, images/s on one GPU, all
    ("TensorFlow", "resnet50", "DGX A100", "TF32", 256, 909, 7000),
    ("TensorFlow", "resnet50", "DGX A100", "mixed precision", 256, 2375, 17400),
    ("TensorFlow", "resnet50", "DGX-1 V100 16 GB", "FP32", 128, 412, 3170),
    ("TensorFlow", "resnet50", "DGX-1 V100 16 GB", "mixed precision", 256, 1270, 9510),
    ("TensorFlow", "resnet50", "DGX-2", "FP32", 128, 432, 6500),
    ("TensorFlow", "resnet50", "DGX-2", "mixed precision", 256, 1300, 17250),
    ("MXNet", "resnet50", "DGX A100", "TF32", 512, 1055.78, 8247.44),
    ("MXNet", "resnet50", "DGX A100", "mixed precision", 512, 3410.52, 26673.72),
    ("MXNet", "resnet50", "DGX-1 V100 16 GB", "FP32", 96, 384, 3005),
    ("MXNet", "resnet50", "DGX-1 V100 16 GB", "mixed precision", 192, 1376, 10723),
    ("MXNet", "resnet50", "DGX-2", "FP32", 128, 417, 6338),
    ("MXNet", "resnet50", "DGX-2", "mixed precision", 256, 1492, 21484),
    ("TensorFlow", "resnext101_32x4d", "DGX A100", "TF32", 128, 371, 2854),
    ("TensorFlow", "resnext101_32x4d", "DGX A100", "mixed precision", 256, 1132, 8500),
    ("TensorFlow", "resnext101_32x4d", "DGX-1 V100 16 GB", "FP32", 64, 166, 1210),
    ("TensorFlow", "resnext101_32x4d", "DGX-1 V100 16 GB", "mixed precision", 128, 566, 4160),
    ("TensorFlow", "resnext101_32x4d", "DGX-2", "FP32", 64, 170, 2500),
    ("TensorFlow", "resnext101_32x4d", "DGX-2", "mixed precision", 128, 572, 7750),
    ("TensorFlow", "se_resnext101_32x4d", "DGX A100", "TF32", 128, 342, 2610),
    ("TensorFlow", "se_resnext101_32x4d", "DGX A100", "mixed precision", 256, 975, 7230),
    ("TensorFlow", "se_resnext101_32x4d", "DGX-1 V100 16 GB", "FP32", 64, 152, 1120),
    ("TensorFlow", "se_resnext101_32x4d", "DGX-1 V100 16 GB", "mixed precision", 96, 475, 3360),
    ("TensorFlow", "se_resnext101_32x4d", "DGX-2", "FP32", 64, 158, 2270),
    ("TensorFlow", "se_resnext101_32x4d", "DGX-2", "mixed precision", 96, 472, 6580),
)
"""The recipes with Horovod over NCCL, every GPU of a DGX A100, a DGX-1 and a DGX-2 (16 V100 32 GB
on NVSwitch) against one.  In TensorFlow (DLE_TF), reading ImageNet TFRecords through tf.data
(training/training_perf.sh passes --data_dir and no DALI flag), with XLA where the table says so,
at Horovod's default cycle; its SE-ResNeXt gates squeeze by 16 (``model_architectures``' se_ratio,
the paper's), not to 16 channels as the PyTorch recipe's.  In MXNet (DLE_MX), ``runner`` launches
Horovod (``horovodrun``, 64 MiB fusion, HOROVOD_CYCLE_TIME 0.1 ms) and DALI decodes ImageNet
RecordIO on the GPUs, batch per GPU from each table's ``benchmark.py -b`` command.  The ResNeXt
rows were added after every preset was set."""

MX_CYCLE_MS = 0.1
"""HOROVOD_CYCLE_TIME the MXNet recipe's ``runner`` sets (ms)."""

RECIPES = {"TensorFlow": (DLE_TF, None, " with XLA"),
           "MXNet": (DLE_MX, MX_CYCLE_MS, " with DALI decoding on the GPUs")}
"""Each Horovod recipe's source, cycle (None: the horovod stack's) and how it ran."""

A100_PART = {"TensorFlow": "a100", "MXNet": "a100-80gb"}
"""The DGX A100 each recipe's tables ran on: 8 A100 40 GB for TensorFlow 20.06 (the same
README's accuracy section names the machine), 8 A100 80 GB for mxnet-22.10 (DLE_MX)."""


def _dle_horovod(framework: str, model: str, machine: str, precision: str, batch: int,
                 single: float, every: float) -> Case:
    """One row pair of a Horovod recipe's tables: every GPU of the machine against one."""
    device, intra, gpus = DGX[machine]
    device = A100_PART[framework] if device == "a100" else device
    source, cycle_ms, how = RECIPES[framework]
    how = "" if (model, machine) in TF_WITHOUT_XLA else how
    cycle = "cycle" if cycle_ms is None else f"{cycle_ms:g} ms cycle"
    label, directory = DLE_MODELS[model]
    return Case(
        f"NVIDIA {label} in {framework}, {machine}, {precision}", "efficiency",
        every / (gpus * single),
        f"one {machine.split(' V100')[0]} ({gpus} GPUs), Horovod over NCCL ({cycle} and 64 MiB "
        f"fusion{' as preset' if cycle_ms is None else ''}), {batch} images/GPU, {precision}"
        f"{how}, one GPU at {single} images/s",
        f"{source.format(directory)}: {single} and {every} images/s",
        weak_scaling(_dle(device, intra, batch, single, "horovod", gpus, cycle_ms,
                          precision == "mixed precision", model)))


DLE_MODELS = {  # registry name: the name in the tables, the README's directory
    "resnet50": ("ResNet-50 v1.5", "resnet50v1.5"),
    "resnext101_32x4d": ("ResNeXt-101 32x4d", "resnext101-32x4d"),
    "se_resnext101_32x4d": ("SE-ResNeXt-101 32x4d", "se-resnext101-32x4d"),
    "nvidia_se_resnext101_32x4d": ("SE-ResNeXt-101 32x4d", "se-resnext101-32x4d"),
    "efficientnet_b0": ("EfficientNet-B0", "efficientnet"),
    "efficientnet_b4": ("EfficientNet-B4", "efficientnet"),
}
DLE_CASES = tuple(_dle_horovod(*run) for run in DLE_HOROVOD_RUNS)
"""The Horovod recipes' points in table order (the PyTorch recipe's: ``cases_dle_pytorch``)."""
