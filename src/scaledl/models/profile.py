"""Layer profiles: parameters and forward FLOPs per layer, the input of the training simulator.

:func:`layer_profile` runs one forward pass of a single sample on the ``meta`` device (shapes
only: no memory for activations, no arithmetic, the model's own weights untouched) with a forward
hook on every module that owns parameters, and counts for each:

- convolution: ``2 * Cin * Cout * kh * kw * Hout * Wout / groups`` FLOPs (a multiply and an add
  per weight use; bias ignored);
- linear: ``2 * in * out`` per output row;
- a module that defines ``forward_flops(output)`` (attention, whose products of activations no
  parameter-owning layer sees): what that method returns;
- any other module with parameters (batch norm, ...): 2 FLOPs per output element (an affine map).

The sample is of the model's ``input_dtype`` (float unless the model declares another: token
ids for BERT), all zeros, which on ``meta`` are shapes only.

A module called several times in one forward pass is counted each time.  A model whose forward
reads tensor values (``.item()``, data-dependent branches) cannot run on ``meta`` and is not
supported.  The list follows module
registration order, which for the registry's models is forward order; backward produces
gradients in roughly the reverse order, which is what gradient bucketing relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["LayerProfile", "layer_profile", "total_flops", "input_dtype", "example_input"]


@dataclass(frozen=True)
class LayerProfile:
    """One module that owns parameters."""

    name: str
    """Qualified module name in the model, e.g. ``features.3.body.0``."""
    kind: str
    """Module class name, e.g. ``Conv2d``."""
    parameters: int
    """Parameters the module owns (shared ones counted at their first owner only)."""
    parameter_bytes: int
    """Bytes of those parameters (the gradient bytes a data-parallel step reduces)."""
    forward_flops: int
    """Floating-point operations of the module's forward pass for one sample."""
    output_shape: tuple[int, ...]
    """Shape of the module's output for one sample (no batch dim); () if never called."""


def _flops(module: nn.Module, output: torch.Tensor) -> int:
    own = getattr(module, "forward_flops", None)
    if callable(own):
        return int(own(output))
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        per_output = 2 * module.in_channels * kh * kw // module.groups
        return per_output * output.numel()
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * output.numel()
    return 2 * output.numel()


def layer_profile(model: nn.Module, input_shape: tuple[int, ...]) -> list[LayerProfile]:
    """Per-layer parameters and one-sample forward FLOPs of ``model`` (see the module docstring)."""
    owners = [
        (name, module) for name, module in model.named_modules()
        if any(True for _ in module.parameters(recurse=False))
    ]
    flops = {name: 0 for name, _ in owners}
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(module: nn.Module, inputs: object, output: object) -> None:
            if isinstance(output, torch.Tensor):
                flops[name] += _flops(module, output)
                shapes[name] = tuple(output.shape[1:])
        return hook

    handles = [module.register_forward_hook(record(name)) for name, module in owners]
    meta_state = {
        name: torch.empty_like(tensor, device="meta")
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    }
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            sample = torch.zeros((1, *input_shape), dtype=input_dtype(model), device="meta")
            functional_call(model, meta_state, (sample,), tie_weights=True, strict=False)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return _profiles(owners, flops, shapes)


def input_dtype(model: nn.Module) -> torch.dtype:
    """The dtype ``model`` takes (its ``input_dtype`` attribute; float32 if it has none)."""
    dtype = getattr(model, "input_dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def example_input(model: nn.Module, batch: int, input_shape: tuple[int, ...],
                  generator: torch.Generator) -> torch.Tensor:
    """A random batch ``model`` takes: standard normal floats, or integers in ``[0,
    model.vocab_size)`` for a model whose ``input_dtype`` is an integer type (token ids)."""
    dtype = input_dtype(model)
    if dtype.is_floating_point:
        return torch.randn(batch, *input_shape, generator=generator, dtype=dtype)
    high = int(getattr(model, "vocab_size", 2))
    return torch.randint(0, high, (batch, *input_shape), generator=generator, dtype=dtype)


def _profiles(
    owners: list[tuple[str, nn.Module]],
    flops: dict[str, int],
    shapes: dict[str, tuple[int, ...]],
) -> list[LayerProfile]:
    seen: set[int] = set()
    profiles = []
    for name, module in owners:
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        count = sum(p.numel() for p in own)
        nbytes = sum(p.numel() * p.element_size() for p in own)
        kind = type(module).__name__
        profiles.append(LayerProfile(name, kind, count, nbytes, flops[name], shapes.get(name, ())))
    return profiles


def total_flops(profiles: list[LayerProfile]) -> int:
    """Forward FLOPs of one sample summed over the layers."""
    return sum(p.forward_flops for p in profiles)
