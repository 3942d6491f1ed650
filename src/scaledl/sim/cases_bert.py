"""NVIDIA's BERT-large recipe in PyTorch: published scaling points of a Transformer, on one
DGX and on up to 32 DGX A100 (docs/simulation.md, "Reproducing published results").

Source (``BERT_DLE``): the training performance tables of NVIDIA/DeepLearningExamples
``PyTorch/LanguageModeling/BERT/README.md``, January 2022 release (commit a9e2c1d, pytorch:21.11-py3
NGC container).  What the cases take from it and from the recipe's code at that commit:

- pre-training (``run_pretraining.py``, ``scripts/run_pretraining.sh``,
  ``scripts/configs/pretrain_config.sh``): torch DDP whose bucket cap is the GPU's memory (one
  bucket: the allreduce starts when backward has ended), every micro-batch but the last under
  ``no_sync``, so the gradients are reduced once per optimizer step and never overlap compute
  (``PRETRAIN_BUCKET_MB``); in float16 for the mixed-precision configurations (the model is
  converted to half precision with ``allreduce_post_accumulation_fp16``), float32 for TF32;
- SQuAD fine-tuning (``run_squad.py``, ``scripts/run_squad.sh``: sequence length 384, no
  accumulation): apex's DistributedDataParallel with its defaults, buckets of 10 million
  elements (``APEX_BUCKET_MB`` of float32 gradients) overlapped with backward, in float16 under
  amp O2 for mixed precision; its per-call and per-gradient costs are taken as torch DDP's (the
  ``nccl`` stack), which is assumed;
- a DGX A100 (80 GB): eight A100 on NVSwitch (``nvlink3``) and eight 200 Gb/s HDR InfiniBand
  adapters, one per GPU (``ib-hdr-x8``, the DGX A100 datasheet); a DGX-1 (32 GB): eight V100 on
  NVLink (``nvlink2``);
- each single-GPU rate of the table as the measured compute (``compute_time``), which replaces
  the device preset's estimate as a measured profile would.

Multi-node rows are strong scaling: the global batch is fixed, so the micro-batches per step
fall as nodes are added (32 at one node, 1 at 32 for mixed precision at sequence length 128);
efficiency is per-GPU throughput at ``N`` nodes over that of one node, which is how the table's
"strong scaling" column reads divided by ``N``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, weak_scaling

__all__ = ["BERT_CASES", "BERT_DLE", "PRETRAIN_BUCKET_MB", "APEX_BUCKET_MB"]

BERT_DLE = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (January 2022 "
            "release, pytorch:21.11-py3 NGC container), training performance tables")
PRETRAIN_BUCKET_MB = 8192.0
"""One bucket holds every gradient: the recipe's single allreduce after accumulation."""
APEX_BUCKET_MB = 10_000_000 * 4 / (1 << 20)
"""apex DDP's default ``message_size``, 10 million elements, as MiB of float32 gradients."""


def _wire(precision: str) -> int:
    """Bytes per gradient element the recipe reduces: 2 at mixed precision, else 4."""
    return 2 if precision == "mixed precision" else 4


MACHINES = {  # machine: device preset, link inside, link between hosts, GPUs per host
    "DGX A100": ("a100-80gb", "nvlink3", "ib-hdr-x8", 8),
    "DGX A100 40 GB": ("a100", "nvlink3", "ib-hdr-x8", 8),
    "DGX-1 32 GB": ("v100", "nvlink2", "ib-edr-x4", 8),
    "DGX-1 16 GB": ("v100", "nvlink2", "ib-edr-x4", 8),
    "DGX-2H": ("v100", "nvswitch-v100", "ib-edr-x8", 16),
    "DGX-2": ("v100", "nvswitch-v100", "ib-edr-x8", 16),
}
"""The machines of this recipe's tables, its 2019 and 2020 releases'
(:mod:`scaledl.sim.cases_bert2019`, :mod:`scaledl.sim.cases_bert2020`; the 2020 DGX A100 has
40 GB GPUs) and the TensorFlow 2 recipe's (:mod:`scaledl.sim.cases_bert_tf2`) included: a
DGX-2 is 16 V100 on NVSwitch with eight EDR InfiniBand adapters, and so is a DGX-2H (its GPUs
at a higher power limit: each table's measured rate carries the difference)."""


def _pretrain(machine: str, precision: str, sequence: int, batch: int, single: float,
              steps: tuple[int, int], nodes: tuple[int, int]
              ) -> Callable[[bool], tuple[Job, Job]]:
    """``nodes[1]`` DGX (or, with ``nodes`` (0, 1), one DGX) against ``nodes[0]`` (0: one GPU),
    accumulating ``steps`` micro-batches per optimizer step at each size."""
    device, intra, network, per_node = MACHINES[machine]

    def job(count: int, accumulation: int, ideal: bool) -> Job:
        gpus, topology = (1, "1") if count == 0 else (
            per_node * count, str(per_node) if count == 1 else f"{per_node}x{count}")
        return Job(model="bert_large", input_shape=(sequence,), gpus=gpus, topology=topology,
                   algorithm="ring", device=device, intra=intra, network=network, batch=batch,
                   bucket_mb=PRETRAIN_BUCKET_MB, allreduce_bytes=_wire(precision),
                   accumulation=accumulation, compute_time=batch / single, stack="nccl",
                   mixed_precision=precision == "mixed precision" and not ideal, ideal=ideal)

    def jobs(ideal: bool) -> tuple[Job, Job]:
        return job(nodes[0], steps[0], ideal), job(nodes[1], steps[1], ideal)
    return jobs


PRETRAIN_SINGLE_NODE = (  # machine, precision, sequence, batch, micro-batches, 1 GPU, 8 GPUs
    ("DGX A100", "mixed precision", 128, 256, 32, 580, 4591),
    ("DGX A100", "mixed precision", 512, 32, 128, 210, 1657),
    ("DGX-1 32 GB", "mixed precision", 128, 64, 64, 224, 1746),
    ("DGX-1 32 GB", "mixed precision", 512, 8, 256, 75, 586),
)
"""Pre-training on one DGX against one of its GPUs; the DGX-1 table lists the accumulated
batch per GPU (4096 and 2048) and the accumulation steps, whose quotient is the micro-batch."""

PRETRAIN_NODES = (  # precision, sequence, batch, one GPU, (micro-batches, throughput) at 1, N
    ("mixed precision", 128, 256, 580, (32, 4553), 16, (2, 70555)),
    ("mixed precision", 128, 256, 580, (32, 4553), 32, (1, 138294)),
    ("TF32", 128, 128, 317, (64, 2486), 16, (4, 38866)),
    ("TF32", 128, 128, 317, (64, 2486), 32, (2, 75706)),
    ("mixed precision", 512, 32, 210, (128, 1648), 16, (8, 25570)),
    ("mixed precision", 512, 32, 210, (128, 1648), 32, (4, 49663)),
    ("TF32", 512, 16, 110, (256, 854), 16, (16, 12131)),
    ("TF32", 512, 16, 110, (256, 854), 32, (8, 21298)),
)
"""The multi-node table (DGX A100): one node's and ``N`` nodes' micro-batches per step and
sequences/s; the batch per GPU is the table's (its TF32 rows say 126, the single-node table
128: 128 is taken), the single-GPU rate the single-node table's."""

SQUAD = (  # machine, precision, batch, 1 GPU, 8 GPUs (sequences/s)
    ("DGX A100", "TF32", 32, 61.5, 469.8),
    ("DGX A100", "mixed precision", 32, 110.5, 846.7),
    ("DGX-1 32 GB", "FP32", 8, 12.0, 85.5),
    ("DGX-1 32 GB", "mixed precision", 16, 52.0, 382.0),
)
"""SQuAD v1.1 fine-tuning (sequence length 384) on one DGX against one of its GPUs, the batch
per GPU as the README's tables state it (``squad_config.sh`` at the same commit gives 16 for the
DGX A100 at TF32, where the table says 32)."""


def _squad(machine: str, precision: str, batch: int, single: float
           ) -> Callable[[bool], tuple[Job, Job]]:
    device, intra, _, _ = MACHINES[machine]

    def jobs(ideal: bool) -> tuple[Job, Job]:
        job = Job(model="bert_large", input_shape=(384,), gpus=8, topology="8",
                  algorithm="ring", device=device, intra=intra, batch=batch,
                  bucket_mb=APEX_BUCKET_MB, allreduce_bytes=_wire(precision),
                  compute_time=batch / single, stack="nccl",
                  mixed_precision=precision == "mixed precision" and not ideal, ideal=ideal)
        return replace(job, gpus=1, topology="1"), job
    return jobs


def _dtype(precision: str) -> str:
    return "float16" if _wire(precision) == 2 else "float32"


def _single_node(machine: str, precision: str, sequence: int, batch: int, steps: int,
                 single: float, every: float) -> Case:
    return Case(
        f"NVIDIA BERT-large pre-training, {machine}, {precision}, sequence {sequence}",
        "efficiency", every / (8 * single),
        f"one {machine} (8 GPUs), {batch} sequences/GPU x {steps} accumulated micro-batches, "
        f"one {_dtype(precision)} allreduce after them, {precision}, one GPU at {single} "
        f"sequences/s", f"{BERT_DLE}: {single} and {every} sequences/s",
        weak_scaling(_pretrain(machine, precision, sequence, batch, single, (steps, steps),
                               (0, 1))))


def _nodes(precision: str, sequence: int, batch: int, single: float, base: tuple[int, int],
           nodes: int, big: tuple[int, int]) -> Case:
    return Case(
        f"NVIDIA BERT-large pre-training, {nodes} DGX A100, {precision}, sequence {sequence}",
        "efficiency", big[1] / (nodes * base[1]),
        f"{nodes} DGX A100 (8x{nodes}) against one, {batch} sequences/GPU x {big[0]} "
        f"micro-batches (one node: x {base[0]}), one {_dtype(precision)} allreduce after them, "
        f"8 HDR InfiniBand ports per node, {precision}, one GPU at {single} sequences/s",
        f"{BERT_DLE}, multi-node scaling: {base[1]} and {big[1]} sequences/s",
        weak_scaling(_pretrain("DGX A100", precision, sequence, batch, single,
                               (base[0], big[0]), (1, nodes))))


def _squad_case(machine: str, precision: str, batch: int, single: float, every: float) -> Case:
    return Case(
        f"NVIDIA BERT-large SQuAD fine-tuning, {machine}, {precision}", "efficiency",
        every / (8 * single),
        f"one {machine} (8 GPUs), apex DDP (10M-element buckets, {_dtype(precision)}), "
        f"sequence 384, {batch} sequences/GPU, {precision}, one GPU at {single} sequences/s",
        f"{BERT_DLE}: {single} and {every} sequences/s",
        weak_scaling(_squad(machine, precision, batch, single)))


BERT_CASES = (*(_single_node(*run) for run in PRETRAIN_SINGLE_NODE),
              *(_nodes(*run) for run in PRETRAIN_NODES),
              *(_squad_case(*run) for run in SQUAD))
"""The recipe's points, in table order."""
