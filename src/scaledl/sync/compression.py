"""Gradient compression on the wire: bfloat16, float16 with an agreed scale, and the choice of a
compression by name (``compression=`` of DataParallel and ``ddp_hook``).

* ``"none"``: float32 (the gradients' own dtype) on the wire.
* ``"bf16"``: each rank casts its bucket to bfloat16 (round to nearest even), the bfloat16
  buffers are summed by the allreduce (each addition rounded to bfloat16, as any reduction in
  that dtype), and the sum is cast back and divided by the world size in the gradients' dtype.
  Half the bytes; bfloat16 has float32's exponent range, so nothing overflows that would not
  overflow in float32, at about three significant digits.
* ``"fp16"``: float16 has about three and a half significant digits but a range of only
  6.1e-5 (smallest normal) to 65504, so a plain cast overflows large gradients to ``inf`` and
  flushes small ones to zero.  So, per bucket and step:

  1. every rank takes the largest absolute value of its gradients, and one allreduce of one
     float32 element takes the maximum of those, ``amax``, over the ranks;
  2. the scale ``s`` is the power of two with ``p * amax * s <= 2**15`` as large as possible
     (``p`` ranks), so every partial sum of the reduction stays below 2**15, half of float16's
     largest finite value: **no sum can overflow**, however large the gradients, and small
     gradients are lifted out of float16's subnormal range as a loss scale would lift them;
  3. each rank sends ``float16(g * s)`` (a power of two: scaling is exact in float32), the
     allreduce sums in float16, and the result is cast back, multiplied by ``1 / s`` (exact)
     and divided by ``p``.

  A bucket whose ``amax`` is not finite (a step that already overflowed in float32) is sent
  unscaled, so ``inf``/``nan`` arrive as they would in float32 and a ``GradScaler`` still
  sees them.  The extra one-element allreduce costs one latency per bucket.
* ``"powersgd"`` / ``"powersgd:RANK"``: :class:`~scaledl.sync.powersgd.PowerSGD`.

The elements after a DataParallel bucket's gradients (one 0/1 'used' flag per parameter) are
sent in the same wire buffer without scaling: in either half-precision dtype a sum of at most
``p`` ones stays exact enough that a zero stays zero and a non-zero stays non-zero.
"""

from __future__ import annotations

import math

import torch

from scaledl.sync.powersgd import PowerSGD
from scaledl.sync.wire import BucketLayout, GradientCompression, Wire

__all__ = [
    "NoCompression", "BF16Compression", "FP16Compression", "PowerSGD", "resolve_compression",
    "COMPRESSIONS",
]

FP16_HEADROOM = 2.0 ** 15
"""The bound ``p * amax * scale`` is kept under: half of float16's largest finite value
(65504), so the rounding of a partial sum can never reach ``inf`` either."""

_EXPONENT_LIMIT = 126
"""Scales stay within ``2**-126 .. 2**126``, float32's normal range, so the scale and its
inverse are exact float32 numbers (``2**-126`` still fits float32's largest value times a
thousand ranks under the bound)."""


class NoCompression(GradientCompression):
    """The gradients travel as they are (in their own dtype)."""

    def average(self, key: int, buffer: torch.Tensor, layout: BucketLayout, wire: Wire) -> None:
        """One allreduce-average of the whole buffer."""
        wire.allreduce(buffer, "avg")

    def spec(self) -> str:
        """``"none"``."""
        return "none"


class _CastCompression(GradientCompression):
    """Send the bucket in a narrower floating dtype, summed in it, averaged back in the
    gradients' own dtype (subclasses choose the dtype and the scale)."""

    wire_dtype: torch.dtype

    def __init__(self) -> None:
        self._wires: dict[int, torch.Tensor] = {}
        """A reused wire buffer per bucket (written and read only on the communicator's
        thread, one bucket at a time)."""

    def _wire_buffer(self, key: int, like: torch.Tensor) -> torch.Tensor:
        wire = self._wires.get(key)
        if wire is None or wire.numel() != like.numel() or wire.device != like.device:
            wire = torch.empty(like.numel(), dtype=self.wire_dtype, device=like.device)
            self._wires[key] = wire
        return wire

    def scale(self, gradients: torch.Tensor, wire: Wire) -> float:
        """The factor the gradients are multiplied by before the cast (1: none)."""
        return 1.0

    def average(self, key: int, buffer: torch.Tensor, layout: BucketLayout, wire: Wire) -> None:
        """Cast (scaled), sum on the wire, cast back, unscale and divide by the world size."""
        if not buffer.is_floating_point():
            raise TypeError(f"{self.spec()} compression needs floating-point gradients, got a "
                            f"{buffer.dtype} bucket; use compression='none'")
        count = layout.numel
        gradients, tail = buffer[:count], buffer[count:]
        factor = self.scale(gradients, wire)
        sent = self._wire_buffer(key, buffer)
        if factor != 1.0:
            gradients.mul_(factor)  # a power of two: exact, and the buffer is overwritten below
        sent[:count].copy_(gradients)
        sent[count:].copy_(tail)
        wire.allreduce(sent, "sum")
        gradients.copy_(sent[:count])
        if factor != 1.0:
            gradients.mul_(1.0 / factor)  # exact: a power of two in float32's normal range
        gradients.div_(wire.world_size)
        tail.copy_(sent[count:]).div_(wire.world_size)


class BF16Compression(_CastCompression):
    """Gradients travel as bfloat16 (half the bytes; float32's range)."""

    wire_dtype = torch.bfloat16

    def spec(self) -> str:
        """``"bf16"``."""
        return "bf16"


class FP16Compression(_CastCompression):
    """Gradients travel as float16, scaled by a power of two agreed over the ranks so that no
    sum overflows (see the module's docstring)."""

    wire_dtype = torch.float16

    def scale(self, gradients: torch.Tensor, wire: Wire) -> float:
        """The power of two ``s`` with ``p * amax * s <= 2**15``, ``amax`` the largest
        absolute gradient of any rank (one one-element allreduce); 1 if ``amax`` is 0 or not
        finite."""
        local = gradients.abs().max().float() if gradients.numel() else torch.zeros(())
        amax = local.reshape(1).to(torch.float32).clone()
        wire.allreduce(amax, "max")
        return fp16_scale(float(amax.item()), wire.world_size)

    def spec(self) -> str:
        """``"fp16"``."""
        return "fp16"


def fp16_scale(amax: float, world_size: int) -> float:
    """The power-of-two scale float16 compression applies when the largest absolute gradient
    over ``world_size`` ranks is ``amax`` (1 when ``amax`` is 0, ``inf`` or ``nan``)."""
    if amax == 0.0 or not math.isfinite(amax):
        return 1.0
    exponent = math.floor(math.log2(FP16_HEADROOM / (world_size * amax)))
    return math.ldexp(1.0, max(-_EXPONENT_LIMIT, min(_EXPONENT_LIMIT, exponent)))


COMPRESSIONS = ("none", "bf16", "fp16", "powersgd", "powersgd:RANK")
"""The names ``compression=`` accepts (RANK a positive integer)."""


def resolve_compression(value: object) -> GradientCompression:
    """The compression a ``compression=`` value names: a string of :data:`COMPRESSIONS`, or a
    :class:`GradientCompression` instance (returned as it is); ``ValueError`` or
    ``TypeError`` naming the value and the valid ones otherwise."""
    if isinstance(value, GradientCompression):
        return value
    valid = ("'none', 'bf16', 'fp16', 'powersgd' or 'powersgd:RANK' (RANK a positive integer, "
             "e.g. 'powersgd:4'), or a scaledl.sync.GradientCompression instance")
    if not isinstance(value, str):
        raise TypeError(f"compression={value!r} ({type(value).__name__}) is not a compression; "
                        f"use {valid}")
    text = value.strip().lower()
    if text == "none":
        return NoCompression()
    if text == "bf16":
        return BF16Compression()
    if text == "fp16":
        return FP16Compression()
    name, _, rank = text.partition(":")
    if name == "powersgd":
        if not rank:
            return PowerSGD()
        if rank.isdigit() and int(rank) > 0:
            return PowerSGD(rank=int(rank))
    raise ValueError(f"unknown compression {value!r}; use {valid}")
