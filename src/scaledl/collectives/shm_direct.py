"""The direct call path of an allreduce on shared memory: the public call straight to the
protocol, with everything that does not change between calls found once.

``scaledl.allreduce(t)`` normally validates its arguments, makes a job of the group's
communicator, flattens the tensor, resolves ``auto``, plans, announces the stage's call word,
looks the tensor up among the shared arenas and only then runs the shared-memory protocol.  For
a 4 KiB tensor that took about 60 of the 65 microseconds of a call on this project's machine
(``benchmarks/peers/small_message.py``), and it is a fixed cost that still weighs at 1 MiB.
None of it changes between two calls with the same arguments, so the first call of a
combination takes the whole path, and if it ran on the shared-memory path a
:class:`DirectAllreduce` remembers what it found: the members and the call word, and for a
tensor of at most :func:`~scaledl.collectives.shm_ops.direct_limit` in a dtype NumPy sums
(float32/64, int32/64) the one-piece exchange prepared (the windows as NumPy arrays, the pair
lines).  Later calls with the same combination (algorithm, op, dtype, element count, group) then
check only what may differ per call (a contiguous CPU tensor that needs no grad and lies in no
shared arena, nothing queued on the communicator) and run on the caller's thread: the fault
hook, the protocol (the one-piece :func:`~scaledl.collectives.shm_ops.fold_piece`, else the
windowed :func:`~scaledl.collectives.shm_ops.allreduce`, announced as the stage runner does),
AVG's division.

A combination takes this path when the call is synchronous and gives the same ``topology``
object as the call that prepared it (or None again: the bench passes one object throughout); the
group has more than one rank, all on this host with its shared memory open; debug mode
(``SCALEDL_DEBUG``, whose every-call agreement check is the point of that mode) is off; and the
algorithm, as asked or as ``auto`` resolves it, is ``shm``.  Every other call takes the whole
path, which stays the reference: the direct path runs the same protocol, word for word
(:meth:`~scaledl.transport.shm.ShmGroup.small_arrive` is the one-piece exchange of both), so
ranks may mix the two.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
import torch

from scaledl.collectives.call import Call
from scaledl.collectives.communicator import Communicator, existing_communicator
from scaledl.collectives.ops import ReduceOp, quiet_floats
from scaledl.collectives.schedule import Collective
from scaledl.collectives.shm_calls import call_word, describe
from scaledl.collectives import shm_ops
from scaledl.collectives.shm_ops import NUMPY_DTYPES, UFUNCS, direct_limit, fold_piece
from scaledl.faults import at_collective
from scaledl.topology import Topology
from scaledl.transport.shm import ShmGroup, SmallPiece

__all__ = ["DirectAllreduce", "allreduce", "learn"]

_LIMIT = 1024
"""Combinations remembered per communicator (sizes that never repeat must not pile up)."""


class DirectAllreduce:
    """A small allreduce of one (algorithm, op, dtype, element count) on one communicator,
    prepared: :meth:`run` is the whole call."""

    def __init__(self, comm: Communicator, group: ShmGroup, op: ReduceOp, dtype: torch.dtype,
                 numel: int, topology: Topology | None) -> None:
        self.comm = comm
        self.topology = topology
        """The ``topology`` argument of the call that prepared it: later calls must pass the
        very same object (or None again) to take this path."""
        self.group = group
        self.op = op
        self.members = [group.local_index(rank) for rank in range(comm.world_size)]
        self.word = call_word(Collective.ALLREDUCE, numel, dtype, op, -1)
        self.describe = lambda other: describe(other, group)
        array_dtype = NUMPY_DTYPES.get(dtype)
        self.nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        self.piece: SmallPiece | None = None
        """The one-piece protocol's prepared exchange, for a tensor NumPy sums and at most
        :func:`~scaledl.collectives.shm_ops.direct_limit`; None: the windowed protocol, piece by
        piece."""
        self.ufunc = UFUNCS[op]
        self.array_dtype = array_dtype or np.dtype(np.uint8)
        if array_dtype is not None and 0 < self.nbytes <= direct_limit(group.window):
            self.piece = group.small_piece(self.members, array_dtype, numel)
        self.finish = _finisher(op, array_dtype, comm.world_size)
        # The caller's last tensor and a NumPy view of its memory that does not keep it alive
        # (``Tensor.numpy()`` costs a microsecond, the size of the whole protocol at 4 KiB).
        self._tensor: weakref.ref[torch.Tensor] | None = None
        self._pointer = 0
        self._array = np.empty(0, self.array_dtype)

    def run(self, tensor: torch.Tensor) -> bool:
        """Allreduce ``tensor`` in place; False (having done nothing) when it must take the
        whole path: not a contiguous CPU tensor, requiring grad, negated lazily, in a shared
        arena, or jobs are queued on the communicator (which run first, in order)."""
        if (not tensor.is_cpu or tensor.requires_grad or not tensor.is_contiguous()
                or tensor.is_neg()):  # a lazy negation: the whole path resolves it first
            return False
        comm = self.comm
        if not comm.idle:
            return False
        piece = self.piece
        if piece is None:
            return self._windowed(tensor)
        with comm.run_lock:  # also guards the cached view against another thread's call
            known = self._tensor  # :meth:`_view`'s first look, inline (the same tensor again)
            if known is not None and known() is tensor and tensor.data_ptr() == self._pointer:
                out = self._array
            else:
                view = self._view(tensor)
                if view is None:
                    return False
                out = view
            at_collective()  # fault-injection hook point (SCALEDL_FAULT, see scaledl.faults)
            try:
                fold_piece(self.group, piece, out, self.ufunc, self.word, self.describe)
            except BaseException as error:  # as Paths does: the peers must stop waiting
                self.group.abort(f"{type(error).__name__}: {error}")
                raise
            if self.finish is not None:
                with quiet_floats():  # an underflow of AVG's division is the caller's too
                    self.finish(out, comm.world_size, out=out)
        return True

    def _windowed(self, tensor: torch.Tensor) -> bool:
        """The windowed protocol (:func:`~scaledl.collectives.shm_ops.allreduce`) on the whole
        tensor, as the stage runner runs it, without the job, plan and stage around it."""
        group = self.group
        if group.arenas and group.locate(tensor) is not None:
            return False  # the in-place path reduces it (the whole path takes it there)
        flat = tensor.view(-1)
        comm = self.comm
        with comm.run_lock:
            at_collective()
            try:
                group.announce(self.members, self.word, self.describe)
                shm_ops.allreduce(group, self.members, flat, 0, flat.numel(), self.op)
            except BaseException as error:
                group.abort(f"{type(error).__name__}: {error}")
                raise
            self.op.finish(flat, comm.world_size)
        return True

    def _view(self, tensor: torch.Tensor) -> np.ndarray | None:
        """A NumPy view of ``tensor``'s memory (None when it lies in a shared arena, which the
        in-place path reduces, or NumPy cannot view it); remembered for the next call."""
        if self.group.arenas and self.group.locate(tensor) is not None:
            return None
        try:
            tensor.numpy()  # refuses what NumPy cannot view as it is (conjugate, negative bits)
        except (RuntimeError, TypeError):
            return None
        pointer = tensor.data_ptr()
        memory = (ctypes.c_char * self.nbytes).from_address(pointer)
        self._array = np.frombuffer(memoryview(memory).cast("B"), self.array_dtype)
        self._tensor, self._pointer = weakref.ref(tensor), pointer
        return self._array


def _finisher(op: ReduceOp, dtype: np.dtype | None, world_size: int) -> np.ufunc | None:
    """AVG's final division on the one-piece protocol's NumPy view, as :meth:`ReduceOp.finish`
    does it (true division for floats, bit for bit the same as torch's; floor division for
    integers), or None."""
    if op is not ReduceOp.AVG or dtype is None:
        return None
    return np.divide if dtype.kind == "f" else np.floor_divide


def allreduce(tensor: torch.Tensor, op: object, algorithm: str, topology: Topology | None,
              group: object) -> bool:
    """Run ``scaledl.allreduce(tensor, op, algorithm, topology, group)`` on the direct path if an
    earlier call prepared this combination; False (having done nothing) otherwise."""
    comm = existing_communicator(group)  # type: ignore[arg-type]
    if comm is None:
        return False
    try:
        direct = comm.direct.get((algorithm, op, tensor.dtype, tensor.numel()))
    except (AttributeError, TypeError):  # not a tensor, or an op that is no dictionary key
        return False
    return (isinstance(direct, DirectAllreduce) and direct.topology is topology
            and direct.run(tensor))


def learn(call: Call, tensor: torch.Tensor, op: object, topology: Topology | None) -> None:
    """After ``call`` ran ``tensor`` on the whole path: remember whether its combination can take
    the direct path next time (and prepare it if so)."""
    comm = call.comm
    key = (call.algorithm, op, tensor.dtype, tensor.numel())
    if key in comm.direct or not isinstance(op, str):
        return
    if len(comm.direct) >= _LIMIT:
        comm.direct.clear()
    comm.direct[key] = _prepare(call, tensor, topology)


def _prepare(call: Call, tensor: torch.Tensor, topology: Topology | None
             ) -> DirectAllreduce | None:
    comm, group = call.comm, call.comm.shm
    if group is None or comm.world_size < 2 or len(group.peers) != comm.world_size \
            or comm.check:
        return None
    if call.resolve(tensor.numel(), tensor.element_size()) != "shm":
        return None
    return DirectAllreduce(comm, group, call.op, tensor.dtype, tensor.numel(), topology)
