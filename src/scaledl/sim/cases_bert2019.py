"""NVIDIA's BERT-large recipe in PyTorch as first published (2019): pre-training on 1 to 64 DGX-2H
(up to 1024 V100) and 1 to 16 DGX-1, published scaling points added after every preset was set
and predicted with none changed (docs/simulation.md, "Reproducing published results").

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
"""

from __future__ import annotations

from scaledl.sim.cases_bert import MACHINES, _pretrain
from scaledl.sim.reproduce import Case, weak_scaling

__all__ = ["BERT_2019_CASES", "BERT_DLE_2019", "BERT_2019_RUNS"]

BERT_DLE_2019 = ("NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md (commit "
                 "78e97e3, October 2019, pytorch:19.07-py3 NGC container), multi-node "
                 "pre-training tables; configurations.yml and run.sub at the same commit")
"""The source."""

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


BERT_2019_CASES = tuple(_case(machine, sequence, batch, rate, rows, nodes)
                        for machine, sequence, batch, rate, rows in BERT_2019_RUNS
                        for nodes in sorted(rows) if nodes > 1)
"""The tables' points, in their order."""
