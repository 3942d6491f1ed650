"""The model registry: build a model by name for an input shape and a number of classes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from torch import nn

from scaledl.models.alexnet import AlexNet
from scaledl.models.efficientnet import efficientnet
from scaledl.models.googlenet import GoogLeNet
from scaledl.models.gpt import GPT_SIZES, Gpt2
from scaledl.models.inception import InceptionV3
from scaledl.models.lenet import LeNet5
from scaledl.models.mlp import MLP
from scaledl.models.resnet import cifar_resnet, imagenet_resnet, resnext101
from scaledl.models.transformer import BERT_BASE, BERT_LARGE, Bert
from scaledl.models.vgg import VGG

__all__ = ["MODELS", "available_models", "build_model"]

logger = logging.getLogger(__name__)

ModelBuilder = Callable[[tuple[int, ...], int], nn.Module]

MODELS: dict[str, ModelBuilder] = {
    "mlp": MLP,
    "lenet": LeNet5,
    "resnet20": partial(cifar_resnet, 20),
    "resnet56": partial(cifar_resnet, 56),
    "resnet50": partial(imagenet_resnet, 50),
    "resnet101": partial(imagenet_resnet, 101),
    "resnext101_32x4d": resnext101,
    "se_resnext101_32x4d": partial(resnext101, squeeze_ratio=16),
    "nvidia_se_resnext101_32x4d": partial(resnext101, squeeze=16),
    "vgg16": VGG,
    "googlenet": GoogLeNet,
    "alexnet": AlexNet,
    "inception_v3": InceptionV3,
    "efficientnet_b0": partial(efficientnet, "b0"),
    "efficientnet_b4": partial(efficientnet, "b4"),
    "bert_base": partial(Bert, config=BERT_BASE, name="bert_base"),
    "bert_large": partial(Bert, config=BERT_LARGE, name="bert_large"),
    **{name: partial(Gpt2, config=size, name=name) for name, size in GPT_SIZES.items()},
}
"""Builders ``(input_shape, num_classes) -> nn.Module`` by name."""


def available_models() -> list[str]:
    """Names :func:`build_model` accepts."""
    return list(MODELS)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Model ``name`` for samples of ``input_shape`` (no batch dim) and ``num_classes`` outputs.

    Weights are drawn from torch's global generator: call ``torch.manual_seed`` first for
    reproducible (and, across ranks, identical) initial weights.
    """
    builder = MODELS.get(name.lower())
    if builder is None:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    if num_classes < 1:
        raise ValueError(f"num_classes {num_classes} must be >= 1")
    shape = tuple(int(d) for d in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape {input_shape} must be a non-empty shape of sizes >= 1")
    model = builder(shape, num_classes)
    logger.debug("built %s for %s -> %d classes", name, shape, num_classes)
    return model
