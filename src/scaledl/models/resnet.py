"""ResNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

Two families from the paper:

- CIFAR-style (section 4.2): a 3x3 convolution to 16 channels, then 3 stages of ``n`` basic
  blocks (two 3x3 convolutions) with 16, 32 and 64 channels, the first block of stages 2 and 3
  halving the resolution; global average pooling and a linear classifier.  Depth ``6n + 2``:
  ResNet-20 (n=3, 0.27M parameters) and ResNet-56 (n=9, 0.85M).  Shortcuts that change shape are
  the paper's option A: subsample and pad the new channels with zeros (no parameters).
- ImageNet-style (table 1): a 7x7 stride-2 convolution and 3x3 max pooling, then 4 stages of
  bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4) with widths 64, 128, 256, 512;
  ResNet-50 has 3, 4, 6, 3 blocks (25.6M parameters), ResNet-101 3, 4, 23, 3 (44.5M).  Shortcuts
  that change shape are 1x1 projections (option B); a stage's stride sits on the 3x3 convolution
  (the common "v1.5" placement, same parameter count).  Adaptive average pooling lets the network
  run on inputs smaller than 224x224 (down to 32x32).

Two ImageNet variants with grouped 3x3 convolutions, as NVIDIA's DeepLearningExamples train them
(PyTorch/Classification/ConvNets, ``image_classification/models/resnet.py``):

- ResNeXt-101 32x4d (Xie et al., "Aggregated Residual Transformations for Deep Neural Networks",
  CVPR 2017): ResNet-101's stages with the bottleneck twice as wide (128, 256, 512, 1024) and its
  3x3 convolution split into 32 groups (4 channels each in the first stage), the block still
  ending at 256 .. 2048 channels (44.2M parameters).
- SE-ResNeXt-101 32x4d (Hu et al., "Squeeze-and-Excitation Networks", CVPR 2018): each block's
  output scaled per channel by a sigmoid gate computed from its global average through two 1x1
  convolutions with biases, squeezed to 1/16 of the block's channels as in the paper and in
  NVIDIA's TensorFlow recipe (``se_ratio: 16``; 49.0M parameters).  NVIDIA's PyTorch recipe
  (its torch.hub entry ``nvidia_se_resnext101_32x4d``) squeezes to 16 channels in every block
  instead, which adds 1.1M parameters to ResNeXt's (45.3M).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from scaledl.models.common import SqueezeExcite, image_shape, init_weights

__all__ = ["CifarResNet", "ImageNetResNet", "cifar_resnet", "imagenet_resnet", "resnext101"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups,
                     bias=False)
    return [conv, nn.BatchNorm2d(cout)]


class ZeroPadShortcut(nn.Module):
    """Option A shortcut: keep every ``stride``-th pixel and append zero channels."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra_channels = extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, added to the (zero-padded) input."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(cin, cout, 3, stride), nn.ReLU(inplace=True), *_conv_bn(cout, cout, 3)
        )
        changes = stride != 1 or cin != cout
        self.shortcut = ZeroPadShortcut(stride, cout - cin) if changes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


@dataclass(frozen=True)
class BlockShape:
    """A bottleneck family: its 3x3 convolution's width per stage and groups, how much the last
    1x1 widens, and the squeeze-and-excitation gate: its channels, or the block's output
    channels over ``squeeze_ratio`` (both 0: no gate)."""

    widths: tuple[int, int, int, int] = (64, 128, 256, 512)
    expansion: int = 4
    groups: int = 1
    squeeze: int = 0
    squeeze_ratio: int = 0

    def gate_channels(self, channels: int) -> int:
        """The gate's width for a block of ``channels`` outputs (0: no gate)."""
        return self.squeeze or (channels // self.squeeze_ratio if self.squeeze_ratio else 0)


RESNET = BlockShape()
RESNEXT_32X4D = BlockShape(widths=(128, 256, 512, 1024), expansion=2, groups=32)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride, grouped for ResNeXt), 1x1 expand; an optional
    squeeze-and-excitation gate on the block's output; projection shortcut on change."""

    def __init__(self, cin: int, width: int, stride: int, shape: BlockShape = RESNET) -> None:
        super().__init__()
        cout = width * shape.expansion
        squeeze = shape.gate_channels(cout)
        gate = [SqueezeExcite(cout, squeeze)] if squeeze else []
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1), nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride, shape.groups), nn.ReLU(inplace=True),
            *_conv_bn(width, cout, 1), *gate,
        )
        changes = stride != 1 or cin != cout
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if changes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images: 3 stages of ``blocks_per_stage`` basic blocks."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, blocks_per_stage: int
    ) -> None:
        super().__init__()
        channels, _, _ = image_shape(f"resnet{6 * blocks_per_stage + 2}", input_shape)
        layers: list[nn.Module] = [*_conv_bn(channels, 16, 3), nn.ReLU(inplace=True)]
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(cin, cout, stride))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


class ImageNetResNet(nn.Module):
    """ResNet with bottleneck blocks: stem, 4 stages, global pooling, classifier."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, blocks: tuple[int, int, int, int],
        shape: BlockShape = RESNET,
    ) -> None:
        super().__init__()
        depth = 3 * sum(blocks) + 2
        channels, _, _ = image_shape(f"resnet{depth}", input_shape, min_side=32)
        layers: list[nn.Module] = [
            *_conv_bn(channels, 64, 7, stride=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        cin = 64
        for stage, (count, width) in enumerate(zip(blocks, shape.widths)):
            for block in range(count):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(Bottleneck(cin, width, stride, shape))
                cin = width * shape.expansion
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


def cifar_resnet(depth: int, input_shape: tuple[int, ...], num_classes: int) -> CifarResNet:
    """ResNet-20, -32, -44, -56, -110 ...: ``depth = 6n + 2``."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth {depth} must be 6n + 2 (20, 32, 44, 56, 110)")
    return CifarResNet(input_shape, num_classes, (depth - 2) // 6)


_IMAGENET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def imagenet_resnet(depth: int, input_shape: tuple[int, ...], num_classes: int) -> ImageNetResNet:
    """ResNet-50, -101 or -152 with bottleneck blocks."""
    if depth not in _IMAGENET_BLOCKS:
        raise ValueError(f"ImageNet ResNet depth {depth} must be one of {sorted(_IMAGENET_BLOCKS)}")
    return ImageNetResNet(input_shape, num_classes, _IMAGENET_BLOCKS[depth])


def resnext101(
    input_shape: tuple[int, ...], num_classes: int, squeeze: int = 0, squeeze_ratio: int = 0
) -> ImageNetResNet:
    """ResNeXt-101 32x4d; with a gate of ``squeeze`` channels in each block (NVIDIA's PyTorch
    recipe: 16) or of its channels over ``squeeze_ratio`` (the paper: 16), SE-ResNeXt-101 32x4d."""
    if squeeze < 0 or squeeze_ratio < 0 or (squeeze and squeeze_ratio):
        raise ValueError(f"squeeze {squeeze} and squeeze_ratio {squeeze_ratio} must be >= 0 and "
                         "at most one of them set (0 and 0: no gate)")
    shape = replace(RESNEXT_32X4D, squeeze=squeeze, squeeze_ratio=squeeze_ratio)
    return ImageNetResNet(input_shape, num_classes, _IMAGENET_BLOCKS[101], shape)
