"""A DDP communication hook that runs DDP's gradient buckets through a scaledl algorithm.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, scaledl.ddp_hook(algorithm="ring"))

DDP keeps its bucketing, overlap and unused-parameter handling; each bucket's allreduce becomes a
scaledl collective (averaged), run in order on the group's communicator thread, and DDP receives
a ``torch.futures.Future`` that completes when it is done.  ``compression=`` (``"bf16"``,
``"fp16"``, ``"powersgd:RANK"``..., see :mod:`scaledl.sync.compression`) sends each bucket
compressed, its collectives still scaledl's: pass it here rather than wrapping the hook in
torch's ``fp16_compress_wrapper``, whose float16 cast is unscaled and can overflow.  This
module deliberately does not use ``from __future__ import annotations``: DDP inspects the hook's
real annotation objects.
"""

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.sync.compression import NoCompression, resolve_compression
from scaledl.sync.wire import BucketLayout, GradientCompression, Wire
from scaledl.topology import Topology

__all__ = ["ddp_hook"]

# torch.distributed imports GradBucket without re-exporting it, so strict mypy cannot see it there.
HookFunction = Callable[
    [object, dist.GradBucket],  # type: ignore[name-defined]
    torch.futures.Future[torch.Tensor],
]


def _value(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return future.value()


def _layout(bucket: dist.GradBucket) -> BucketLayout:  # type: ignore[name-defined]
    """Where DDP put each gradient of ``bucket`` in its flat buffer."""
    buffer = bucket.buffer()
    gradients = bucket.gradients()
    offsets = tuple((g.data_ptr() - buffer.data_ptr()) // buffer.element_size()
                    for g in gradients)
    return BucketLayout(tuple(tuple(g.shape) for g in gradients), offsets)


def ddp_hook(
    algorithm: str = "auto", topology: Topology | None = None,
    group: dist.ProcessGroup | None = None,
    compression: str | GradientCompression = "none",
) -> HookFunction:
    """A comm hook averaging each DDP bucket with scaledl's ``algorithm``, compressed as
    ``compression`` says (``"none"``, ``"bf16"``, ``"fp16"``, ``"powersgd"``,
    ``"powersgd:RANK"`` or a :class:`~scaledl.sync.wire.GradientCompression`; one hook per
    model, since PowerSGD keeps state per bucket).

    With a process group already made, the algorithm and topology are checked here (an
    algorithm that needs the layout without one raises now, not at the first backward).
    """
    codec = resolve_compression(compression)
    wires: list[Wire] = []  # made at the first bucket, when the group surely exists
    if dist.is_initialized():
        collectives.resolve_topology(algorithm, "allreduce", topology, group)
    elif algorithm != "auto":
        collectives.lookup(algorithm, "allreduce")

    def scaledl_allreduce_hook(
        state: object, bucket: dist.GradBucket  # type: ignore[name-defined]
    ) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        if isinstance(codec, NoCompression):
            handle = collectives.allreduce(
                buffer, op="avg", algorithm=algorithm, topology=topology, group=group,
                async_op=True,
            )
            assert handle is not None
        else:
            if not wires:
                wires.append(Wire(algorithm, topology, group))
            handle = codec.start(bucket.index(), buffer, _layout(bucket), wires[0])

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

    if not isinstance(codec, NoCompression):
        codec.claim(scaledl_allreduce_hook)
    return scaledl_allreduce_hook
