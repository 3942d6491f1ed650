"""LeNet-5 (LeCun et al., 1998), adapted to the input size.

The classic network reads 32x32 images: conv 5x5 (6) -> pool -> conv 5x5 (16) -> pool ->
fc 120 -> fc 84 -> classifier.  Here ReLU and max pooling replace the scaled tanh and
subsampling layers, and two rules let one definition take 32x32, 28x28 and 8x8 inputs:

1. the first convolution pads by 2 when the input is smaller than 32 (MNIST's usual adaptation,
   so 28x28 is seen as 32x32);
2. the second convolution pads by 2 when its input is smaller than 10 (so small images such as
   8x8 digits keep a positive size); pooling rounds up, so a side of 1 stays 1.

The first fully connected layer takes whatever the convolutions leave (16x5x5 for 28 and 32).
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.models.common import image_shape

__all__ = ["LeNet5"]


def _conv_out(side: int, padding: int) -> int:
    return side + 2 * padding - 4


def _pool_out(side: int) -> int:
    return (side + 1) // 2


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling, for ``(C, H, W)`` inputs of any size."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = image_shape("lenet", input_shape)
        pad1 = (2 if height < 32 else 0, 2 if width < 32 else 0)
        sides = [_pool_out(_conv_out(side, p)) for side, p in zip((height, width), pad1)]
        pad2 = (2 if sides[0] < 10 else 0, 2 if sides[1] < 10 else 0)
        sides = [_pool_out(_conv_out(side, p)) for side, p in zip(sides, pad2)]
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=pad1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(6, 16, 5, padding=pad2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * sides[0] * sides[1], 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits
