"""Synthetic data: random but learnable samples for throughput runs, deterministic per seed.

Each class ``k`` has a mean ``m_k`` drawn once from N(0, 1) per element; a sample of class ``k``
is ``(SIGNAL * m_k + noise) / sqrt(1 + SIGNAL^2)`` with unit Gaussian noise, so features have
about zero mean and unit variance, and a linear classifier (or nearest class mean) learns it.
The class means depend only on the seed, so the train and test splits share them; the samples of
each split come from their own stream.  Shape and class count ride on the dataset name:
``synthetic`` (3x32x32, 10 classes), ``synthetic:1x28x28``, ``synthetic:1x28x28:10``,
``synthetic:64:5`` (vectors of 64 features, 5 classes).
"""

from __future__ import annotations

import torch

from scaledl.data.sharding import epoch_generator

__all__ = ["DEFAULT_SHAPE", "DEFAULT_CLASSES", "SIGNAL", "parse_synthetic", "make_synthetic"]

DEFAULT_SHAPE = (3, 32, 32)
"""Sample shape of plain ``synthetic`` (CIFAR-sized images)."""
DEFAULT_CLASSES = 10
"""Class count when the name gives none."""
SIGNAL = 0.5
"""Standard deviation of the class means, relative to the unit noise."""


def parse_synthetic(name: str) -> tuple[tuple[int, ...], int]:
    """``"synthetic[:CxHxW|:D[:classes]]"`` -> ``(input_shape, num_classes)``."""
    parts = name.split(":")
    try:
        shape = tuple(int(s) for s in parts[1].lower().split("x")) if len(parts) > 1 else None
        classes = int(parts[2]) if len(parts) > 2 else DEFAULT_CLASSES
    except ValueError:
        shape, classes = (), 0
    shape = DEFAULT_SHAPE if shape is None else shape
    if len(parts) > 3 or len(shape) not in (1, 3) or min(shape) < 1 or classes < 2:
        raise ValueError(
            f"synthetic dataset name {name!r} is malformed; write 'synthetic', "
            "'synthetic:CxHxW[:classes]' or 'synthetic:D[:classes]' with sizes >= 1, classes >= 2"
        )
    return shape, classes


def make_synthetic(
    shape: tuple[int, ...], num_classes: int, size: int, seed: int, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` samples (float32 features, int64 labels) from stream ``stream`` (0: train)."""
    if size < 1:
        raise ValueError(f"synthetic_size {size} must be >= 1")
    means = torch.randn((num_classes, *shape), generator=epoch_generator(seed, 0))
    generator = epoch_generator(seed, 1 + stream)
    labels = torch.randint(num_classes, (size,), generator=generator)
    noise = torch.randn((size, *shape), generator=generator)
    features = (means[labels] * SIGNAL + noise) / (1.0 + SIGNAL**2) ** 0.5
    return features, labels
