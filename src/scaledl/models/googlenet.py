"""GoogLeNet / Inception v1 (Szegedy et al., "Going Deeper with Convolutions", CVPR 2015).

A stem (7x7 stride-2 convolution, max pooling, 1x1 and 3x3 convolutions, max pooling), nine
Inception modules (3a, 3b | 4a..4e | 5a, 5b) with max pooling between the groups, global average
pooling, dropout 0.4 and a linear classifier.  Each Inception module concatenates four branches:
1x1; 1x1 reduce then 3x3; 1x1 reduce then 5x5; 3x3 max pooling then 1x1 projection, with the
widths of the paper's table 1.  Departures from the paper, as most reimplementations make them:
batch norm after every convolution (instead of local response normalisation), and no auxiliary
classifiers (they only matter for the training loss).  7.0M parameters for 1000 classes.
Adaptive average pooling lets it run on inputs from 32x32 up.
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.models.common import image_shape, init_weights

__all__ = ["GoogLeNet", "Inception", "INCEPTION_WIDTHS"]

INCEPTION_WIDTHS: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}
"""Per module (table 1): #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool projection."""


def _conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class Inception(nn.Module):
    """Four parallel branches concatenated along channels."""

    def __init__(self, cin: int, widths: tuple[int, int, int, int, int, int]) -> None:
        super().__init__()
        one, reduce3, three, reduce5, five, project = widths
        self.branch1 = _conv(cin, one, 1)
        self.branch3 = nn.Sequential(_conv(cin, reduce3, 1), _conv(reduce3, three, 3))
        self.branch5 = nn.Sequential(_conv(cin, reduce5, 1), _conv(reduce5, five, 5))
        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True), _conv(cin, project, 1)
        )
        self.out_channels = one + three + five + project

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
        return torch.cat([branch(x) for branch in branches], dim=1)


class GoogLeNet(nn.Module):
    """Inception v1 without auxiliary classifiers, with batch norm."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = image_shape("googlenet", input_shape, min_side=32)
        layers: list[nn.Module] = [
            _conv(channels, 64, 7, stride=2), nn.MaxPool2d(3, stride=2, ceil_mode=True),
            _conv(64, 64, 1), _conv(64, 192, 3), nn.MaxPool2d(3, stride=2, ceil_mode=True),
        ]
        cin = 192
        for name, widths in INCEPTION_WIDTHS.items():
            if name in ("4a", "5a"):
                layers.append(nn.MaxPool2d(3, stride=2, ceil_mode=True))
            module = Inception(cin, widths)
            layers.append(module)
            cin = module.out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(cin, num_classes)
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits
