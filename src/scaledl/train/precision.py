"""Mixed precision of a run: autocast of forward and loss, and a gradient scaler for float16.

``fp32`` changes nothing.  ``bf16`` and ``fp16`` run the forward pass and the loss under
``torch.autocast`` (matrix products and convolutions in the 16-bit type, reductions and the loss
in float32, as torch's autocast lists decide); the parameters, their gradients, every collective
and the optimizer state stay float32, so the strategies see what they see at ``fp32``.

bfloat16 has float32's exponent range, so gradients need no scaling.  float16's range is narrow
(a gradient below about 6e-8 becomes 0), so ``fp16`` multiplies the loss by a scale before
backward and divides the gradients by it before the update (``torch.amp.GradScaler``); an update
whose gradients overflowed is skipped and the scale halves.  Every rank must skip the same
updates, which holds where the gradients are averaged before the update (the DataParallel
strategy: an overflow on one rank reaches every rank through the average); the other strategies
are refused with ``fp16`` (:func:`check_precision`).  ``fp16`` is refused on the CPU: CPUs have
no fast float16 arithmetic, and bf16 needs no scaler.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any, cast

import torch

from scaledl.strategies import Strategy
from scaledl.strategies.catalogue import strategy_class

__all__ = ["DTYPES", "MixedPrecision", "check_precision"]

DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16,
}
"""The autocast type of each ``precision`` (None: no autocast)."""


def check_precision(precision: str, device: str, strategy: str) -> None:
    """A one-line ``ValueError`` for a precision this device or strategy cannot do."""
    if precision == "fp16" and device == "cpu":
        raise ValueError("precision 'fp16' is not done on the CPU: CPUs have no fast float16 "
                         "arithmetic and float16's narrow range needs a gradient scaler; use "
                         "--precision bf16 on the CPU (float32's range, no scaler) or "
                         "--device cuda")
    cls = strategy_class(strategy)
    if precision == "fp16" and "bucket_mb" not in cls.keywords:
        raise ValueError(f"precision 'fp16' skips every update whose scaled gradients overflow, "
                         f"and under {strategy} the ranks would decide it apart (they do not "
                         "average their gradients before the update); use --precision bf16, "
                         "or --strategy allreduce")


class _StrategyUpdate:
    """What ``GradScaler`` needs of an optimizer, with the strategy's whole update as its step:
    the scaler unscales ``param_groups`` and calls ``step()`` only when no gradient overflowed,
    and a strategy's update (``strategy.step()``) may be more than the optimizer's."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.stepped = False
        """Whether the last update ran (False: skipped for an overflow)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.strategy.optimizer.param_groups

    def step(self) -> None:
        self.strategy.step()
        self.stepped = True


class MixedPrecision:
    """Autocast, scaled backward and the (possibly skipped) update of one rank's training."""

    def __init__(self, precision: str, device: torch.device, strategy: Strategy) -> None:
        self.precision = precision
        self.device = device
        self.dtype = DTYPES[precision]
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self._update = _StrategyUpdate(strategy)
        self._as_optimizer = cast(torch.optim.Optimizer, self._update)  # duck-typed for the scaler

    def autocast(self) -> AbstractContextManager[object]:
        """The context of forward and loss (training and evaluation)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, of the scaled loss under ``fp16``."""
        scaled = loss if self.scaler is None else self.scaler.scale(loss)
        scaled.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    def unscale(self) -> None:
        """Divide the gradients by the scale (before clipping them); no-op without a scaler."""
        if self.scaler is not None:
            self.scaler.unscale_(self._as_optimizer)

    def step(self) -> bool:
        """The strategy's update, skipped under ``fp16`` when a gradient overflowed; whether it
        ran."""
        if self.scaler is None:
            self._update.step()
            return True
        self._update.stepped = False
        self.scaler.step(self._as_optimizer)
        self.scaler.update()
        return self._update.stepped

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (scale and growth tracker) for a checkpoint; empty without one."""
        return {} if self.scaler is None else dict(self.scaler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint from another precision leaves it fresh)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
