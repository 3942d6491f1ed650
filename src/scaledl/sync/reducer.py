"""The gradient reducer: launch each bucket's collective as soon as backward has filled it.

How one backward pass goes:

1. a post-accumulate-grad hook on every trainable parameter copies its gradient into the
   parameter's slot of its bucket's flat buffer and counts it;
2. when a bucket is complete it is launched as an asynchronous collective, but only in bucket
   order: bucket ``k`` waits for ``0..k-1`` to launch, so every rank issues the same sequence
   even when gradients arrive in a different order;
3. at the end of backward (a callback queued on autograd's engine) buckets that are still
   incomplete are launched: the slot of a parameter that got no gradient in this step holds its
   accumulated ``.grad`` if it has one, else zeros, so a rank that did not use a parameter
   contributes zero instead of hanging the others; then every collective is waited for and the
   reduced gradient is copied from each slot into its parameter's ``.grad`` (a copy, not a view
   of the slot, as torch's DDP does by default: the buffers are reused by every step, and a
   gradient a script kept after ``zero_grad()`` must not change under it).

With ``track_unused`` (DataParallel), each bucket's buffer also carries one flag per parameter
after the gradients: 1 where this rank produced or accumulated a gradient for it, else 0.  The
flags are filled as the bucket launches (a bucket launches once all its parameters are ready or
at the end of backward, so every flag is known by then) and reduced with the gradients, so
afterwards every rank knows which parameters no rank used: their ``.grad`` is left as it was
(``None`` after ``zero_grad()``), as in single-process training and in DDP with
``find_unused_parameters``, so momentum and weight decay do not move a parameter that took no
part in the step.  One element per parameter, no extra collective.

A backward that raises (an out-of-memory error, a bad batch) never reaches step 3: autograd
drops the queued callback.  The reducer notices at the next backward, because its hooks then
fire in another autograd graph task: it first finishes the abandoned step (launches the buckets
not yet launched, whatever they hold, and waits for all of them, discarding the results), so
every rank has issued the same sequence of collectives, then reduces the new backward as usual.
With ``nested_backward`` (DataParallel), a hook firing in another graph task while a step is
open is instead taken as a backward nested in this one (reentrant activation checkpointing,
``checkpoint(..., use_reentrant=True)``, runs each block's backward as a backward of its own)
and counted in the open step; the owner then closes a step whose backward raised by calling
:meth:`GradientReducer.close_abandoned` before its next forward, as DDP prepares each backward
in its forward.  (The end-of-backward callback goes to the task of the first gradient to
arrive: the outer backward's, unless every parameter is inside a reentrant checkpoint.)
``enabled`` is read when the hooks fire; :class:`~scaledl.sync.data_parallel.DataParallel`
sets it at forward time, as DDP decides ``no_sync`` in its forward.

The reduction itself (allreduce-average, or reduce to a root) is the ``launch`` callable, so the
same machinery serves data parallelism and the reduce-broadcast strategy.  Time spent by the
collectives (on the communicator's thread) and time the training thread was blocked waiting for
them are accumulated in :class:`~scaledl.sync.stats.SyncStats`, from which the share of
communication hidden behind backward computation follows.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Collection, Sequence

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scaledl.collectives import CollectiveHandle
from scaledl.sync.bucketing import Bucket
from scaledl.sync.stats import SpanRecorder, SyncStats, charge_run, charge_wait
from scaledl.sync.wire import FinishingHandle

__all__ = ["GradientReducer", "Launch", "buffer_numels"]

log = logging.getLogger(__name__)

Launch = Callable[[Bucket, torch.Tensor], "CollectiveHandle | None"]
"""Start the collective of one bucket's flat buffer; return its handle (None if synchronous)."""


class GradientReducer:
    """Bucket buffers, readiness counting and launching for one model."""

    def __init__(
        self, buckets: Sequence[Bucket], parameters: dict[str, nn.Parameter], launch: Launch,
        timeline: SpanRecorder | None = None, label: str = "allreduce",
        buffers: Sequence[torch.Tensor] | None = None, track_unused: bool = False,
        sparse: Collection[str] = (), nested_backward: bool = False,
    ) -> None:
        self.buckets = list(buckets)
        self.track_unused = track_unused
        self.nested_backward = nested_backward
        self.sparse = frozenset(sparse)
        """Parameters whose reduced gradient is handed back sparse (e.g. the weights of
        embeddings with ``sparse=True``); any other sparse gradient comes back dense."""
        self.launch = launch
        self.timeline = timeline
        self.label = label
        self.enabled = True
        self.stats = SyncStats()
        numels = buffer_numels(self.buckets, track_unused)
        self.buffers = list(buffers) if buffers is not None else [
            torch.zeros(numel, dtype=b.dtype, device=b.device)
            for b, numel in zip(self.buckets, numels)
        ]
        """One flat buffer per bucket (zeroed; given, e.g. in shared memory, or allocated):
        the gradients, then the used flags when ``track_unused``."""
        assert [b.numel() for b in self.buffers] == numels, "a given buffer has the wrong size"
        self._slots: dict[str, tuple[int, torch.Tensor]] = {}
        self._params: dict[str, nn.Parameter] = {}
        for bucket, buffer in zip(self.buckets, self.buffers):
            for name, offset, numel in zip(bucket.names, bucket.offsets, bucket.numels):
                param = parameters[name]
                view = buffer[offset:offset + numel].view_as(param)
                self._slots[name] = (bucket.index, view)
                self._params[name] = param
        self._hooks = [  # torch leaves Tensor.register_post_accumulate_grad_hook unannotated
            param.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                self._hook_for(name))
            for name, param in self._params.items()
        ]
        # A model that outlives its wrapper (re-wrapped, say) keeps no dead reducer's hooks.
        weakref.finalize(self, _remove_hooks, list(self._hooks))
        self._begin_step()

    def _begin_step(self) -> None:
        self._missing = [len(b.names) for b in self.buckets]
        self._ready: set[str] = set()
        self._used: set[str] = set()
        """Parameters whose slot holds a gradient of this rank (not zeros for want of one)."""
        self._handles: list[CollectiveHandle | None] = []
        self._queued = False
        self._task: int | None = None
        """Autograd graph task whose end-of-backward callback is queued."""

    def _hook_for(self, name: str) -> Callable[[torch.Tensor], None]:
        # A weak reference: the hook lives in torch's autograd graph, which the garbage
        # collector cannot see through, so a strong one would keep the reducer, its wrapper and
        # its buckets (shared memory among them) alive for as long as the parameter lives.
        reducer = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            this = reducer()
            if this is not None and this.enabled:
                this._mark_ready(name, param)
        return hook

    def _mark_ready(self, name: str, param: torch.Tensor) -> None:
        task = _graph_task()
        if self._queued and task != self._task and not self.nested_backward:
            self._abandon()
        if not self._queued:
            self._queued, self._task = True, task
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)
        if name in self._ready:
            return
        self._ready.add(name)
        index, view = self._slots[name]
        if param.grad is not None:
            view.copy_(_dense(param.grad))
            self._used.add(name)
        self._missing[index] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while len(self._handles) < len(self.buckets) and self._missing[len(self._handles)] == 0:
            self._launch_next()

    def _launch_next(self) -> None:
        bucket = self.buckets[len(self._handles)]
        buffer = self.buffers[bucket.index]
        if self.track_unused:
            flags = buffer[bucket.numel:]
            flags.copy_(torch.tensor([name in self._used for name in bucket.names]))
        self._handles.append(self.launch(bucket, buffer))

    def _fill_missing(self) -> None:
        for name, param in self._params.items():
            if name in self._ready:
                continue
            _, view = self._slots[name]
            if param.grad is None or not param.requires_grad:
                view.zero_()
            else:
                view.copy_(_dense(param.grad))
                self._used.add(name)
            self._ready.add(name)

    def close_abandoned(self) -> None:
        """Close the open step if its backward raised (its end-of-backward callback never ran):
        launch and wait for its buckets as the other ranks expect, discard the results."""
        if self._queued:
            self._abandon()

    def _abandon(self) -> None:
        """Close a step whose backward raised: launch and wait for every bucket, then reset."""
        log.warning("a backward pass raised before its gradients were reduced; closing that "
                    "step (its gradients are discarded) before reducing this one")
        try:
            while len(self._handles) < len(self.buckets):
                self._launch_next()
            for handle in self._handles:
                if handle is not None:
                    handle.wait()
        finally:
            self._begin_step()

    def finish(self) -> None:
        """Launch what is left, wait for everything, expose the reduced gradients.

        Whatever happens (a peer timing out, say), the reducer is ready for the next backward.
        """
        if not self.enabled:
            return
        try:
            self._finish()
        finally:
            self._begin_step()

    def _finish(self) -> None:
        self._fill_missing()
        while len(self._handles) < len(self.buckets):
            self._launch_next()
        blocked = time.perf_counter()
        for bucket, handle in zip(self.buckets, self._handles):
            nbytes = bucket.nbytes
            if handle is not None:
                handle.wait()
                if isinstance(handle, FinishingHandle):  # compressed: what went on the wire
                    nbytes = handle.nbytes
                charge_run(self.stats, self.timeline, f"{self.label} bucket {bucket.index}",
                           handle, span_bytes=nbytes)
            self.stats.bytes += nbytes
        charge_wait(self.stats, self.timeline, "wait for gradients", blocked, time.perf_counter())
        self.stats.syncs += 1
        unused = self._unused_everywhere()
        for name, param in self._params.items():
            # one frozen since wrapping keeps its .grad (None), as does one no rank used
            if param.requires_grad and name not in unused:
                _expose(param, self._slots[name][1], name in self.sparse)

    def _unused_everywhere(self) -> set[str]:
        """Parameters whose reduced flag is 0: no rank had a gradient for them."""
        if not self.track_unused:
            return set()
        unused: set[str] = set()
        for bucket, buffer in zip(self.buckets, self.buffers):
            flags = buffer[bucket.numel:].tolist()
            unused.update(name for name, flag in zip(bucket.names, flags) if flag == 0)
        return unused

    def remove(self) -> None:
        """Remove the hooks (the model goes back to plain local gradients)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


def _remove_hooks(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()


def buffer_numels(buckets: Sequence[Bucket], track_unused: bool) -> list[int]:
    """Elements of each bucket's flat buffer: its gradients, and a used flag per parameter when
    ``track_unused``."""
    return [b.numel + (len(b.names) if track_unused else 0) for b in buckets]


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """A sparse gradient (an embedding's with ``sparse=True``) as the dense one it adds up to:
    it is reduced as dense."""
    return grad if grad.layout == torch.strided else grad.to_dense()


def _expose(param: nn.Parameter, slot: torch.Tensor, sparse: bool) -> None:
    """Put the reduced gradient of ``slot`` in ``param.grad``, never aliasing the bucket.

    The gradient autograd produced holds it (as torch's DDP does by default): a ``.grad`` that
    a script kept after ``zero_grad()`` dropped it is never written by a later step, as it
    would be if ``.grad`` were a view of the reused bucket buffer.  A parameter that got no
    gradient gets a copy of its slot.  A ``sparse`` one gets a sparse gradient of the rows that
    are not all zero (an optimizer for sparse gradients, ``SparseAdam``, refuses dense ones):
    the rows some rank's batch looked up, as DDP's sparse allreduce gives, except a row whose
    contributions cancel exactly, which DDP would list with zeros.
    """
    if sparse:
        param.grad = slot.to_sparse(sparse_dim=1)
    elif param.grad is None or param.grad.layout != torch.strided:
        param.grad = slot.clone()
    else:
        param.grad.copy_(slot)


def _graph_task() -> int:
    """Id of the autograd graph task running this hook (each backward call gets a new one)."""
    return int(torch._C._current_graph_task_id())
