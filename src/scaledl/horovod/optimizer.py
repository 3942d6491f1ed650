"""DistributedOptimizer: Horovod's optimizer wrapper on scaledl's gradient reducer.

``opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())`` and train as
usual.  Gradients go through the same machinery as :class:`scaledl.DataParallel`
(:class:`scaledl.sync.GradientReducer`): packed into buckets of ``bucket_mb`` MiB in reverse
registration order, each full bucket allreduced asynchronously while backward goes on, all of
them waited for at the end of backward.  So the reduced gradients are in ``.grad`` when
``loss.backward()`` returns (Horovod has them by ``step()`` or ``synchronize()``, which therefore
have nothing left to wait for here, except to flush a partial accumulation).

* ``backward_passes_per_step=k``: the first ``k - 1`` backward passes accumulate locally, the
  ``k``-th reduces the sum; a ``k + 1``-th pass before ``step()`` raises, as in Horovod;
* ``compression=hvd.Compression.fp16``: each bucket travels as float16;
* ``op`` (Average, Sum, Min, Max, Product) and ``gradient_predivide_factor`` ``f`` (gradients are
  scaled by ``1/f`` before the sum and by ``f/size`` after);
* every backward pass that reduces starts one negotiation round at its first gradient, without
  waiting, and checks it at the end of backward: it lets ranks inside ``hvd.join()`` take part
  with zero gradients, and when another rank called something else every rank raises
  ``MismatchError`` instead of hanging.  The first bucket waits for that verdict before it is
  launched (the round started at the first gradient, so it is normally back by then), so a
  mismatch raises from ``backward()`` before any gradient travels and the process set stays
  usable.  ``SCALEDL_HOROVOD_STEP_NEGOTIATION=0`` skips this round (it costs one small Gloo
  allgather per step, noticeable only on steps of a few milliseconds); ``join`` then cannot be
  used while others train.

It is a ``torch.optim.Optimizer`` sharing ``param_groups`` and ``state`` with the optimizer it
wraps (learning-rate schedulers and ``GradScaler`` work on it), not an instance of the wrapped
class as Horovod's dynamically created class is.  Sparse gradients are reduced as dense ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
import warnings
from typing import Any

import torch
from torch import nn

from scaledl.collectives import CollectiveHandle
from scaledl.horovod import runtime
from scaledl.horovod.compression import Compression, Compressor
from scaledl.horovod.errors import unsupported
from scaledl.horovod.allreduce import reduction_plan
from scaledl.horovod.handles import Handle
from scaledl.horovod.negotiation import Kind, Pending, Request, negotiate, plan_key
from scaledl.horovod.dispatch import launch_allreduce
from scaledl.horovod.process_sets import ProcessSet, SetContext, context_of, global_process_set
from scaledl.horovod.reduce_ops import Average, ReduceOperation, identity, resolve_op
from scaledl.horovod.tensors import scale_
from scaledl.sync import Bucket, GradientReducer, plan_buckets

__all__ = ["DistributedOptimizer"]

MiB = 1 << 20


def _then(handle: CollectiveHandle | None, after: Callable[[], None]) -> CollectiveHandle | None:
    """A handle that completes once ``handle`` has and ``after()`` ran (on the comm thread)."""
    if handle is None:
        after()
        return None
    future: Future[None] = Future()
    chained = CollectiveHandle(future)

    def complete(error: BaseException | None) -> None:
        chained.started_at, chained.finished_at = handle.started_at, handle.finished_at
        if error is not None:
            future.set_exception(error)
            return
        try:
            after()
        except BaseException as failure:  # handed to the waiter
            future.set_exception(failure)
        else:
            future.set_result(None)

    handle.add_done_callback(complete)
    return chained


def _named(optimizer: torch.optim.Optimizer,
           named_parameters: Iterable[tuple[str, nn.Parameter]] | None
           ) -> list[tuple[str, nn.Parameter]]:
    """The optimizer's trainable parameters with names, checked as Horovod checks them."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        named = [(f"param.{g}.{i}", p) for g, group in enumerate(optimizer.param_groups)
                 for i, p in enumerate(group["params"])]
    else:
        named = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters must be (name, parameter) pairs, as "
                             "model.named_parameters() gives")
        names = [name for name, _ in named]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"named_parameters repeats the names {duplicates}; names must be "
                             "unique")
        known = {id(p) for _, p in named}
        unnamed = [i for i, p in enumerate(params) if id(p) not in known]
        if unnamed:
            raise ValueError(f"named_parameters does not name the optimizer's parameters at "
                             f"positions {unnamed}; pass the named_parameters() of the model "
                             "the optimizer trains")
    wanted = {id(p) for p in params}
    seen: set[int] = set()
    result = []
    for name, param in named:
        if id(param) in wanted and id(param) not in seen and param.requires_grad:
            seen.add(id(param))
            result.append((name, param))
    return result


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` so gradients are reduced over ``process_set`` during backward."""

    def __init__(
        self, optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, nn.Parameter]] | None = None,
        compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
        op: ReduceOperation = Average, gradient_predivide_factor: float = 1.0,
        num_groups: int = 0, groups: object = None, sparse_as_dense: bool = False,
        process_set: ProcessSet = global_process_set, bucket_mb: float = 25.0,
    ) -> None:
        # No Optimizer.__init__: param_groups and state are the wrapped optimizer's own.
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(
                optimizer, DistributedOptimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.op = resolve_op(op)
        if groups is not None or num_groups:
            raise unsupported("DistributedOptimizer(groups=/num_groups=)", "leave them out: "
                              "gradients are fused into buckets of bucket_mb MiB (default 25)")
        if isinstance(backward_passes_per_step, bool) or not isinstance(
                backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step!r} must be an "
                             "integer >= 1")
        if gradient_predivide_factor != 1.0 and self.op is not Average:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average")
        if gradient_predivide_factor <= 0 or bucket_mb <= 0:
            raise ValueError(f"gradient_predivide_factor ({gradient_predivide_factor}) and "
                             f"bucket_mb ({bucket_mb}) must be positive")
        self.optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set
        self._compression = compression
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = gradient_predivide_factor
        self._passes = 0
        self._reduced = False
        """Whether this step's gradients were reduced already (by backward or synchronize)."""
        self._pass_open = False
        self._should_synchronize = True
        self._context: SetContext | None = None
        self._reducer: GradientReducer | None = None
        self._pending: Pending | None = None
        self._negotiate = True
        self._hooks: list[Any] = []
        self._named: list[tuple[str, nn.Parameter]] = []
        named = _named(optimizer, named_parameters)
        self._parameter_names = {param: name for name, param in named}
        """Each trainable parameter's name, as Horovod's optimizer keeps it."""
        self._sparse: list[nn.Parameter] = []
        """Parameters whose gradient of this pass was sparse, made sparse again once reduced."""
        self._synchronized = False
        """Whether the script called synchronize() itself since the last step."""
        runtime.current()  # ValueError before hvd.init()
        if process_set.included():
            context = context_of(process_set)
            if context.size > 1:
                self._attach(context, named, int(bucket_mb * MiB))

    # The wrapped optimizer's own attributes, read through: its load_state_dict() replaces its
    # param_groups list, so a copy taken when wrapping would go stale (and lose loaded options).
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    # -- set-up ---------------------------------------------------------------------------------
    def _attach(self, context: SetContext, named: list[tuple[str, nn.Parameter]],
                bucket_bytes: int) -> None:
        self._context = context
        self._negotiate = runtime.step_negotiation()
        self.buckets: list[Bucket] = plan_buckets(named, bucket_bytes)
        self._sent_dtypes = [self._compression.compress(torch.empty(0, dtype=b.dtype))[0].dtype
                             for b in self.buckets]
        layout = [f"bucket {i}: {b.names} {b.numels} {b.dtype} sent as {d}"
                  for i, (b, d) in enumerate(zip(self.buckets, self._sent_dtypes))]
        self._plan = "\n".join(layout + [f"prescale {self._prescale}",
                                         f"negotiate every step {self._negotiate}"])
        total = sum(b.numel for b in self.buckets)
        negotiate(context, Request(Kind.OPTIMIZER_SETUP, None, None, (total,), op=int(self.op),
                                   detail=self._plan))
        self._step_request = Request(Kind.OPTIMIZER_STEP, None, None, (total,), op=int(self.op),
                                     detail=self._plan)
        """What every step negotiates (built once: the plan is fixed at set-up)."""
        # registered before the reducer's hooks, so they run first on every parameter
        self._hooks = [p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
            self._on_gradient) for _, p in named]
        self._named = named
        self._reducer = GradientReducer(self.buckets, dict(named), self._launch)
        context.servers[plan_key(self._plan)] = self

    # -- during backward ------------------------------------------------------------------------
    def _on_gradient(self, param: torch.Tensor) -> None:
        if param.grad is not None and param.grad.layout != torch.strided:
            # reduced as dense (the buckets are dense), handed back sparse as Horovod does, so
            # optimizers that need sparse gradients (SparseAdam) still get them
            param.grad = param.grad.to_dense()
            if isinstance(param, nn.Parameter) and all(p is not param for p in self._sparse):
                self._sparse.append(param)
        if self._pass_open or self._reducer is None or self._context is None:
            return
        k = self.backward_passes_per_step
        if self._passes >= k:
            raise RuntimeError(
                f"gradients were computed more than backward_passes_per_step={k} times before "
                "optimizer.step(); call step() after every "
                f"{k} backward passes, or raise backward_passes_per_step")
        if self._passes + 1 == k and self._negotiate:  # this pass reduces: tell the others
            self._pending = Pending(self._context, self._step_request)
        self._passes += 1
        self._pass_open = True
        torch.autograd.Variable._execution_engine.queue_callback(self._close_pass)
        self._reducer.enabled = self._passes == k
        self._reduced = self._reduced or self._reducer.enabled

    def _close_pass(self) -> None:
        """End of backward (before the reducer waits for its buckets): check the negotiation."""
        self._pass_open = False
        self._check_negotiation()
        if self._sparse and self._reducer is not None and self._reducer.enabled:
            # queued now, so it runs after the reducer's own callback has exposed the gradients
            torch.autograd.Variable._execution_engine.queue_callback(self._restore_sparse)

    def _restore_sparse(self) -> None:
        sparse, self._sparse = self._sparse, []
        for param in sparse:
            if param.grad is not None and param.grad.layout == torch.strided:
                param.grad = param.grad.to_sparse()

    def _check_negotiation(self) -> None:
        """Wait for this pass's round; on a mismatch, forget the pass and raise.

        Called before the first bucket leaves, so nothing of this pass has travelled yet when
        the ranks disagree: every rank raises from ``backward()`` and the next call is matched
        as usual.  The reducer is rebuilt because autograd drops the end-of-backward callbacks
        of a backward that raised, which would leave it waiting for this pass's buckets.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except BaseException:
            self._reset_pass()
            raise

    def _reset_pass(self) -> None:
        self._passes, self._pass_open, self._reduced = 0, False, False
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = GradientReducer(self.buckets, dict(self._named), self._launch)

    def _launch(self, bucket: Bucket, buffer: torch.Tensor) -> CollectiveHandle | None:
        assert self._context is not None
        self._check_negotiation()
        sent, restore = self._compression.compress(buffer)
        scale_(sent, self._prescale)
        divide_here, factor = reduction_plan(self.op, sent, self._postscale, self._context.size)
        handle = launch_allreduce(self._context, sent, self.op, divide_here)
        if sent is buffer and factor == 1.0:
            return handle

        def finish() -> None:
            if sent is not buffer:
                buffer.copy_(self._compression.decompress(sent, restore))
            scale_(buffer, factor)

        return _then(handle, finish)

    def serve_joined(self, context: SetContext) -> None:
        """On a rank inside ``hvd.join()``: take part in one gradient reduction with zeros."""
        handles = []
        for bucket, dtype in zip(self.buckets, self._sent_dtypes):
            buffer = torch.full((bucket.numel,), identity(self.op, dtype), dtype=dtype,
                                device=bucket.device)
            handles.append(launch_allreduce(context, buffer, self.op, divide_here=False))
        Handle(handles, lambda: None, "DistributedOptimizer step for the running ranks").wait()

    # -- the optimizer interface ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Make sure the reduced gradients are in ``.grad``.

        Reduces what backward has not: a partial accumulation (fewer than
        ``backward_passes_per_step`` passes), or, on a rank that ran no backward pass since its
        last step (an empty batch), its current gradients, zeros where ``.grad`` is ``None``,
        as Horovod submits them, so the step stays collective and the replicas equal.
        """
        self._synchronized = True
        self._synchronize()

    def _synchronize(self) -> None:
        k = self.backward_passes_per_step
        if (self._reducer is not None and self._context is not None and not self._reduced
                and self._passes < k):
            if self._negotiate:
                negotiate(self._context, self._step_request)
            self._reducer.enabled = True
            self._reducer.finish()
            self._restore_sparse()
        self._reduced = True
        self._passes = 0

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside the block ``step()`` does not synchronize (call ``synchronize()`` yourself)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Synchronize (unless inside ``skip_synchronize()``), then step the wrapped optimizer."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after an "
                    "explicit optimizer.synchronize(); wrap the step in "
                    "`with optimizer.skip_synchronize():` (here the second synchronize has "
                    "nothing left to do, but under Horovod it reduces again)", stacklevel=2)
            self._synchronize()
        self._synchronized = False
        self._passes = 0
        self._reduced = False
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; refused between backward and step, as Horovod.

        The gradients of that backward pass would be lost (and, accumulated over
        ``backward_passes_per_step``, reduced without the passes before).
        """
        if self._passes:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(), which would drop the gradients "
                "of that backward pass; call zero_grad() before backward or after step()")
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer; a pending accumulation is dropped."""
        self._passes = 0
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the gradient buckets are planned when the optimizer is wrapped."""
        raise ValueError("add parameter groups to the optimizer before wrapping it in "
                         "hvd.DistributedOptimizer")

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a reduction."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step={passes!r} must be an integer >= 1")
        self.backward_passes_per_step = passes
        self._passes = 0

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"
