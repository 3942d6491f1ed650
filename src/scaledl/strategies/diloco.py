"""DiLoCo and streaming DiLoCo: local inner steps, an outer Nesterov step on the averaged
pseudo-gradient, the whole model at once or one fragment at a time.

**DiLoCo** (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv 2311.08105) is local SGD whose averaging is an optimizer step.  Every worker
keeps the *anchor* ``theta`` (the model of the last synchronization, the same on every rank)
and trains alone with its inner optimizer (AdamW in the paper; here the optimizer the strategy
is given, any torch optimizer):

    1. H inner steps:   x_i <- InnerStep(x_i, grad_i)              (no communication)
    2. pseudo-gradient: delta = mean_i(theta - x_i)               (one allreduce-average)
    3. outer step:      theta <- OuterSGD(theta, delta)            (Nesterov, lr 0.7, mu 0.9)
    4. restart:         x_i <- theta                                on every worker

Cost per worker: the pseudo-gradient once every H steps, ``n`` bytes (``n`` the parameter
bytes, halved with bfloat16 outer gradients), against ``n`` every step for allreduce SGD.  An
outer SGD with lr 1 and no momentum is plain model averaging (local SGD).

**Streaming DiLoCo** (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication",
arXiv 2501.18512) makes three changes, each a knob here:

* *fragments*: the parameters are split into ``fragments`` contiguous groups of whole
  parameter tensors (the paper's fragments are groups of layers), balanced by element count.
  Fragment ``f`` synchronizes every H steps, at the steps ``s`` (inner steps done) with
  ``s % H == offset_f = f * H // fragments``, so the exchanges are staggered and one step
  sends at most the largest fragment, not the whole model;
* *overlap*: a fragment's allreduce is started after its sync step and waited for
  ``overlap_steps`` inner steps later, while those steps compute; its outer step then lands on
  the anchor, and the worker's fragment becomes ``mixing * x_i + (1 - mixing) * theta``
  (``mixing = 0``, the default as in torchft, adopts the anchor; the paper's alpha);
* *low-precision outer gradients*: the pseudo-gradient travels as bfloat16 (``outer_dtype``),
  halving the bytes; the anchor and the outer optimizer stay float32.

**Synchronous warm-up** (``sync_warmup_steps`` W, default 0): the first W steps average the
gradients over the workers before every inner step (synchronous SGD with the inner optimizer, and
the anchor follows the model); the local phases start after them, so the outer steps fall at steps
``W + H, W + 2H, ...``.  This is Lin et al.'s post-local SGD (2020, "Don't Use Large Mini-Batches,
Use Local SGD", ICLR, arXiv 1808.07217: local SGD after a synchronous first phase) and stands in
for the trained starting model of Douillard et al.  Each warm-up step sends the model's gradient
once (``n`` bytes, float32), counted in the bytes.  ``sync_warmup_lr_scale`` multiplies the
inner learning rate during the warm-up (default 1): DiLoCo's inner rate is tuned small because
the outer step amplifies it, while the synchronous steps have no outer step.

With one fragment and no overlap streaming DiLoCo is DiLoCo, bit for bit.  Each fragment has
its own outer optimizer (one per fragment: a fragment's momentum moves only at its own syncs).

Every exchange runs through scaledl's collectives (``algorithm``: any allreduce, ``auto``
included, the shared-memory path inside a host).  Checkpoints are exact: besides the periodic
strategies' gathered worker states (:mod:`scaledl.strategies.periodic`) the state holds the
anchor, each fragment's outer-optimizer state, and an exchange in flight as its averaged
pseudo-gradient (waited for before saving) with the step it is due at.  The model evaluated is
the anchor (the global model), with the first worker's buffers on every worker.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl import collectives
from scaledl.collectives import CollectiveHandle
from scaledl.strategies.comparison import MethodRow
from scaledl.sync.consistency import broadcast_tensors
from scaledl.strategies.elastic import flatten_parameters
from scaledl.strategies.options import PeriodicOptions, option
from scaledl.strategies.periodic import PeriodicStrategy
from scaledl.sync.stats import SpanRecorder
from scaledl.topology import Topology

__all__ = ["DiLoCo", "StreamingDiLoCo", "DiLoCoOptions", "StreamingDiLoCoOptions",
           "split_fragments", "OUTER_DTYPES", "DEFAULT_H"]

OUTER_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                        "fp32": torch.float32, "bf16": torch.bfloat16}
"""The names --precision and --compression use are accepted too."""
"""The precision the pseudo-gradient travels in."""

DEFAULT_H = 20
"""Inner steps between outer steps when ``tau`` is not given."""

DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM = 0.7, 0.9
"""Douillard et al.'s outer Nesterov SGD."""

OuterOptimizerFactory = Callable[[list[nn.Parameter]], Optimizer]
"""Builds one fragment's outer optimizer on its slice of the anchor (one flat parameter)."""


def check_warmup(steps: int) -> None:
    """One-line error for a synchronous warm-up that is not a whole number of steps >= 0."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"sync_warmup_steps {steps!r} must be an integer >= 0 (synchronous "
                         "steps before DiLoCo's local phases; 0: none)")


def check_warmup_lr_scale(scale: float) -> None:
    """One-line error for a warm-up learning-rate multiple that is not positive."""
    if not scale > 0:
        raise ValueError(f"sync_warmup_lr_scale {scale} must be positive, e.g. 8 (the inner "
                         "learning rate's multiple during the synchronous warm-up; 1: same)")


def check_outer(outer_lr: float, outer_momentum: float) -> None:
    """One-line errors for an outer learning rate that is not positive or a momentum outside
    [0, 1)."""
    if not outer_lr > 0:
        raise ValueError(f"outer_lr {outer_lr} must be positive, e.g. 0.7 (DiLoCo's outer "
                         "Nesterov learning rate)")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_momentum {outer_momentum} must be in [0, 1), e.g. 0.9 (DiLoCo's "
                         "outer Nesterov momentum)")


def split_fragments(numels: list[int], fragments: int) -> list[tuple[int, int]]:
    """Cut tensors of ``numels`` elements (in order) into ``fragments`` contiguous groups of
    whole tensors whose largest element count is as small as possible; the groups as
    ``[start, end)`` element ranges of the flat buffer.

    A linear partition by dynamic programming (tensor counts are small): ``best[k][j]`` is the
    smallest largest group when the first ``j`` tensors form ``k`` groups.
    """
    if isinstance(fragments, bool) or not isinstance(fragments, int) or fragments < 1:
        raise ValueError(f"fragments {fragments!r} must be an integer >= 1")
    if fragments > len(numels):
        raise ValueError(f"fragments {fragments} is more than the model's {len(numels)} "
                         f"parameter tensors; give --fragments {len(numels)} or fewer")
    prefix = [0]
    for n in numels:
        prefix.append(prefix[-1] + n)
    count = len(numels)
    inf = float("inf")
    best = [[inf] * (count + 1) for _ in range(fragments + 1)]
    cut = [[0] * (count + 1) for _ in range(fragments + 1)]
    best[0][0] = 0
    for k in range(1, fragments + 1):
        for j in range(k, count + 1):
            for i in range(k - 1, j):  # the k-th group is tensors [i, j)
                largest = max(best[k - 1][i], prefix[j] - prefix[i])
                if largest < best[k][j]:
                    best[k][j], cut[k][j] = largest, i
    bounds, j = [], count
    for k in range(fragments, 0, -1):
        i = cut[k][j]
        bounds.append((prefix[i], prefix[j]))
        j = i
    return bounds[::-1]


@dataclass(frozen=True)
class DiLoCoOptions(PeriodicOptions):
    """DiLoCo's options: ``tau`` is H; the outer Nesterov SGD; the precision of the
    pseudo-gradient.  The inner optimizer is the run's own."""

    outer_lr: float | None = option(float, "outer Nesterov learning rate (diloco, "
                                    f"streaming-diloco; default {DEFAULT_OUTER_LR})")
    """The outer SGD's learning rate; ``None``: 0.7."""
    outer_momentum: float | None = option(float, "outer Nesterov momentum in [0, 1) (diloco, "
                                          f"streaming-diloco; default {DEFAULT_OUTER_MOMENTUM})")
    """The outer SGD's Nesterov momentum; ``None``: 0.9 (0: plain outer SGD)."""
    outer_dtype: str | None = option(str, "precision of the pseudo-gradient on the wire: "
                                     "float32 or bfloat16 (diloco, streaming-diloco)")
    """``float32`` or ``bfloat16``; ``None``: ``float32``."""
    sync_warmup_steps: int | None = option(int, "synchronous steps (gradients averaged every step) "
                                      "before the local phases (diloco, streaming-diloco; "
                                      "default 0)")
    """Synchronous warm-up steps; ``None``: 0, local phases from the first step."""
    sync_warmup_lr_scale: float | None = option(float, "multiple of the learning rate during "
                                                "the synchronous warm-up (diloco, "
                                                "streaming-diloco; default 1)")
    """The inner learning rate's multiple during the warm-up; ``None``: 1."""

    def _check(self) -> None:
        check_warmup(0 if self.sync_warmup_steps is None else self.sync_warmup_steps)
        check_warmup_lr_scale(1.0 if self.sync_warmup_lr_scale is None
                              else self.sync_warmup_lr_scale)
        check_outer(DEFAULT_OUTER_LR if self.outer_lr is None else self.outer_lr,
                    DEFAULT_OUTER_MOMENTUM if self.outer_momentum is None
                    else self.outer_momentum)
        if self.outer_dtype is not None and self.outer_dtype not in OUTER_DTYPES:
            raise ValueError(f"outer_dtype {self.outer_dtype!r} is unknown; use one of "
                             f"{', '.join(OUTER_DTYPES)}")

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {
            **super().keywords(ranks, lr), "tau": self.tau or DEFAULT_H,
            "outer_lr": DEFAULT_OUTER_LR if self.outer_lr is None else self.outer_lr,
            "outer_momentum": (DEFAULT_OUTER_MOMENTUM if self.outer_momentum is None
                               else self.outer_momentum),
            "outer_dtype": self.outer_dtype or "float32",
            "sync_warmup_steps": self.sync_warmup_steps or 0,
            "sync_warmup_lr_scale": self.sync_warmup_lr_scale or 1.0,
        }


@dataclass(frozen=True)
class StreamingDiLoCoOptions(DiLoCoOptions):
    """DiLoCo's options, the fragments and the inner steps an exchange overlaps."""

    fragments: int | None = option(int, "fragments synchronized at staggered steps "
                                   "(streaming-diloco; default 2)")
    """Fragments; ``None``: 2.  At most the model's parameter tensors."""
    overlap_steps: int | None = option(int, "inner steps a fragment's allreduce overlaps "
                                       "(streaming-diloco; default 1, 0: none)")
    """Inner steps between a fragment's send and its outer step; ``None``: 1."""

    def _check(self) -> None:
        if self.fragments is not None and self.fragments < 1:
            raise ValueError(f"fragments {self.fragments} must be at least 1")
        if self.overlap_steps is not None and self.overlap_steps < 0:
            raise ValueError(f"overlap_steps {self.overlap_steps} must be >= 0 (0: no overlap)")
        tau = self.tau or DEFAULT_H
        if self.overlap_steps is not None and self.overlap_steps >= tau:
            raise ValueError(f"overlap_steps {self.overlap_steps} must be below tau {tau}, so "
                             "that a fragment's exchange lands before its next one starts")

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {**super().keywords(ranks, lr), "fragments": self.fragments or 2,
                "overlap_steps": 1 if self.overlap_steps is None else self.overlap_steps}

    def check_model(self, module: nn.Module) -> None:
        """More fragments than parameter tensors is refused before any worker starts."""
        tensors = [p.numel() for p in module.parameters() if p.requires_grad]
        split_fragments(tensors, self.fragments or 2)


class _Exchange:
    """One fragment's pseudo-gradient on its way: the buffer, the handle (``None`` once waited
    for, or restored from a checkpoint), and the inner step count it is applied at."""

    def __init__(self, fragment: int, buffer: torch.Tensor, handle: CollectiveHandle | None,
                 due: int) -> None:
        self.fragment, self.buffer, self.handle, self.due = fragment, buffer, handle, due


class DiLoCo(PeriodicStrategy):
    """Inner steps alone, an outer Nesterov step on the averaged pseudo-gradient every ``tau``
    steps (module docstring).  ``outer_optimizer`` replaces the outer Nesterov SGD by any
    optimizer factory ``f([flat_parameter]) -> Optimizer`` (called once per fragment)."""

    name = "diloco"
    options = DiLoCoOptions
    comparison = MethodRow(32, "DiLoCo (H 20)", tau=DEFAULT_H, momentum=True)
    fragments = 1
    """Fragments synchronized at staggered steps (streaming DiLoCo; DiLoCo has one)."""
    overlap_steps = 0
    """Inner steps an exchange overlaps (streaming DiLoCo; DiLoCo waits at once)."""
    mixing = 0.0
    """Weight of the worker's own fragment when an overlapped outer step lands."""

    def __init__(
        self, module: nn.Module, optimizer: Optimizer, *, tau: int = DEFAULT_H,
        outer_lr: float = DEFAULT_OUTER_LR, outer_momentum: float = DEFAULT_OUTER_MOMENTUM,
        outer_dtype: str = "float32", sync_warmup_steps: int = 0,
        sync_warmup_lr_scale: float = 1.0,
        outer_optimizer: OuterOptimizerFactory | None = None, algorithm: str = "auto",
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        check_warmup(sync_warmup_steps)
        self.sync_warmup_steps = sync_warmup_steps
        check_warmup_lr_scale(sync_warmup_lr_scale)
        self.sync_warmup_lr_scale = float(sync_warmup_lr_scale)
        """The inner learning rate's multiple during the warm-up."""
        """Synchronous steps (averaged gradients) before the local phases start."""
        self._configure(module, tau, outer_lr, outer_momentum, outer_dtype)
        super().__init__(module, optimizer, tau, group, timeline)
        self.algorithm = algorithm
        self.topology = collectives.resolve_topology(algorithm, "allreduce", topology, group)
        self.anchor = self.flat.detach().clone()
        """The global model: the parameters of the last outer step (the same on every rank)."""
        self.bounds = split_fragments(self._numels, self.fragments)
        """Each fragment's ``[start, end)`` in the flat buffer."""
        self.offsets = [f * tau // self.fragments for f in range(self.fragments)]
        """The inner step (mod ``tau``) each fragment synchronizes at."""
        if outer_optimizer is None:
            outer_optimizer = self._nesterov
        self._slices = [nn.Parameter(self.anchor[a:b]) for a, b in self.bounds]
        self.outer = [outer_optimizer([p]) for p in self._slices]
        """One outer optimizer per fragment, on its slice of the anchor."""
        self._pending: list[_Exchange] = []
        self.max_step_bytes = 0
        """The most pseudo-gradient bytes this rank started in one step (peak per step)."""
        self._evaluation: nn.Module | None = None

    # -- configuration (before any communication) ----------------------------------------------
    def _configure(self, module: nn.Module, tau: int, outer_lr: float, outer_momentum: float,
                   outer_dtype: str) -> None:
        """Check the options on every rank before the constructor communicates."""
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau {tau!r} must be an integer >= 1 (DiLoCo's H, inner steps "
                             "between outer steps)")
        check_outer(outer_lr, outer_momentum)
        if outer_dtype not in OUTER_DTYPES:
            raise ValueError(f"outer_dtype {outer_dtype!r} is unknown; use one of "
                             f"{', '.join(OUTER_DTYPES)}")
        if self.overlap_steps >= tau:
            raise ValueError(f"overlap_steps {self.overlap_steps} must be below tau {tau}, so "
                             "that a fragment's exchange lands before its next one starts")
        self.outer_lr, self.outer_momentum = float(outer_lr), float(outer_momentum)
        self.outer_dtype = OUTER_DTYPES[outer_dtype]
        self._numels = [p.numel() for p in module.parameters() if p.requires_grad]
        split_fragments(self._numels, self.fragments)

    def _nesterov(self, params: list[nn.Parameter]) -> Optimizer:
        return torch.optim.SGD(params, lr=self.outer_lr, momentum=self.outer_momentum,
                               nesterov=self.outer_momentum > 0)

    # -- the algorithm ---------------------------------------------------------------------------
    def syncing_fragments(self, done: int) -> list[int]:
        """The fragments whose exchange starts once ``done`` steps are done (the local phases
        count from the end of the warm-up)."""
        local = done - self.sync_warmup_steps
        return [f for f, offset in enumerate(self.offsets)
                if local >= 1 and local % self.tau == offset]

    def step(self) -> None:
        """A warm-up step (averaged gradients, the anchor follows), or the inner step; then the
        outer steps due now, then the exchanges that start now."""
        self._begin_step()
        if self.steps < self.sync_warmup_steps:
            self._average_gradients()
            rates = [group["lr"] for group in self.optimizer.param_groups]
            for group, rate in zip(self.optimizer.param_groups, rates):
                group["lr"] = rate * self.sync_warmup_lr_scale
            self.optimizer.step()
            # the run's schedule owns the rate: give it back as it was written
            for group, rate in zip(self.optimizer.param_groups, rates):
                group["lr"] = rate
            self.steps += 1
            # Every worker took the same step from the same model, so the global model is
            # the worker's: the first outer step's pseudo-gradient starts from here.
            self.anchor.copy_(self.flat.detach())
            return
        self.optimizer.step()
        self.steps += 1
        due = [e for e in self._pending if e.due == self.steps]
        for exchange in due:
            self._apply(exchange)
        self._pending = [e for e in self._pending if e.due != self.steps]
        started = 0
        for fragment in self.syncing_fragments(self.steps):
            exchange = self._launch(fragment)
            started += exchange.buffer.numel() * exchange.buffer.element_size()
            if self.overlap_steps == 0:
                self._apply(exchange)
            else:
                self._pending.append(exchange)
        self.max_step_bytes = max(self.max_step_bytes, started)

    @torch.no_grad()
    def _average_gradients(self) -> None:
        """Allreduce-average the gradients (one flat float32 buffer; a parameter without a
        gradient contributes zeros), as synchronous SGD does, and put them back."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        handle = collectives.allreduce(flat, "avg", algorithm=self.algorithm,
                                       topology=self.topology, group=self.group, async_op=True)
        assert handle is not None  # async_op=True always returns one
        nbytes = flat.numel() * flat.element_size()
        self._account("warm-up gradients", handle, nbytes)
        self.max_step_bytes = max(self.max_step_bytes, nbytes)
        offset = 0
        for p in params:
            numel = p.numel()
            averaged = flat[offset:offset + numel].view_as(p)
            if p.grad is None:
                p.grad = averaged.clone()
            else:
                p.grad.copy_(averaged)
            offset += numel

    @torch.no_grad()
    def _launch(self, fragment: int) -> _Exchange:
        """Start the allreduce-average of this worker's pseudo-gradient of ``fragment``."""
        start, end = self.bounds[fragment]
        buffer = (self.anchor[start:end] - self.flat[start:end]).to(self.outer_dtype)
        handle = collectives.allreduce(buffer, "avg", algorithm=self.algorithm,
                                       topology=self.topology, group=self.group,
                                       async_op=True)
        assert handle is not None  # async_op=True always returns one
        nbytes = buffer.numel() * buffer.element_size()
        self._stats.bytes += nbytes
        return _Exchange(fragment, buffer, handle, self.steps + self.overlap_steps)

    def _wait(self, exchange: _Exchange) -> None:
        if exchange.handle is not None:
            nbytes = exchange.buffer.numel() * exchange.buffer.element_size()
            self._wait_timed(f"pseudo-gradient {exchange.fragment}", exchange.handle, nbytes)
            exchange.handle = None

    @torch.no_grad()
    def _apply(self, exchange: _Exchange) -> None:
        """The outer step of one fragment on the averaged pseudo-gradient; the worker's
        fragment moves to the anchor (mixed with its own, ``mixing > 0``)."""
        self._wait(exchange)
        fragment = exchange.fragment
        start, end = self.bounds[fragment]
        anchor = self._slices[fragment]
        anchor.grad = exchange.buffer.to(anchor.dtype)
        self.outer[fragment].step()
        anchor.grad = None
        local = self.flat[start:end]
        if self.mixing:
            local.mul_(self.mixing).add_(self.anchor[start:end], alpha=1.0 - self.mixing)
        else:
            local.copy_(self.anchor[start:end])
        self._stats.syncs += 1

    def synchronize(self) -> None:
        """Wait for the exchanges in flight (each is applied at its due step)."""
        for exchange in self._pending:
            self._wait(exchange)

    @torch.no_grad()
    def evaluation_module(self) -> nn.Module:
        """Collective (call on every worker): the anchor (the global model) with the first
        worker's buffers, so every worker scores, and rank 0 saves, the same model (each
        worker's own BatchNorm statistics drift apart between synchronizations)."""
        if self._evaluation is None:
            self._evaluation = copy.deepcopy(self.module)
        flatten_parameters(self._evaluation).copy_(self.anchor)
        buffers = list(self._evaluation.buffers())
        for mine, source in zip(buffers, self.module.buffers()):
            mine.copy_(source)
        if buffers:
            broadcast_tensors(buffers, src=0, algorithm=self.algorithm, group=self.group)
        return self._evaluation

    # -- checkpoints -----------------------------------------------------------------------------
    def _strategy_state(self) -> dict[str, Any]:
        """Anchor, each fragment's outer-optimizer state, the exchanges in flight (waited for:
        their averaged pseudo-gradient and due step) and the fragment layout."""
        self.synchronize()
        return {
            "anchor": self.anchor.clone(), "outer": [o.state_dict() for o in self.outer],
            "bounds": [list(b) for b in self.bounds], "sync_warmup_steps": self.sync_warmup_steps,
            "pending": [{"fragment": e.fragment, "due": e.due, "buffer": e.buffer.clone()}
                        for e in self._pending],
        }

    @torch.no_grad()
    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        bounds = [tuple(b) for b in state.get("bounds", [])]
        if "anchor" not in state or bounds != self.bounds:
            raise ValueError(f"checkpoint holds no {self.name} state for fragments "
                             f"{self.bounds}; resume with the strategy, model and fragments "
                             "it was written with")
        saved_warmup = int(state.get("sync_warmup_steps", 0))
        if saved_warmup != self.sync_warmup_steps:
            raise ValueError(f"checkpoint was written with sync_warmup_steps {saved_warmup}, "
                             f"this run has {self.sync_warmup_steps}; resume with "
                             f"--sync-warmup-steps {saved_warmup}")
        self.anchor.copy_(state["anchor"])
        for outer, saved in zip(self.outer, state["outer"]):
            outer.load_state_dict(saved)
        self._pending = [_Exchange(int(e["fragment"]), e["buffer"].clone(), None, int(e["due"]))
                         for e in state.get("pending", [])]


class StreamingDiLoCo(DiLoCo):
    """DiLoCo with fragments at staggered steps, overlapped exchanges and optional bfloat16
    pseudo-gradients (module docstring)."""

    name = "streaming-diloco"
    options = StreamingDiLoCoOptions
    comparison = MethodRow(34, "Streaming DiLoCo (H 20, 2 fragments, bf16)", tau=DEFAULT_H,
                           momentum=True, options=(("outer_dtype", "bfloat16"),))

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, fragments: int = 2,
                 overlap_steps: int = 1, mixing: float = 0.0, **diloco: Any) -> None:
        """``fragments``, ``overlap_steps`` and ``mixing`` (module docstring); every other
        keyword is :class:`DiLoCo`'s (``tau``, the outer optimizer, ``algorithm``, ...)."""
        if isinstance(overlap_steps, bool) or not isinstance(overlap_steps, int) \
                or overlap_steps < 0:
            raise ValueError(f"overlap_steps {overlap_steps!r} must be an integer >= 0")
        if not 0 <= mixing < 1:
            raise ValueError(f"mixing {mixing} must be in [0, 1) (0: adopt the anchor)")
        self.fragments, self.overlap_steps, self.mixing = fragments, overlap_steps, float(mixing)
        super().__init__(module, optimizer, **diloco)
