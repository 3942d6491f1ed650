"""NVIDIA's image classification recipe in PyTorch (DeepLearningExamples
``PyTorch/Classification/ConvNets``): published scaling points of ResNet-50 v1.5, ResNeXt-101
32x4d, SE-ResNeXt-101 32x4d, EfficientNet-B0 and EfficientNet-B4 (docs/simulation.md,
"Reproducing published results").

Every table here was measured in the pytorch-21.03 NGC container with torch DDP over NCCL (25 MB
buckets) on ImageNet JPEGs decoded by PyTorch's DataLoader (``data_backend: pytorch``), batch per
GPU and NHWC at mixed precision from ``ConvNets/configs.yml`` at commit 7bdfc81 (April 2021),
each single-GPU rate as the measured compute.  One DGX's 8 GPUs, and for EfficientNet on a DGX
A100 up to 8 of them (64 GPUs), against one GPU.  Only the ResNet-50 rows were there when the
presets were set; the ResNeXt and EfficientNet rows check models with grouped and depthwise
convolutions, squeeze-and-excitation gates and, for EfficientNet, several nodes.
"""

from __future__ import annotations

from scaledl.sim.cases_dle import DLE_MODELS, DLE_PYT, _dle
from scaledl.sim.reproduce import Case, weak_scaling

__all__ = ["DLE_PYTORCH_CASES", "DLE_PYTORCH_MACHINES", "DLE_PYTORCH_RUNS"]

DLE_PYTORCH_MACHINES = {  # machine: the device preset, the link preset, how the GPUs are joined
    "DGX A100": ("a100-80gb", "nvlink3", "8 A100 80 GB on NVSwitch"),
    "DGX-1 V100 16 GB": ("v100", "nvlink2", "8 V100 16 GB on NVLink"),
}
DLE_PYTORCH_RUNS = (  # model, machine, precision, batch per GPU, images/s on one GPU, GPUs, all
    ("resnet50", "DGX A100", "TF32", 256, 938, 8, 7248),
    ("resnet50", "DGX A100", "mixed precision", 256, 2470, 8, 16621),
    ("resnet50", "DGX-1 V100 16 GB", "FP32", 112, 367, 8, 2855),
    ("resnet50", "DGX-1 V100 16 GB", "mixed precision", 256, 1200, 8, 8322),
    ("resnext101_32x4d", "DGX A100", "TF32", 128, 456, 8, 3471),
    ("resnext101_32x4d", "DGX A100", "mixed precision", 128, 1211, 8, 7925),
    ("resnext101_32x4d", "DGX-1 V100 16 GB", "FP32", 64, 147, 8, 1133),
    ("resnext101_32x4d", "DGX-1 V100 16 GB", "mixed precision", 128, 587, 8, 4065),
    ("nvidia_se_resnext101_32x4d", "DGX A100", "TF32", 128, 395, 8, 2991),
    ("nvidia_se_resnext101_32x4d", "DGX A100", "mixed precision", 128, 855, 8, 5779),
    ("nvidia_se_resnext101_32x4d", "DGX-1 V100 16 GB", "FP32", 64, 132, 8, 1004),
    ("nvidia_se_resnext101_32x4d", "DGX-1 V100 16 GB", "mixed precision", 112, 443, 8, 2971),
    ("efficientnet_b0", "DGX A100", "TF32", 256, 1078, 8, 8193),
    ("efficientnet_b0", "DGX A100", "TF32", 256, 1078, 16, 16137),
    ("efficientnet_b0", "DGX A100", "mixed precision", 256, 2489, 8, 16652),
    ("efficientnet_b0", "DGX A100", "mixed precision", 256, 2489, 16, 29332),
    ("efficientnet_b4", "DGX A100", "TF32", 64, 157, 8, 1223),
    ("efficientnet_b4", "DGX A100", "TF32", 64, 157, 16, 2417),
    ("efficientnet_b4", "DGX A100", "TF32", 64, 157, 32, 4813),
    ("efficientnet_b4", "DGX A100", "TF32", 64, 157, 64, 9146),
    ("efficientnet_b4", "DGX A100", "mixed precision", 128, 331, 8, 2570),
    ("efficientnet_b4", "DGX A100", "mixed precision", 128, 331, 16, 4813),
    ("efficientnet_b4", "DGX A100", "mixed precision", 128, 331, 32, 9425),
    ("efficientnet_b4", "DGX A100", "mixed precision", 128, 331, 64, 18900),
    ("efficientnet_b0", "DGX-1 V100 16 GB", "FP32", 64, 655, 8, 4672),
    ("efficientnet_b0", "DGX-1 V100 16 GB", "mixed precision", 128, 1301, 8, 7789),
    ("efficientnet_b4", "DGX-1 V100 16 GB", "FP32", 16, 83, 8, 616),
    ("efficientnet_b4", "DGX-1 V100 16 GB", "mixed precision", 32, 204, 8, 1366),
)
"""The tables' rows.  EfficientNet's README (``efficientnet/README.md``) gives B0 and B4 at TF32
and mixed precision on 1, 8 and 16 (B4: up to 64) A100 80 GB and on 1 and 8 V100 16 GB; its
widese variants (wider gates) and its DGX-1 32 GB table (whose 8-GPU rows read 17.6x of one
GPU) are left out.  More than one DGX A100: their 8 HDR InfiniBand ports each (``ib-hdr-x8``,
the DGX A100 datasheet; the README names no network)."""


def _name(label: str, machine: str, gpus: int, precision: str) -> str:
    nodes = f"{gpus // 8} {machine}" if gpus > 8 else machine
    return f"NVIDIA {label}, {nodes}, {precision}"


def _dle_pytorch(model: str, machine: str, precision: str, batch: int, single: float,
                 gpus: int, every: float) -> Case:
    """One row pair of the recipe's tables: ``gpus`` GPUs against one."""
    label, directory = DLE_MODELS[model]
    device, intra, joined = DLE_PYTORCH_MACHINES[machine]
    mixed = precision == "mixed precision"
    where = (f"one {machine.split(' V100')[0]} ({joined})" if gpus <= 8 else
             f"{gpus // 8} {machine} ({joined}, 8x{gpus // 8}, 8 HDR InfiniBand ports per node)")
    return Case(
        _name(label, machine, gpus, precision), "efficiency", every / (gpus * single),
        f"{where}, PyTorch DDP over NCCL, 25 MB buckets, {batch} images/GPU, {precision}"
        f"{' (NHWC, fp32 gradients)' if mixed else ''}, one GPU at the published {single} "
        "images/s",
        f"{DLE_PYT.format(directory)} (pytorch-21.03 NGC container), training performance "
        f"tables: {single} and {every} images/s",
        weak_scaling(_dle(device, intra, batch, single, gpus=gpus, mixed=mixed, model=model,
                          nodes=max(1, gpus // 8))))


DLE_PYTORCH_CASES = tuple(_dle_pytorch(*run) for run in DLE_PYTORCH_RUNS)
"""The recipe's points in the tables' order."""
