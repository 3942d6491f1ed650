"""Compute time per layer on one device: the ideal FLOP rule, a roofline per device preset, or
a measured profile (docs/simulation.md, "Device efficiency").

- :class:`FlopsCompute` (``--ideal``): ``batch x FLOPs / (peak x efficiency)`` forward, twice
  that backward: a constant efficiency at every batch size.
- :class:`RooflineCompute`: each layer is bound by arithmetic or by memory, whichever is slower,
  plus a fixed cost per pass (kernel launches, framework dispatch):

      forward = max(batch F / (peak e util), (W + 2 batch O s) / memory bandwidth) + launch
      util    = min(1, batch O / fill)

  with ``F`` the layer's forward FLOPs (over 2.25 for 3x3 stride-1 convolutions, which cuDNN
  runs with Winograd's F(2x2, 3x3)) and ``O`` its output elements per sample, ``W`` its
  parameter bytes, ``s`` the element size, ``e`` the fraction of peak that compute-bound
  kernels sustain and ``fill`` the threads the device needs in flight to use every core (SMs x
  resident threads per SM).  Backward is twice forward (gradients of inputs and of weights).
  On a tensor-core preset (``Device.nhwc_convolutions``) a convolution of an NCHW model
  also pays its transposes: cuDNN runs tensor-core convolutions on NHWC tensors and converts
  NCHW ones around each call (cuDNN Developer Guide, "Tensor Transformations"), so each of
  its tensors is read and written once more, ``2 (W + batch B) / memory bandwidth`` with ``B``
  its activation bytes per sample, added to the convolution's own time (other kernels); none
  with ``channels_last``.  With ``mixed_precision`` the arithmetic runs at the device's FP16/BF16
  tensor-core peak and tensor-core ``e`` (``Device.mixed_tflops``, ``Device.tensor_efficiency``),
  every tensor moves at half its float32 bytes, and convolutions pay the transposes on every
  tensor-core device (the V100's included, whose own FP32 preset does not).
  Per-sample time never grows with the batch, so the efficiency
  ``batch x total FLOPs / (peak x time)`` never falls as the batch grows and never exceeds
  ``e <= 1`` (a unit test checks both).
- :class:`MeasuredCompute` (``--profile FILE``): per-layer times measured by ``scaledl simulate
  profile``, each layer's time an affine function of the batch through the measured points;
  :func:`measured_compute` maps the file's leaf modules onto the layers: a module without
  parameters (ReLU, pooling) is charged to the closest parameter-owning module before it in
  forward order (its backward then runs just before that module's, as in autograd), and the
  time the hooks did not see (the loss, autograd's own work) is spread over the layers in
  proportion to their time, so that per-layer times add up to the measured iteration.
- :func:`scaled`: any of these rescaled to a measured whole compute time (``--compute-time``),
  keeping the split between layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from scaledl.models.trace import OpCost
from scaledl.profiling.profile_file import MeasuredProfile
from scaledl.sim.presets import Device
from scaledl.sim.profile import BACKWARD_FACTOR, Layer, ModelProfile

__all__ = ["ComputeModel", "FlopsCompute", "RooflineCompute", "MeasuredCompute",
           "measured_compute", "scaled", "efficiency"]

Times = tuple[list[float], list[float]]

HALF_BYTES = 2.0
"""Under mixed precision every traced float32 tensor moves as FP16/BF16: half the bytes, which
the roofline prices as twice the memory bandwidth."""

WINOGRAD = 2.25
"""Multiplies saved by Winograd's F(2x2, 3x3) on 3x3 stride-1 convolutions (36 / 16)."""


class ComputeModel(Protocol):
    """Per-layer forward and backward seconds for a batch on one device."""

    def layer_times(self, profile: ModelProfile, batch: int) -> Times:
        """``(forward, backward)`` seconds per layer of ``profile``, in forward order."""


def _check_batch(batch: int) -> None:
    if batch < 1:
        raise ValueError(f"batch {batch} per GPU must be >= 1")


@dataclass(frozen=True)
class FlopsCompute:
    """The ideal rule: FLOPs at a constant rate, whatever the batch."""

    flops: float
    """Effective FLOP/s."""

    def layer_times(self, profile: ModelProfile, batch: int) -> Times:
        """Forward ``batch x FLOPs / flops``, backward twice that."""
        _check_batch(batch)
        if not self.flops > 0:
            raise ValueError(f"device FLOP/s {self.flops} must be > 0")
        forward = [layer.forward_flops * batch / self.flops for layer in profile.layers]
        return forward, [f * BACKWARD_FACTOR for f in forward]


@dataclass(frozen=True)
class RooflineCompute:
    """A roofline per layer with an occupancy limit and a fixed cost per pass."""

    device: Device
    channels_last: bool = False
    """The model's tensors are NHWC (``torch.channels_last``): no transposes on tensor cores."""
    mixed_precision: bool = False
    """FP16/BF16 on tensor cores (``Device.mixed_tflops`` at ``Device.tensor_efficiency``),
    every tensor moved at 2 bytes instead of the traced float32's 4."""

    def layer_times(self, profile: ModelProfile, batch: int) -> Times:
        """Forward and backward seconds per layer (see the module docstring)."""
        _check_batch(batch)
        dev, mixed = self.device, self.mixed_precision
        if mixed and not dev.mixed_tflops > 0:
            raise ValueError(f"device {dev.name!r} has no mixed-precision (tensor-core) preset")
        rate = (dev.mixed_tflops * dev.tensor_efficiency if mixed
                else dev.peak_tflops * dev.compute_efficiency) * 1e12
        bandwidth = dev.memory_gbps * 1e9 * (HALF_BYTES if mixed else 1.0)
        transposes = (mixed or dev.nhwc_convolutions) and not self.channels_last
        forward = []
        for layer in profile.layers:
            ops = layer.ops or (_alone(layer, profile.itemsize),)
            seconds = sum(_operation(op, batch, rate, bandwidth, dev.fill_threads)
                          + (_transposes(op, batch, bandwidth) if transposes else 0.0)
                          for op in ops)
            forward.append(seconds + dev.launch_s)
        return forward, [f * BACKWARD_FACTOR for f in forward]


def _alone(layer: Layer, itemsize: int) -> OpCost:
    """A layer without traced operations as one operation: its FLOPs, its parameters read once,
    its output read and written."""
    return OpCost(layer.name, layer.forward_flops, 2 * layer.output_elements * itemsize,
                  layer.parameter_bytes, layer.output_elements, layer.winograd,
                  layer.convolution)


def _transposes(op: OpCost, batch: int, bandwidth: float) -> float:
    """A convolution's NCHW-to-NHWC transposes on tensor cores: each of its tensors (input,
    filter, output) read and written once more, by kernels of their own beside the
    convolution's (so added, not overlapped); nothing for other operations.  A layer priced
    alone (``_alone``) counts its output twice for its activations, as if its input were the
    size of its output."""
    return 2 * (op.fixed_bytes + batch * op.bytes_per_sample) / bandwidth if op.convolution \
        else 0.0


def _operation(op: OpCost, batch: int, rate: float, bandwidth: float, fill: int) -> float:
    """One traced operation's roofline: its FLOPs at the compute rate (derated below full
    occupancy) or its bytes at the memory bandwidth, whichever is slower."""
    work = batch * op.output_elements
    util = min(1.0, work / fill) if work else 1.0
    flops = op.flops / (WINOGRAD if op.winograd else 1.0)
    arithmetic = batch * flops / (rate * util) if flops else 0.0
    return max(arithmetic, (op.fixed_bytes + batch * op.bytes_per_sample) / bandwidth)


@dataclass(frozen=True)
class MeasuredCompute:
    """Measured seconds per layer at some batch sizes; affine in the batch between them."""

    batches: tuple[int, ...]
    """Measured batch sizes, increasing."""
    forward: tuple[tuple[float, ...], ...]
    """Per layer (in the profile's layer order), forward seconds at each measured batch."""
    backward: tuple[tuple[float, ...], ...]

    def layer_times(self, profile: ModelProfile, batch: int) -> Times:
        """Each layer's time through its measured points (the nearest two, extended linearly
        beyond them, never below zero); one measured batch scales proportionally."""
        _check_batch(batch)
        if len(self.forward) != len(profile.layers):
            raise ValueError(f"the measured profile has {len(self.forward)} layers but the model "
                             f"{len(profile.layers)}; profile the same model and input shape")
        return ([_at(self.batches, times, batch) for times in self.forward],
                [_at(self.batches, times, batch) for times in self.backward])


def measured_compute(measured: MeasuredProfile, profile: ModelProfile) -> MeasuredCompute:
    """Per-layer times of ``measured`` on ``profile``'s layers (see the module docstring);
    ``ValueError`` when a layer has no module's times."""
    missing = measured.untimed(layer.name for layer in profile.layers)
    if missing is not None:
        raise ValueError(f"the profile of {measured.model} has no module {missing!r}; "
                         "profile the same model (and input shape) again")
    index = {layer.name: i for i, layer in enumerate(profile.layers)}
    k_count = len(measured.batches)
    forward = [[0.0] * k_count for _ in profile.layers]
    backward = [[0.0] * k_count for _ in profile.layers]
    owner = 0
    for module in measured.modules:
        owner = index.get(module.name, owner)
        for k in range(k_count):
            forward[owner][k] += module.forward_s[k]
            backward[owner][k] += module.backward_s[k]
    for k in range(k_count):  # spread what the hooks did not see
        seen = sum(f[k] + b[k] for f, b in zip(forward, backward))
        factor = measured.forward_backward_s[k] / seen if seen > 0 else 1.0
        for f, b in zip(forward, backward):
            f[k] *= factor
            b[k] *= factor
    return MeasuredCompute(measured.batches, tuple(tuple(f) for f in forward),
                           tuple(tuple(b) for b in backward))


def _at(batches: Sequence[int], times: Sequence[float], batch: int) -> float:
    if len(batches) == 1:
        return times[0] * batch / batches[0]
    k = 1
    while k < len(batches) - 1 and batches[k] < batch:
        k += 1
    (b0, t0), (b1, t1) = (batches[k - 1], times[k - 1]), (batches[k], times[k])
    slope = (t1 - t0) / (b1 - b0)
    return max(t0 + slope * (batch - b0), 0.0)


def scaled(times: Times, total: float) -> Times:
    """``times`` rescaled so that forward plus backward sums to ``total`` seconds."""
    if not 0 < total < float("inf"):
        raise ValueError(f"compute time {total} s must be a finite number > 0")
    forward, backward = times
    whole = sum(forward) + sum(backward)
    factor = total / whole if whole > 0 else 0.0
    return [f * factor for f in forward], [b * factor for b in backward]


def efficiency(model: ComputeModel, profile: ModelProfile, batch: int, device: Device) -> float:
    """Fraction of the device's peak in use (its mixed-precision peak for a mixed-precision
    roofline) that ``model`` achieves on ``profile`` at ``batch``."""
    forward, backward = model.layer_times(profile, batch)
    seconds = sum(forward) + sum(backward)
    flops = batch * profile.forward_flops * (1 + BACKWARD_FACTOR)
    mixed = isinstance(model, RooflineCompute) and model.mixed_precision
    peak = device.mixed_tflops if mixed else device.peak_tflops
    return flops / (peak * 1e12 * seconds) if seconds > 0 else 0.0
