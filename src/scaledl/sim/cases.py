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
from scaledl.sim.cases_horovod import HOROVOD_CASES
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, Prediction, against_one_gpu, weak_scaling

__all__ = ["CASES", "IMAGENET_TRAIN_IMAGES"]

IMAGENET_TRAIN_IMAGES = 1_281_167
"""ILSVRC-2012 training set size."""

TF = "tensorflow/tensorflow tensorflow/docs_src/performance/benchmarks.md (May 2017)"
DDP = "pytorch/pytorch benchmarks/distributed/ddp/README.md (PyTorch 1.4, NCCL)"
DLE = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md "
       "(pytorch-21.03 NGC container), training performance tables; batch per GPU from "
       "ConvNets/configs.yml")
DLE_MX = ("NVIDIA/DeepLearningExamples MxNet/Classification/RN50v1.5/README.md (commit "
          "1bd98ac: mxnet-20.12-py3 on the DGX-1 and DGX-2, mxnet-22.10-py3 on the DGX A100 "
          "80 GB), training performance tables")
DLE_TF = ("NVIDIA/DeepLearningExamples TensorFlow/Classification/ConvNets/resnet50v1.5/README.md "
          "(commit 1d4211f, TensorFlow 20.06-tf1-py3 NGC container), training performance "
          "tables")


def _ddl(ideal: bool) -> Prediction:
    job = Job(model="resnet50", gpus=256, topology="4x16x4", algorithm="torus", device="p100",
              network="ib-edr", intra="nvlink1", batch=32, stack="mpi", ideal=ideal)
    result = job.run()
    minutes = 90 * IMAGENET_TRAIN_IMAGES / result.samples_per_s / 60
    return Prediction(result.efficiency,
                      f"90 epochs in {minutes:.0f} min ({result.samples_per_s / 256:.0f} "
                      f"images/s/GPU, comm share {result.communication_share:.1%})")


def _scaffe(ideal: bool) -> Prediction:
    base = Job(model="googlenet", device="k80", network="ib-fdr", intra="pcie3",
               strategy="reduce-broadcast", algorithm="hierarchical", stack="mpi", ideal=ideal)
    small = replace(base, gpus=32, topology="16x2", batch=80).run()
    large = replace(base, gpus=160, topology="16x10", batch=16).run()
    speedup = small.iteration_s / large.iteration_s
    return Prediction(speedup, f"{speedup / 5:.0%} of linear; comm share "
                               f"{small.communication_share:.0%} -> "
                               f"{large.communication_share:.0%}")


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


def _dle(device: str, intra: str, batch: int, images_per_s: float, stack: str = "nccl",
         gpus: int = 8, cycle_ms: float | None = None) -> Callable[[bool], tuple[Job, Job]]:
    # NVIDIA's ResNet-50 v1.5 recipe on one DGX, one process per GPU: torch DDP over NCCL
    # (25 MB buckets) or, in TensorFlow and MXNet, Horovod over NCCL (the stack's fusion, and
    # its cycle unless the recipe sets one)
    job = Job(model="resnet50", gpus=gpus, topology=str(gpus), algorithm="ring", device=device,
              intra=intra, batch=batch, stack=stack, compute_time=batch / images_per_s,
              cycle_ms=cycle_ms)
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


def _dle_horovod(framework: str, machine: str, precision: str, batch: int, single: float,
                 every: float) -> Case:
    """One row pair of a Horovod recipe's tables: every GPU of the machine against one."""
    device, intra, gpus = DGX[machine]
    source, cycle_ms, how = RECIPES[framework]
    cycle = "cycle" if cycle_ms is None else f"{cycle_ms:g} ms cycle"
    return Case(
        f"NVIDIA ResNet-50 v1.5 in {framework}, {machine}, {precision}", "efficiency",
        every / (gpus * single),
        f"one {machine.split(' V100')[0]} ({gpus} GPUs), Horovod over NCCL ({cycle} and 64 MiB "
        f"fusion{' as preset' if cycle_ms is None else ''}), {batch} images/GPU, {precision} "
        f"{how}, one GPU at {single} images/s",
        f"{source}: {single} and {every} images/s",
        weak_scaling(_dle(device, intra, batch, single, "horovod", gpus, cycle_ms)))


CASES = (
    Case("PowerAI DDL, ResNet-50, 256 P100", "efficiency", 0.95,
         "64 hosts x 4 P100 (4x16x4), torus (DDL's multi-dimensional ring), one EDR InfiniBand "
         "port per host, NVLink inside, 32 images/GPU; Caffe over MPI",
         "Cho et al., arXiv 1708.02188 (2017); IBM's announcement (95% with Caffe)", _ddl),
    Case("S-Caffe, GoogLeNet, 32 -> 160 K80", "speedup", 2.5,
         "16 K80 GPUs per host (16x2, 16x10), FDR InfiniBand, PCIe inside, per-layer "
         "hierarchical reduce and broadcast overlapped, global batch 2560 (80 -> 16 per GPU, "
         "assumed); Caffe over MVAPICH2-GDR",
         "Awan et al., PPoPP 2017, abstract (seed 000)", _scaffe),
    *HOROVOD_CASES,
    Case("Goyal et al., ResNet-50, 8 -> 256 P100", "efficiency", 0.90,
         "32 Big Basin servers x 8 P100 on NVLink (8x32), one 50 Gbit/s Ethernet port per "
         "server, 32 images/GPU (8k batch), intra-server reduce, inter-server allreduce, "
         "broadcast (hierarchical); efficiency against one server of 8",
         "Goyal et al., arXiv 1706.02677 (2017), abstract and section 5.5 (~90% from 8 to 256 "
         "GPUs)", weak_scaling(_goyal)),
    *(case for run in TF_DGX1_RUNS for case in _tf_dgx1(*run)),
    *(_ddp_case(*run) for run in DDP_RUNS),
    Case("NVIDIA ResNet-50 v1.5, DGX A100, TF32", "efficiency", 7248 / (8 * 938),
         "one DGX A100 (8 A100 80 GB on NVSwitch), PyTorch DDP over NCCL, 25 MB buckets, "
         "256 images/GPU, TF32, one GPU at the published 938 images/s (the a100 preset, a "
         "40 GB part, stands in; only its links and per-call costs are used)",
         DLE + ": 938 and 7248 images/s", weak_scaling(_dle("a100", "nvlink3", 256, 938))),
    Case("NVIDIA ResNet-50 v1.5, DGX A100, mixed precision", "efficiency", 16621 / (8 * 2470),
         "as above with AMP (fp16 compute, fp32 gradients: the same bytes), one GPU at "
         "2470 images/s",
         DLE + ": 2470 and 16621 images/s", weak_scaling(_dle("a100", "nvlink3", 256, 2470))),
    Case("NVIDIA ResNet-50 v1.5, DGX-1 V100 16 GB, FP32", "efficiency", 2855 / (8 * 367),
         "one DGX-1 (8 V100 16 GB on NVLink), PyTorch DDP over NCCL, 25 MB buckets, "
         "112 images/GPU, FP32, one GPU at the published 367 images/s",
         DLE + ": 367 and 2855 images/s", weak_scaling(_dle("v100", "nvlink2", 112, 367))),
    Case("NVIDIA ResNet-50 v1.5, DGX-1 V100 16 GB, mixed precision", "efficiency",
         8322 / (8 * 1200),
         "as above with AMP at 256 images/GPU (fp32 gradients), one GPU at 1200 images/s",
         DLE + ": 1200 and 8322 images/s", weak_scaling(_dle("v100", "nvlink2", 256, 1200))),
    *(_dle_horovod(*run) for run in DLE_HOROVOD_RUNS),
    *BERT_CASES,
    Case("You et al., original EASGD on 8 K80, AlexNet", "share", 0.87,
         "one host of 8 K80 on PCIe 3.0, 64 images/GPU, exchange every step; the paper trains "
         "on CIFAR (32x32), scaledl's AlexNet needs 64x64 (the value compared) or more",
         "You, Buluç, Demmel, SC17 (seed 003; /work/shared/research/seeds.md section 4)", _you),
)
