"""Communicator: the per-group runtime behind the public collectives.

A communicator owns, for one process group: scaledl's private channel among the group's ranks
(:mod:`scaledl.transport.channel`) and the transport over it, the scratch workspace the executor
reuses, the cost model ``auto`` uses (rank 0's copy, broadcast once so every rank decides alike),
the members' identities and the group's default layout (agreed by every member when the
communicator is created, never read from one rank's environment), and one worker thread that
runs asynchronous collectives in submission order.  Running every job of a group in one order on
every rank is what keeps point-to-point messages matched when several collectives are in flight
(e.g. gradient buckets), just as a CUDA stream orders NCCL kernels; running them on a channel of
their own is what keeps them apart from the user's direct ``torch.distributed`` calls.

A synchronous call runs in the caller's thread when nothing is queued, so small collectives pay
no thread hand-off.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from scaledl.bootstrap import host_name
from scaledl.signature import Kind, Signature, agree
from scaledl.collectives.auto import CostModel, Fabric
from scaledl.collectives.executor import DEFAULT_CHUNK_BYTES, Workspace
from scaledl.collectives.stages import Paths
from scaledl.topology import (
    TOPOLOGY_ENV, Topology, current_job, host_digest, topology_of_hosts,
)
from scaledl.transport.base import Transport
from scaledl.transport.channel import open_channel
from scaledl.transport.shm_open import open_arena, open_shm
from scaledl.transport.torch_p2p import TorchTransport, resolve_group

__all__ = [
    "Communicator", "CollectiveHandle", "Member", "communicator_for", "existing_communicator",
    "forget_communicator", "forget_communicators", "debug_enabled", "DEBUG_ENV",
]

log = logging.getLogger(__name__)

DEBUG_ENV = "SCALEDL_DEBUG"
"""Set to 1 to check before every collective that all ranks agree on its arguments (see
:func:`debug_enabled` for the values that mean off)."""


class CollectiveHandle:
    """An asynchronous collective in flight; ``wait()`` blocks until it is done.

    ``started_at`` and ``finished_at`` (``time.perf_counter()`` values, set by the thread that
    ran the collective) measure how long it ran, which is how training reports communication
    time and the share of it hidden behind computation.
    """

    def __init__(self, future: Future[None]) -> None:
        self._future = future
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def add_done_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(error_or_None)`` once the collective finished (on the worker thread)."""
        self._future.add_done_callback(lambda future: callback(future.exception()))

    @property
    def duration(self) -> float:
        """Seconds the collective ran (0 while it has not finished)."""
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return self.finished_at - self.started_at

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (raising the collective's error, if any); return True."""
        try:
            self._future.result(timeout=timeout)
        except FutureTimeout:
            raise TimeoutError(f"collective did not finish within {timeout} s") from None
        return True

    def is_completed(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._future.done()


def _model_to_tensor(model: CostModel) -> torch.Tensor:
    values = model.to_vector()
    if len(values) > 64:
        spare = (64 - len(values)) // 2 + len(model.links)
        raise ValueError(f"a cost model of {len(model.links)} link classes is too large to share; "
                         f"keep at most {spare} topology axes")
    return torch.tensor(values + [0.0] * (64 - len(values)), dtype=torch.float64)


def _model_from_tensor(tensor: torch.Tensor) -> CostModel:
    return CostModel.from_vector(tensor.tolist())


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``SCALEDL_DEBUG`` asks for argument checks (any value but empty, 0, false, no,
    off)."""
    env = os.environ if environ is None else environ
    return env.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Member:
    """One rank of a communicator's group, as it described itself when the group was opened."""

    rank: int
    """Rank in the group."""
    global_rank: int
    """Rank in the job."""
    pid: int
    """Process id (meaningful to members on the same host)."""
    host: int
    """Digest of the member's host name (:func:`scaledl.topology.host_digest`)."""


def _layout_request(group: dist.ProcessGroup, global_ranks: tuple[int, ...], rank: int,
                    ) -> Topology | None:
    """The default layout this rank would take without asking the others (None: take it
    from the members' hosts)."""
    job = current_job()
    if job is not None:
        return job.topology_for(global_ranks, rank)
    spec = os.environ.get(TOPOLOGY_ENV, "").strip()
    if spec and group is dist.group.WORLD:
        return Topology.parse(spec, len(global_ranks), rank)
    return None


class Communicator:
    """Channel, transport, workspace, cost model and ordered async worker of one group."""

    def __init__(
        self, group: dist.ProcessGroup | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        self.group = resolve_group(group)
        self.channel = open_channel(self.group)
        self.transport = TorchTransport(self.channel)
        self.rank = self.channel.rank
        self.world_size = self.channel.world_size
        self.backend = self.channel.backend
        self.chunk_bytes = chunk_bytes
        self.workspace = Workspace()
        self.check = debug_enabled()
        """Compare every call's arguments across ranks first (``SCALEDL_DEBUG=1``)."""
        self.choices: dict[tuple[object, ...], str] = {}
        """``auto``'s decisions, by (collective, numel, itemsize, root, topology)."""
        self.checked: dict[tuple[object, ...], Topology] = {}
        """Layouts of (algorithm, collective, topology) combinations already validated."""
        self.direct: dict[tuple[object, ...], object] = {}
        """Small allreduces' prepared direct calls (:mod:`scaledl.collectives.shm_direct`),
        or None where a combination cannot take that path."""
        self.device = self.channel.device
        """Where small control tensors live: NCCL groups have no CPU backend."""
        self.members, self.default_topology = self._introduce()
        """Every member's identity, and the layout used when a call gives none."""
        self.cost_model = self._agree_on_model(CostModel.load()).for_backend(self.backend)
        """Agreed by every member; the backend's own reduce_scatter priced as it runs."""
        hosts = [member.host for member in self.members]
        self.shm = open_shm(self.channel, hosts, [m.pid for m in self.members]) \
            if self.world_size > 1 else None
        """Shared memory with the group's other ranks on this host (None: no such path)."""
        shared = self.shm is not None or self.world_size == 1
        self.fabric = Fabric(tuple(hosts) if shared else None,
                             native_stages=self.backend in ("gloo", "nccl"))
        """The paths ``auto`` may choose per level."""
        if self.shm is not None:
            self.cost_model = replace(self.cost_model, shm_window=self.shm.window)
        self.stages = Paths(self.channel, self.shm)
        """Runs the stage steps of this group's schedules."""
        self._jobs: queue.Queue[tuple[Callable[[], None], CollectiveHandle] | None] = (
            queue.Queue()
        )
        self._pending = 0
        self._lock = threading.Lock()
        self.run_lock = threading.Lock()
        """Held while a job runs: jobs of one group never overlap, inline or queued."""
        self._worker: threading.Thread | None = None

    def _introduce(self) -> tuple[tuple[Member, ...], Topology]:
        """One exchange: who every member is, and that all agree on the default layout."""
        requested = _layout_request(self.group, self.channel.global_ranks, self.rank)
        mine = Signature(Kind.OPEN_GROUP, layout=requested.layout if requested else None,
                         data=(os.getpid(), host_digest(host_name())))
        if self.world_size > 1:
            rows = [row.data for row in agree(
                mine, self.channel.exchange, ranks=self.channel.global_ranks,
                fix=f"give every rank the same {TOPOLOGY_ENV} (or the same topology= to "
                    "scaledl.init()), or pass topology= to each call")]
        else:
            rows = [mine.data]
        members = tuple(
            Member(rank, self.channel.global_ranks[rank], row[0], row[1])
            for rank, row in enumerate(rows)
        )
        if requested is None:
            requested = topology_of_hosts([m.host for m in members], self.rank)
        return members, requested

    def shared_buffers(
        self, numels: Sequence[int], dtype: torch.dtype, owner: object | None = None,
    ) -> list[torch.Tensor] | None:
        """Zeroed 1-D tensors of ``numels`` elements carved from one shared-memory arena, which
        the shared-memory path reduces in place (no copy in); None when the group has no such
        path or the arena did not fit (then on every rank).  A collective: every rank of the
        group calls it with the same sizes.

        The arena is released when ``owner`` (e.g. the wrapper that reduces the tensors) is
        garbage-collected, and its memory unmapped once the tensors are gone too; without an
        owner it lasts as long as the group."""
        if self.fabric.hosts is None or self.world_size == 1:
            return None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        offsets, total = [], 0
        for numel in numels:
            offsets.append(total)
            total += -(-numel * itemsize // 64) * 64  # each on its own cache lines
        opened = open_arena(self.channel, self.shm, self.fabric.hosts,
                            [m.pid for m in self.members], max(total, 1))
        if opened is None:
            return None
        arena, memory = opened
        if owner is not None and self.shm is not None:
            weakref.finalize(owner, self.shm.release_arena, arena)
        return [memory[start:start + numel * itemsize].view(dtype)
                for start, numel in zip(offsets, numels)]

    def _agree_on_model(self, local: CostModel) -> CostModel:
        if self.world_size == 1:
            return local
        tensor = _model_to_tensor(local).to(self.device)
        self.channel.broadcast(tensor, 0)
        return _model_from_tensor(tensor.cpu())

    def submit(self, job: Callable[[], None], async_op: bool) -> CollectiveHandle | None:
        """Run ``job`` after every job submitted before it; return a handle if ``async_op``."""
        with self._lock:
            idle = self._pending == 0
            if async_op or not idle:
                self._pending += 1
                handle = CollectiveHandle(Future())
                self._ensure_worker()
                self._jobs.put((job, handle))
        if not async_op and idle:
            with self.run_lock:
                job()
            return None
        if not async_op:
            handle.wait()
            return None
        return handle

    @property
    def idle(self) -> bool:
        """True when no job is queued or running on the worker thread: a synchronous call may
        run now, in the caller's thread (holding :attr:`run_lock`)."""
        return self._pending == 0

    def point_to_point(self, part: Callable[[Transport], None],
                       async_op: bool) -> CollectiveHandle | None:
        """Run ``part(transport)``, a point-to-point exchange among this group's ranks (peers
        are group ranks), in call order with the group's collectives, so its messages never
        interleave with theirs; a handle if ``async_op``."""
        transport = self.transport
        return self.submit(lambda: part(transport), async_op)

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._serve, name=f"scaledl-comm-{self.rank}", daemon=True
            )
            self._worker.start()

    def _serve(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, handle = item
            future = handle._future
            # The job counts as done before its future resolves, so a waiter that submits
            # the next job right away may run it inline.
            try:
                with self.run_lock:
                    handle.started_at = time.perf_counter()
                    job()
                    handle.finished_at = time.perf_counter()
            except BaseException as error:  # handed to the waiter
                with self._lock:
                    self._pending -= 1
                future.set_exception(error)
            else:
                with self._lock:
                    self._pending -= 1
                future.set_result(None)

    def close(self) -> None:
        """Stop the worker thread after the queued jobs (give up waiting after 5 s), then
        release the channel."""
        with self._lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._jobs.put(None)
        if worker is not None:
            worker.join(timeout=5.0)
        if self.shm is not None:
            self.shm.close()
        self.channel.close()


_COMMUNICATORS: dict[int, tuple[dist.ProcessGroup, Communicator]] = {}
_CREATING = threading.Lock()
"""Held while a communicator is created: one creation at a time in a process."""


def communicator_for(group: dist.ProcessGroup | None) -> Communicator:
    """The communicator of ``group`` (the default group if None), created on first use.

    Creating one is a collective of the group's members (it opens scaledl's channel and
    exchanges who everyone is), so every member must reach its first scaledl call on the group.
    Threads whose first calls race on one group share the one communicator (each opening its
    own would wait for peers under store keys the other ranks never use); threads that make
    their first calls on different groups must reach them in the same order on every rank, as
    torch asks of ``new_group``, or the creations wait for each other until the timeout.
    """
    existing = existing_communicator(group)
    if existing is not None:
        return existing
    with _CREATING:
        existing = existing_communicator(group)
        if existing is not None:
            return existing
        resolved = resolve_group(group)
        comm = Communicator(resolved)
        _COMMUNICATORS[id(resolved)] = (resolved, comm)
        return comm


def existing_communicator(group: dist.ProcessGroup | None) -> Communicator | None:
    """The communicator of ``group`` if one was created, without creating one."""
    resolved = resolve_group(group)
    entry = _COMMUNICATORS.get(id(resolved))
    return entry[1] if entry is not None and entry[0] is resolved else None


def forget_communicator(group: dist.ProcessGroup) -> None:
    """Close and drop the communicator cached for ``group``, if any (before destroying it)."""
    entry = _COMMUNICATORS.get(id(group))
    if entry is not None and entry[0] is group:
        del _COMMUNICATORS[id(group)]
        entry[1].close()


def _close_at_exit() -> None:
    try:
        forget_communicators()
    except Exception as error:  # noqa: BLE001 - exiting anyway; say what could not be closed
        log.debug("closing scaledl's communicators at exit: %s", error)


atexit.register(_close_at_exit)


def forget_communicators() -> None:
    """Drop every cached communicator (after ``destroy_process_group``, and at exit: a script
    that never calls ``scaledl.shutdown()`` still ends with its threads joined and its channels
    closed in order)."""
    for _, comm in _COMMUNICATORS.values():
        comm.close()
    _COMMUNICATORS.clear()
