"""Every operation of a training forward pass, with its FLOPs and the bytes it moves, charged to
the layers that own parameters: the input of the simulator's per-operation roofline.

:func:`operation_costs` runs the model in training mode on the ``meta`` device (shapes only)
under a dispatch mode that sees every aten operation, twice, at batch 2 and batch 4 (a batch of
one lets aten skip copies that larger batches need), so that each operation's cost splits into
a part per sample and a fixed part (the weights it reads):

- FLOPs: torch's own formulas (``torch.utils.flop_counter``: matrix products, convolutions,
  attention kernels); other operations count none;
- bytes: every tensor an operation reads and writes (an in-place one reads and writes its
  tensor); views, which move nothing, are left out;
- output elements, for the occupancy term.

An operation belongs to the parameter-owning module that ran most recently (a ReLU or a
residual add after a convolution's batch norm belongs to that batch norm; attention's softmax to
its attention module; those before any such module to the first), as a measured profile charges
modules without parameters.  A model whose operations differ between the two batches
(data-dependent control flow) cannot be traced: :class:`TraceError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from scaledl.models.profile import input_dtype

__all__ = ["OpCost", "TraceError", "operation_costs", "TRACE_BATCHES"]

TRACE_BATCHES = (2, 4)
"""The two batch sizes traced; costs are affine in the batch between and beyond them."""


@dataclass(frozen=True)
class OpCost:
    """One operation of the forward pass."""

    name: str
    """The aten operation, e.g. ``aten.convolution.default``."""
    flops: float
    """FLOPs per sample."""
    bytes_per_sample: float
    """Bytes read and written per sample (activations)."""
    fixed_bytes: float
    """Bytes read whatever the batch (weights)."""
    output_elements: float
    """Output elements per sample."""
    winograd: bool = False
    """A 3x3 stride-1 dense convolution (cuDNN's Winograd F(2x2, 3x3): 2.25x fewer multiplies)."""
    convolution: bool = False
    """A dense 2-D convolution (one group, not transposed): on tensor cores cuDNN runs it on
    NHWC tensors, so NCHW ones are transposed around it (``scaledl.sim.compute``)."""


class TraceError(ValueError):
    """The model's operations depend on its batch size; it cannot be traced this way."""


@dataclass(frozen=True)
class _Raw:
    name: str
    owner: int
    flops: float
    nbytes: float
    outputs: float
    winograd: bool
    convolution: bool


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return (leaf for leaf in leaves if isinstance(leaf, torch.Tensor))


_UNANNOTATED_VIEWS = frozenset({"aten._unsafe_view"})
"""Operations that return a view without saying so in their schema."""


def _is_view(func: Any) -> bool:
    schema = func._schema
    if str(func._overloadpacket) in _UNANNOTATED_VIEWS:
        return True
    return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


def _winograd(func: Any, args: tuple[Any, ...]) -> bool:
    if func._overloadpacket is not torch.ops.aten.convolution or len(args) < 9:
        return False
    weight, stride, dilation, transposed, groups = args[1], args[3], args[5], args[6], args[8]
    return (tuple(weight.shape[2:]) == (3, 3) and list(stride) == [1, 1]
            and list(dilation) == [1, 1] and not transposed and groups == 1)


def _tensor_core_convolution(func: Any, args: tuple[Any, ...]) -> bool:
    """A dense, non-transposed 2-D convolution (4-D weight, one group): the kind cuDNN runs on
    tensor cores in NHWC; depthwise, grouped, transposed, 1-D and 3-D ones are not counted."""
    if func._overloadpacket is not torch.ops.aten.convolution or len(args) < 9:
        return False
    weight, transposed, groups = args[1], args[6], args[8]
    return weight.dim() == 4 and not transposed and groups == 1


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every aten operation with the index of the owner module running it."""

    def __init__(self, owner: Callable[[], int]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner, self.ops = owner, list[_Raw]()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) \
            if packet in flop_registry else 0.0
        if _is_view(func):
            return out
        outputs = sum(t.numel() for t in _tensors(out))
        nbytes = float(sum(t.numel() * t.element_size() for t in _tensors((args, kwargs)))
                       + sum(t.numel() * t.element_size() for t in _tensors(out)))
        self.ops.append(_Raw(str(func), self.owner(), flops, nbytes, float(outputs),
                             _winograd(func, args), _tensor_core_convolution(func, args)))
        return out


def _trace(model: nn.Module, owners: list[nn.Module], input_shape: tuple[int, ...],
           batch: int) -> list[_Raw]:
    index = {id(module): k for k, module in enumerate(owners)}
    current = [0]

    def enter(module: nn.Module, inputs: object) -> None:
        current[0] = index.get(id(module), current[0])

    handles = [module.register_forward_pre_hook(enter) for module in owners]
    state = {name: torch.empty_like(t, device="meta")
             for name, t in [*model.named_parameters(), *model.named_buffers()]}
    was_training = model.training
    recorder = _Recorder(lambda: current[0])
    try:
        model.train()
        sample = torch.zeros((batch, *input_shape), dtype=input_dtype(model), device="meta")
        with recorder:
            functional_call(model, state, (sample,), tie_weights=True, strict=False)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return recorder.ops


def operation_costs(model: nn.Module, owners: list[nn.Module], input_shape: tuple[int, ...]
                    ) -> list[tuple[OpCost, ...]]:
    """For each module of ``owners`` (the parameter-owning modules, in forward order), the
    operations charged to it (see the module docstring)."""
    small, large = (_trace(model, owners, input_shape, batch) for batch in TRACE_BATCHES)
    if [op.name for op in small] != [op.name for op in large]:
        raise TraceError("the model runs different operations at batch 2 and batch 4; give "
                         "the simulator a measured profile (--profile) instead")
    charged: list[list[OpCost]] = [[] for _ in owners]
    low, high = TRACE_BATCHES
    for a, b in zip(small, large):
        def per_sample(x: float, y: float) -> float:
            return max((y - x) / (high - low), 0.0)
        nbytes = per_sample(a.nbytes, b.nbytes)
        charged[a.owner].append(OpCost(
            a.name, per_sample(a.flops, b.flops), nbytes, max(a.nbytes - low * nbytes, 0.0),
            per_sample(a.outputs, b.outputs), a.winograd, a.convolution))
    return [tuple(ops) for ops in charged]
