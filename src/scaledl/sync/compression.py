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
from collections.abc import Callable

import torch

from scaledl.sync.powersgd import PowerSGD
from scaledl.sync.wire import BucketLayout, GradientCompression, Job, Wire

__all__ = [
    "NoCompression", "CastCompression", "BF16Compression", "FP16Compression", "PowerSGD",
    "resolve_compression", "COMPRESSIONS",
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

    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """Nothing local: one allreduce-average of the whole buffer."""
        def job(wire: Wire) -> None:
            wire.allreduce(buffer, "avg")
        return job

    def spec(self) -> str:
        """``"none"``."""
        return "none"


class CastCompression(GradientCompression):
    """Send the bucket in a narrower floating dtype, summed in it, averaged back in the
    gradients' own dtype."""

    wire_dtype: torch.dtype

    def __init__(self) -> None:
        self._wires: dict[int, torch.Tensor] = {}
        """A reused wire buffer per bucket (each step waits for all its buckets, so a bucket's
        buffer is free again when that bucket is prepared next)."""

    def place_wire_buffers(self, buffers: dict[int, torch.Tensor]) -> None:
        """Use ``buffers[key]`` (1-D, of the wire dtype, as long as bucket ``key``'s buffer)
        as bucket ``key``'s wire buffer: DataParallel hands over buffers in shared memory, which
        the shared-memory path reduces in place (no copy in)."""
        for key, buffer in buffers.items():
            if buffer.dtype != self.wire_dtype or buffer.dim() != 1:
                raise ValueError(f"a wire buffer for {self.spec()} must be 1-D {self.wire_dtype}, "
                                 f"got {buffer.dtype} of shape {tuple(buffer.shape)}")
            self._wires[key] = buffer

    def _split(self, key: int, buffer: torch.Tensor, layout: BucketLayout
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gradients, the tail, and the bucket's wire buffer (its tail filled in)."""
        if not buffer.is_floating_point():
            raise TypeError(f"{self.spec()} compression needs floating-point gradients, got a "
                            f"{buffer.dtype} bucket; use compression='none'")
        sent = self._wires.get(key)
        if sent is None or sent.numel() != buffer.numel() or sent.device != buffer.device:
            sent = torch.empty(buffer.numel(), dtype=self.wire_dtype, device=buffer.device)
            self._wires[key] = sent
        count = layout.numel
        sent[count:].copy_(buffer[count:])
        return buffer[:count], buffer[count:], sent

    @staticmethod
    def _sum(wire: Wire, sent: torch.Tensor, gradients: torch.Tensor, tail: torch.Tensor,
             factor: float) -> Callable[[], None]:
        """Sum the wire buffer over the ranks; return the rest: cast back, undo ``factor``,
        divide by ``p``."""
        wire.allreduce(sent, "sum")
        world_size = wire.world_size

        def restore() -> None:
            count = gradients.numel()
            gradients.copy_(sent[:count])
            if factor != 1.0:
                gradients.mul_(1.0 / factor)  # exact: a power of two in float32's normal range
            gradients.div_(world_size)
            tail.copy_(sent[count:]).div_(world_size)
        return restore


class BF16Compression(CastCompression):
    """Gradients travel as bfloat16 (half the bytes; float32's range)."""

    wire_dtype = torch.bfloat16

    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """Cast now (overlapping the communication of earlier buckets); sum in the job; cast
        back and divide after it."""
        gradients, tail, sent = self._split(key, buffer, layout)
        sent[:gradients.numel()].copy_(gradients)
        return lambda wire: self._sum(wire, sent, gradients, tail, 1.0)

    def spec(self) -> str:
        """``"bf16"``."""
        return "bf16"


class FP16Compression(CastCompression):
    """Gradients travel as float16, scaled by a power of two agreed over the ranks so that no
    sum overflows (see the module's docstring)."""

    wire_dtype = torch.float16

    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """This rank's largest absolute gradient now; in the job, agree on the maximum, scale
        and cast, sum; cast back, unscale and divide after it."""
        gradients, tail, sent = self._split(key, buffer, layout)
        amax = torch.zeros(1, dtype=torch.float32, device=buffer.device)
        if gradients.numel():
            low, high = torch.aminmax(gradients)
            amax[0] = torch.maximum(-low, high)  # NaN stays NaN

        def job(wire: Wire) -> Callable[[], None]:
            wire.allreduce(amax, "max")
            factor = fp16_scale(float(amax.item()), wire.world_size)
            if factor != 1.0:
                gradients.mul_(factor)  # a power of two: exact; overwritten by the average
            sent[:gradients.numel()].copy_(gradients)
            return self._sum(wire, sent, gradients, tail, factor)
        return job

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
    name, colon, rank = text.partition(":")
    if name == "powersgd":
        if not colon:
            return PowerSGD()
        if rank.isdigit() and int(rank) > 0:
            return PowerSGD(rank=int(rank))
    raise ValueError(f"unknown compression {value!r}; use {valid}")
