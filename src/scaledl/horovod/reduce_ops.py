"""Horovod's reduction operators (``hvd.Average``, ``hvd.Sum``, ...) and how each one runs.

``Average``, ``Sum``, ``Min`` and ``Max`` run as scaledl allreduces (average divides the sum by
the process-set size).  ``Product`` has no scaledl algorithm and runs as torch.distributed's own
allreduce on the group.  ``Adasum`` is not implemented: using it raises
:class:`~scaledl.horovod.errors.UnsupportedError`.
"""

from __future__ import annotations

import enum
import warnings

import torch

from scaledl.horovod.errors import unsupported

__all__ = ["ReduceOperation", "Average", "Sum", "Adasum", "Min", "Max", "Product", "resolve_op",
           "scaledl_op", "identity"]


class ReduceOperation(enum.IntEnum):
    """How contributions of the ranks combine."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5

    @property
    def label(self) -> str:
        """The name a script writes: ``hvd.Average`` etc."""
        return f"hvd.{self.name.capitalize()}"


Average = ReduceOperation.AVERAGE
Sum = ReduceOperation.SUM
Adasum = ReduceOperation.ADASUM
Min = ReduceOperation.MIN
Max = ReduceOperation.MAX
Product = ReduceOperation.PRODUCT


def resolve_op(op: object, average: bool | None = None) -> ReduceOperation:
    """The operator from ``op=`` or the deprecated ``average=`` (``True``: Average, ``False``:
    Sum); neither means Average, Horovod's default."""
    if op is not None and average is not None:
        raise ValueError("give either op= or the deprecated average=, not both; use op=hvd.Sum "
                         "or op=hvd.Average")
    if op is None:
        if average is not None:
            warnings.warn("average= is deprecated in Horovod; use op=hvd.Average or op=hvd.Sum",
                          DeprecationWarning, stacklevel=3)
        return Sum if average is False else Average
    known = ReduceOperation._value2member_map_
    if isinstance(op, bool) or not isinstance(op, int) or op not in known:
        raise ValueError(f"unknown reduce op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max "
                         "or hvd.Product")
    resolved = ReduceOperation(op)
    if resolved is Adasum:
        raise unsupported("the Adasum reduction (op=hvd.Adasum)",
                          "use op=hvd.Average (and scale the learning rate by hvd.size())")
    return resolved


def scaledl_op(op: ReduceOperation, divide_here: bool) -> str | None:
    """The scaledl op name running ``op``; ``None`` for Product (torch.distributed's own).

    With ``divide_here`` an Average runs as a sum and the caller divides (to fold the division
    into a post-scale factor, or to truncate integers the way Horovod does)."""
    if op is Average:
        return "sum" if divide_here else "avg"
    if op is Product:
        return None
    return {Sum: "sum", Min: "min", Max: "max"}[op]


def identity(op: ReduceOperation, dtype: torch.dtype) -> float | int | bool:
    """The value a joined rank contributes: it leaves every other rank's result unchanged."""
    if op is Min or op is Max:
        if dtype == torch.bool:
            return op is Min
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        if dtype.is_floating_point:
            return float("inf") if op is Min else float("-inf")
        return info.max if op is Min else info.min
    return 1 if op is Product else 0
