"""EfficientNet (Tan and Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural
Networks", ICML 2019): B0, and B4 scaled from it.

B0 (the paper's table 1): a 3x3 stride-2 convolution to 32 channels, then seven stages of MBConv
blocks, then a 1x1 convolution to 1280 channels, global pooling, dropout and a classifier.  An
MBConv block widens its input by the stage's expansion with a 1x1 convolution (none at
expansion 1), filters each channel alone with a ``k x k`` depthwise convolution (which carries the
stride), gates the channels by squeeze-and-excitation (global average, a 1x1 to a quarter of the
block's input channels, SiLU, a 1x1 back, sigmoid), and projects with a 1x1 convolution and batch
norm, no activation; the input is added back when the shape is unchanged.  Every other
convolution is followed by batch norm and SiLU.  5.3M parameters.

B4 scales B0's widths by 1.4 (rounded to a multiple of 8, never more than 10% down) and its
stages' depths by 1.8 (rounded up), at 380x380 (19.3M parameters), as the paper's compound
scaling and NVIDIA's DeepLearningExamples (PyTorch/Classification/ConvNets) build it.  Stochastic
depth, which drops a residual branch per sample in training, changes no parameter or FLOP count
and is left out.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from scaledl.models.common import SqueezeExcite, image_shape, init_weights

__all__ = ["EfficientNet", "efficientnet"]

# stage: expansion, output channels, blocks, depthwise kernel, stride of the first block
B0_STAGES = ((1, 16, 1, 3, 1), (6, 24, 2, 3, 2), (6, 40, 2, 5, 2), (6, 80, 3, 3, 2),
             (6, 112, 3, 5, 1), (6, 192, 4, 5, 2), (6, 320, 1, 3, 1))
STEM, HEAD = 32, 1280
SE_RATIO = 0.25
SCALING = {"b0": (1.0, 1.0, 224, 0.2), "b4": (1.4, 1.8, 380, 0.4)}
"""Variant: width and depth multipliers, the resolution it was trained at, classifier dropout."""


def _width(channels: int, multiplier: float, divisor: int = 8) -> int:
    scaled = channels * multiplier
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * scaled else rounded


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             act: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    return [*layers, nn.SiLU(inplace=True)] if act else layers


class MBConv(nn.Module):
    """Expand (1x1), depthwise ``kernel`` (stride), squeeze-and-excite, project (1x1)."""

    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int) -> None:
        super().__init__()
        hidden, squeeze = cin * expansion, max(1, int(cin * SE_RATIO))
        expand = _conv_bn(cin, hidden, 1) if expansion != 1 else []
        self.body = nn.Sequential(
            *expand, *_conv_bn(hidden, hidden, kernel, stride, hidden),
            SqueezeExcite(hidden, squeeze, nn.SiLU), *_conv_bn(hidden, cout, 1, act=False),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out + x if self.residual else out


class EfficientNet(nn.Module):
    """EfficientNet at width and depth multipliers of B0's stages."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: float,
                 depth: float, dropout: float) -> None:
        super().__init__()
        channels, _, _ = image_shape("efficientnet", input_shape, min_side=32)
        cin = _width(STEM, width)
        layers: list[nn.Module] = [*_conv_bn(channels, cin, 3, 2)]
        for expansion, cout, blocks, kernel, stride in B0_STAGES:
            cout = _width(cout, width)
            for block in range(math.ceil(blocks * depth)):
                layers.append(MBConv(cin, cout, expansion, kernel, stride if block == 0 else 1))
                cin = cout
        head = _width(HEAD, width)
        self.features = nn.Sequential(*layers, *_conv_bn(cin, head, 1))
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
            nn.Linear(head, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


def efficientnet(variant: str, input_shape: tuple[int, ...], num_classes: int) -> EfficientNet:
    """EfficientNet-B0 or -B4 (``variant`` "b0" or "b4")."""
    if variant not in SCALING:
        raise ValueError(f"EfficientNet variant {variant!r} must be one of {sorted(SCALING)}")
    width, depth, _, dropout = SCALING[variant]
    return EfficientNet(input_shape, num_classes, width, depth, dropout)
