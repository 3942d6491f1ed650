"""A DDP communication hook that runs DDP's gradient buckets through a scaledl algorithm.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, scaledl.ddp_hook(algorithm="ring"))

DDP keeps its bucketing, overlap and unused-parameter handling; each bucket's allreduce becomes a
scaledl collective (averaged), run in order on the group's communicator thread, and DDP receives
a ``torch.futures.Future`` that completes when it is done.  This module deliberately does not use
``from __future__ import annotations``: DDP inspects the hook's real annotation objects.
"""

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.topology import Topology

__all__ = ["ddp_hook"]

# torch.distributed imports GradBucket without re-exporting it, so strict mypy cannot see it there.
HookFunction = Callable[
    [object, dist.GradBucket],  # type: ignore[name-defined]
    torch.futures.Future[torch.Tensor],
]


def _value(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return future.value()


def ddp_hook(
    algorithm: str = "auto", topology: Topology | None = None,
    group: dist.ProcessGroup | None = None,
) -> HookFunction:
    """A comm hook averaging each DDP bucket with scaledl's ``algorithm``.

    With a process group already made, the algorithm and topology are checked here (an
    algorithm that needs the layout without one raises now, not at the first backward).
    """
    if dist.is_initialized():
        collectives.resolve_topology(algorithm, "allreduce", topology, group)
    elif algorithm != "auto":
        collectives.lookup(algorithm, "allreduce")

    def scaledl_allreduce_hook(
        state: object, bucket: dist.GradBucket  # type: ignore[name-defined]
    ) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        handle = collectives.allreduce(
            buffer, op="avg", algorithm=algorithm, topology=topology, group=group,
            async_op=True,
        )
        assert handle is not None

        def resolve(error: BaseException | None) -> None:
            if error is None:
                future.set_result(buffer)
            else:
                future.set_exception(error)  # type: ignore[arg-type]  # torch stub

        handle.add_done_callback(resolve)
        # DDP reads a failed future's value in C++, where an exception set from Python is an
        # object it cannot cast to a tensor; a callback that raises fails the future it returns
        # with the error's text, which DDP raises.
        return future.then(_value)

    return scaledl_allreduce_hook
