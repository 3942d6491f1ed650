"""Megatron-LM's GPT in pure data parallelism as measured by a third party on 1 to 4 servers of 8
V100 with one EDR InfiniBand port each: published scaling points of a 534M-parameter decoder,
added after every preset was set and predicted with none changed (docs/simulation.md,
"Reproducing published results").

Source (``DLPERF_MEGATRON``): Oneflow-Inc/DLPerf ``Megatron-LM/README.md`` (the cases, the
machines and each case's time per iteration) and ``reports/GPT/dlperf_gpt_test_report_210512.md``
(the same runs as sequences per second), read at commit c89430b.

- The machines are DLPerf's (:mod:`scaledl.sim.cases_dlperf`): 8 Tesla V100-SXM2-16GB per node
  in the DGX-1's NVLink mesh, one 100 Gb/s EDR InfiniBand port per node (``ib-edr``; the README
  installs the InfiniBand driver in the container, checked with ``ibstat``, so that NCCL can use
  verbs rather than sockets; the script names ``ib0`` for NCCL's own bootstrap sockets); NGC's
  pytorch:20.12-py3 (NCCL 2.8.3).
- The runs: NVIDIA/Megatron-LM at commit 8aa4619 (March 2021), DLPerf's
  ``Megatron-LM/scripts/mutil_perf_pretrain_gpt_dp_mp_pp.sh`` with tensor and pipeline
  parallelism of 1: 16 layers of 1536 with 16 heads, 2048-token sequences, 2 sequences per GPU,
  no accumulation (global batch = 2 x GPUs), ``--fp16`` and ``--checkpoint-activations``.
- How it reduces (Megatron-LM at 8aa4619): ``--DDP-impl`` defaults to ``local``, whose
  ``megatron/model/distributed.py`` flattens every gradient of one dtype into one buffer and
  allreduces it after backward has ended (``train_step`` calls ``allreduce_params`` after
  ``forward_backward_no_pipelining``), then synchronises; under ``--fp16`` the model and its
  gradients are float16 and ``--fp32-allreduce`` is not set, so one float16 allreduce of all
  533.7M gradients per step, nothing overlapped.
- The vocabulary: Megatron pads GPT-2's 50,257 tokens to a multiple of 128 times the tensor-
  parallel size (``--make-vocab-size-divisible-by``, default 128; the script sets neither), so
  50,304 here; DLPerf's report says 51,200 for every case (the padding of its 8-way
  tensor-parallel cases) and counts FLOPs with it.  The difference is 1.4M parameters, 0.26%.
- Each case's one-GPU time per iteration as the measured compute (``compute_time``), activation
  recomputation included; the stack's per-call costs are torch DDP's (``nccl``), as for the
  other recipes that reduce once per step.
- Left out: the tensor-, pipeline- and mixed-parallel cases (the simulator models data
  parallelism only), and the ``2D_8x1x1`` case, which repeats ``DP_8x1x1`` (480.22 ms against
  480.96) and is not a second point.
"""

from __future__ import annotations

from dataclasses import replace

from scaledl.sim.cases_dlperf import servers
from scaledl.sim.job import Job
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["MEGATRON_CASES", "DLPERF_MEGATRON", "MEGATRON_RUNS", "ONE_BUCKET_MB", "MODEL",
           "SEQUENCE", "BATCH", "ONE_GPU_MS", "megatron_job"]

DLPERF_MEGATRON = ("Oneflow-Inc/DLPerf Megatron-LM/README.md and "
                   "reports/GPT/dlperf_gpt_test_report_210512.md (commit c89430b; NVIDIA/"
                   "Megatron-LM 8aa4619, pytorch:20.12-py3 NGC container)")
"""The source."""
MODEL = "megatron_gpt_1536x16"
"""The registry's Megatron GPT of DLPerf's data-parallel cases."""
SEQUENCE = 2048
"""Tokens per sequence (``--seq-length``)."""
BATCH = 2
"""Sequences per GPU (``--micro-batch-size``), one micro-batch per step."""
ONE_BUCKET_MB = 4096.0
"""Megatron's local DDP reduces all gradients of a dtype as one flattened buffer: one bucket,
larger than the model's 533.7M gradients even as float32 (2036 MiB)."""
ONE_GPU_MS = 464.12
"""``DP_1x1x1_2_1536x16``: milliseconds per iteration on one GPU (4.31 sequences/s)."""
MEGATRON_RUNS = (  # GPUs, milliseconds per iteration (the report's sequences/s)
    (8, 480.96),  # DP_8x1x1_16_1536x16: 33.27 sequences/s
    (16, 664.46),  # DP_16x1x1_32_1536x16: 48.16
    (32, 683.51),  # DP_32x1x1_64_1536x16: 93.63
)
"""The data-parallel cases on 1, 2 and 4 nodes against one GPU."""


def megatron_job(gpus: int) -> Job:
    """The data-parallel run on ``gpus`` GPUs of DLPerf's servers."""
    return replace(servers(gpus)[0], model=MODEL, input_shape=(SEQUENCE,), batch=BATCH,
                   bucket_mb=ONE_BUCKET_MB, allreduce_bytes=2, compute_time=ONE_GPU_MS / 1e3,
                   mixed_precision=True)


def _case(gpus: int, milliseconds: float) -> Case:
    return Case(
        f"DLPerf, Megatron-LM GPT 1536x16, {gpus} V100, FP16, batch {BATCH}", "efficiency",
        ONE_GPU_MS / milliseconds,
        f"{servers(gpus)[1]}, Megatron's local DDP: one float16 allreduce of all 533.7M "
        f"gradients after backward, {BATCH} sequences of {SEQUENCE} tokens/GPU, FP16 with "
        f"activation recomputation, one GPU at the published {ONE_GPU_MS} ms per iteration",
        f"{DLPERF_MEGATRON}: {ONE_GPU_MS} and {milliseconds} ms per iteration",
        weak_scaling(against_one_gpu(megatron_job(gpus))))


MEGATRON_CASES = tuple(_case(*run) for run in MEGATRON_RUNS)
"""DLPerf's Megatron-LM data-parallel points, in the README's order."""
