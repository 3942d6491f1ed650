"""The published points ``scaledl simulate reproduce`` predicts (docs/simulation.md).

Every case uses the presets as they are; what varies is only what its source states: model,
GPU, batch per GPU, GPUs per host and hosts, network, collective algorithm, software stack
(its per-call cost and, for Horovod, its cycle and fusion buffer) and, where the source
measured it, the single-GPU rate (``compute_time``), which replaces the device preset's
estimate as a measured profile would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from scaledl.sim.cases_bert import BERT_CASES
from scaledl.sim.cases_bert2019 import BERT_2019_CASES
from scaledl.sim.cases_bert2020 import BERT_2020_CASES
from scaledl.sim.cases_bert_tf2 import BERT_TF2_CASES
from scaledl.sim.cases_convnets2020 import CONVNETS_2020_CASES
from scaledl.sim.cases_dle import DLE_CASES
from scaledl.sim.cases_dle_pytorch import DLE_PYTORCH_CASES
from scaledl.sim.cases_dlperf import DLPERF_CASES
from scaledl.sim.cases_horovod import HOROVOD_CASES
from scaledl.sim.cases_megatron import MEGATRON_CASES
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, Prediction, against_one_gpu, weak_scaling

__all__ = ["CASES", "FAMILIES", "IMAGENET_TRAIN_IMAGES"]

IMAGENET_TRAIN_IMAGES = 1_281_167
"""ILSVRC-2012 training set size."""

TF = "tensorflow/tensorflow tensorflow/docs_src/performance/benchmarks.md (May 2017)"
DDP = "pytorch/pytorch benchmarks/distributed/ddp/README.md (PyTorch 1.4, NCCL)"


def _ddl(ideal: bool) -> Prediction:
    job = Job(model="resnet50", gpus=256, topology="4x16x4", algorithm="torus", device="p100",
              network="ib-edr", intra="nvlink1", batch=32, stack="mpi", ideal=ideal)
    result = job.run()
    minutes = 90 * IMAGENET_TRAIN_IMAGES / result.samples_per_s / 60
    return Prediction(result.efficiency,
                      f"90 epochs in {minutes:.0f} min ({result.samples_per_s / 256:.0f} "
                      f"images/s/GPU, comm share {result.communication_share:.1%})", job)


def _scaffe(ideal: bool) -> Prediction:
    base = Job(model="googlenet", device="k80", network="ib-fdr", intra="pcie3",
               strategy="reduce-broadcast", algorithm="hierarchical", stack="mpi", ideal=ideal)
    small = replace(base, gpus=32, topology="16x2", batch=80).run()
    big = replace(base, gpus=160, topology="16x10", batch=16)
    large = big.run()
    speedup = small.iteration_s / large.iteration_s
    return Prediction(speedup, f"{speedup / 5:.0%} of linear; comm share "
                               f"{small.communication_share:.0%} -> "
                               f"{large.communication_share:.0%}", big)


def _you(ideal: bool) -> Prediction:
    parts, share = [], 0.0
    for side in (64, 224):
        base = Job(model="alexnet", input_shape=(3, side, side), gpus=8, topology="8",
                   device="k80", intra="pcie3", batch=64, ideal=ideal)
        original = replace(base, strategy="easgd").run()
        sync = replace(base, strategy="sync-easgd", algorithm="tree", overlap=True).run()
        share = original.communication_share if side == 64 else share
        parts.append(f"{side}x{side}: {original.communication_share:.0%} vs "
                     f"{sync.communication_share:.0%}")
    return Prediction(share, "original vs Sync EASGD comm share, " + "; ".join(parts))


def _goyal(ideal: bool) -> tuple[Job, Job]:
    job = Job(model="resnet50", device="p100", network="50gbe", intra="nvlink1", batch=32,
              algorithm="hierarchical", stack="nccl", ideal=ideal)
    return replace(job, gpus=8, topology="8"), replace(job, gpus=256, topology="8x32")


def _dgx1(model: str, batch: int, images_per_s: float, gpus: int
          ) -> Callable[[bool], tuple[Job, Job]]:
    # tf_cnn_benchmarks "replicated (with NCCL)": one NCCL 1.x allreduce per gradient tensor,
    # its single ring in device order; on 8 GPUs the hops 3 -> 4 and 7 -> 0 have no NVLink and
    # no peer access, so their copies are staged through host memory (4x2, dgx1-p100-staged)
    job = Job(model=model, gpus=gpus, topology="4x2" if gpus == 8 else str(gpus),
              algorithm="ring", device="p100", network="dgx1-p100-staged", intra="nvlink1-dgx1",
              batch=batch, bucket_mb=1e-6, stack="tf-replicated",
              compute_time=batch / images_per_s)
    return against_one_gpu(job)


HOST_HOPS = ("; NCCL 1's one ring in device order crosses from GPU 3 to 4 and 7 to 0, pairs "
             "without NVLink or peer access, staged through host memory at 10.1 GB/s (4x2)")
TF_DGX1_RUNS = (  # model, its name, batch per GPU, the table, images/s on 1, 2, 4 and 8 GPUs
    ("vgg16", "VGG16", 64, "training synthetic data", (154, 295, 584, 1081)),
    ("vgg16", "VGG16", 32, "other results (batch 32)", (144, 281, 549, 820)),
    ("alexnet", "AlexNet", 512, "training synthetic data", (2987, 5658, 10509, 17822)),
)
"""The DGX-1 tables of TensorFlow's May 2017 benchmarks (TF) for the two models it ran
replicated with NCCL (the others used a parameter server on the CPU)."""


def _tf_dgx1(model: str, label: str, batch: int, table: str, rates: tuple[int, ...]
             ) -> list[Case]:
    """One model's rows of the DGX-1 tables: 2, 4 and 8 GPUs against one."""
    single = rates[0]
    return [Case(
        f"TensorFlow, {label}, {gpus} P100 (DGX-1), batch {batch}", "efficiency",
        rate / (gpus * single),
        f"{gpus} GPUs of one DGX-1 (P100, NVLink hybrid cube mesh: one 20 GB/s link per "
        f"connected pair){HOST_HOPS if gpus == 8 else ''}, replicated variables with one NCCL 1 "
        "allreduce per gradient tensor (0.74 of each link's rate, as measured on a DGX-1), "
        f"{batch} images/GPU, one GPU at {single} images/s",
        f"{TF}, DGX-1 {table}: {single} and {rate} images/s",
        weak_scaling(_dgx1(model, batch, single, gpus)))
        for gpus, rate in zip((2, 4, 8), rates[1:])]


def _ddp(model: str, images_per_s: float, gpus: int, bucket_mb: float
         ) -> Callable[[bool], tuple[Job, Job]]:
    job = Job(model=model, gpus=gpus, topology="8x2" if gpus == 16 else str(gpus),
              algorithm="ring", device="v100", network="ib-edr-x4", intra="nvlink2", batch=32,
              bucket_mb=bucket_mb, stack="nccl", compute_time=32 / images_per_s)
    return against_one_gpu(job)


DDP_SINGLE = {"resnet50": 329, "resnet101": 197}
"""One V100 without DDP at batch 32 (the README's p50 and p75 alike), images/s."""
DDP_RUNS = (  # model, its name, GPUs, bucket MB, measured images/s per GPU, the statistic
    ("resnet50", "ResNet-50", 16, 25.0, 306, "p50"),
    ("resnet101", "ResNet-101", 16, 25.0, 178, "p50"),
    ("resnet50", "ResNet-50", 8, 25.0, 307, "p50"),
    ("resnet101", "ResNet-101", 8, 25.0, 179, "p50"),
    ("resnet50", "ResNet-50", 16, 1.0, 294, "p75"),
    ("resnet101", "ResNet-101", 16, 1.0, 170, "p75"),
)
"""PyTorch's DDP benchmark (DDP): its table at 25 MB buckets, and its bucket_cap_mb=1 against
25 comparison (p75 only) on the same 8 DGX-1 machines; the 2- and 4-GPU rows (one host, as the
8-GPU row) are not repeated."""


def _ddp_case(model: str, label: str, gpus: int, bucket_mb: float, measured: int,
              statistic: str) -> Case:
    """One row of PyTorch's DDP benchmark: images/s per GPU against one GPU without DDP."""
    hosts = ("2 DGX-1 (8 V100 on NVLink) with 4x 100 Gbit/s InfiniBand each (8x2)"
             if gpus == 16 else "one DGX-1 (8 V100 on NVLink)")
    default = bucket_mb == 25.0
    single = DDP_SINGLE[model]
    return Case(
        f"PyTorch DDP, {label}, {gpus} V100{'' if default else f', {bucket_mb:g} MB buckets'}",
        "efficiency", measured / single,
        f"{hosts}, NCCL ring, {bucket_mb:g} MB buckets, 32 images/GPU, one GPU without DDP at "
        f"{single} images/s",
        f"{DDP}: {single} images/s (1 GPU, no DDP) and {statistic} {measured} ({gpus} GPUs"
        f"{'' if default else f', bucket_cap_mb={bucket_mb:g}'})",
        weak_scaling(_ddp(model, single, gpus, bucket_mb)))


_DDL = Case(
    "PowerAI DDL, ResNet-50, 256 P100", "efficiency", 0.95,
    "64 hosts x 4 P100 (4x16x4), torus (DDL's multi-dimensional ring), one EDR InfiniBand port "
    "per host, NVLink inside, 32 images/GPU; Caffe over MPI",
    "Cho et al., arXiv 1708.02188 (2017); IBM's announcement (95% with Caffe)", _ddl)
_SCAFFE = Case(
    "S-Caffe, GoogLeNet, 32 -> 160 K80", "speedup", 2.5,
    "16 K80 GPUs per host (16x2, 16x10), FDR InfiniBand, PCIe inside, per-layer hierarchical "
    "reduce and broadcast overlapped, global batch 2560 (80 -> 16 per GPU, assumed); Caffe over "
    "MVAPICH2-GDR", "Awan et al., PPoPP 2017, abstract (seed 000)", _scaffe)
_GOYAL = Case(
    "Goyal et al., ResNet-50, 8 -> 256 P100", "efficiency", 0.90,
    "32 Big Basin servers x 8 P100 on NVLink (8x32), one 50 Gbit/s Ethernet port per server, 32 "
    "images/GPU (8k batch), intra-server reduce, inter-server allreduce, broadcast "
    "(hierarchical); efficiency against one server of 8",
    "Goyal et al., arXiv 1706.02677 (2017), abstract and section 5.5 (~90% from 8 to 256 GPUs)",
    weak_scaling(_goyal))
_YOU = Case(
    "You et al., original EASGD on 8 K80, AlexNet", "share", 0.87,
    "one host of 8 K80 on PCIe 3.0, 64 images/GPU, exchange every step; the paper trains on "
    "CIFAR (32x32), scaledl's AlexNet needs 64x64 (the value compared) or more",
    "You, Buluç, Demmel, SC17 (seed 003; /work/shared/research/seeds.md section 4)", _you)

FAMILIES: tuple[tuple[str, tuple[Case, ...]], ...] = (
    ("PowerAI DDL (Cho et al., 2017)", (_DDL,)),
    ("S-Caffe (Awan et al., PPoPP 2017)", (_SCAFFE,)),
    ("Horovod's README, charts and announcement (2017-2018)", HOROVOD_CASES),
    ("Goyal et al. (2017)", (_GOYAL,)),
    ("TensorFlow's benchmarks on a P100 DGX-1 (May 2017)",
     tuple(case for run in TF_DGX1_RUNS for case in _tf_dgx1(*run))),
    ("PyTorch's DDP benchmark (PyTorch 1.4, V100)", tuple(_ddp_case(*run) for run in DDP_RUNS)),
    ("NVIDIA's image recipes in PyTorch (21.03)", DLE_PYTORCH_CASES),
    ("NVIDIA's image recipes in PyTorch (20.06)", CONVNETS_2020_CASES),
    ("NVIDIA's image recipes in TensorFlow and MXNet", DLE_CASES),
    ("NVIDIA's BERT-large in PyTorch (21.11)", BERT_CASES),
    ("NVIDIA's BERT-large in PyTorch (19.07)", BERT_2019_CASES),
    ("NVIDIA's BERT-large in PyTorch (20.06)", BERT_2020_CASES),
    ("NVIDIA's BERT-large in TensorFlow 2 (21.02)", BERT_TF2_CASES),
    ("DLPerf: NVIDIA's PyTorch recipes on V100 servers (20.03)", DLPERF_CASES),
    ("DLPerf: Megatron-LM's GPT on V100 servers (20.12)", MEGATRON_CASES),
    ("You et al. (SC17)", (_YOU,)),
)
"""The published points by source, in the table's order (``scaledl simulate reproduce``
summarises each)."""

CASES = tuple(case for _, cases in FAMILIES for case in cases)
