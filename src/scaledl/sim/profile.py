"""Model profiles for the iteration model: per-layer gradient bytes, FLOPs, outputs and buckets.

A :class:`ModelProfile` comes from scaledl's own model definitions: the model is built on the
``meta`` device (no memory, no arithmetic), :func:`scaledl.models.profile.layer_profile` gives
each layer's parameter bytes, forward FLOPs and output size, and
:func:`scaledl.sync.bucketing.plan_buckets` groups the gradients exactly as ``DataParallel``
does.  How long each layer takes is the job of :mod:`scaledl.sim.compute` (FLOPs at a constant
efficiency in the ideal model, a roofline per device preset, or a measured profile);
:meth:`ModelProfile.compute_times` keeps the ideal rule: ``batch x FLOPs / device FLOP/s``
forward and twice that backward (the usual 1:2 split), or a measured per-iteration compute time
spread over the layers by their FLOPs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from scaledl.models.gpt import GPT_SIZES
from scaledl.models.profile import layer_profile
from scaledl.models.trace import OpCost, TraceError, operation_costs
from scaledl.models.registry import MODELS, build_model
from scaledl.sync.bucketing import layer_of, plan_buckets

__all__ = ["Layer", "ModelProfile", "profile_model", "layer_names", "default_input",
           "has_depthwise", "IMAGENET_MODELS", "TOKEN_MODELS"]

TOKEN_MODELS = frozenset({"bert_base", "bert_large", *GPT_SIZES})
"""Registry models whose input is a sequence of token ids (``--input-shape`` is its length)."""
IMAGENET_MODELS = frozenset({"resnet50", "resnet101", "resnext101_32x4d", "se_resnext101_32x4d",
                             "nvidia_se_resnext101_32x4d", "vgg16", "googlenet", "alexnet",
                             "inception_v3", "efficientnet_b0", "efficientnet_b4"})
IMAGENET_SIDES = {"inception_v3": 299, "efficientnet_b4": 380}
"""ImageNet models published at another resolution than 224x224."""
BACKWARD_FACTOR = 2.0
"""Backward FLOPs per forward FLOP (gradients of inputs and of weights)."""


@dataclass(frozen=True)
class Layer:
    """One module that owns parameters, in forward order."""

    name: str
    parameter_bytes: int
    forward_flops: float
    """Forward FLOPs for one sample."""
    output_elements: int = 0
    """Elements of the layer's output for one sample (0: unknown)."""
    tensors: int = 1
    """Parameter tensors the module owns (a gradient each: weight and bias are two)."""
    winograd: bool = False
    """A 3x3 stride-1 convolution, which cuDNN runs with Winograd's F(2x2, 3x3): 16 instead of
    36 multiplies per output tile element (Lavin and Gray, CVPR 2016), 2.25x fewer."""
    convolution: bool = False
    """A dense 2-D convolution (``nn.Conv2d``, one group): on tensor cores an NCHW model pays
    its NHWC transposes (``scaledl.sim.compute``); priced alone, its input is taken to be the
    size of its output."""
    ops: tuple[OpCost, ...] = ()
    """Every operation of the training forward pass charged to this layer, the ones without
    parameters after it included (``scaledl.models.trace``); empty: price the layer alone."""


@dataclass(frozen=True)
class ModelProfile:
    """What the iteration model needs to know about a model."""

    name: str
    layers: tuple[Layer, ...]
    buckets: tuple[tuple[int, tuple[int, ...]], ...]
    """Gradient buckets in launch order: ``(elements, indices of the layers they hold)``."""
    itemsize: int = 4

    @property
    def parameter_bytes(self) -> int:
        """Bytes of all gradients (= the packed model)."""
        return sum(layer.parameter_bytes for layer in self.layers)

    def reduced_as(self, itemsize: int) -> ModelProfile:
        """The same model with gradients reduced at ``itemsize`` bytes per element (2: a
        float16 allreduce, as DDP's fp16 compression hook or Horovod's fp16 compression);
        buckets keep their elements, layers' gradient bytes scale."""
        if itemsize == self.itemsize:
            return self
        layers = tuple(replace(layer, parameter_bytes=layer.parameter_bytes // self.itemsize
                               * itemsize) for layer in self.layers)
        return replace(self, layers=layers, itemsize=itemsize)

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs for one sample."""
        return sum(layer.forward_flops for layer in self.layers)

    def compute_times(
        self, batch: int, flops: float | None = None, compute_time: float | None = None
    ) -> tuple[list[float], list[float]]:
        """Per-layer forward and backward seconds for ``batch`` samples on one device."""
        if batch < 1:
            raise ValueError(f"batch {batch} per GPU must be >= 1")
        total = self.forward_flops * (1 + BACKWARD_FACTOR)
        if compute_time is not None:
            if compute_time <= 0:
                raise ValueError(f"compute time {compute_time} s must be > 0")
            scale = compute_time / total if total else 0.0
        elif flops is not None and flops > 0:
            scale = batch / flops
        else:
            raise ValueError("give a device FLOP/s > 0 or a measured compute time per iteration")
        forward = [layer.forward_flops * scale for layer in self.layers]
        return forward, [f * BACKWARD_FACTOR for f in forward]


def default_input(model: str) -> tuple[tuple[int, ...], int]:
    """``(input shape, classes)``: ImageNet for the ImageNet models (299x299 for Inception v3
    and 380x380 for EfficientNet-B4, as their papers and the benchmarks that use them), 128
    tokens and two classes for BERT (its pre-training's first phase and sentence-pair tasks),
    a full context and next-token logits over the vocabulary for a GPT decoder (1024 tokens for
    GPT-2; its tied head), CIFAR-10 otherwise."""
    if model.lower() in GPT_SIZES:
        size = GPT_SIZES[model.lower()]
        return (size.positions,), size.vocab
    if model.lower() in TOKEN_MODELS:
        return (128,), 2
    if model.lower() in IMAGENET_MODELS:
        side = IMAGENET_SIDES.get(model.lower(), 224)
        return (3, side, side), 1000
    if model.lower() in ("lenet", "mlp"):
        return (1, 28, 28), 10
    return (3, 32, 32), 10


def _tensors(module: torch.nn.Module) -> int:
    return sum(1 for _ in module.parameters(recurse=False))


def _winograd(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Conv2d) and tuple(module.kernel_size) == (3, 3)
            and tuple(module.stride) == (1, 1) and module.groups == 1
            and tuple(module.dilation) == (1, 1))


def _tensor_core_convolution(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Conv2d) and module.groups == 1


@functools.lru_cache(maxsize=64)
def _traced(model: str, shape: tuple[int, ...], classes: int
            ) -> tuple[torch.nn.Module, tuple[Layer, ...]]:
    """Registry model ``model`` on ``meta`` and its layers with their traced operations (cached:
    a job's profile is asked for once per simulated iteration)."""
    with torch.device("meta"):
        net = build_model(model, shape, classes)
    profiles = layer_profile(net, shape)
    modules = dict(net.named_modules())
    owners = [modules[p.name] for p in profiles]
    try:
        ops = operation_costs(net, owners, shape)
    except TraceError:
        ops = [() for _ in owners]
    return net, tuple(Layer(p.name, p.parameter_bytes, float(p.forward_flops),
                            math.prod(p.output_shape) if p.output_shape else 0,
                            _tensors(modules[p.name]), _winograd(modules[p.name]),
                            _tensor_core_convolution(modules[p.name]),
                            tuple(cost))
                      for p, cost in zip(profiles, ops))


def has_depthwise(model: str, input_shape: tuple[int, ...] | None = None) -> bool:
    """Whether registry model ``model`` has depthwise convolutions (one input channel per
    group), which the device presets do not price well (docs/simulation.md, "Device
    efficiency"); the traced model is the one :func:`profile_model` uses (cached)."""
    name = model.lower()
    if name not in MODELS or name in TOKEN_MODELS:
        return False  # not a registry model, or a Transformer (no convolution)
    shape, classes = default_input(name)
    net, _ = _traced(name, tuple(input_shape or shape), classes)
    return any(isinstance(m, torch.nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
               for m in net.modules())


def profile_model(
    model: str, bucket_bytes: int = 25 << 20, input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None, by_layer: bool = False,
) -> ModelProfile:
    """Profile registry model ``model`` with DataParallel's bucketing of ``bucket_bytes``."""
    if model.lower() not in MODELS:
        raise ValueError(f"unknown model {model!r}; available: {', '.join(MODELS)}")
    shape, classes = default_input(model)
    shape = input_shape if input_shape is not None else shape
    classes = num_classes if num_classes is not None else classes
    net, layers = _traced(model.lower(), tuple(shape), classes)
    index = {layer.name: i for i, layer in enumerate(layers)}
    buckets = []
    for bucket in plan_buckets(list(net.named_parameters()), bucket_bytes, by_layer=by_layer):
        owners = tuple(sorted({index[layer_of(name)] for name in bucket.names}))
        buckets.append((bucket.numel, owners))
    return ModelProfile(model.lower(), layers, tuple(buckets))


def layer_names(model: str, input_shape: tuple[int, ...], num_classes: int) -> list[str]:
    """The names of :func:`profile_model`'s layers (traced once and cached): what a measured
    profile must time (:func:`scaledl.profiling.profile_file.load_profile`'s check)."""
    profile = profile_model(model, input_shape=input_shape, num_classes=num_classes)
    return [layer.name for layer in profile.layers]
