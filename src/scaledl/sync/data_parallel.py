"""DataParallel: scaledl's one-line replacement for DistributedDataParallel.

``model = scaledl.DataParallel(model, algorithm="ring")`` then train as usual: ``loss.backward()``
returns with every gradient averaged over the ranks, so any torch optimizer works unchanged.

On wrapping, every rank checks that all ranks built the same model (names, shapes, dtypes;
otherwise a ``ValueError`` naming the first difference, on every rank) and takes rank 0's
parameters and buffers.  During backward, gradients are packed into buckets in reverse
registration order and each full bucket is averaged with an asynchronous scaledl allreduce
while backward goes on (:mod:`scaledl.sync.reducer`); the end of backward waits for the last
ones.  ``no_sync()`` skips the reduction for gradient accumulation (decided at forward time, as
in DDP).  A backward that raises is survived: the next forward closes its step, and the next
backward reduces normally.  A backward nested in backward (reentrant activation checkpointing)
counts in the step of the backward around it.  When the ranks
share a host's memory, the buckets live in a shared-memory arena and the shared-memory path
reduces them where they are (no copy in; :mod:`scaledl.collectives.shm_inplace`).

``compression=`` sends the buckets compressed (:mod:`scaledl.sync.compression`): ``"bf16"``,
``"fp16"`` (scaled by a power of two agreed over the ranks, so no sum overflows),
``"powersgd"`` or ``"powersgd:RANK"`` (:mod:`scaledl.sync.powersgd`), or a
:class:`~scaledl.sync.wire.GradientCompression`; the default ``"none"`` sends them as they
are.  Each bucket is still launched from backward as soon as it is full; its compression,
collectives and decompression run as one job on the group's communicator thread.

Devices follow DDP's rule: a model on one GPU per process, wrapped with
``device_ids=[local_rank]``, gets its forward's tensor inputs (nested in tuples, lists and
dicts) moved to that GPU, and its output to ``output_device`` where that is another device;
without ``device_ids`` nothing is moved.  What DDP leaves to the first forward is refused at
wrap time, on every rank: ``device_ids`` with a model on the CPU or on several devices, more
than one id, or a model that is not on the device ``device_ids`` names.

A parameter that gets no gradient in a step (a branch not taken, on one rank or all) does not
hang the job: at the end of backward its slot contributes its accumulated ``.grad`` or zeros.
Where some rank used it, its ``.grad`` then holds the average on every rank; where no rank did,
its ``.grad`` is left as it was (``None`` after ``zero_grad()``), as single-process training
and DDP with ``find_unused_parameters`` leave it, so momentum and weight decay do not move it
(the ranks learn which parameters nobody used from a flag per parameter reduced with the
gradients; see :mod:`scaledl.sync.reducer`).
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map_only

from scaledl import collectives
from scaledl.collectives import CollectiveHandle
from scaledl.collectives.communicator import communicator_for
from scaledl.sync.bucketing import Bucket, plan_buckets
from scaledl.sync.compression import CastCompression, NoCompression, resolve_compression
from scaledl.sync.consistency import broadcast_state, broadcast_tensors, check_same_model
from scaledl.sync.reducer import GradientReducer, buffer_numels
from scaledl.sync.stats import SpanRecorder, SyncStats
from scaledl.sync.wire import BucketLayout, GradientCompression, Wire
from scaledl.topology import Topology

__all__ = ["DataParallel"]

MiB = 1 << 20


class DataParallel(nn.Module):
    """Wrap ``module`` so backward averages gradients over the ranks of ``group``."""

    def __init__(
        self, module: nn.Module, algorithm: str = "auto", bucket_mb: float = 25.0,
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        broadcast_buffers: bool = True, timeline: SpanRecorder | None = None,
        compression: str | GradientCompression = "none",
        device_ids: Sequence[int | str | torch.device] | None = None,
        output_device: int | str | torch.device | None = None,
    ) -> None:
        super().__init__()
        # what a rank refuses of its own arguments is raised on every rank (check_same_model),
        # so the others do not wait for it in the model check
        problem: ValueError | TypeError | None = None
        try:
            _check_wrappable(module)
            _check_bucket_mb(bucket_mb)
            self.compression = resolve_compression(compression)
            """How buckets travel (:mod:`scaledl.sync.compression`)."""
            self.topology = collectives.resolve_topology(algorithm, "allreduce", topology, group)
            self.device, self.output_device = _placement(
                {t.device for t in (*module.parameters(), *module.buffers())},
                device_ids, output_device)
        except (ValueError, TypeError) as error:
            problem = error
        if not dist.is_initialized():
            raise problem or RuntimeError(
                "call scaledl.init() before wrapping a model in DataParallel")
        settings = [] if problem is not None else [
            f"setting algorithm {algorithm}", f"setting bucket_mb {bucket_mb:g}",
            f"setting compression {self.compression.spec()}"]
        check_same_model(module, group, settings, problem)
        self.module = module
        self.algorithm = algorithm
        self.group = group
        self.broadcast_buffers = broadcast_buffers
        self.world_size = dist.get_world_size(group)
        broadcast_state(module, group)
        named = list(module.named_parameters())
        self.buckets: list[Bucket] = plan_buckets(named, int(bucket_mb * MiB))
        compressed = not isinstance(self.compression, NoCompression)
        self._wire: Wire | None = None
        if compressed:
            self.compression.claim(self)
            self._wire = Wire(algorithm, topology, group)
        if isinstance(self.compression, CastCompression):
            wires = _shared_buffers(self.buckets, group, self, self.compression.wire_dtype)
            if wires is not None:
                self.compression.place_wire_buffers(dict(enumerate(wires)))
        shapes = {name: tuple(p.shape) for name, p in named}
        self._layouts = [BucketLayout(tuple(shapes[n] for n in b.names), b.offsets,
                                      tail=len(b.names)) for b in self.buckets]
        """Each bucket's gradients and its flags, as the compression sees them."""
        self.reducer = GradientReducer(self.buckets, dict(named), self._launch, timeline,
                                       buffers=None if compressed else
                                       _shared_buffers(self.buckets, group, self),
                                       track_unused=True, sparse=_sparse_gradients(module),
                                       nested_backward=True)
        self.require_backward_grad_sync = True
        """False inside :meth:`no_sync`; read by :meth:`forward`, as in DDP."""
        _warn_if_wrapped(module)
        _WRAPPERS[module] = weakref.ref(self)

    def _launch(self, bucket: Bucket, buffer: torch.Tensor) -> CollectiveHandle | None:
        if self._wire is not None:
            return self.compression.start(bucket.index, buffer, self._layouts[bucket.index],
                                          self._wire)
        return collectives.allreduce(
            buffer, op="avg", algorithm=self.algorithm, topology=self.topology,
            group=self.group, async_op=True,
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module (after taking rank 0's buffers, like DDP).

        Whether the backward of this forward averages gradients is decided here, as DDP
        decides it: by whether the forward ran inside :meth:`no_sync`.
        """
        self.reducer.close_abandoned()  # before any collective of this step
        self.reducer.enabled = self.require_backward_grad_sync
        if self.broadcast_buffers and self.world_size > 1:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                broadcast_tensors(buffers, group=self.group)
        if self.device is not None:
            args, kwargs = _moved((args, kwargs), self.device)
        output = self.module(*args, **kwargs)
        if self.output_device is not None and self.output_device != self.device:
            output = _moved(output, self.output_device)
        return output

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: the backward of a forward run inside the block does not
        average (DDP's rule: the forward decides); the first one outside averages the sum."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @property
    def stats(self) -> SyncStats:
        """Communication time, exposed wait time and bytes since the last ``stats.reset()``."""
        return self.reducer.stats

    def bucket_summary(self) -> list[tuple[int, int, int]]:
        """``(index, parameters, bytes)`` of every bucket, in launch order."""
        return [(b.index, len(b.names), b.nbytes) for b in self.buckets]


_WRAPPERS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[DataParallel]] = (
    weakref.WeakKeyDictionary()
)
"""The latest wrapper of each wrapped model, to notice a model wrapped twice."""


def _warn_if_wrapped(module: nn.Module) -> None:
    """Warn when ``module`` already has a live wrapper: both would average its gradients."""
    previous = _WRAPPERS.get(module)
    if previous is None or previous() is None:
        return
    gc.collect()  # a wrapper the script let go of may wait for the cycle collector
    if previous() is not None:
        warnings.warn("this model is already wrapped by a DataParallel that is still alive, so "
                      "both average its gradients (twice the communication; no_sync() of one "
                      "does not stop the other); drop the first wrapper (del it) before "
                      "wrapping the model again", stacklevel=3)


def _placement(
    devices: set[torch.device], device_ids: Sequence[int | str | torch.device] | None,
    output_device: int | str | torch.device | None,
) -> tuple[torch.device | None, torch.device | None]:
    """Where :meth:`DataParallel.forward` moves its inputs and its output, for a model whose
    tensors are on ``devices`` (DDP's rule: only when ``device_ids`` names the one accelerator
    the whole model is on; None: left where they are).  Unlike DDP, a model that is not on
    ``device_ids[0]`` is refused here rather than failing at its first forward."""
    kinds = sorted({d.type for d in devices})
    if "meta" in kinds:
        raise ValueError("the model has tensors on the meta device (shapes without values), "
                         "which cannot be averaged; give them values before wrapping, e.g. "
                         "model.to_empty(device='cpu') then load or initialise the weights")
    if len(kinds) > 1:
        raise ValueError(f"the model's tensors are on {', '.join(sorted(map(str, devices)))}; "
                         "DataParallel averages a model on one kind of device, so move it "
                         "first with model.to(device)")
    if isinstance(device_ids, (str, int, torch.device)):
        raise TypeError(f"device_ids={device_ids!r} must be a list, as DDP takes it: "
                        f"device_ids=[{device_ids!r}]")
    if not device_ids:
        if output_device is not None:
            raise ValueError(f"output_device={output_device!r} needs device_ids (the model's "
                             "one device, e.g. device_ids=[local_rank]); pass both or neither")
        return None, None
    if len(device_ids) != 1:
        raise ValueError(f"device_ids={list(device_ids)!r} names {len(device_ids)} devices, but "
                         "each process drives one device (as in DDP): start one process per "
                         "GPU and pass device_ids=[local_rank]")
    if kinds in ([], ["cpu"]) or len(devices) > 1:
        where = "on the CPU" if kinds in ([], ["cpu"]) else "on several devices"
        raise ValueError(f"device_ids={list(device_ids)!r} is for a model on one accelerator, "
                         f"but this model is {where}; leave device_ids out, or move the model "
                         "with model.to(f'cuda:{local_rank}') first")
    (model_device,) = devices
    device = _device(device_ids[0], model_device.type)
    if device != model_device:
        raise ValueError(f"device_ids={list(device_ids)!r} names {device} but the model is on "
                         f"{model_device}; move it with model.to('{device}') or pass "
                         f"device_ids=['{model_device}']")
    return device, device if output_device is None else _device(output_device, device.type)


def _device(value: int | str | torch.device, kind: str) -> torch.device:
    """``value`` (an index, ``"cuda:1"`` or a device) as a device of ``kind`` with an index."""
    if isinstance(value, bool) or not isinstance(value, (int, str, torch.device)):
        raise TypeError(f"a device is an index, a name such as 'cuda:0' or a torch.device, "
                        f"got {type(value).__name__} {value!r}")
    try:
        device = torch.device(kind, value) if isinstance(value, int) else torch.device(value)
    except RuntimeError:
        raise ValueError(f"{value!r} is not a device; pass an index such as 0 or a name such "
                         f"as '{kind}:0'") from None
    if device.type != kind or device.index is None:
        raise ValueError(f"device {value!r} must be a {kind} device with an index, such as "
                         f"'{kind}:0', as the model is on {kind}")
    return device


def _moved(tree: Any, device: torch.device) -> Any:
    """Every tensor in ``tree`` (nested tuples, lists, dicts) on ``device``."""
    return tree_map_only(torch.Tensor, lambda t: t.to(device, non_blocking=True), tree)


def _check_bucket_mb(bucket_mb: object) -> None:
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)):
        raise TypeError(f"bucket_mb must be a number of MiB, got {type(bucket_mb).__name__} "
                        f"{bucket_mb!r}")
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb {bucket_mb} must be > 0 (DDP's default is 25)")


def _check_wrappable(module: object) -> None:
    """A ``TypeError`` unless ``module`` is a model instance not yet wrapped for averaging."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"DataParallel wraps a model (an nn.Module instance), got "
                        f"{getattr(module, '__name__', type(module).__name__)!s}; build it "
                        "first, e.g. DataParallel(Net())")
    if isinstance(module, (DataParallel, nn.parallel.DistributedDataParallel)):
        raise TypeError(f"the model is already a {type(module).__name__}, whose gradients would "
                        "be averaged twice; wrap the model itself")


def _sparse_gradients(module: nn.Module) -> set[str]:
    """Names of the parameters whose gradients torch makes sparse: embeddings' weights with
    ``sparse=True`` (known at wrap time, so a rank that did not look any row up this step hands
    back the same layout as the others)."""
    return {f"{name}.weight" if name else "weight" for name, child in module.named_modules()
            if isinstance(child, (nn.Embedding, nn.EmbeddingBag)) and child.sparse}


def _shared_buffers(
    buckets: list[Bucket], group: dist.ProcessGroup | None, owner: object,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor] | None:
    """The buckets' buffers in shared memory (in ``dtype``, the buckets' own by default: a
    compression's wire dtype), when the group's ranks share a host's memory and every bucket is
    a CPU tensor of one dtype, so the shared-memory path reduces them in place; None otherwise
    (private ones are allocated).  The memory is released once ``owner`` (the wrapper) is
    gone."""
    dtypes = {b.dtype for b in buckets}
    if not buckets or len(dtypes) != 1 or any(b.device.type != "cpu" for b in buckets):
        return None
    numels = buffer_numels(buckets, track_unused=True)
    return communicator_for(group).shared_buffers(numels, dtype or dtypes.pop(), owner)
