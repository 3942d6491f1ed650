"""MLP: a multilayer perceptron on flattened inputs (any input shape)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["MLP", "DEFAULT_HIDDEN"]

DEFAULT_HIDDEN = (256,)
"""Hidden widths of the registry's ``mlp`` (784-256-10 on MNIST: 204K parameters)."""


class MLP(nn.Module):
    """Flatten, then ``Linear -> ReLU`` per hidden width, then a linear classifier."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        hidden: tuple[int, ...] = DEFAULT_HIDDEN,
    ) -> None:
        super().__init__()
        if any(width < 1 for width in hidden):
            raise ValueError(f"MLP hidden widths {hidden} must all be >= 1")
        widths = (math.prod(input_shape), *hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        for fan_in, fan_out in zip(widths, widths[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.layers(x)
        return logits
