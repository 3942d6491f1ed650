"""Where a rank trains: the CPU over Gloo, or one GPU per rank over NCCL.

With ``device = "cuda"`` rank ``r`` of a host uses GPU ``LOCAL_RANK`` (torchrun, ``mpirun``,
``srun`` and ``scaledl train``'s own launcher all set it), as torch's DDP does with
``device_ids=[local_rank]``; the model, every batch and the trainer's own small collectives
(evaluation counts, checkpoint agreement) live there, and the process group is NCCL's.  What
cannot run is refused before any worker starts (:func:`check_device`): no CUDA, no NCCL, more
local workers than GPUs, bf16 on a GPU without it, and strategies whose parameter server or
round-robin master speaks point to point on host tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaledl.strategies.catalogue import strategy_class
from scaledl.train.config import TrainConfig

__all__ = ["BACKENDS", "check_device", "rank_device", "check_local_ranks"]

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
"""The process-group backend of each ``device``."""


def check_device(config: TrainConfig, local_workers: int | None = None) -> None:
    """A one-line ``ValueError`` for a device this host or the strategy cannot train on;
    ``local_workers``: the ranks this host will start (``None``: not known here)."""
    device = config.run.device
    if device != "cuda":
        return
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise ValueError(f"device 'cuda' but this host has no usable CUDA GPU ({build}); use "
                         "--device cpu, or run on a GPU host with a CUDA build of torch")
    if not dist.is_nccl_available():
        raise ValueError("device 'cuda' trains over NCCL, which this torch build lacks; use "
                         "--device cpu or a torch build with NCCL")
    if local_workers is not None:
        check_local_ranks(local_workers, torch.cuda.device_count())
    if config.run.precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision 'bf16' but {torch.cuda.get_device_name(0)} has no "
                         "bfloat16; use --precision fp16 (with its gradient scaler) or fp32")
    parallel = config.parallel
    kind = strategy_class(parallel.strategy).collective_kind(parallel.easgd_form or "tree")
    if kind == "none":
        raise ValueError(f"strategy {parallel.strategy!r} exchanges host tensors point to point "
                         "(a parameter server or a round-robin master) and does not run with "
                         "--device cuda; use --device cpu, or a collective strategy such as "
                         "allreduce, local-sgd or sync-easgd")


def check_local_ranks(local_workers: int, gpus: int) -> None:
    """One GPU per rank: a host starting more ranks than it has GPUs is refused."""
    if local_workers > gpus:
        raise ValueError(f"{local_workers} workers on this host but it has {gpus} GPU(s), and "
                         f"--device cuda gives each rank its own; give --workers {gpus} or fewer")


def rank_device(device: str, local_rank: int, gpus: int) -> torch.device:
    """The device of the rank with ``local_rank`` on a host with ``gpus`` GPUs: the CPU, or
    GPU ``local_rank``."""
    if device == "cpu":
        return torch.device("cpu")
    if not 0 <= local_rank < gpus:
        raise ValueError(f"local rank {local_rank} has no GPU: this host has {gpus}; start at "
                         f"most {gpus} ranks per host with --device cuda")
    return torch.device("cuda", local_rank)
