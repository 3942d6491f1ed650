"""NVIDIA's BERT-large pre-training recipe in TensorFlow 2 (Horovod): published scaling points on
one DGX-2 (1 to 16 V100), one DGX A100 (1 to 8 A100), up to 32 DGX-2H (512 V100) and up to 32
DGX A100 (256 A100), added after every preset was set and predicted with none changed
(docs/simulation.md, "Reproducing published results").

Source (``BERT_TF2``): NVIDIA/DeepLearningExamples ``TensorFlow2/LanguageModeling/BERT/README.md``
at commit afb7dd1 (April 2021, the recipe's first release, tensorflow:21.02-tf2-py3 NGC
container), its four pre-training performance tables.  What the cases take from the README and
the recipe's code at that commit:

- how gradients are reduced (``official/modeling/model_training_utils.py``): every micro-batch
  adds its gradients to a local accumulator with no communication; after the last, each
  gradient goes through ``hvd.allreduce`` (Horovod fuses them; ``HOROVOD_*`` is set nowhere in
  the recipe, so the defaults of the container's Horovod hold: the ``horovod-0.21`` stack, see
  below), with ``Compression.fp16`` under mixed precision (float16 on the wire,
  ``allreduce_bytes=2``) and none at FP32 and TF32; the reduction starts when the accumulation
  loop has ended, so it overlaps no compute (``overlap=False``), except with one micro-batch
  per step (32 DGX A100 at mixed precision and sequence length 128), where
  ``hvd.DistributedGradientTape`` reduces each gradient as backward produces it.  The loop also
  reduces after the first micro-batch of every 100 steps (``steps_per_loop``), one extra
  reduction per 100: not modelled;
- Horovod's release: the recipe's Dockerfile (``pip3 install horovod``) keeps the container's,
  which the recipe does not name; NGC's TensorFlow release notes list Horovod 0.20.0 in 20.10
  and 0.21.3 in 21.04, so 21.02 is taken to carry a 0.21 release, whose defaults are a 1 ms
  cycle and 128 MiB fusion buffers (the ``horovod-0.21`` stack) where earlier releases had 5 ms
  and 64 MiB (``horovod``: the 32-node mixed-precision rows move by up to 12 points,
  docs/simulation.md);
- the micro-batch and the micro-batches per step of every row, from its table; the DGX-2H table's
  mixed-precision rows at sequence length 512 list 96 and 24 micro-batches on 4 and 16 nodes,
  which contradicts the global batch the same rows state (30720), and the recipe's
  ``scripts/configs/configurations.yml`` at that commit gives 48 and 12 (``DGX2_n4p2``,
  ``DGX2_n16p2``): those are taken.  Its FP32 rows at 512 give 256 and 64 micro-batches of 4
  on 1 and 4 nodes, a global batch of 16384 against the 32768 of its 16- and 32-node rows, and
  no configuration settles it: the table's values are taken (with 64 or more micro-batches per
  reduction either count hides it);
- the machines (``cases_bert.MACHINES``): a DGX-2 and a DGX-2H are 16 V100 on NVSwitch with
  eight EDR InfiniBand adapters; a DGX A100 eight A100 on NVSwitch with eight HDR adapters.  The
  README names no network: the adapters are the machines' datasheets, as for the PyTorch
  recipe's multi-node rows.  The DGX A100 multi-node table is said to be measured on A100 40 GB
  in its text and 80 GB in its heading; the ``a100-80gb`` preset is used, whose compute the
  measured rate replaces either way;
- the compute per micro-batch from the tables' own rates: the one-GPU row of each single-node
  table, and for the multi-node tables (which have no one-GPU row) one node's rate per GPU.

Efficiency is per-GPU throughput at ``N`` GPUs (or nodes) over that of one GPU (or node), the
tables' "weak scaling" column divided by ``N``.
"""

from __future__ import annotations

from collections.abc import Callable

from scaledl.sim.cases_bert import MACHINES, _dtype, _wire
from scaledl.sim.job import Job
from scaledl.sim.losses import stack
from scaledl.sim.reproduce import Case, weak_scaling

__all__ = ["BERT_TF2_CASES", "BERT_TF2", "TF2_SINGLE_NODE", "TF2_NODES", "STACK",
           "tf2_job", "single_gpu_rates"]

BERT_TF2 = ("NVIDIA/DeepLearningExamples TensorFlow2/LanguageModeling/BERT/README.md (commit "
            "afb7dd1, April 2021, tensorflow:21.02-tf2-py3 NGC container), pre-training "
            "performance tables")
"""The source."""

STACK = "horovod-0.21"
"""The container's Horovod (see above)."""

Row = tuple[int, int, float]
"""Micro-batch per GPU, micro-batches per step, sequences/s."""

TF2_SINGLE_NODE: tuple[tuple[str, str, int, dict[int, Row]], ...] = (
    ("DGX-2", "mixed precision", 128, {1: (60, 1024, 206.5), 4: (60, 256, 789.75),
                                       8: (60, 128, 1561.77), 16: (60, 64, 3077.99)}),
    ("DGX-2", "FP32", 128, {1: (32, 2048, 49.97), 4: (32, 512, 194.02),
                            8: (32, 256, 367.9), 16: (32, 128, 762.22)}),
    ("DGX-2", "mixed precision", 512, {1: (10, 3072, 40.95), 4: (10, 768, 158.5),
                                       8: (10, 384, 312.03), 16: (10, 192, 614.94)}),
    ("DGX-2", "FP32", 512, {1: (6, 5120, 11.06), 4: (6, 1280, 43.05), 8: (6, 640, 85.51),
                            16: (4, 512, 161.38)}),
    ("DGX A100", "mixed precision", 128, {1: (312, 256, 485.59), 8: (312, 32, 3799.24)}),
    ("DGX A100", "TF32", 128, {1: (176, 512, 282.98), 8: (176, 64, 1944.77)}),
    ("DGX A100", "mixed precision", 512, {1: (40, 768, 96.52), 8: (40, 96, 649.69)}),
    ("DGX A100", "TF32", 512, {1: (22, 1536, 54.92), 8: (22, 192, 427.39)}),
)
"""The single-node tables: per GPU count, the row's micro-batch, micro-batches and throughput."""

TF2_NODES: tuple[tuple[str, str, int, dict[int, Row]], ...] = (
    ("DGX-2H", "mixed precision", 128, {1: (60, 64, 3528.51), 4: (60, 16, 13370.21),
                                        16: (60, 4, 42697.42), 32: (60, 2, 84223.16)}),
    ("DGX-2H", "FP32", 128, {1: (32, 128, 841.72), 4: (32, 32, 3060.49),
                             16: (32, 8, 10383.57), 32: (32, 4, 20094.14)}),
    ("DGX-2H", "mixed precision", 512, {1: (10, 192, 678.35), 4: (10, 48, 2678.29),
                                        16: (10, 12, 7834.72), 32: (10, 6, 18786.93)}),
    ("DGX-2H", "FP32", 512, {1: (4, 256, 180.0), 4: (4, 64, 646.76), 16: (4, 32, 2204.72),
                             32: (4, 16, 4196.15)}),
    ("DGX A100", "mixed precision", 128, {1: (312, 32, 3803.82), 2: (312, 16, 7551.37),
                                          8: (312, 4, 29711.11), 32: (312, 1, 110280.73)}),
    ("DGX A100", "TF32", 128, {1: (176, 64, 2062.98), 2: (176, 32, 4084.76),
                               8: (176, 8, 16134.02), 32: (176, 2, 59569.77)}),
    ("DGX A100", "mixed precision", 512, {1: (40, 96, 749.73), 2: (40, 48, 1491.87),
                                          8: (40, 12, 5870.83), 32: (40, 3, 22506.23)}),
    ("DGX A100", "TF32", 512, {1: (22, 192, 431.89), 2: (22, 96, 739.14),
                               8: (22, 24, 2926.58), 32: (22, 6, 11240.5)}),
)
"""The multi-node tables: per node count, the row's micro-batch, micro-batches and throughput
(sequences/s of all nodes)."""


def single_gpu_rates() -> tuple[tuple[str, str, int, int, float], ...]:
    """The single-node tables' one-GPU rates: machine, precision, sequence length, batch per
    GPU and sequences/s (for the single-GPU rate checks, ``scaledl.sim.device_checks``)."""
    return tuple((machine, precision, sequence, *rows[1][::2])
                 for machine, precision, sequence, rows in TF2_SINGLE_NODE)


def tf2_job(machine: str, precision: str, sequence: int, batch: int, steps: int, gpus: int,
            rate: float, ideal: bool = False) -> Job:
    """``gpus`` GPUs of ``machine`` (whole nodes beyond one), each at ``rate`` sequences/s, taking
    optimizer steps of ``steps`` micro-batches of ``batch`` sequences: after the last, every
    gradient goes through Horovod in fused buffers, float16 at mixed precision, with no compute
    beside it; with one micro-batch per step the recipe's ``hvd.DistributedGradientTape``
    reduces each gradient as backward produces it, overlapped."""
    device, intra, network, per_node = MACHINES[machine]
    topology = str(gpus) if gpus <= per_node else f"{per_node}x{gpus // per_node}"
    return Job(model="bert_large", input_shape=(sequence,), gpus=gpus, topology=topology,
               algorithm="ring", device=device, intra=intra, network=network, batch=batch,
               allreduce_bytes=_wire(precision), accumulation=steps, overlap=steps == 1,
               compute_time=batch / rate, stack=STACK,
               mixed_precision=precision == "mixed precision" and not ideal, ideal=ideal)


def _pair(machine: str, precision: str, sequence: int, rows: dict[int, Row], rate: float,
          unit: int, multiple: int) -> Callable[[bool], tuple[Job, Job]]:
    """The row of ``unit`` GPUs (one GPU, or one node) against the row of ``multiple`` times
    as many, each GPU at ``rate``."""
    def jobs(ideal: bool) -> tuple[Job, Job]:
        (small_batch, small_steps, _), (batch, steps, _) = rows[1], rows[multiple]
        return (tf2_job(machine, precision, sequence, small_batch, small_steps, unit, rate,
                        ideal),
                tf2_job(machine, precision, sequence, batch, steps, unit * multiple, rate,
                        ideal))
    return jobs


def _reduction(precision: str) -> str:
    cycle = stack(STACK).cycle
    assert cycle is not None
    return (f"every {_dtype(precision)} gradient through Horovod after them (0.21's defaults: "
            f"{cycle.cycle_s * 1e3:g} ms cycle, {cycle.fusion_bytes >> 20} MiB fusion buffers)")


def _single(machine: str, precision: str, sequence: int, rows: dict[int, Row], gpus: int
            ) -> Case:
    batch, steps, throughput = rows[gpus]
    single = rows[1][2]
    return Case(
        f"NVIDIA BERT-large pre-training in TensorFlow 2, {gpus} GPUs of a {machine}, "
        f"{precision}, sequence {sequence}", "efficiency", throughput / (gpus * single),
        f"{gpus} GPUs of one {machine}, {batch} sequences/GPU x {steps} micro-batches (one GPU: "
        f"{rows[1][0]} x {rows[1][1]}), {_reduction(precision)}, {precision} with XLA, one GPU "
        f"at {single} sequences/s",
        f"{BERT_TF2}: {single} and {throughput} sequences/s",
        weak_scaling(_pair(machine, precision, sequence, rows, single, 1, gpus)))


def _nodes(machine: str, precision: str, sequence: int, rows: dict[int, Row], nodes: int
           ) -> Case:
    batch, steps, throughput = rows[nodes]
    base, per_node = rows[1][2], MACHINES[machine][3]
    return Case(
        f"NVIDIA BERT-large pre-training in TensorFlow 2, {nodes} {machine}, {precision}, "
        f"sequence {sequence}", "efficiency", throughput / (nodes * base),
        f"{nodes} {machine} ({per_node}x{nodes}) against one, {batch} sequences/GPU x {steps} "
        f"micro-batches (one node: x {rows[1][1]}), {_reduction(precision)}, {precision} with "
        f"XLA, each GPU at one node's rate over {per_node}, {base / per_node:.1f} sequences/s",
        f"{BERT_TF2}, multi-node: {base} and {throughput} sequences/s",
        weak_scaling(_pair(machine, precision, sequence, rows, base / per_node, per_node,
                           nodes)))


BERT_TF2_CASES = (
    *(_single(machine, precision, sequence, rows, gpus)
      for machine, precision, sequence, rows in TF2_SINGLE_NODE for gpus in rows if gpus > 1),
    *(_nodes(machine, precision, sequence, rows, nodes)
      for machine, precision, sequence, rows in TF2_NODES for nodes in rows if nodes > 1),
)
"""The tables' points, in their order."""
