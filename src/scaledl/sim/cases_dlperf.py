"""NVIDIA's PyTorch recipes for ResNet-50 v1.5 and BERT-base as measured by a third party, on 1
to 4 servers of 8 V100 with one EDR InfiniBand port each: published scaling points added after
every preset was set, and predicted with none changed (docs/simulation.md, "Reproducing
published results").

Source (``DLPERF``): Oneflow-Inc/DLPerf, ``reports/dlperf_benchmark_test_report_v1.md`` (October
2020: the machines) and the two READMEs under ``NVIDIADeepLearningExamples/PyTorch/``
(``resnet50v1.5``, ``BERT``: the tables, scripts and logs), read at commit c89430b.  Each row is
the median of 5 runs of 100 timed iterations after 20.

- The machines: 4 nodes, each 8 Tesla V100-SXM2-16GB joined by NVLink in the DGX-1's hybrid cube
  mesh (the report's ``nvidia-smi topo -m``: pairs joined by one or two NVLinks), one Mellanox
  MT27700 (ConnectX-4) port of 100 Gb/s EDR InfiniBand per node (``ib-edr``), two Xeon Gold
  5118; the pytorch:20.03-py3 container (NCCL 2.5.6, DALI 0.19).
- ResNet-50 v1.5 (DeepLearningExamples ``PyTorch/Classification/ConvNets`` at commit 5cc03ca as
  DLPerf names it, whose ``ConvNets`` tree is 46ff370's,
  ``main.py`` and ``image_classification/training.py``): apex's DistributedDataParallel with its
  defaults (buckets of 10 million elements, overlapped with backward); ImageNet JPEGs decoded by
  DALI on the CPU (``--data-backend dali-cpu``); NCHW at both precisions (the scripts set no
  memory format); ``--amp`` is apex amp O1, whose weights and gradients stay float32; 128
  images per GPU at FP32 and 256 at mixed precision (dynamic loss scale).
- BERT-base pre-training, phase 1 (sequence length 128; DeepLearningExamples
  ``PyTorch/LanguageModeling/BERT`` at commit 26c2676, ``run_pretraining.py``, with FusedAdam in
  place of LAMB as DLPerf's README says): no accumulation and no
  ``--allreduce_post_accumulation``, so apex's DistributedDataParallel with a message size of
  250 million elements, more than BERT-base's 110 million parameters: one bucket, reduced when
  backward has ended; ``--fp16`` is apex amp O2, whose model and gradients are float16; 32 and
  48 sequences per GPU at FP32, 64 and 96 at FP16 (dynamic loss scale).
- Each single-GPU rate of the tables as the measured compute (``compute_time``); apex DDP's
  per-call and per-tensor costs are taken as torch DDP's (the ``nccl`` stack), as for the BERT
  SQuAD rows (:mod:`scaledl.sim.cases_bert`).
"""

from __future__ import annotations

from dataclasses import replace

from scaledl.sim.cases_bert import APEX_BUCKET_MB
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["DLPERF_CASES", "DLPERF", "DLPERF_RUNS", "APEX_ONE_BUCKET_MB", "MODELS",
           "single_gpu_rates", "servers"]

DLPERF = ("Oneflow-Inc/DLPerf NVIDIADeepLearningExamples/PyTorch/{}/README.md and "
          "reports/dlperf_benchmark_test_report_v1.md (commit c89430b; October 2020, "
          "pytorch:20.03-py3 NGC container)")
"""The source, formatted with the README's directory."""
APEX_ONE_BUCKET_MB = 250_000_000 * 4 / (1 << 20)
"""The BERT recipe's apex DDP message size, 250 million elements, as MiB of float32 gradients:
more than the model, so one bucket."""

MODELS = {  # model: the name in the tables, the README's directory, the sample, its unit
    "resnet50": ("ResNet-50 v1.5", "resnet50v1.5", None, "images"),
    "bert_base": ("BERT-base pre-training, sequence 128", "BERT", (128,), "sequences"),
}
DLPERF_RUNS = (  # model, precision, batch per GPU, samples/s on one GPU, GPUs, on all
    ("resnet50", "FP32", 128, 367.29, 8, 2887.65),
    ("resnet50", "FP32", 128, 367.29, 16, 5716.79),
    ("resnet50", "FP32", 128, 367.29, 32, 10917.09),
    ("resnet50", "mixed precision", 256, 802.9, 8, 6154.66),
    ("resnet50", "mixed precision", 256, 802.9, 16, 11991.94),
    ("resnet50", "mixed precision", 256, 802.9, 32, 22551.16),
    ("bert_base", "FP32", 32, 119.6, 8, 921.32),
    ("bert_base", "FP32", 32, 119.6, 16, 1499.4),
    ("bert_base", "FP32", 32, 119.6, 32, 2885.81),
    ("bert_base", "mixed precision", 64, 444.51, 8, 3251.7),
    ("bert_base", "mixed precision", 64, 444.51, 16, 4936.92),
    ("bert_base", "mixed precision", 64, 444.51, 32, 9331.72),
    ("bert_base", "FP32", 48, 121.94, 8, 928.01),
    ("bert_base", "FP32", 48, 121.94, 16, 1584.32),
    ("bert_base", "FP32", 48, 121.94, 32, 3039.3),
    ("bert_base", "mixed precision", 96, 462.35, 8, 3287.12),
    ("bert_base", "mixed precision", 96, 462.35, 16, 5426.07),
    ("bert_base", "mixed precision", 96, 462.35, 32, 10349.12),
)
"""Every multi-GPU row of the tables: ResNet-50 at 128 (FP32) and 256 (AMP) images per GPU,
BERT-base at 32 and 48 (FP32) and 64 and 96 (FP16) sequences per GPU, all with a dynamic loss
scale; the static loss scale's rows, run on one server only, are left out."""


def single_gpu_rates() -> tuple[tuple[str, str, int, float, str], ...]:
    """Each distinct one-GPU rate of the tables: model, precision, batch per GPU, samples/s and
    how the recipe trained (for the single-GPU rate checks, ``scaledl.sim.device_checks``)."""
    how = {("resnet50", "FP32"): "FP32", ("resnet50", "mixed precision"): "AMP (apex O1), NCHW",
           ("bert_base", "FP32"): "FP32, FusedAdam",
           ("bert_base", "mixed precision"): "FP16 (apex O2), FusedAdam"}
    rates = dict.fromkeys((model, precision, batch, single)
                          for model, precision, batch, single, _, _ in DLPERF_RUNS)
    return tuple((*rate, how[rate[0], rate[1]]) for rate in rates)


def servers(gpus: int) -> tuple[Job, str]:
    """``gpus`` GPUs (8 per server) of DLPerf's servers as a job to fill in (model, batch,
    buckets, compute), and as the reproduction table's setup column names them."""
    nodes = gpus // 8
    where = "one server of 8 V100 16 GB" if nodes == 1 else f"{nodes} servers of 8 V100 16 GB"
    return (Job(gpus=gpus, topology="8" if gpus == 8 else f"8x{nodes}", algorithm="ring",
                device="v100", intra="nvlink2", network="ib-edr", stack="nccl"),
            f"{where} (8x{nodes}: NVLink hybrid cube mesh, one EDR InfiniBand port per node)")


def _job(model: str, precision: str, batch: int, single: float, gpus: int) -> Job:
    _, _, shape, _ = MODELS[model]
    mixed = precision == "mixed precision"
    bert = model == "bert_base"
    return replace(servers(gpus)[0], model=model, input_shape=shape, batch=batch,
                   bucket_mb=APEX_ONE_BUCKET_MB if bert else APEX_BUCKET_MB,
                   allreduce_bytes=2 if mixed and bert else 4, compute_time=batch / single,
                   mixed_precision=mixed)


def _case(model: str, precision: str, batch: int, single: float, gpus: int,
          every: float) -> Case:
    label, directory, _, unit = MODELS[model]
    if model == "bert_base":
        how = (f"apex DDP, one {'float16' if precision != 'FP32' else 'float32'} allreduce "
               f"after backward")
    else:
        how = "apex DDP (10M-element buckets, float32, overlapped), DALI on the CPU, NCHW"
    return Case(
        f"DLPerf, NVIDIA {label}, {gpus} V100, {precision}, batch {batch}", "efficiency",
        every / (gpus * single),
        f"{servers(gpus)[1]}, {how}, {batch} {unit}/GPU, {precision}, one GPU at the published "
        f"{single} {unit}/s",
        f"{DLPERF.format(directory)}: {single} and {every} {unit}/s",
        weak_scaling(against_one_gpu(_job(model, precision, batch, single, gpus))))


DLPERF_CASES = tuple(_case(*run) for run in DLPERF_RUNS)
"""DLPerf's points, in the tables' order."""
