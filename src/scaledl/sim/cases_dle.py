"""NVIDIA's ResNet-50 v1.5 recipe in PyTorch, TensorFlow and MXNet on one DGX: published
scaling points (docs/simulation.md, "Reproducing published results").

Every GPU of a DGX A100, a DGX-1 and a DGX-2 against one of them, each single-GPU rate of the
tables as the measured compute (``compute_time``); PyTorch runs torch DDP over NCCL, TensorFlow
and MXNet Horovod over NCCL (the stack's fusion, and its cycle unless the recipe sets one).
"""

from __future__ import annotations

from collections.abc import Callable

from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["DLE_CASES", "DLE", "DLE_MX", "DLE_TF"]

DLE = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md "
       "(pytorch-21.03 NGC container), training performance tables; batch per GPU from "
       "ConvNets/configs.yml")
DLE_MX = ("NVIDIA/DeepLearningExamples MxNet/Classification/RN50v1.5/README.md (commit "
          "1bd98ac: mxnet-20.12-py3 on the DGX-1 and DGX-2, mxnet-22.10-py3 on the DGX A100 "
          "80 GB), training performance tables")
DLE_TF = ("NVIDIA/DeepLearningExamples TensorFlow/Classification/ConvNets/resnet50v1.5/README.md "
          "(commit 1d4211f, TensorFlow 20.06-tf1-py3 NGC container), training performance "
          "tables")


def _dle(device: str, intra: str, batch: int, images_per_s: float, stack: str = "nccl",
         gpus: int = 8, cycle_ms: float | None = None, mixed: bool = False
         ) -> Callable[[bool], tuple[Job, Job]]:
    # NVIDIA's ResNet-50 v1.5 recipe on one DGX, one process per GPU: torch DDP over NCCL
    # (25 MB buckets) or, in TensorFlow and MXNet, Horovod over NCCL (the stack's fusion, and
    # its cycle unless the recipe sets one); mixed precision runs NHWC in every recipe
    # (configs.yml's memory_format, MXNet's runner's layouts, TensorFlow's NHWC default)
    job = Job(model="resnet50", gpus=gpus, topology=str(gpus), algorithm="ring", device=device,
              intra=intra, batch=batch, stack=stack, compute_time=batch / images_per_s,
              cycle_ms=cycle_ms, mixed_precision=mixed, channels_last=mixed)
    return against_one_gpu(job)


DGX = {  # machine: the device preset standing in for its GPUs, the link preset between them, GPUs
    "DGX A100": ("a100", "nvlink3", 8),
    "DGX-1 V100 16 GB": ("v100", "nvlink2", 8),
    "DGX-2": ("v100", "nvswitch-v100", 16),
}
DLE_HOROVOD_RUNS = (  # recipe, machine, precision, batch per GPU, images/s on one GPU and all
    ("TensorFlow", "DGX A100", "TF32", 256, 909, 7000),
    ("TensorFlow", "DGX A100", "mixed precision", 256, 2375, 17400),
    ("TensorFlow", "DGX-1 V100 16 GB", "FP32", 128, 412, 3170),
    ("TensorFlow", "DGX-1 V100 16 GB", "mixed precision", 256, 1270, 9510),
    ("TensorFlow", "DGX-2", "FP32", 128, 432, 6500),
    ("TensorFlow", "DGX-2", "mixed precision", 256, 1300, 17250),
    ("MXNet", "DGX A100", "TF32", 512, 1055.78, 8247.44),
    ("MXNet", "DGX A100", "mixed precision", 512, 3410.52, 26673.72),
    ("MXNet", "DGX-1 V100 16 GB", "FP32", 96, 384, 3005),
    ("MXNet", "DGX-1 V100 16 GB", "mixed precision", 192, 1376, 10723),
    ("MXNet", "DGX-2", "FP32", 128, 417, 6338),
    ("MXNet", "DGX-2", "mixed precision", 256, 1492, 21484),
)
"""The same recipe with Horovod over NCCL, every GPU of a DGX A100, a DGX-1 and a DGX-2 (16
V100 32 GB on NVSwitch) against one.  In TensorFlow (DLE_TF) with XLA, reading ImageNet
TFRecords through tf.data (training/training_perf.sh passes --data_dir and no DALI flag), at
Horovod's default cycle; in MXNet (DLE_MX), ``runner`` launches Horovod (``horovodrun``, 64 MiB
fusion, HOROVOD_CYCLE_TIME 0.1 ms) and DALI decodes ImageNet RecordIO on the GPUs, batch per GPU
from each table's ``benchmark.py -b`` command."""

MX_CYCLE_MS = 0.1
"""HOROVOD_CYCLE_TIME the MXNet recipe's ``runner`` sets (ms)."""

RECIPES = {"TensorFlow": (DLE_TF, None, "with XLA"),
           "MXNet": (DLE_MX, MX_CYCLE_MS, "with DALI decoding on the GPUs")}
"""Each Horovod recipe's source, cycle (None: the horovod stack's) and how it ran."""

A100_PART = {"TensorFlow": "a100", "MXNet": "a100-80gb"}
"""The DGX A100 each recipe's tables ran on: 8 A100 40 GB for TensorFlow 20.06 (the same
README's accuracy section names the machine), 8 A100 80 GB for mxnet-22.10 (DLE_MX)."""


def _dle_horovod(framework: str, machine: str, precision: str, batch: int, single: float,
                 every: float) -> Case:
    """One row pair of a Horovod recipe's tables: every GPU of the machine against one."""
    device, intra, gpus = DGX[machine]
    device = A100_PART[framework] if device == "a100" else device
    source, cycle_ms, how = RECIPES[framework]
    cycle = "cycle" if cycle_ms is None else f"{cycle_ms:g} ms cycle"
    return Case(
        f"NVIDIA ResNet-50 v1.5 in {framework}, {machine}, {precision}", "efficiency",
        every / (gpus * single),
        f"one {machine.split(' V100')[0]} ({gpus} GPUs), Horovod over NCCL ({cycle} and 64 MiB "
        f"fusion{' as preset' if cycle_ms is None else ''}), {batch} images/GPU, {precision} "
        f"{how}, one GPU at {single} images/s",
        f"{source}: {single} and {every} images/s",
        weak_scaling(_dle(device, intra, batch, single, "horovod", gpus, cycle_ms,
                          precision == "mixed precision")))


DLE_CASES = (
    Case("NVIDIA ResNet-50 v1.5, DGX A100, TF32", "efficiency", 7248 / (8 * 938),
         "one DGX A100 (8 A100 80 GB on NVSwitch), PyTorch DDP over NCCL, 25 MB buckets, "
         "256 images/GPU, TF32, one GPU at the published 938 images/s",
         DLE + ": 938 and 7248 images/s", weak_scaling(_dle("a100-80gb", "nvlink3", 256, 938))),
    Case("NVIDIA ResNet-50 v1.5, DGX A100, mixed precision", "efficiency", 16621 / (8 * 2470),
         "as above with AMP (fp16 compute, fp32 gradients: the same bytes), one GPU at "
         "2470 images/s",
         DLE + ": 2470 and 16621 images/s", weak_scaling(_dle("a100-80gb", "nvlink3", 256, 2470,
                                                          mixed=True))),
    Case("NVIDIA ResNet-50 v1.5, DGX-1 V100 16 GB, FP32", "efficiency", 2855 / (8 * 367),
         "one DGX-1 (8 V100 16 GB on NVLink), PyTorch DDP over NCCL, 25 MB buckets, "
         "112 images/GPU, FP32, one GPU at the published 367 images/s",
         DLE + ": 367 and 2855 images/s", weak_scaling(_dle("v100", "nvlink2", 112, 367))),
    Case("NVIDIA ResNet-50 v1.5, DGX-1 V100 16 GB, mixed precision", "efficiency",
         8322 / (8 * 1200),
         "as above with AMP at 256 images/GPU (fp32 gradients), one GPU at 1200 images/s",
         DLE + ": 1200 and 8322 images/s",
         weak_scaling(_dle("v100", "nvlink2", 256, 1200, mixed=True))),
    *(_dle_horovod(*run) for run in DLE_HOROVOD_RUNS),
)
"""The recipe's points: PyTorch's four, then the Horovod recipes' in table order."""
