"""Negotiation: before a collective, every member shows what it is about to call.

Horovod's coordinator collects each rank's request and refuses mismatched ones by name.  Here each
call first exchanges its :class:`~scaledl.signature.Signature` (one row of integers, allgathered
on the set's Gloo control group: one small round trip, measured in docs/horovod.md): the
collective, its name, dtype, shape, reduction op, root, what else must match (the tensors of a
grouped call, an optimizer's buckets) and a *problem* for arguments this rank found invalid.
Every member decodes the same rows and reaches the same verdict, so a mismatch raises the same
:class:`~scaledl.horovod.errors.MismatchError` on every rank before any data moves, instead of a
hang or a silently wrong result, and the set stays usable.  The rows also carry what the call
needs from the others: the first dimensions of an allgather.

A rank inside ``hvd.join()`` sends ``JOIN`` rows; the others' rows tell it which collective to
take part in (see :mod:`scaledl.horovod.join`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from scaledl.backend_errors import attempt, raise_in_words
from scaledl.horovod.errors import HorovodInternalError, MismatchError
from scaledl.horovod.process_sets import SetContext
from scaledl.horovod.reduce_ops import ReduceOperation
from scaledl.signature import (
    ALLGATHER, ROW_LENGTH, Exchange, Kind, Row, Signature, digest, dtype_text, over_group, settle,
)

__all__ = ["Kind", "Problem", "Request", "Agreement", "Pending", "negotiate", "op_of",
           "OP_NAMES", "plan_key", "judge"]


_ALLGATHER = ALLGATHER
"""The rows' allgather (a module attribute, so tests can delay it)."""

OP_NAMES = {ReduceOperation.AVERAGE: "avg", ReduceOperation.SUM: "sum",
            ReduceOperation.ADASUM: "adasum", ReduceOperation.MIN: "min",
            ReduceOperation.MAX: "max", ReduceOperation.PRODUCT: "product"}
"""Horovod's reduction ops by their names in a :class:`~scaledl.signature.Signature`."""


def op_of(row: Row) -> ReduceOperation:
    """The Horovod reduction op a row announces."""
    name = Signature.from_word(row.word).op
    return next(op for op, text in OP_NAMES.items() if text == name)


class Problem(str, enum.Enum):
    """Why a rank's own arguments are invalid: a phrase that follows "rank N" in the error
    every rank raises."""

    NONE = ""
    DTYPE = ("passed a tensor of {dtype}; use float16/32/64, bfloat16, int8/16/32/64, uint8 or "
             "bool")
    SCALAR = "passed a 0-d tensor; give it a first dimension (tensor.reshape(1))"
    SPLITS_LENGTH = "passed splits whose length is not the process set's size"
    SPLITS_SUM = "passed splits that are negative or do not add up to the tensor's first dimension"
    NOT_DIVISIBLE = ("passed no splits and a first dimension that the process set's size does "
                     "not divide; pass splits=")
    ROOT = ("passed root_rank={root}, which is not a rank of the process set; pass the global "
            "rank of one of its members")
    SPARSE = "passed a sparse tensor; pass tensor.to_dense()"
    ROOT_TYPE = "passed a root_rank that is not an int; pass a global rank such as 0"


_SHAPED = (Kind.ALLGATHER, Kind.ALLTOALL)
_ORDER = ("collectives are matched by call order, so every rank must issue them in the same "
          "order with the same arguments")


@dataclass(frozen=True)
class Request:
    """What this rank is about to call."""

    kind: Kind
    name: str | None = None
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] = ()
    op: int = -1
    """A :class:`ReduceOperation`, or -1."""
    root: int = -1
    detail: str | None = None
    """What else must match, one fact per line (the tensors of a grouped call, a plan)."""
    rounds: int = 0
    """Rounds a rank inside ``hvd.join()`` has served (shared, not compared)."""
    problem: Problem = Problem.NONE

    def signature(self) -> Signature:
        """The call's signature (the problem's text formatted with this rank's dtype)."""
        problem = (self.problem.value.format(dtype=dtype_text(self.dtype), root=self.root)
                   if self.problem is not Problem.NONE else None)
        op = OP_NAMES[ReduceOperation(self.op)] if self.op >= 0 else None
        # a call of several tensors (its detail lists them) shows their total elements
        # (and a call without a tensor, none)
        tensorless = not self.shape and self.dtype is None
        shape = None if self.detail is not None or tensorless else tuple(self.shape)
        return Signature(self.kind, 0 if tensorless else math.prod(self.shape), self.dtype,
                         op, self.root,
                         name=self.name, shape=shape, detail=self.detail, problem=problem,
                         data=(self.rounds,))


_SERVABLE = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE, Kind.BARRIER, Kind.OPTIMIZER_STEP)


@dataclass(frozen=True)
class Agreement:
    """Every member's row, by position in the process set, and the verdict on them."""

    rows: tuple[Row, ...]
    ranks: tuple[int, ...]
    problem: str | None = None
    """Why the active members' calls cannot run (the same on every rank), or ``None``."""

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
        if self.problem is not None or not self.active:
            return self.problem
        ref = self.rows[self.active[0]]
        mixed = ref.kind is Kind.GROUPED_ALLREDUCE and Signature.from_word(ref.word).dtype is None
        if self.joined and (ref.kind not in _SERVABLE or mixed):
            joined = [self.ranks[i] for i in self.joined]
            return (f"{ref.kind.value} cannot run while ranks {joined} are in hvd.join(); only "
                    "allreduce, grouped_allreduce of one dtype, barrier and DistributedOptimizer "
                    "steps can")
        return None


class Pending:
    """A negotiation round in flight (the DistributedOptimizer overlaps it with backward)."""

    def __init__(self, context: SetContext, request: Request) -> None:
        self._context = context
        self._request = request
        self._signature = request.signature()
        mine = torch.tensor(self._signature.encode(), dtype=torch.int64)
        self._everyone = torch.empty(context.size * ROW_LENGTH, dtype=torch.int64)
        started = attempt(lambda: _ALLGATHER(self._everyone, mine, group=context.control,
                                             async_op=True))
        if isinstance(started, RuntimeError):
            self._fail(started)
        self._work: dist.Work | None = started

    def _fail(self, error: RuntimeError) -> NoReturn:
        """Raise the backend's ``error`` as a :class:`HorovodInternalError` in words.

        Called outside the ``except`` block that caught ``error`` (:func:`attempt`), so a
        Ctrl-C that reaches this rank while its peer, interrupted first, has already closed the
        connection is a bare ``KeyboardInterrupt``, as in any script, not one printed under
        Gloo's "Connection closed by peer".  A lost or late peer is named as such, without the
        backend's error chained; any other backend error stays chained as the cause."""
        context, kind = self._context, self._request.kind.value
        raise_in_words(error, lambda failure: HorovodInternalError(
            f"{kind} on rank {context.ranks[context.rank]}: the ranks of process set "
            f"{list(context.ranks)} did not all reach it ("
            f"{failure.reason or 'a rank died, timed out or issued fewer collectives'}): "
            f"{failure.line}"))

    def _gather(self) -> Agreement:
        """Every member's row (the backend's error when a member is missing)."""
        context = self._context
        if self._work is not None:
            self._work.wait()
        values = self._everyone.view(context.size, ROW_LENGTH).tolist()
        return judge(self._signature, values, over_group(context.control), context.ranks)

    def result(self) -> Agreement:
        """Wait for every member's row; raise ``MismatchError`` unless all calls match."""
        agreement = attempt(self._gather)
        if isinstance(agreement, RuntimeError):
            self._fail(agreement)
        if self._request.kind is not Kind.JOIN:
            verdict = agreement.verdict()
            if verdict is not None:
                raise MismatchError(verdict)
        return agreement


def judge(mine: Signature, values: list[list[int]], exchange: Exchange,
          ranks: tuple[int, ...]) -> Agreement:
    """Every member's rows and the verdict on them, the same on every member (which all run
    the text round of a failed comparison, joined ones included)."""
    active = [i for i, row in enumerate(values) if Row(tuple(row)).kind is not Kind.JOIN]
    shaped = bool(active) and Row(tuple(values[active[0]])).kind in _SHAPED
    try:
        rows = settle(mine, values, exchange, ranks=ranks, compare=active, error=MismatchError,
                      fix="only the first dimension may differ" if shaped else _ORDER)
    except MismatchError as error:
        return Agreement(tuple(Row(tuple(row)) for row in values), ranks, str(error))
    return Agreement(tuple(rows), ranks)


def negotiate(context: SetContext, request: Request) -> Agreement:
    """Exchange ``request`` with every member; raise ``MismatchError`` unless all calls match."""
    return Pending(context, request).result()


def plan_key(detail: str) -> int:
    """The key under which a joined rank finds the optimizer whose plan a row announces."""
    return digest(detail)
