"""The optimizer of a run and its learning rate at every step.

:func:`build_optimizer` makes ``torch.optim.SGD`` (with momentum) or ``torch.optim.AdamW`` from an
:class:`~scaledl.train.config.OptimConfig`.  :class:`LearningRate` is the rate as a pure
function of the update's index, so a resumed run (which knows its step) continues the schedule
exactly without a scheduler's state in the checkpoint; the trainer writes it into every
parameter group before each update (the parameter-server strategies read the rate from there).

The rate at update ``s`` (0-based) of ``S`` in all, with ``E`` updates per epoch:

1. **Scaling.** ``base = lr`` , or with ``lr_scaling = "linear"`` Goyal et al.'s rule
   ``base = lr * global batch / lr_reference_batch`` (global batch = ``batch_size * workers *
   grad_accum``; "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017, section
   2.1: ``0.1 * kn / 256``).
2. **Warm-up** over ``W = round(warmup_epochs * E)`` updates: the rate rises linearly, for
   ``s < W``, from ``start`` to ``base``: ``start + (base - start) * s / W``.  With linear
   scaling ``start = lr`` (Goyal et al.'s gradual warm-up from the unscaled rate); without it
   ``start = base / W``, so the first update is small and none is zero.
3. **Schedule** on ``t = s - W`` of ``T = S - W`` updates after the warm-up: ``constant``;
   ``step``: ``base * lr_decay ** floor(t / (lr_decay_every * E))``; ``cosine``: ``base * (1 +
   cos(pi * t / T)) / 2``, from ``base`` towards 0, reached just after the last update
   (Loshchilov and Hutter's SGDR, one cycle, no restarts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from scaledl.strategies.catalogue import strategy_class
from scaledl.train.config import OptimConfig, TrainConfig

__all__ = ["build_optimizer", "LearningRate", "check_optim_for_strategy", "total_updates",
           "updates_per_epoch"]


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """The run's optimizer over ``model``'s parameters."""
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=optim.lr, momentum=optim.momentum,
                           weight_decay=optim.weight_decay)


def updates_per_epoch(batches: int, grad_accum: int) -> int:
    """Updates in an epoch of ``batches`` micro-batches: a last group shorter than
    ``grad_accum`` is an update of its own."""
    return math.ceil(batches / grad_accum)


def total_updates(optim: OptimConfig, batches: int) -> int:
    """Updates of the whole run: every epoch's, or ``max_steps`` when that is fewer."""
    every = optim.epochs * updates_per_epoch(batches, optim.grad_accum)
    return every if optim.max_steps is None else min(every, optim.max_steps)


@dataclass(frozen=True)
class LearningRate:
    """The rate at each update (see the module docstring for the formula)."""

    optim: OptimConfig
    per_epoch: int
    """Updates per epoch (``E``)."""
    total: int
    """Updates of the run (``S``)."""
    global_batch: int
    """Samples per update over every worker (``batch_size * workers * grad_accum``)."""

    @property
    def base(self) -> float:
        """The rate after warm-up and before any decay."""
        optim = self.optim
        if optim.lr_scaling == "linear":
            return optim.lr * self.global_batch / optim.lr_reference_batch
        return optim.lr

    @property
    def warmup(self) -> int:
        """Warm-up updates (``W``)."""
        return round(self.optim.warmup_epochs * self.per_epoch)

    def __call__(self, step: int) -> float:
        """The rate of update ``step`` (0-based)."""
        optim, base, warmup = self.optim, self.base, self.warmup
        if step < warmup:
            start = optim.lr if optim.lr_scaling == "linear" else base / warmup
            return start + (base - start) * step / warmup
        since = step - warmup
        if optim.lr_schedule == "step":
            every = optim.lr_decay_every or math.ceil(optim.epochs / 3)
            return base * optim.lr_decay ** (since // (every * self.per_epoch))
        if optim.lr_schedule == "cosine":
            span = max(1, self.total - warmup)
            return base * (1 + math.cos(math.pi * min(since, span) / span)) / 2
        return base

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Write the rate of update ``step`` into every parameter group; return it."""
        rate = self(step)
        for group in optimizer.param_groups:
            group["lr"] = rate
        return rate


def check_optim_for_strategy(config: TrainConfig) -> None:
    """A one-line ``ValueError`` for an optimizer setting the chosen strategy cannot honour,
    before any worker starts."""
    optim, name = config.optim, config.parallel.strategy
    cls = strategy_class(name)
    if optim.optimizer == "adamw" and cls.server:
        raise ValueError(f"optimizer 'adamw' cannot run under {name}, whose parameter server "
                         "applies plain SGD updates; use --optimizer sgd or a synchronous "
                         "strategy such as allreduce")
    default_momentum = OptimConfig.__dataclass_fields__["momentum"].default
    if optim.optimizer == "adamw" and optim.momentum != default_momentum:
        raise ValueError(f"momentum {optim.momentum} is SGD's and AdamW takes none (it keeps "
                         "its own moment estimates); drop --momentum or use --optimizer sgd")
    if optim.lr_scaling == "linear" and (cls.server or cls.periodic):
        raise ValueError(f"lr_scaling 'linear' scales the rate of one update on the global "
                         f"batch of synchronous SGD, and under {name} each worker updates on "
                         "its own batch; drop --lr-scaling or use --strategy allreduce")
    if optim.grad_accum > 1 and cls.server:
        raise ValueError(f"grad_accum {optim.grad_accum} cannot work with the asynchronous "
                         f"strategy {name}, whose workers push every step's gradient to the "
                         "server at once; drop --grad-accum or use a synchronous strategy "
                         "such as allreduce")
    if optim.grad_accum > 1 and not cls.periodic and "bucket_mb" not in cls.keywords:
        raise ValueError(f"grad_accum {optim.grad_accum} cannot work with {name}, which "
                         "reduces every backward's gradients to the root, so micro-batches "
                         "cannot add up locally; drop --grad-accum or use --strategy allreduce")
