"""Hugging Face Accelerate: average the gradient buckets of a prepared model with scaledl.

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model = register_comm_hook(model, algorithm="ring")

Accelerate wraps a model in ``DistributedDataParallel`` when it runs several processes, and
its ``DistributedDataParallelKwargs(comm_hook=...)`` takes only the names of PyTorch's built-in
hooks (``DDPCommunicationHookType``: fp16, bf16, PowerSGD), so a custom hook is registered on
the prepared model itself, before the first backward, as with plain DDP.
:func:`register_comm_hook` does that with :func:`scaledl.ddp_hook`, after :func:`scaledl.init`
has agreed on the job's layout over Accelerate's process group.  Everything else stays
Accelerate's: ``accelerator.backward``, ``accelerator.accumulate`` (DDP's ``no_sync``), mixed
precision, ``accelerate launch``.

On hosts without GPUs Accelerate runs several processes as one job only with
``Accelerator(cpu=True)`` (or ``ACCELERATE_USE_CPU=1``): otherwise, under torchrun, every process
joins the process group but ``prepare`` returns the bare model (``distributed_type`` NO, seen
with Accelerate 1.15) and each process trains alone; :func:`register_comm_hook` refuses such a
model rather than let that pass.

Nothing here imports Accelerate: the function works on whatever DDP model it is given.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scaledl.bootstrap import init
from scaledl.collectives import lookup
from scaledl.sync import ddp_hook
from scaledl.topology import Topology

__all__ = ["register_comm_hook"]


def register_comm_hook(
    model: nn.Module, algorithm: str = "auto", topology: Topology | str | None = None
) -> nn.Module:
    """Have scaledl's ``algorithm`` average the gradients of ``model`` (what
    ``accelerator.prepare`` returned); return ``model``.

    A single process has nothing to average: its model is returned unchanged.  ``topology``
    (a :class:`~scaledl.Topology` or a spec like ``"4x2"``) overrides the layout found from
    the hosts.  Raises ``TypeError`` for a model that is not ``DistributedDataParallel`` in a
    job of several processes (FSDP and DeepSpeed exchange gradients their own way).
    """
    if algorithm != "auto":
        lookup(algorithm, "allreduce")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"register_comm_hook needs the DistributedDataParallel model that "
            f"accelerator.prepare returns in this {dist.get_world_size()}-process job, not "
            f"{type(model).__name__}; pass the prepared model, and on hosts without GPUs create "
            "Accelerator(cpu=True), without which Accelerate trains every process alone (FSDP "
            "and DeepSpeed reduce gradients their own way)"
        )
    layout = init(topology=topology)
    hook = ddp_hook(algorithm=algorithm, topology=layout if topology is not None else None)
    try:
        model.register_comm_hook(None, hook)
    except RuntimeError as error:
        if "only be called once" not in str(error):
            raise
        raise ValueError(
            "the model already has a communication hook (register_comm_hook was called on it "
            "before, or Accelerate registered one from DistributedDataParallelKwargs(comm_hook="
            "...)); DDP takes one: register scaledl's once and leave comm_hook unset"
        ) from None
    return model
