"""Bucketing: group parameters' gradients into flat buffers for overlapped reduction.

Backward produces gradients roughly in reverse registration order (last layer first), so
buckets are filled in that order: a bucket is a run of consecutive parameters (in reverse
order) of one dtype and device whose gradients together fit in ``bucket_bytes``; a parameter
larger than the cap gets a bucket of its own.  When every gradient of a bucket has arrived, its
collective can start while backward still computes earlier layers: the overlap S-Caffe calls
layer-wise gradient aggregation and DDP calls bucketing.

``by_layer=True`` instead gives every module with parameters its own bucket (S-Caffe's and
CaffeGPI's per-layer reduction), used by the reduce-broadcast strategy so each layer's
parameters can be broadcast, and waited for, on their own.

The plan is data (:class:`Bucket` values), so it is tested without processes, and identical on
every rank that wrapped the same model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Bucket", "plan_buckets", "layer_of"]


@dataclass(frozen=True)
class Bucket:
    """Consecutive gradients reduced together as one flat buffer."""

    index: int
    """Position in launch order (0 is launched first)."""
    names: tuple[str, ...]
    """Parameter names, in the order their slots appear in the buffer."""
    offsets: tuple[int, ...]
    """Element offset of each parameter's slot in the flat buffer."""
    numels: tuple[int, ...]
    """Elements of each parameter."""
    dtype: torch.dtype
    device: torch.device

    @property
    def numel(self) -> int:
        """Elements in the flat buffer."""
        return sum(self.numels)

    @property
    def nbytes(self) -> int:
        """Bytes in the flat buffer."""
        return self.numel * self.dtype.itemsize


def layer_of(name: str) -> str:
    """The module path of a parameter name (``"layer1.0.conv.weight"`` -> ``"layer1.0.conv"``)."""
    return name.rpartition(".")[0]


def plan_buckets(
    named_parameters: Sequence[tuple[str, nn.Parameter]], bucket_bytes: int,
    by_layer: bool = False,
) -> list[Bucket]:
    """Buckets over the trainable parameters, in reverse registration order."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size {bucket_bytes} bytes must be >= 1")
    trainable = [(name, p) for name, p in named_parameters if p.requires_grad]
    groups: list[list[tuple[str, nn.Parameter]]] = []
    current: list[tuple[str, nn.Parameter]] = []
    current_bytes = 0
    for name, param in reversed(trainable):
        size = param.numel() * param.element_size()
        if current and _must_split(current, name, param, current_bytes + size, bucket_bytes,
                                   by_layer):
            groups.append(current)
            current, current_bytes = [], 0
        current.append((name, param))
        current_bytes += size
    if current:
        groups.append(current)
    return [_bucket(index, group) for index, group in enumerate(groups)]


def _must_split(
    current: list[tuple[str, nn.Parameter]], name: str, param: nn.Parameter, total: int,
    cap: int, by_layer: bool,
) -> bool:
    last_name, last = current[-1]
    if last.dtype != param.dtype or last.device != param.device:
        return True
    if by_layer:
        return layer_of(last_name) != layer_of(name)
    return total > cap


def _bucket(index: int, group: list[tuple[str, nn.Parameter]]) -> Bucket:
    offsets, numels = [], []
    offset = 0
    for _, param in group:
        offsets.append(offset)
        numels.append(param.numel())
        offset += param.numel()
    first = group[0][1]
    return Bucket(index, tuple(n for n, _ in group), tuple(offsets), tuple(numels),
                  first.dtype, first.device)
