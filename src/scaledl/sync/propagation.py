"""Reduce-broadcast with multi-stage model propagation (S-Caffe, OSU-Caffe, CaffeGPI).

Instead of every rank averaging gradients and stepping its own optimizer, one root owns the
update:

1. backward: each layer's gradients form a bucket, reduced to the root (tree, chain or
   hierarchical reduce) as soon as backward has produced them, layer by layer;
2. the root alone runs the optimizer step on the averaged gradients;
3. propagation: the root broadcasts the new parameters layer by layer, first layer first, all
   asynchronous; a forward pre-hook on each layer waits only for that layer's broadcast, so the
   later layers are still arriving while the first ones compute ("multi-stage data propagation"
   in S-Caffe's words).

The parameters equal those of allreduce data parallelism up to floating-point rounding: the
same averaged gradient, applied once at the root instead of on every rank.  Only the root
holds optimizer state.

Which forward waits for which layer: a leaf module's own forward pre-hook waits for its
parameters; parameters held by a container, a ``ParameterList``/``ParameterDict`` or the wrapped
module itself are waited for before the whole forward starts.  A parent that reads a leaf
child's parameters directly (``self.proj.weight`` without calling ``self.proj``) defeats the
per-layer wait; call ``synchronize()`` first in that case.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from scaledl import collectives
from scaledl.collectives import CollectiveHandle
from scaledl.sync.bucketing import Bucket, layer_of, plan_buckets
from scaledl.sync.consistency import broadcast_state, check_same_model
from scaledl.sync.reducer import GradientReducer
from scaledl.sync.stats import SpanRecorder, SyncStats, wait_and_charge
from scaledl.topology import Topology

__all__ = ["ReduceBroadcast", "ROOTED_ALGORITHMS"]

ROOTED_ALGORITHMS = tuple(
    name for name in collectives.available("reduce") if name in collectives.available("broadcast")
)
"""Algorithms that implement both reduce and broadcast."""


class _Layer:
    """One layer's parameters as a flat buffer that travels as one broadcast."""

    def __init__(self, name: str, params: list[nn.Parameter]) -> None:
        self.name = name
        self.params = params
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.handle: CollectiveHandle | None = None

    def pack(self) -> None:
        offset = 0
        for p in self.params:
            self.flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            offset += p.numel()

    @torch.no_grad()
    def unpack(self) -> None:
        offset = 0
        for p in self.params:
            p.copy_(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def _runs_own_forward(module: nn.Module) -> bool:
    """True for a leaf module that is called as such (not a parameter container)."""
    containers = (nn.ParameterList, nn.ParameterDict)
    return not isinstance(module, containers) and next(module.children(), None) is None


class ReduceBroadcast(nn.Module):
    """Wrap ``module``: per-layer reduce to ``root`` in backward, per-layer broadcast after."""

    def __init__(
        self, module: nn.Module, algorithm: str = "auto", root: int = 0,
        topology: Topology | None = None, group: dist.ProcessGroup | None = None,
        timeline: SpanRecorder | None = None,
    ) -> None:
        super().__init__()
        if algorithm not in ROOTED_ALGORITHMS:
            raise ValueError(
                f"reduce-broadcast algorithm {algorithm!r} is not one of {ROOTED_ALGORITHMS}"
            )
        if not dist.is_initialized():
            raise RuntimeError("call scaledl.init() before wrapping a model in ReduceBroadcast")
        collectives.resolve_topology(algorithm, "broadcast", topology, group)
        self.module = module
        self.algorithm, self.root, self.group = algorithm, root, group
        self.topology = collectives.resolve_topology(algorithm, "reduce", topology, group)
        self.timeline = timeline
        self.rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        if not 0 <= root < world:
            raise ValueError(f"root {root} is outside the group of {world} ranks")
        check_same_model(module, group, [f"setting algorithm {algorithm}", f"setting root {root}"])
        broadcast_state(module, group)
        named = list(module.named_parameters())
        self.buckets = plan_buckets(named, bucket_bytes=1, by_layer=True)
        self.reducer = GradientReducer(
            self.buckets, dict(named), self._launch_reduce, timeline, label="reduce"
        )
        self.layers = self._layers(named)
        # A leaf module's own forward waits for its parameters; a layer whose module may never
        # run a forward of its own (a container, a ParameterList, the root) is waited for
        # before the whole forward starts.
        self._early: list[_Layer] = []
        self._pre_hooks: list[RemovableHandle] = []
        for layer in self.layers:
            owner = module.get_submodule(layer.name)
            if layer.name and _runs_own_forward(owner):
                self._pre_hooks.append(owner.register_forward_pre_hook(self._waiter(layer)))
            else:
                self._early.append(layer)

    @staticmethod
    def _layers(named: list[tuple[str, nn.Parameter]]) -> list[_Layer]:
        by_layer: dict[str, list[nn.Parameter]] = {}
        for name, param in named:
            if param.requires_grad:
                by_layer.setdefault(layer_of(name), []).append(param)
        return [_Layer(name, params) for name, params in by_layer.items()]

    def _launch_reduce(self, bucket: Bucket, buffer: torch.Tensor) -> CollectiveHandle | None:
        return collectives.reduce(
            buffer, dst=self.root, op="avg", algorithm=self.algorithm, topology=self.topology,
            group=self.group, async_op=True,
        )

    def _waiter(self, layer: _Layer) -> Any:
        def wait_for_layer(module: nn.Module, inputs: Any) -> None:
            self._receive(layer)
        return wait_for_layer

    def _receive(self, layer: _Layer) -> None:
        if layer.handle is None:
            return
        wait_and_charge(layer.handle, self.reducer.stats, self.timeline,
                        comm_span=f"broadcast {layer.name}", wait_span=f"wait {layer.name}")
        self.reducer.stats.bytes += layer.flat.numel() * layer.flat.element_size()
        if self.rank != self.root:
            layer.unpack()
        layer.handle = None

    def propagate(self) -> None:
        """After the root's optimizer step: broadcast every layer, first layer first."""
        self.synchronize()  # a layer whose forward never ran still holds last step's broadcast
        for layer in self.layers:
            if self.rank == self.root:
                layer.pack()
            layer.handle = collectives.broadcast(
                layer.flat, src=self.root, algorithm=self.algorithm, topology=self.topology,
                group=self.group, async_op=True,
            )

    def synchronize(self) -> None:
        """Wait for every pending broadcast (before evaluation or a checkpoint)."""
        for layer in self.layers:
            self._receive(layer)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; each layer waits for its own parameters first."""
        for layer in self._early:
            self._receive(layer)
        return self.module(*args, **kwargs)

    @property
    def is_root(self) -> bool:
        """True on the rank that owns the optimizer."""
        return self.rank == self.root

    @property
    def stats(self) -> SyncStats:
        """Communication time (reduces and broadcasts), exposed waits and bytes."""
        return self.reducer.stats
