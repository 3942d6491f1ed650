"""The wire of a gradient compression: what a bucket looks like, and collectives run inside one
job of the group's communicator.

A compression averages one bucket with several dependent collectives and some arithmetic
between them (fp16's scale is agreed with a one-element maximum before the cast; PowerSGD
allreduces ``P``, orthogonalises it, computes ``Q`` from it and allreduces ``Q``).  Each
bucket's whole sequence runs as **one** job of the communicator (:meth:`Wire.submit`), whose
collectives run inline on that job's thread (:meth:`Wire.allreduce`).  The communicator runs
jobs in submission order on every rank, so ranks meet each other's collectives in the same
order however backward interleaves the buckets; chaining separate asynchronous calls instead
would let the next bucket's collective slip between a bucket's ``P`` and ``Q`` on one rank and
not on another.  The collectives are scaledl's own (any algorithm, the shared-memory and
hierarchical stage paths included), exactly as an uncompressed bucket's.
"""

from __future__ import annotations

import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaledl.collectives import CollectiveHandle, ReduceOp, resolve_topology
from scaledl.collectives.call import Call
from scaledl.collectives.communicator import communicator_for
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology

__all__ = ["BucketLayout", "GradientCompression", "Wire"]


@dataclass(frozen=True)
class BucketLayout:
    """Where each gradient lies in a bucket's flat buffer, and what follows them."""

    shapes: tuple[tuple[int, ...], ...]
    """Shape of each gradient, in buffer order."""
    offsets: tuple[int, ...]
    """Element offset of each gradient in the buffer."""
    tail: int = 0
    """Elements after the gradients that must arrive exactly (DataParallel's per-parameter
    'used' flags, 0 or 1 each): they are summed uncompressed and unscaled, then averaged."""

    @property
    def numel(self) -> int:
        """Elements of the gradients (the buffer holds ``numel + tail``)."""
        return max((o + _numel(s) for o, s in zip(self.offsets, self.shapes)), default=0)

    @classmethod
    def packed(cls, shapes: Sequence[Sequence[int]], tail: int = 0) -> BucketLayout:
        """Gradients of ``shapes`` stored one after another from offset 0."""
        offsets, offset = [], 0
        for shape in shapes:
            offsets.append(offset)
            offset += _numel(shape)
        return cls(tuple(tuple(s) for s in shapes), tuple(offsets), tail)


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


class Wire:
    """Scaledl's allreduce on one group with one algorithm and layout, run inline by a job."""

    def __init__(self, algorithm: str = "auto", topology: Topology | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        self.algorithm = algorithm
        self.topology = resolve_topology(algorithm, "allreduce", topology, group)
        self.comm = communicator_for(group)
        self.world_size = self.comm.world_size
        self.sent = 0
        """Bytes this rank has put into the wire's collectives (what compression saves)."""

    def allreduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Reduce ``tensor`` in place over the group, on the calling thread: call it only from
        inside a job given to :meth:`submit` (elsewhere it would race the communicator)."""
        call = Call(self.comm, Collective.ALLREDUCE, self.algorithm, self.topology,
                    ReduceOp.parse(op), 0)
        call.job(tensor)()
        self.sent += tensor.numel() * tensor.element_size()

    def submit(self, job: Callable[[], None]) -> CollectiveHandle:
        """Run ``job`` on the communicator after every job submitted before it."""
        handle = self.comm.submit(job, async_op=True)
        assert handle is not None, "an asynchronous submission returns a handle"
        return handle


Job = Callable[[Wire], "Callable[[], None] | None"]
"""A bucket's communicator job: runs its collectives; returns what is left after them."""


class FinishingHandle(CollectiveHandle):
    """A bucket's communicator job in flight, plus the arithmetic it left: run once, by the
    first :meth:`wait` (on the waiting thread) or before the first done-callback."""

    def __init__(self, job: CollectiveHandle, finish: Callable[[], None],
                 sent: Callable[[], int] = lambda: 0) -> None:
        # not CollectiveHandle.__init__: the job's handle keeps the future and the times
        self._future = job._future
        self._job = job
        self._finish = finish
        self._sent = sent
        self._lock = threading.Lock()
        self._finished = False

    @property
    def started_at(self) -> float | None:
        """When the job started (set by the communicator)."""
        return self._job.started_at

    @started_at.setter
    def started_at(self, value: float | None) -> None:
        self._job.started_at = value

    @property
    def finished_at(self) -> float | None:
        """When the job finished (set by the communicator)."""
        return self._job.finished_at

    @finished_at.setter
    def finished_at(self, value: float | None) -> None:
        self._job.finished_at = value

    @property
    def nbytes(self) -> int:
        """Bytes the job put on the wire (final once it is done)."""
        return self._sent()

    def _run_finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._finish()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the job, then run what it left (once); return True."""
        self._job.wait(timeout)
        self._run_finish()
        return True

    def add_done_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(error_or_None)`` once the job is done and what it left has run
        (on the communicator's thread)."""
        def done(error: BaseException | None) -> None:
            if error is None:
                try:
                    self._run_finish()
                except BaseException as failure:  # handed to the callback, as a job's error
                    error = failure
            callback(error)
        self._job.add_done_callback(done)


class GradientCompression(ABC):
    """How a bucket of gradients is averaged over the ranks with fewer bytes on the wire.

    Averaging one bucket has three parts.  :meth:`prepare` runs on the thread that launches
    the bucket (in DataParallel, backward's, while the communicator still sends earlier
    buckets): whatever needs no other rank (a cast, PowerSGD's ``P = M Q``).  It returns the
    job, which :meth:`start` queues on the communicator: the collectives and the arithmetic
    between them.  The job returns what is left after its last collective (a cast back, a
    division, PowerSGD's ``P Q^T``), or None; that part runs on the thread that first waits
    for the bucket (or on the communicator's, for a done-callback), so the communicator goes
    on with the next bucket meanwhile.  Together they replace the bucket's gradients with the
    (compressed) average and the tail with its exact average.  Every rank prepares the same
    buckets in the same order, with the same ``key`` and ``layout``.  An instance may keep
    state per bucket (PowerSGD's error feedback and warm-started ``Q``), so it serves one
    model: give each wrapper its own (a string such as ``"powersgd:4"`` makes a fresh one).
    """

    @abstractmethod
    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """Do the local part of averaging ``buffer`` (bucket ``key``, laid out as ``layout``)
        now; return the job to run with a :class:`Wire` on the communicator."""

    def prepare_on(self, wire: Wire, key: int, buffer: torch.Tensor,
                   layout: BucketLayout) -> Job:
        """:meth:`prepare` for a bucket that will be averaged on ``wire``: a compression whose
        work depends on the group's layout (PowerSGD splits it by host) overrides this."""
        return self.prepare(key, buffer, layout)

    def average(self, key: int, buffer: torch.Tensor, layout: BucketLayout, wire: Wire) -> None:
        """Average ``buffer`` over the ranks in place, every part on this thread (call it
        only from inside a communicator job)."""
        finish = self.prepare_on(wire, key, buffer, layout)(wire)
        if finish is not None:
            finish()

    @abstractmethod
    def spec(self) -> str:
        """The short name a user writes for this compression (``"bf16"``, ``"powersgd:4"``),
        compared across ranks when a model is wrapped."""

    def claim(self, owner: object) -> None:
        """Tie this instance to the wrapper or hook that uses it: a ``ValueError`` if another
        one still alive uses it (their buckets would share one per-bucket state)."""
        previous = getattr(self, "_owner", None)
        if previous is not None and previous() is not None and previous() is not owner:
            raise ValueError(f"compression={self!r} is already used by another model's "
                             "wrapper or hook; give each its own instance (or pass the name, "
                             "e.g. compression='powersgd:4', which makes a fresh one)")
        self._owner = weakref.ref(owner)

    def start(self, key: int, buffer: torch.Tensor, layout: BucketLayout,
              wire: Wire) -> CollectiveHandle:
        """Prepare one bucket here and queue its job on the communicator; a handle whose
        first wait (or done-callback) also runs what the job left."""
        job = self.prepare_on(wire, key, buffer, layout)
        left: list[Callable[[], None] | None] = []
        sent = [0]

        def run() -> None:
            # jobs run one at a time on the communicator, so the difference is this bucket's
            before = wire.sent
            left.append(job(wire))
            sent[0] = wire.sent - before
        handle = wire.submit(run)
        return FinishingHandle(handle, lambda: left[0]() if left and left[0] else None,
                               lambda: sent[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"
