"""Tensors on their way into and out of a collective: dtypes, working buffers, scaling.

scaledl's collectives reduce float32/64, float16, bfloat16, int32 and int64.  Horovod also moves
uint8, int8, int16 and bool tensors; those travel as int32 (an exact conversion both ways; a sum
that overflows the small type wraps when converted back, as it would in the small type).  Complex
and other dtypes are refused with a ``TypeError``-style problem that every rank reports.

A *working buffer* is flat, contiguous and of the working dtype.  In-place calls on a tensor that
already is one reduce it directly; everything else works on a copy that :meth:`Staged.finish`
copies back (converting the dtype) into the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaledl.collectives.ops import SUPPORTED_DTYPES

__all__ = ["work_dtype", "Staged", "stage", "scale_", "check_tensor"]

_WIDENED = {torch.uint8: torch.int32, torch.int8: torch.int32, torch.int16: torch.int32,
            torch.bool: torch.int32}

def work_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the collective runs in; ``None`` when the dtype cannot be reduced or moved."""
    if dtype in SUPPORTED_DTYPES:
        return dtype
    return _WIDENED.get(dtype)


def check_tensor(value: object, what: str) -> torch.Tensor:
    """``value`` if it is a tensor, else a ``TypeError`` naming ``what``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(value).__name__}")
    return value


def scale_(buffer: torch.Tensor, factor: float) -> None:
    """Multiply in place; integer tensors truncate toward zero."""
    if factor == 1.0:
        return
    if buffer.is_floating_point():
        buffer.mul_(factor)
    else:
        buffer.copy_(torch.mul(buffer, factor).to(buffer.dtype))


@dataclass
class Staged:
    """A working buffer and the tensor its result belongs in."""

    output: torch.Tensor
    """Where the result goes: the caller's tensor (in place) or a new one."""
    buffer: torch.Tensor
    """Flat, contiguous, working dtype; the collective runs on it."""

    @property
    def direct(self) -> bool:
        """True when ``buffer`` is ``output``'s own memory (nothing to copy back)."""
        return self.buffer.dtype == self.output.dtype and (
            self.buffer.data_ptr() == self.output.data_ptr() or self.buffer.numel() == 0)

    def finish(self, factor: float = 1.0) -> torch.Tensor:
        """Scale the buffer, copy it into the output if needed, return the output."""
        scale_(self.buffer, factor)
        if not self.direct:
            with torch.no_grad():
                self.output.copy_(self.buffer.view(self.output.shape))
        return self.output


def stage(tensor: torch.Tensor, in_place: bool, prescale: float = 1.0) -> Staged:
    """The working buffer for ``tensor``: itself when in place and already flat-able, else a copy
    (``tensor`` is never modified unless ``in_place``)."""
    work = work_dtype(tensor.dtype)
    assert work is not None, "callers reject unsupported dtypes first"
    source = tensor.detach()
    output = source if in_place else torch.empty_like(source, memory_format=torch.contiguous_format)
    if output.is_contiguous() and work == tensor.dtype:
        if not in_place:
            output.copy_(source)
        buffer = output.view(-1)
    else:
        buffer = torch.empty(tensor.numel(), dtype=work, device=tensor.device)
        buffer.view(tensor.shape).copy_(source)
    scale_(buffer, prescale)
    return Staged(tensor if in_place else output, buffer)
