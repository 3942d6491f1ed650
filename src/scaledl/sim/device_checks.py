"""Published single-GPU training rates beside the device model's (docs/simulation.md, "Device
efficiency"): how far the FLOP-based roofline of each GPU preset can be trusted without a
measured rate (``--compute-time``) or profile (``--profile``).

Every reproduction case that states a single-GPU rate uses it as the measured compute, so
these rates check only the predictions a user gets from a preset alone.  Some of them set the
presets (``used``: the P100's and K80's compute efficiency and launch cost, the V100's and
the A100's efficiency, and the V100's on tensor cores); the others were not used for anything.
Each rate is at the preset's own precision (FP32 on the K80, P100 and V100, TF32 on the A100
and H100) or, marked ``mixed``, FP16 on tensor cores (``Job.mixed_precision``).  The H100's
and H200's rates are not published ones: this project measured them on the GPUs it was lent
(``MEASURED_H100``, ``MEASURED_H200``).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaledl.sim.cases_bert import MACHINES as BERT_MACHINES
from scaledl.sim.cases_bert_tf2 import BERT_TF2, single_gpu_rates as tf2_bert_rates
from scaledl.sim.cases_dle import DLE_MODELS
from scaledl.sim.cases_dlperf import DLPERF, MODELS as DLPERF_MODELS, single_gpu_rates
from scaledl.sim.job import Job

__all__ = ["RateCheck", "RATE_CHECKS", "predicted_rate", "rate_table"]

TF = "tensorflow/docs_src/performance/benchmarks.md (May 2017, synthetic data)"
DLE_RN50 = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md "
            "(pytorch-21.03)")
DLE_MX = ("NVIDIA/DeepLearningExamples MxNet/Classification/RN50v1.5/README.md (commit 1bd98ac), "
          "NCHW without fused kernels at float32 (its runner sets NHWC layouts for float16 only)")
DLE_CONVNETS = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/{}/README.md "
            "(pytorch-21.03)")
"""The same recipe's README for ResNeXt-101 32x4d (resnext101-32x4d), SE-ResNeXt-101 32x4d
(se-resnext101-32x4d) or EfficientNet (efficientnet: B0 at 224x224, B4 at 380x380): grouped and
depthwise convolutions and squeeze-and-excitation gates, added after every preset was set.  The
EfficientNet rates are 1.5-2.3x below the presets' estimates: the roofline does not describe
depthwise convolutions' kernels (docs/simulation.md, "Device efficiency")."""
DLE_BERT = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (January 2022, "
            "SQuAD, sequence length 384)")
MEASURED_H100 = ("measured: scaledl's model by benchmarks/device/rates.py on a lent H100 80GB HBM3 "
                 "(benchmarks/device/h100-2026-11-26; torch 2.11, cuDNN autotuning, synthetic "
                 "data on the GPU, median of 10 steps)")
"""No published rate checks the H100 preset, whose ``e`` is the A100's, carried over; these rates
were measured by this project on the one H100 a session was lent, with ``scaledl.sim.measure``
(the profiler of ``scaledl simulate profile``) under the recipes' settings: TF32 convolutions
and matrix products, or float16 autocast on NHWC images (``AMP``).  Eager PyTorch without the
recipes' fused kernels and data loaders, so the rates are a lower bound on what the device does."""
MEASURED_H200 = ("measured: scaledl's model by benchmarks/device/rates.py on a lent H200 "
                 "(benchmarks/device/h200-2026-11-26; torch 2.11, cuDNN autotuning, synthetic "
                 "data on the GPU, median of 10 steps)")
"""The same twelve configurations on the one H200 a session was lent (the H100's GH100 compute
with 1.43x its memory bandwidth): they check the h200 preset, which is the h100's with the
H200's memory, and so the roofline's memory term (the only GPU specification that differs; the
two hosts differ too)."""
_MEASURED_RATES = (  # model, batch, precision, samples/s on the H100 and on the H200
    ("resnet50", 64, "TF32", 1689.6, 1969.4), ("resnet50", 128, "TF32", 1798.4, 2125.5),
    ("resnet50", 192, "TF32", 1821.2, 2162.0), ("resnet50", 256, "TF32", 1855.3, 2210.5),
    ("resnet50", 128, "AMP", 4519.0, 4481.9), ("resnet50", 256, "AMP", 4860.5, 6020.0),
    ("resnext101_32x4d", 128, "TF32", 917.1, 1082.0),
    ("resnext101_32x4d", 128, "AMP", 2354.7, 2605.9),
    ("efficientnet_b0", 256, "TF32", 1997.8, 2170.3),
    ("efficientnet_b0", 256, "AMP", 5633.1, 5137.4),
    ("bert_large", 32, "TF32", 183.8, 212.3), ("bert_large", 32, "AMP", 268.2, 313.4),
)


_DLE_CONVNETS_RATES = {  # model: device, batch per GPU (ConvNets/configs.yml), images/s, how
    "resnext101_32x4d": (("v100", 64, 147.0, "FP32, DGX-1 16 GB"),
                         ("a100-80gb", 128, 456.0, "TF32, DGX A100"),
                         ("v100", 128, 587.0, "AMP, DGX-1 16 GB"),
                         ("a100-80gb", 128, 1211.0, "AMP, DGX A100")),
    "nvidia_se_resnext101_32x4d": (("v100", 64, 132.0, "FP32, DGX-1 16 GB"),
                                   ("a100-80gb", 128, 395.0, "TF32, DGX A100"),
                                   ("v100", 112, 443.0, "AMP, DGX-1 16 GB"),
                                   ("a100-80gb", 128, 855.0, "AMP, DGX A100")),
    "efficientnet_b0": (("v100", 64, 655.0, "FP32, DGX-1 16 GB"),
                        ("a100-80gb", 256, 1078.0, "TF32, DGX A100"),
                        ("v100", 128, 1301.0, "AMP, DGX-1 16 GB"),
                        ("a100-80gb", 256, 2489.0, "AMP, DGX A100")),
    "efficientnet_b4": (("v100", 16, 83.0, "FP32, DGX-1 16 GB"),
                        ("a100-80gb", 64, 157.0, "TF32, DGX A100"),
                        ("v100", 32, 204.0, "AMP, DGX-1 16 GB"),
                        ("a100-80gb", 128, 331.0, "AMP, DGX A100")),
}


@dataclass(frozen=True)
class RateCheck:
    """One single-GPU training rate, published (or, for the H100 and H200, measured here)."""

    device: str
    model: str
    batch: int
    published: float
    """Samples per second (images, or sequences for BERT)."""
    source: str
    input_shape: tuple[int, ...] | None = None
    used: bool = False
    """Whether the rate set the device preset (then the model meets it by construction)."""
    mixed_precision: bool = False
    """Measured with FP16 on tensor cores (AMP); otherwise at the preset's own precision."""
    channels_last: bool = False
    """The recipe's model was NHWC (``torch.channels_last``)."""


RATE_CHECKS = (
    RateCheck("p100", "resnet50", 32, 195.0, f"{TF}, DGX-1", used=True),
    RateCheck("p100", "resnet50", 64, 219.0, f"{TF}, DGX-1", used=True),
    RateCheck("k80", "resnet50", 32, 49.5, f"{TF}, Google Compute Engine", used=True),
    RateCheck("k80", "resnet50", 64, 51.9, f"{TF}, Google Compute Engine", used=True),
    RateCheck("v100", "resnet50", 32, 329.0,
              "pytorch/pytorch benchmarks/distributed/ddp/README.md (1 GPU, no DDP)", used=True),
    RateCheck("p100", "vgg16", 32, 144.0, f"{TF}, DGX-1"),
    RateCheck("p100", "vgg16", 64, 154.0, f"{TF}, DGX-1"),
    RateCheck("k80", "vgg16", 32, 35.4, f"{TF}, Google Compute Engine"),
    RateCheck("p100", "resnet101", 64, 119.4,
              "uber/horovod README.md (2017), one Pascal GPU"),
    RateCheck("v100", "resnet50", 112, 367.0, f"{DLE_RN50}, FP32, DGX-1"),
    RateCheck("a100-80gb", "resnet50", 256, 938.0, f"{DLE_RN50}, TF32, DGX A100", used=True),
    RateCheck("v100", "resnet50", 96, 384.0, f"{DLE_MX}, FP32, DGX-1 16 GB (mxnet-20.12)"),
    RateCheck("a100-80gb", "resnet50", 512, 1055.78, f"{DLE_MX}, TF32, DGX A100 80 GB "
              "(mxnet-22.10)"),
    RateCheck("v100", "bert_large", 8, 12.0, f"{DLE_BERT}, FP32, DGX-1 32 GB", (384,)),
    RateCheck("a100-80gb", "bert_large", 32, 61.5, f"{DLE_BERT}, TF32, DGX A100", (384,)),
    RateCheck("v100", "resnet50", 256, 1200.0, f"{DLE_RN50}, AMP, DGX-1", used=True,
              mixed_precision=True, channels_last=True),
    RateCheck("v100", "bert_large", 16, 52.0, f"{DLE_BERT}, AMP, DGX-1 32 GB", (384,),
              mixed_precision=True),
    RateCheck("a100-80gb", "resnet50", 256, 2470.0, f"{DLE_RN50}, AMP, DGX A100",
              mixed_precision=True, channels_last=True),
    RateCheck("a100-80gb", "bert_large", 32, 110.5, f"{DLE_BERT}, AMP, DGX A100", (384,),
              mixed_precision=True),
    *(RateCheck(device, model, batch, rate, f"{DLE_CONVNETS.format(DLE_MODELS[model][1])}, "
                f"{how}", mixed_precision=how.startswith("AMP"),
                channels_last=how.startswith("AMP"))
      for model, rates in _DLE_CONVNETS_RATES.items() for device, batch, rate, how in rates),
    *(RateCheck("v100", model, batch, rate, f"{DLPERF.format(DLPERF_MODELS[model][1])}, {how}",
                DLPERF_MODELS[model][2], mixed_precision=precision == "mixed precision")
      for model, precision, batch, rate, how in single_gpu_rates()),
    *(RateCheck(BERT_MACHINES[machine][0], "bert_large", batch, rate,
                f"{BERT_TF2}, {precision} with XLA, LAMB, one GPU of a {machine}", (sequence,),
                mixed_precision=precision == "mixed precision")
      for machine, precision, sequence, batch, rate in tf2_bert_rates()),
    *(RateCheck(gpu, model, batch, rates[column], f"{measured}, {how}",
                (384,) if model == "bert_large" else None, mixed_precision=how == "AMP",
                channels_last=how == "AMP" and model != "bert_large")
      for column, (gpu, measured) in enumerate((("h100", MEASURED_H100),
                                                ("h200", MEASURED_H200)))
      for model, batch, how, *rates in _MEASURED_RATES),
)
"""The rates, presets' own first, the H100's and H200's measured ones last."""


def predicted_rate(check: RateCheck) -> float:
    """Samples per second the device preset predicts on one GPU (compute and update)."""
    job = Job(model=check.model, input_shape=check.input_shape, gpus=1, topology="1",
              device=check.device, batch=check.batch, mixed_precision=check.mixed_precision,
              channels_last=check.channels_last)
    return check.batch / job.run().iteration_s


def rate_table(checks: tuple[RateCheck, ...] = RATE_CHECKS) -> str:
    """The published (or measured) and predicted rates as a markdown table."""
    lines = ["| device | model | batch | rate /s | predicted /s | error | set the preset | "
             "source |", "|---|---|---:|---:|---:|---:|---|---|"]
    for check in checks:
        predicted = predicted_rate(check)
        model = check.model + (f" ({'x'.join(map(str, check.input_shape))})"
                               if check.input_shape else "") + \
            (", mixed" if check.mixed_precision else "") + (", NHWC" if check.channels_last else "")
        lines.append(f"| {check.device} | {model} | {check.batch} | {check.published:g} | "
                     f"{predicted:.1f} | {round(100 * (predicted / check.published - 1)):+d}% | "
                     f"{'yes' if check.used else 'no'} | {check.source} |")
    return "\n".join(lines)
