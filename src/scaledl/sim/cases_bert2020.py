"""NVIDIA's BERT-large recipe in PyTorch, mid-2020 release: pre-training and SQuAD fine-tuning on
4, 8 and 16 GPUs of one DGX A100 (40 GB), DGX-1 (16 and 32 GB) and DGX-2, against one of their
GPUs; published points added after every preset was set and predicted with none changed
(docs/simulation.md, "Reproducing published results").

Source (``BERT_DLE_2020``): NVIDIA/DeepLearningExamples ``PyTorch/LanguageModeling/BERT/README.md``
at commit b2763ae (July 2020, pytorch:20.06-py3 NGC container), the single-node "Training
performance" tables.  What the cases take from it and from the recipe at that commit:

- pre-training (``run_pretraining.py``): no DDP; the gradients of all micro-batches are
  accumulated, then reduced once per optimizer step as one flat tensor, float16 at mixed
  precision and float32 at TF32 and FP32, as ``scripts/configs/pretrain_config.sh`` sets
  ``allreduce_post_accumulation`` for every machine and precision and its float16 variant at
  mixed precision only (the README says both must be off at TF32 and FP32, where apex DDP would
  then reduce every micro-batch behind its backward; the configuration files are followed here),
  once per 128 to 2048 micro-batches on the multi-GPU rows;
- the micro-batch is the table's accumulated batch per GPU over its accumulation steps (54 and
  64 sequences at TF32 and mixed precision on the DGX A100 at sequence length 128, 8 and 16 at
  512; 8 and 16 on the V100 machines at 128, 2 and 4 at 512), and the steps fall as GPUs are
  added so the global batch stays fixed (the configuration file's batches differ, 64 at TF32 on
  the DGX A100 and on a DGX-2 at mixed precision, so the tables' are used);
- SQuAD v1.1 (``run_squad.py``: sequence length 384, no accumulation): apex's
  DistributedDataParallel with its defaults (10 million-element buckets overlapped with
  backward), float16 gradients under amp O2 at mixed precision, as in the 2022 release
  (:mod:`scaledl.sim.cases_bert`); the batch per GPU is the table's;
- the machines of :data:`scaledl.sim.cases_bert.MACHINES`; the DGX A100 of these tables has the
  40 GB A100 (the ``a100`` preset).

Published efficiency is the tables' throughput on ``N`` GPUs over ``N`` times one GPU's.  The
tables print throughput as whole sequences per second and their scaling columns are computed
from those rounded rates, so a point is used only when the rounding leaves its efficiency
determined within :data:`ROUNDING_POINTS` (every FP32 row at sequence length 512, where one GPU
runs 9 or 10 sequences/s, and every FP32 SQuAD row, 9 or 12, are left out).  In three rows the
scaling columns disagree with the rates: two, the DGX A100's at sequence length 512 on 8 GPUs
and its SQuAD row on 8 GPUs, have their TF32 and mixed-precision columns swapped, and the rates
are used; in the third (:data:`DOUBTFUL`) neither the scaling nor the speedup column agrees with
the rates, so its rates are in doubt and it is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from scaledl.sim.cases_bert import APEX_BUCKET_MB, MACHINES, PRETRAIN_BUCKET_MB
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, idealised, weak_scaling

__all__ = ["BERT_2020_CASES", "BERT_DLE_2020", "PRETRAIN_2020", "SQUAD_2020", "ROUNDING_POINTS",
           "DOUBTFUL", "rounding_points", "squad_jobs", "squad_case"]

BERT_DLE_2020 = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (commit "
                 "b2763ae, July 2020, pytorch:20.06-py3 NGC container), single-node training "
                 "performance tables; scripts/configs at the same commit")
"""The source."""

ROUNDING_POINTS = 2.0
"""Largest half-width, in points, of the efficiencies the tables' rounded rates allow."""

DOUBTFUL = frozenset({("DGX-1 32 GB", "mixed precision", 128, 4)})
"""Rows whose columns contradict their own rates: the DGX-1 32 GB's 4 GPUs at mixed precision and
sequence length 128 list 157 (FP32) and 625 sequences/s, a speedup of 3.93 and scaling of 3.96
and 3.65, where the rates give 3.98, 3.93 and 3.96 (every other row's speedup agrees with its
rates within 0.01)."""

PRETRAIN_2020 = (  # machine, precision, sequence, micro-batch, {GPUs: (micro-batches, seq/s)}
    ("DGX A100 40 GB", "TF32", 128, 54, {1: (1208, 234), 4: (302, 910), 8: (151, 1777)}),
    ("DGX A100 40 GB", "mixed precision", 128, 64,
     {1: (1024, 415), 4: (256, 1618), 8: (128, 3231)}),
    ("DGX A100 40 GB", "TF32", 512, 8, {1: (4096, 41), 4: (1024, 159), 8: (512, 318)}),
    ("DGX A100 40 GB", "mixed precision", 512, 16, {1: (2048, 78), 4: (512, 308), 8: (256, 620)}),
    ("DGX-1 16 GB", "FP32", 128, 8, {1: (8192, 40), 4: (2048, 155), 8: (1024, 313)}),
    ("DGX-1 16 GB", "mixed precision", 128, 16, {1: (4096, 164), 4: (1024, 615), 8: (512, 1236)}),
    ("DGX-1 16 GB", "FP32", 512, 2, {1: (16384, 9), 4: (4096, 35), 8: (2048, 71)}),
    ("DGX-1 16 GB", "mixed precision", 512, 4, {1: (8192, 34), 4: (2048, 131), 8: (1024, 263)}),
    ("DGX-1 32 GB", "FP32", 128, 8, {1: (8192, 40), 4: (2048, 157), 8: (1024, 317)}),
    ("DGX-1 32 GB", "mixed precision", 128, 16, {1: (4096, 158), 4: (1024, 625), 8: (512, 1203)}),
    ("DGX-1 32 GB", "FP32", 512, 2, {1: (16384, 9), 4: (4096, 35), 8: (2048, 72)}),
    ("DGX-1 32 GB", "mixed precision", 512, 4, {1: (8192, 33), 4: (2048, 130), 8: (1024, 262)}),
    ("DGX-2", "FP32", 128, 8,
     {1: (8192, 42), 4: (2048, 166), 8: (1024, 330), 16: (512, 658)}),
    ("DGX-2", "mixed precision", 128, 16,
     {1: (4096, 173), 4: (1024, 669), 8: (512, 1324), 16: (256, 2557)}),
    ("DGX-2", "FP32", 512, 2, {1: (16384, 10), 4: (4096, 37), 8: (2048, 75), 16: (1024, 150)}),
    ("DGX-2", "mixed precision", 512, 4,
     {1: (8192, 36), 4: (2048, 137), 8: (1024, 273), 16: (512, 551)}),
)
"""The pre-training tables, row by row (throughput in sequences/s)."""

SQUAD_2020 = (  # machine, precision, batch per GPU, {GPUs: sequences/s}
    ("DGX A100 40 GB", "TF32", 16, {1: 44, 4: 165, 8: 324}),
    ("DGX A100 40 GB", "mixed precision", 32, {1: 116, 4: 441, 8: 861}),
    ("DGX-1 16 GB", "FP32", 4, {1: 9, 4: 32, 8: 61}),
    ("DGX-1 16 GB", "mixed precision", 10, {1: 50, 4: 183, 8: 359}),
    ("DGX-1 32 GB", "FP32", 8, {1: 12, 4: 42, 8: 67}),
    ("DGX-1 32 GB", "mixed precision", 10, {1: 49, 4: 178, 8: 351}),
    ("DGX-2", "FP32", 8, {1: 12, 4: 47, 8: 92, 16: 178}),
    ("DGX-2", "mixed precision", 10, {1: 53, 4: 188, 8: 369, 16: 700}),
)
"""The SQuAD fine-tuning tables (sequence length 384)."""


def rounding_points(single: float, every: float, gpus: int) -> float:
    """Half the range of efficiencies, in points, that rates rounded to whole sequences per
    second allow: one GPU's ``single`` and ``gpus`` GPUs' ``every``."""
    low = (every - 0.5) / (gpus * (single + 0.5))
    high = (every + 0.5) / (gpus * (single - 0.5))
    return (high - low) / 2 * 100


def _job(machine: str, precision: str, gpus: int, sequence: int, batch: int,
         bucket_mb: float, single: float, ideal: bool) -> Job:
    """``gpus`` GPUs of one ``machine`` (the ideal model's when ``ideal``)."""
    device, intra, network, _ = MACHINES[machine]
    mixed = precision == "mixed precision"
    job = Job(model="bert_large", input_shape=(sequence,), gpus=gpus, topology=str(gpus),
              algorithm="ring", device=device, intra=intra, network=network, batch=batch,
              bucket_mb=bucket_mb, allreduce_bytes=2 if mixed else 4, compute_time=batch / single,
              stack="nccl", mixed_precision=mixed)
    return idealised(job, ideal)


def _pretrain(machine: str, precision: str, sequence: int, batch: int, single: float,
              steps: tuple[int, int], gpus: int) -> Callable[[bool], tuple[Job, Job]]:
    def jobs(ideal: bool) -> tuple[Job, Job]:
        job = _job(machine, precision, gpus, sequence, batch, PRETRAIN_BUCKET_MB, single, ideal)
        return (replace(job, gpus=1, topology="1", accumulation=steps[0]),
                replace(job, accumulation=steps[1]))
    return jobs


def squad_jobs(machine: str, precision: str, batch: int, single: float, gpus: int
               ) -> Callable[[bool], tuple[Job, Job]]:
    """SQuAD fine-tuning (sequence 384) on ``gpus`` GPUs of one ``machine`` against one GPU at
    ``single`` sequences/s: apex DDP's 10M-element buckets, float16 at mixed precision."""
    def jobs(ideal: bool) -> tuple[Job, Job]:
        job = _job(machine, precision, gpus, 384, batch, APEX_BUCKET_MB, single, ideal)
        return replace(job, gpus=1, topology="1"), job
    return jobs


def _dtype(precision: str) -> str:
    return "float16" if precision == "mixed precision" else "float32"


def _pretrain_cases(machine: str, precision: str, sequence: int, batch: int,
                    rows: dict[int, tuple[int, int]]) -> list[Case]:
    steps, single = rows[1]
    return [Case(
        f"NVIDIA BERT-large pre-training (2020), {gpus} GPUs of a {machine}, {precision}, "
        f"sequence {sequence}", "efficiency", every / (gpus * single),
        f"{gpus} GPUs of one {machine}, {batch} sequences/GPU x {many} micro-batches (one GPU: "
        f"x {steps}), one {_dtype(precision)} allreduce after them, {precision}, one GPU at "
        f"{single} sequences/s", f"{BERT_DLE_2020}: {single} and {every} sequences/s",
        weak_scaling(_pretrain(machine, precision, sequence, batch, single, (steps, many),
                               gpus)))
        for gpus, (many, every) in rows.items()
        if gpus > 1 and rounding_points(single, every, gpus) <= ROUNDING_POINTS
        and (machine, precision, sequence, gpus) not in DOUBTFUL]


def squad_case(name: str, source: str, machine: str, precision: str, batch: int,
               single: float, gpus: int, every: float) -> Case:
    """One SQuAD row's point: ``gpus`` GPUs of one ``machine`` at ``every`` sequences/s against
    one at ``single`` (:func:`squad_jobs`), named ``name`` and sourced to ``source``."""
    return Case(
        name, "efficiency", every / (gpus * single),
        f"{gpus} GPUs of one {machine}, apex DDP (10M-element buckets, {_dtype(precision)}), "
        f"sequence 384, {batch} sequences/GPU, {precision}, one GPU at {single} sequences/s",
        f"{source}: {single} and {every} sequences/s",
        weak_scaling(squad_jobs(machine, precision, batch, single, gpus)))


def _squad_cases(machine: str, precision: str, batch: int, rates: dict[int, int]
                 ) -> list[Case]:
    single = rates[1]
    return [squad_case(
        f"NVIDIA BERT-large SQuAD fine-tuning (2020), {gpus} GPUs of a {machine}, {precision}",
        BERT_DLE_2020, machine, precision, batch, single, gpus, every)
        for gpus, every in rates.items()
        if gpus > 1 and rounding_points(single, every, gpus) <= ROUNDING_POINTS]


BERT_2020_CASES = (*(case for run in PRETRAIN_2020 for case in _pretrain_cases(*run)),
                   *(case for run in SQUAD_2020 for case in _squad_cases(*run)))
"""The tables' points whose rates determine them within :data:`ROUNDING_POINTS`, less
:data:`DOUBTFUL`, in table order."""
