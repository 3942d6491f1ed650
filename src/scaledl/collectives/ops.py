"""Reduction operators and the dtypes the collectives accept."""

from __future__ import annotations

import contextvars
import enum
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["ReduceOp", "SUPPORTED_DTYPES", "check_dtype", "quiet_floats"]

_SERIAL = 16384
"""Elements per torch call that stay below its parallel grain (32768): one thread."""

SUPPORTED_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
)


def _error_state() -> tuple[contextvars.ContextVar[Any], Any] | None:
    """NumPy's floating-point error state and its value under ``all="ignore"``, where NumPy
    keeps that state in a context variable (NumPy 2) and setting it is seen to take effect;
    None elsewhere (then :class:`quiet_floats` uses ``np.errstate``)."""
    try:
        from numpy._core import _ufunc_config
        state = getattr(_ufunc_config, "_extobj_contextvar")  # noqa: B009 - private to NumPy
    except (ImportError, AttributeError):
        return None
    if not isinstance(state, contextvars.ContextVar):
        return None
    with np.errstate(all="raise"):
        with np.errstate(all="ignore"):
            ignore = state.get()
        token = state.set(ignore)
        try:
            works = set(np.geterr().values()) == {"ignore"}
        finally:
            state.reset(token)
    return (state, ignore) if works else None


_ERROR_STATE = _error_state()


class quiet_floats:  # noqa: N801 - used as ``with quiet_floats():``, like np.errstate
    """``with quiet_floats():`` ignores floating-point errors in NumPy as
    ``with np.errstate(all="ignore"):`` does (an overflow to inf is the caller's, as in torch,
    not a NumPy warning or error whatever the caller's error state), in a third of the time:
    entering ``np.errstate`` costs about 1.2 microseconds on this project's machine, as much as
    the whole sum of a 4 KiB allreduce, and the small messages' path enters it on every call.

    It sets NumPy's error-state context variable to a value made once at import, so inside
    the block the ufunc buffer size and error callback are NumPy's defaults rather than the
    caller's (``np.setbufsize``, ``np.seterrcall``): that changes speed, never a result.  Where
    the error state is not a context variable that takes effect (checked at import) it uses
    ``np.errstate``.  One ``with`` per instance: make a new one for each block."""

    __slots__ = ("_exit",)

    def __enter__(self) -> None:
        if _ERROR_STATE is None:
            manager = np.errstate(all="ignore")
            manager.__enter__()
            self._exit: Any = manager
        else:
            state, ignore = _ERROR_STATE
            self._exit = state.set(ignore)

    def __exit__(self, *exc: object) -> None:
        if _ERROR_STATE is None:
            self._exit.__exit__(*exc)
        else:
            _ERROR_STATE[0].reset(self._exit)


class ReduceOp(str, enum.Enum):
    """How contributions combine: sum, average (sum / world size), minimum, maximum."""

    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"

    @classmethod
    def parse(cls, op: str | ReduceOp | dist.ReduceOp) -> ReduceOp:
        """Accept ``"sum"``, ``ReduceOp.SUM`` or ``torch.distributed.ReduceOp.SUM``."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, (bool, int)):  # an int equals torch's ReduceOp of that number
            raise ValueError(f"unknown reduce op {op!r}; use one of: "
                             f"{', '.join(member.value for member in cls)}")
        if isinstance(op, str):
            try:
                return cls(op.lower())
            except ValueError:
                pass
        else:
            for name in ("SUM", "AVG", "MIN", "MAX"):
                if op == getattr(dist.ReduceOp, name):
                    return cls(name.lower())
        choices = ", ".join(member.value for member in cls)
        raise ValueError(f"unknown reduce op {op!r}; use one of: {choices}")

    def combine(self, into: torch.Tensor, other: torch.Tensor) -> None:
        """Fold ``other`` into ``into`` in place, on the calling thread only for CPU tensors.

        torch would spread a large CPU add over its intra-op threads, which then fight the
        other ranks of the host (and the backend's own threads) for the same cores; a rank's
        reduction runs on one core, as in MPI's and NCCL's, with NumPy (torch in slices below
        its parallel grain for half precision).
        """
        if into.device.type != "cpu":
            self._torch(into, other)
        elif into.dtype in (torch.float16, torch.bfloat16):
            for start in range(0, into.numel(), _SERIAL):
                self._torch(into[start:start + _SERIAL], other[start:start + _SERIAL])
        else:
            a, b = into.numpy(), other.numpy()
            with quiet_floats():
                if self is ReduceOp.MIN:
                    np.minimum(a, b, out=a)
                elif self is ReduceOp.MAX:
                    np.maximum(a, b, out=a)
                else:
                    np.add(a, b, out=a)

    def _torch(self, into: torch.Tensor, other: torch.Tensor) -> None:
        if self is ReduceOp.MIN:
            torch.minimum(into, other, out=into)
        elif self is ReduceOp.MAX:
            torch.maximum(into, other, out=into)
        else:
            into.add_(other)

    def finish(self, tensor: torch.Tensor, world_size: int) -> None:
        """Apply the final step of the op (AVG divides; integers round toward minus infinity)."""
        if self is not ReduceOp.AVG or world_size == 1:
            return
        if tensor.is_floating_point():
            tensor.div_(world_size)
        else:
            tensor.div_(world_size, rounding_mode="floor")

    def to_torch(self) -> dist.ReduceOp:
        """The matching ``torch.distributed.ReduceOp``."""
        return dist.ReduceOp(getattr(dist.ReduceOp, self.name))


def check_dtype(tensor: torch.Tensor) -> None:
    """Raise ``TypeError`` naming the dtype when the collectives do not support it."""
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"dtype {tensor.dtype} is not supported; use one of: {names}")
