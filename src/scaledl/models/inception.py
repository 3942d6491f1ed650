"""Inception v3 (Szegedy et al., "Rethinking the Inception Architecture for Computer Vision",
CVPR 2016), the network of Horovod's and TensorFlow's published benchmarks.

A stem of five convolutions and two max pools takes a 299x299 image to 35x35x192; three 35x35
modules (``A``: 1x1, 5x5, double 3x3 and pooled branches), a grid reduction to 17x17 (``B``),
four 17x17 modules that factorise 7x7 convolutions into 1x7 and 7x1 (``C``), a reduction to 8x8
(``D``) and two 8x8 modules whose 3x3 branches split into parallel 1x3 and 3x1 convolutions
(``E``) give 2048 channels; global average pooling, dropout and a linear classifier follow.
Every convolution is bias-free with batch norm and ReLU.  The layers are those of the released
network as TensorFlow's benchmark builds it (tensorflow/benchmarks, tf_cnn_benchmarks
``models/inception_model.py``, the code of Horovod's published runs), whose stem differs from
the paper's table 1 and whose last module pools by maximum.  As there (by default) and in most
reimplementations, no auxiliary classifier (it only matters for the training loss), which
leaves 23.8M parameters for 1000 classes.  The stem's unpadded stride-2 layers need inputs of
at least 75x75; adaptive average pooling takes any size from there.
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.models.common import image_shape, init_weights

__all__ = ["InceptionV3", "MIN_SIDE"]

MIN_SIDE = 75
"""Smallest input side the stem and the two grid reductions accept."""

Kernel = int | tuple[int, int]


def _conv(cin: int, cout: int, kernel: Kernel, stride: int = 1,
          padding: Kernel = 0) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(cout, eps=1e-3),
        nn.ReLU(inplace=True),
    )


def _pooled(cin: int, cout: int, by_max: bool = False) -> nn.Sequential:
    pool = nn.MaxPool2d(3, stride=1, padding=1) if by_max else nn.AvgPool2d(3, stride=1, padding=1)
    return nn.Sequential(pool, _conv(cin, cout, 1))


class _Branches(nn.Module):
    """Parallel branches concatenated along channels."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class _Split(nn.Module):
    """A 1x3 and a 3x1 convolution side by side on the same input (module E)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.wide = _conv(cin, cout, (1, 3), padding=(0, 1))
        self.tall = _conv(cin, cout, (3, 1), padding=(1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.wide(x), self.tall(x)], dim=1)


def _module_a(cin: int, pool: int) -> _Branches:
    return _Branches(
        _conv(cin, 64, 1),
        nn.Sequential(_conv(cin, 48, 1), _conv(48, 64, 5, padding=2)),
        nn.Sequential(_conv(cin, 64, 1), _conv(64, 96, 3, padding=1), _conv(96, 96, 3, padding=1)),
        _pooled(cin, pool),
    )


def _module_b(cin: int) -> _Branches:
    return _Branches(
        _conv(cin, 384, 3, stride=2),
        nn.Sequential(_conv(cin, 64, 1), _conv(64, 96, 3, padding=1), _conv(96, 96, 3, stride=2)),
        nn.MaxPool2d(3, stride=2),
    )


def _seven(cin: int, mid: int, cout: int, order: str) -> nn.Sequential:
    """1x1 to ``mid``, then a factorised 7x7: ``order`` lists the convolutions, ``w`` for 1x7
    and ``t`` for 7x1, the last one to ``cout`` channels."""
    shapes = {"w": ((1, 7), (0, 3)), "t": ((7, 1), (3, 0))}
    convs: list[nn.Module] = [_conv(cin, mid, 1)]
    for index, key in enumerate(order):
        kernel, padding = shapes[key]
        convs.append(_conv(mid, cout if index == len(order) - 1 else mid, kernel,
                           padding=padding))
    return nn.Sequential(*convs)


def _module_c(cin: int, mid: int) -> _Branches:
    return _Branches(_conv(cin, 192, 1), _seven(cin, mid, 192, "wt"), _seven(cin, mid, 192, "twtw"),
                     _pooled(cin, 192))


def _module_d(cin: int) -> _Branches:
    return _Branches(
        nn.Sequential(_conv(cin, 192, 1), _conv(192, 320, 3, stride=2)),
        nn.Sequential(_seven(cin, 192, 192, "wt"), _conv(192, 192, 3, stride=2)),
        nn.MaxPool2d(3, stride=2),
    )


def _module_e(cin: int, by_max: bool) -> _Branches:
    return _Branches(
        _conv(cin, 320, 1),
        nn.Sequential(_conv(cin, 384, 1), _Split(384, 384)),
        nn.Sequential(_conv(cin, 448, 1), _conv(448, 384, 3, padding=1), _Split(384, 384)),
        _pooled(cin, 192, by_max),
    )


class InceptionV3(nn.Module):
    """Inception v3 without the auxiliary classifier, for ``(C, H, W)`` inputs of 75x75 up."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = image_shape("inception_v3", input_shape, min_side=MIN_SIDE)
        self.features = nn.Sequential(
            _conv(channels, 32, 3, stride=2), _conv(32, 32, 3), _conv(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2), _conv(64, 80, 1), _conv(80, 192, 3),
            nn.MaxPool2d(3, stride=2),
            _module_a(192, 32), _module_a(256, 64), _module_a(288, 64),
            _module_b(288),
            _module_c(768, 128), _module_c(768, 160), _module_c(768, 160), _module_c(768, 192),
            _module_d(768),
            _module_e(1280, by_max=False), _module_e(2048, by_max=True),
        )
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(2048, num_classes)
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits
