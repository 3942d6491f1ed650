"""A backward pass that fails on demand, for the tests of what a raising backward leaves behind."""

from __future__ import annotations

import torch


class FailingBackward(torch.autograd.Function):
    """Identity whose backward raises while ``fail`` is set (an out-of-memory error in the middle
    of backward, say)."""

    fail = False

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if FailingBackward.fail:
            raise RuntimeError("simulated failure in backward")
        return grad
