"""NVIDIA's BERT-large recipe in PyTorch as first published (2019): pre-training on 1 to 64 DGX-2H
(up to 1024 V100) and 1 to 16 DGX-1, and SQuAD fine-tuning on 4 to 16 GPUs of one DGX-1 or DGX-2,
published scaling points added after every preset was set and predicted with none changed
(docs/simulation.md, "Reproducing published results").

Source (``BERT_DLE_2019``): NVIDIA/DeepLearningExamples ``PyTorch/LanguageModeling/BERT/README.md``
at commit 78e97e3 (October 2019, pytorch:19.07-py3 NGC container), the tables "Pre-training on
multiple NVIDIA DGX-2H With 32G" and "Pre-training on multiple NVIDIA DGX-1 With 16G", mixed
precision.  What the cases take from the README and its ``configurations.yml`` and ``run.sub`` at
that commit (the README: "Variables to re-run the Training performance results are available in
the configurations.yml file"):

- every run: ``--fp16 --allreduce_post_accumulation --allreduce_post_accumulation_fp16``, so no
  DDP: the gradients of all micro-batches are accumulated, then reduced once in float16 (as the
  2022 release's mixed-precision runs, :mod:`scaledl.sim.cases_bert`);
- the micro-batches per step, ``GRADIENT_STEPS``, fall as nodes are added, so the global batch
  stays 65536 (sequence length 128) and 32768 (512): DGX-2H 64, 16, 4 and 1 (phase 1) and 256,
  64, 16 and 4 (phase 2) on 1, 4, 16 and 64 nodes; DGX-1 512, 128 and 32, and 1024, 256 and 64
  on 1, 4 and 16 nodes; the micro-batch is the tables' batch per GPU (64 and 8 on a DGX-2H, 16
  and 4 on a DGX-1);
- a DGX-2H: 16 V100 on NVSwitch (``nvswitch-v100``) and eight EDR InfiniBand adapters
  (``ib-edr-x8``); a DGX-1 (16 GB): 8 V100 on NVLink (``nvlink2``) and four (``ib-edr-x4``);
- the compute per micro-batch: on the DGX-1, the same README's one-GPU rate (its single-node
  table, DGX-1 16 GB); the README has none for the DGX-2H (its single-node table is a DGX-2's,
  whose GPUs run at a lower power limit: 2775 sequences/s on 16 against the DGX-2H node's
  3379), so the DGX-2H node's own rate, per GPU, stands in for it: with 64 or 256 micro-batches
  per reduction, one node spends under 1% of its step reducing.

Efficiency is per-GPU throughput at ``N`` nodes over that of one node, the tables' "weak scaling"
column divided by ``N``.  The tables' two FP32 rows (64 DGX-2H) have no one-node row to compare
with and are left out.

The same README's single-node fine-tuning tables (SQuAD v1.1, ``SQUAD_2019``) give 1, 4 and 8 GPUs
of a DGX-1 16 GB and 32 GB and 1 to 16 of a DGX-2, at FP32 and mixed precision, to one or two
decimals: ``scripts/run_squad.sh`` multiplies the last steps per second its progress bar printed
(two decimals) by the GPUs and the batch per GPU.  The recipe at that commit (``run_squad.py``,
``scripts/run_squad.sh``): sequence length 384, no accumulation, apex's DistributedDataParallel
with its defaults (10 million-element buckets overlapped with backward) and, under ``--fp16``, apex
amp at O2 with a dynamic loss scale, whose model and gradients are float16: the 2020 release's
SQuAD runs (:func:`scaledl.sim.cases_bert2020.squad_jobs`).  The tables' single-node pre-training
rows are not used: ``configurations.yml`` holds only the whole-node runs behind the multi-node
tables, none on 1 or 4 GPUs, and the script's default of 128 micro-batches per step cannot give the
91-93% they show on 8 GPUs of a DGX-1.  The DGX-1 32 GB's fine-tuning rows at batch 8 are left out
(``DOUBTFUL_2019``): their 4-GPU rates, 31.52 and 116.80 sequences/s, are also the same machine's
pre-training rates at sequence length 512 on 4 GPUs (which table holds the copy is not known), and
three of their rates (36.04 on one GPU, 31.52 and 64.32 at FP32) are not a two-decimal step rate
times GPUs times 8, while at a batch of 4 every one of them is: the table's batch or its rates are
wrong, so none of the four points is used.
"""

from __future__ import annotations

from scaledl.sim.cases_bert import MACHINES, _pretrain
from scaledl.sim.cases_bert2020 import squad_case
from scaledl.sim.reproduce import Case, weak_scaling

__all__ = ["BERT_2019_CASES", "BERT_DLE_2019", "BERT_2019_RUNS", "SQUAD_2019", "DOUBTFUL_2019",
           "SQUAD_DLE_2019"]

BERT_DLE_2019 = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (commit "
                 "78e97e3, October 2019, pytorch:19.07-py3 NGC container), multi-node "
                 "pre-training tables; configurations.yml and run.sub at the same commit")
"""The source of the pre-training points."""
SQUAD_DLE_2019 = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (commit "
                  "78e97e3, October 2019, pytorch:19.07-py3 NGC container), single-node "
                  "fine-tuning tables; run_squad.py and scripts/run_squad.sh at the same commit")
"""The source of the fine-tuning points."""

JOINED = {"DGX-2H": "16 V100 on NVSwitch, 8 EDR InfiniBand ports",
          "DGX-1 16 GB": "8 V100 on NVLink, 4 EDR InfiniBand ports"}
"""How each machine's GPUs and nodes are joined (its presets: ``cases_bert.MACHINES``)."""

BERT_2019_RUNS = (  # machine, sequence, batch/GPU, GPU rate, (micro-batches, seq/s) per node count
    ("DGX-2H", 128, 64, 3379.2 / 16, {1: (64, 3379.2), 4: (16, 12709.88), 16: (4, 51937.28),
                                      64: (1, 188088.32)}),
    ("DGX-2H", 512, 8, 625.66 / 16, {1: (256, 625.66), 4: (64, 2386.38), 16: (16, 9932.8),
                                     64: (4, 37478.4)}),
    ("DGX-1 16 GB", 128, 16, 125.44, {1: (512, 874.24), 4: (128, 3089.76),
                                      16: (32, 12144.64)}),
    ("DGX-1 16 GB", 512, 4, 26.64, {1: (1024, 195.93), 4: (256, 700.16), 16: (64, 2746.368)}),
)
"""The tables' rows: each machine and sequence length with its one-GPU rate (sequences/s; the
DGX-2H's its node's per GPU) and, per node count, the micro-batches per step and the
throughput."""


def _case(machine: str, sequence: int, batch: int, rate: float,
          rows: dict[int, tuple[int, float]], nodes: int) -> Case:
    (base_steps, base), (steps, every) = rows[1], rows[nodes]
    per_node, joined = MACHINES[machine][3], JOINED[machine]
    one = (f"each GPU at one node's rate over {per_node}, {rate:.1f}" if machine == "DGX-2H"
           else f"one GPU at the single-node table's {rate:.1f}")
    return Case(
        f"NVIDIA BERT-large pre-training (2019), {nodes} {machine}, mixed precision, sequence "
        f"{sequence}", "efficiency", every / (nodes * base),
        f"{nodes} {machine} ({per_node}x{nodes}; {joined} each) against one, {batch} "
        f"sequences/GPU x {steps} micro-batches (one node: x {base_steps}), one float16 "
        f"allreduce after them, mixed precision, {one} sequences/s",
        f"{BERT_DLE_2019}: {base} and {every} sequences/s",
        weak_scaling(_pretrain(machine, "mixed precision", sequence, batch, rate,
                               (base_steps, steps), (1, nodes))))


SQUAD_2019 = (  # machine, precision, batch per GPU, {GPUs: sequences/s}
    ("DGX-1 16 GB", "FP32", 4, {1: 8.96, 4: 31.04, 8: 64.64}),
    ("DGX-1 16 GB", "mixed precision", 4, {1: 35.88, 4: 120.00, 8: 227.84}),
    ("DGX-1 16 GB", "mixed precision", 10, {1: 45.2, 4: 163.6, 8: 327.2}),
    ("DGX-1 32 GB", "FP32", 8, {1: 8.64, 4: 31.52, 8: 64.32}),
    ("DGX-1 32 GB", "mixed precision", 8, {1: 36.04, 4: 116.80, 8: 231.04}),
    ("DGX-1 32 GB", "mixed precision", 10, {1: 46.00, 4: 164.00, 8: 325.60}),
    ("DGX-2", "FP32", 4, {1: 9.92, 4: 35.52, 8: 71.36, 16: 141.40}),
    ("DGX-2", "mixed precision", 4, {1: 38.16, 4: 122.08, 8: 241.28, 16: 462.08}),
    ("DGX-2", "mixed precision", 10, {1: 47.40, 4: 165.60, 8: 325.60, 16: 648.00}),
)
"""The fine-tuning tables, row by row (sequence length 384)."""
DOUBTFUL_2019 = frozenset({("DGX-1 32 GB", 8)})
"""Machine and batch per GPU of the fine-tuning rows whose rates contradict their table."""


def _squad_cases(machine: str, precision: str, batch: int, rates: dict[int, float]
                 ) -> list[Case]:
    single = rates[1]
    return [squad_case(
        f"NVIDIA BERT-large SQuAD fine-tuning (2019), {gpus} GPUs of a {machine}, {precision}, "
        f"batch {batch}", SQUAD_DLE_2019, machine, precision, batch, single, gpus, every)
        for gpus, every in rates.items()
        if gpus > 1 and (machine, batch) not in DOUBTFUL_2019]


BERT_2019_CASES = (*(_case(machine, sequence, batch, rate, rows, nodes)
                     for machine, sequence, batch, rate, rows in BERT_2019_RUNS
                     for nodes in sorted(rows) if nodes > 1),
                   *(case for run in SQUAD_2019 for case in _squad_cases(*run)))
"""The tables' points, in their order: multi-node pre-training, then single-node fine-tuning."""
