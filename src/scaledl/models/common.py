"""Helpers shared by the model families: input-shape checks and deterministic initialisation."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SqueezeExcite", "image_shape", "init_weights"]


def image_shape(
    model: str, input_shape: tuple[int, ...], min_side: int = 1
) -> tuple[int, int, int]:
    """``(C, H, W)`` from ``input_shape``; ``ValueError`` if it is not an image of that size."""
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ValueError(
            f"{model} needs an image input (C, H, W), got {tuple(input_shape)}; use 'mlp' for "
            "vector data"
        )
    channels, height, width = (int(d) for d in input_shape)
    if min(height, width) < min_side:
        raise ValueError(
            f"{model} needs images of at least {min_side}x{min_side}, got {height}x{width}; "
            "resize the inputs or pick a model for small images (lenet, resnet20)"
        )
    return channels, height, width


def init_weights(model: nn.Module) -> None:
    """He (fan-out) init for convolutions, N(0, 0.01) for linear layers, BN to identity.

    Every draw comes from torch's global generator in module order, so ``torch.manual_seed``
    before construction makes the weights reproducible.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, 0.01)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class SqueezeExcite(nn.Module):
    """A per-channel gate (Hu et al., CVPR 2018): global average, a 1x1 convolution to ``squeeze``
    channels, ``activation``, a 1x1 back, sigmoid; the input scaled by it."""

    def __init__(self, channels: int, squeeze: int,
                 activation: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, squeeze, 1), activation(),
            nn.Conv2d(squeeze, channels, 1), nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled: torch.Tensor = x * self.gate(x)
        return scaled
