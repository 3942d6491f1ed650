"""AlexNet (Krizhevsky, Sutskever and Hinton, "ImageNet Classification with Deep Convolutional
Neural Networks", NIPS 2012).

Five convolutions (96 11x11 stride 4, 256 5x5, 384 3x3, 384 3x3, 256 3x3) with local response
normalisation after the first two and 3x3 stride-2 max pooling after the first, second and fifth,
then fully connected layers 4096, 4096, classes with dropout 0.5.  As in the paper, the second,
fourth and fifth convolutions are split in two groups (the paper's two GPUs, each half seeing only
its own half of the previous layer), which gives the published 61.0M parameters for 1000 classes.
Adaptive average pooling to 6x6 (what 224x224 input gives) lets it run on inputs from 64x64 up.
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.models.common import image_shape, init_weights

__all__ = ["AlexNet"]


class AlexNet(nn.Module):
    """The two-group AlexNet of the paper, in one module.

    ``classifier_width`` is the width of the two hidden fully-connected layers (4096 in the
    paper; a small one builds the same architecture for tests)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 classifier_width: int = 4096) -> None:
        super().__init__()
        channels, _, _ = image_shape("alexnet", input_shape, min_side=64)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 96, 11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(inplace=True),
            nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        self.pool = nn.AdaptiveAvgPool2d(6)
        width = classifier_width
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, width), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(width, width), nn.ReLU(inplace=True),
            nn.Linear(width, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.pool(self.features(x)))
        return logits
