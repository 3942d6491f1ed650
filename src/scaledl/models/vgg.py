"""VGG-16 (Simonyan and Zisserman, "Very Deep Convolutional Networks", ICLR 2015, config D).

Thirteen 3x3 convolutions in five blocks (64, 64 | 128, 128 | 256 x3 | 512 x3 | 512 x3), each
block closed by 2x2 max pooling, then three fully connected layers (4096, 4096, classes) with
dropout: 138.4M parameters for 1000 classes, 102.8M of them in the first fully connected layer,
which is what makes VGG the classic communication-bound model for data parallelism.  No batch
norm, as in the paper.  Adaptive average pooling to 7x7 before the classifier (as 224x224 input
gives) lets the network run on inputs from 32x32 up.
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.models.common import image_shape, init_weights

__all__ = ["VGG", "VGG16_CONFIG"]

VGG16_CONFIG: tuple[int | str, ...] = (
    64, 64, "pool", 128, 128, "pool", 256, 256, 256, "pool", 512, 512, 512, "pool",
    512, 512, 512, "pool",
)
"""Output channels of each 3x3 convolution, ``"pool"`` for 2x2 max pooling (configuration D)."""


class VGG(nn.Module):
    """A VGG network from a configuration of convolution widths and pooling layers.

    ``classifier_width`` is the width of the two hidden fully-connected layers (4096 in the
    paper; a small one builds the same architecture for tests)."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        config: tuple[int | str, ...] = VGG16_CONFIG,
        classifier_width: int = 4096,
    ) -> None:
        super().__init__()
        cin, _, _ = image_shape("vgg16", input_shape, min_side=32)
        layers: list[nn.Module] = []
        for entry in config:
            if entry == "pool":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, int(entry), 3, padding=1), nn.ReLU(inplace=True)]
                cin = int(entry)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(7)
        width = classifier_width
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(cin * 7 * 7, width), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(width, width), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(width, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.pool(self.features(x)))
        return logits
