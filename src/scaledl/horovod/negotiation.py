"""Negotiation: before a collective, every member shows what it is about to call.

Horovod's coordinator collects each rank's request and refuses mismatched ones by name.  Here each
call first allgathers a fixed-size row of 16 integers on the set's Gloo control group (one small
round trip; measured in docs/horovod.md): the collective, its name (CRC-32), dtype, shape (up to
six dimensions; beyond five, the sixth carries a CRC-32 of the rest), reduction op, root, a count
and a signature (grouped calls, optimizers) and a *problem* code for arguments this rank found
invalid.  Every member decodes the same rows and reaches the same verdict, so a mismatch raises
the same :class:`~scaledl.horovod.errors.MismatchError` on every rank before any data moves,
instead of a hang or a silently wrong result.  The rows also carry what the call needs from
the others: the first dimensions of an allgather.

A rank inside ``hvd.join()`` sends ``JOIN`` rows; the others' rows tell it which collective to
take part in (see :mod:`scaledl.horovod.join`).
"""

from __future__ import annotations

import enum
import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaledl.horovod.errors import HorovodInternalError, MismatchError
from scaledl.horovod.process_sets import SetContext
from scaledl.horovod.reduce_ops import ReduceOperation
from scaledl.horovod.tensors import MIXED, dtype_code, dtype_name

__all__ = ["Kind", "Problem", "Request", "Row", "Agreement", "Pending", "negotiate",
           "signature_of", "MAX_DIMS"]

MAX_DIMS = 6
_ALLGATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_FIELDS = 10 + MAX_DIMS


class Kind(enum.IntEnum):
    """Which collective a row announces."""

    ALLREDUCE = 1
    GROUPED_ALLREDUCE = 2
    BROADCAST = 3
    ALLGATHER = 4
    ALLTOALL = 5
    REDUCESCATTER = 6
    BARRIER = 7
    JOIN = 8
    OPTIMIZER = 9
    SETUP = 10

    @property
    def label(self) -> str:
        """The Horovod name of the call."""
        if self is Kind.OPTIMIZER:
            return "DistributedOptimizer gradient reduction"
        return "DistributedOptimizer construction" if self is Kind.SETUP else self.name.lower()


class Problem(enum.IntEnum):
    """Why a rank's own arguments are invalid (reported by every rank)."""

    NONE = 0
    DTYPE = 1
    SCALAR = 2
    SPLITS_LENGTH = 3
    SPLITS_SUM = 4
    NOT_DIVISIBLE = 5
    ROOT = 6
    SPARSE = 7
    ROOT_TYPE = 8


_PROBLEMS = {
    Problem.DTYPE: "passed a tensor of {dtype}; use float16/32/64, bfloat16, int8/16/32/64, "
                   "uint8 or bool",
    Problem.SCALAR: "passed a 0-d tensor; give it a first dimension (tensor.reshape(1))",
    Problem.SPLITS_LENGTH: "passed splits whose length is not the process set's size",
    Problem.SPLITS_SUM: "passed splits that are negative or do not add up to the tensor's first "
                        "dimension",
    Problem.NOT_DIVISIBLE: "passed no splits and a first dimension that the process set's size "
                           "does not divide; pass splits=",
    Problem.ROOT: "passed a root rank that is not in the process set",
    Problem.SPARSE: "passed a sparse tensor; pass tensor.to_dense()",
    Problem.ROOT_TYPE: "passed a root_rank that is not an int; pass a global rank such as 0",
}
_WHOLE_SHAPE = (Kind.ALLREDUCE, Kind.BROADCAST, Kind.REDUCESCATTER)
_ROW_SHAPE = (Kind.ALLGATHER, Kind.ALLTOALL)
_WITH_OP = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE, Kind.REDUCESCATTER, Kind.OPTIMIZER)


def signature_of(text: str | None) -> int:
    """A stable 31-bit fingerprint of ``text`` (0 for ``None``); Python's ``hash`` is salted."""
    return 0 if text is None else zlib.crc32(text.encode()) & 0x7FFFFFFF


def _folded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Six integers: the dimensions, padded; beyond six, the sixth is a CRC-32 of the rest.

    The fingerprint, not the product, so shapes that differ only there still differ.
    """
    if len(shape) <= MAX_DIMS:
        return shape + (0,) * (MAX_DIMS - len(shape))
    return shape[:MAX_DIMS - 1] + (signature_of(repr(shape[MAX_DIMS - 1:])),)


@dataclass(frozen=True)
class Request:
    """What this rank is about to call."""

    kind: Kind
    name: str | None = None
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] = ()
    op: int = -1
    root: int = -1
    count: int = 0
    signature: int = 0
    problem: Problem = Problem.NONE

    def encode(self) -> list[int]:
        """The 16 integers every member receives."""
        numel = math.prod(self.shape)
        head = [int(self.kind), int(self.problem), dtype_code(self.dtype), self.op, self.root,
                self.count, self.signature, signature_of(self.name), len(self.shape), numel]
        return head + list(_folded(tuple(self.shape)))


@dataclass(frozen=True)
class Row:
    """One member's decoded request."""

    kind: Kind
    problem: Problem
    dtype: int
    op: int
    root: int
    count: int
    signature: int
    name: int
    ndim: int
    numel: int
    dims: tuple[int, ...]

    @classmethod
    def decode(cls, values: list[int]) -> Row:
        """The row from its 16 integers."""
        dtype, op, root, count, signature, name, ndim, numel = values[2:10]
        return cls(Kind(values[0]), Problem(values[1]), dtype, op, root, count, signature, name,
                   ndim, numel, tuple(values[10:]))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape as sent (its sixth entry a fingerprint beyond six dimensions)."""
        return self.dims[:min(self.ndim, MAX_DIMS)]

    @property
    def shape_text(self) -> str:
        """The shape for a message (dimensions beyond the fifth unknown to the others)."""
        if self.ndim <= MAX_DIMS:
            return str(list(self.shape))
        known = ", ".join(str(d) for d in self.dims[:MAX_DIMS - 1])
        return f"[{known}, and {self.ndim - MAX_DIMS + 1} more dimensions]"


def _op_label(op: int) -> str:
    return ReduceOperation(op).label if op in ReduceOperation._value2member_map_ else f"op {op}"


def _difference(kind: Kind, ref: Row, other: Row) -> str | None:
    """How ``other`` fails to match ``ref`` (``None`` when they match)."""
    if other.kind != ref.kind:
        return f"called {ref.kind.label} but rank {{b}} called {other.kind.label}"
    if other.name != ref.name:
        return (f"named its {kind.label} differently from rank {{b}}; collectives are matched by "
                "call order, so every rank must issue them in the same order")
    if other.dtype != ref.dtype:
        return (f"passed {dtype_name(ref.dtype)} to {kind.label} but rank {{b}} passed "
                f"{dtype_name(other.dtype)}")
    if kind in _WHOLE_SHAPE and (other.ndim, other.shape) != (ref.ndim, ref.shape):
        return (f"passed shape {ref.shape_text} to {kind.label} but rank {{b}} passed "
                f"{other.shape_text}; the shapes must be equal on every rank")
    if kind in _ROW_SHAPE and (other.ndim != ref.ndim or other.shape[1:] != ref.shape[1:]):
        return (f"passed shape {ref.shape_text} to {kind.label} but rank {{b}} passed "
                f"{other.shape_text}; only the first dimension may differ")
    if kind in _WITH_OP and other.op != ref.op:
        return (f"reduces with {_op_label(ref.op)} but rank {{b}} with {_op_label(other.op)} in "
                f"{kind.label}")
    if kind is Kind.BROADCAST and other.root != ref.root:
        return f"broadcasts from root {ref.root} but rank {{b}} from root {other.root}"
    numel_differs = kind not in _ROW_SHAPE and other.numel != ref.numel
    if (other.count, other.signature) != (ref.count, ref.signature) or numel_differs:
        return (f"passed {kind.label} other tensors (count, shapes or parameters) than rank "
                "{b}")
    return None


_SERVABLE = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE, Kind.BARRIER, Kind.OPTIMIZER)


@dataclass(frozen=True)
class Agreement:
    """Every member's row, by position in the process set."""

    rows: tuple[Row, ...]
    ranks: tuple[int, ...]

    @property
    def joined(self) -> list[int]:
        """Positions of the members inside ``hvd.join()``."""
        return [i for i, row in enumerate(self.rows) if row.kind is Kind.JOIN]

    @property
    def active(self) -> list[int]:
        """Positions of the members calling a collective."""
        return [i for i, row in enumerate(self.rows) if row.kind is not Kind.JOIN]

    def verdict(self) -> str | None:
        """Why the active members' calls cannot run (identical on every rank), or ``None``."""
        active = self.active
        if not active:
            return None
        for i in active:
            row = self.rows[i]
            if row.problem is not Problem.NONE:
                text = _PROBLEMS[row.problem].format(dtype=dtype_name(row.dtype))
                return f"{row.kind.label}: rank {self.ranks[i]} {text}"
        ref = self.rows[active[0]]
        for i in active[1:]:
            difference = _difference(ref.kind, ref, self.rows[i])
            if difference is not None:
                return f"rank {self.ranks[active[0]]} " + difference.format(b=self.ranks[i])
        mixed = ref.kind is Kind.GROUPED_ALLREDUCE and ref.dtype == MIXED
        if self.joined and (ref.kind not in _SERVABLE or mixed):
            joined = [self.ranks[i] for i in self.joined]
            return (f"{ref.kind.label} cannot run while ranks {joined} are in hvd.join(); only "
                    "allreduce, grouped_allreduce of one dtype, barrier and DistributedOptimizer "
                    "steps can")
        return None


class Pending:
    """A negotiation round in flight (the DistributedOptimizer overlaps it with backward)."""

    def __init__(self, context: SetContext, request: Request) -> None:
        self._context = context
        self._request = request
        mine = torch.tensor(request.encode(), dtype=torch.int64)
        self._everyone = torch.empty(context.size * _FIELDS, dtype=torch.int64)
        self._work: dist.Work | None = None
        try:
            self._work = _ALLGATHER(self._everyone, mine, group=context.control, async_op=True)
        except RuntimeError as error:
            raise self._failure(error) from error

    def _failure(self, error: BaseException) -> HorovodInternalError:
        context, text = self._context, str(error).splitlines()
        return HorovodInternalError(
            f"{self._request.kind.label} on rank {context.ranks[context.rank]}: the ranks of "
            f"process set {list(context.ranks)} did not all reach it (a rank died, timed out or "
            f"issued fewer collectives): {text[0] if text else repr(error)}")

    def result(self) -> Agreement:
        """Wait for every member's row; raise ``MismatchError`` unless all calls match."""
        try:
            if self._work is not None:
                self._work.wait()
        except RuntimeError as error:
            raise self._failure(error) from error
        values = self._everyone.view(self._context.size, _FIELDS).tolist()
        agreement = Agreement(tuple(Row.decode(v) for v in values), self._context.ranks)
        if self._request.kind is not Kind.JOIN:
            problem = agreement.verdict()
            if problem is not None:
                raise MismatchError(problem)
        return agreement


def negotiate(context: SetContext, request: Request) -> Agreement:
    """Exchange ``request`` with every member; raise ``MismatchError`` unless all calls match."""
    return Pending(context, request).result()
