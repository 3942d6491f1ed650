"""Bootstrap: turn whatever launched this process into a process group and a :class:`Topology`.

:func:`init` reads where this process sits from its launcher's variables
(:mod:`scaledl.launchers`: torchrun, Open MPI, MPICH/PMI, Slurm's srun), joins the ranks with a
timeout on every blocking step, finds the layout (argument, then ``SCALEDL_TOPOLOGY``, then an
exchange of host names), checks that every rank found the same one, records it with every
rank's host (:class:`~scaledl.topology.JobLayout`, the defaults of every later call) and returns
the :class:`Topology` seen from this rank.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store
from torch.distributed.rendezvous import rendezvous

from scaledl.launchers import (
    DEFAULT_PORT, HOSTNAME_ENV, LOOPBACK, LaunchEnv, detect_launcher, first_slurm_host,
    host_name, in_srun_step, read_launch_env,
)
from scaledl.signature import Kind, Signature, agree, over_group
from scaledl.topology import TOPOLOGY_ENV, JobLayout, Topology, forget_job, record_job

__all__ = [
    "LaunchEnv", "read_launch_env", "init", "shutdown", "first_slurm_host", "topology_from_hosts",
    "BACKENDS", "HOST_BACKEND", "DEFAULT_PORT", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV",
    "HOSTNAME_ENV", "host_name",
    "detect_launcher", "in_srun_step", "RendezvousError", "resolve_timeout", "owns_world",
]

logger = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl", "mpi")
"""Process-group backends :func:`init` accepts."""
HOST_BACKEND = "gloo"
"""The backend of jobs whose tensors live in host memory (``scaledl train``, ``scaledl bench``):
on a GPU host :func:`init` would default to NCCL, which moves CUDA tensors only."""
DEFAULT_TIMEOUT_S = 300.0
"""Timeout of every blocking process-group call unless ``SCALEDL_TIMEOUT`` or ``timeout`` says."""
TIMEOUT_ENV = "SCALEDL_TIMEOUT"
"""Environment variable holding the process-group timeout in seconds."""


class RendezvousError(RuntimeError):
    """The ranks could not join one process group within the timeout (a rank missing, an
    unreachable ``MASTER_ADDR``); the message names the address, the timeout and what to check."""


# -- joining the process group ------------------------------------------------------------------
def resolve_timeout(
    timeout: float | timedelta | None, env: Mapping[str, str] | None = None
) -> timedelta:
    """``timeout`` if given, else ``SCALEDL_TIMEOUT`` seconds (from ``env``, default
    ``os.environ``), else :data:`DEFAULT_TIMEOUT_S`; ``ValueError`` unless positive."""
    if timeout is None:
        value = (os.environ if env is None else env).get(TIMEOUT_ENV, "").strip()
        try:
            timeout = float(value) if value else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ValueError(
                f"{TIMEOUT_ENV}={value!r} is not a number; set it to a timeout in seconds"
            ) from None
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise ValueError(f"timeout {timeout} must be positive; give seconds > 0")
    return timeout


def _backend(backend: str | None) -> str:
    """``backend``, or NCCL when CUDA and NCCL are available, else Gloo."""
    if backend is None:
        cuda = torch.cuda.is_available() and dist.is_nccl_available()
        return "nccl" if cuda else "gloo"
    if backend.lower() not in BACKENDS:
        raise ValueError(f"backend {backend!r} is unknown; use one of {', '.join(BACKENDS)}")
    return backend.lower()


def _select_device(backend: str, launch: LaunchEnv) -> torch.device | None:
    """For NCCL, make GPU ``local_rank`` this process's device; ``None`` for other backends."""
    if backend != "nccl":
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if launch.local_rank >= count:
        raise ValueError(
            f"local rank {launch.local_rank} has no GPU ({count} visible); start at most {count} "
            "ranks per host for backend 'nccl', or use backend='gloo'"
        )
    torch.cuda.set_device(launch.local_rank)
    return torch.device("cuda", launch.local_rank)


def _join(backend: str, launch: LaunchEnv, timeout: timedelta, env: Mapping[str, str]) -> None:
    """Create the world process group; a job of one needs no address (an in-memory store)."""
    device = _select_device(backend, launch)
    if backend == "mpi":
        dist.init_process_group("mpi", timeout=timeout)
    elif launch.world_size == 1 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(
            backend, store=dist.HashStore(),  # type: ignore[attr-defined]  # stub omits it
            rank=0, world_size=1, timeout=timeout,
            device_id=device,
        )
    else:
        host = launch.master_addr or LOOPBACK
        address = f"tcp://{f'[{host}]' if ':' in host else host}:{launch.master_port}"
        try:
            dist.init_process_group(
                backend, store=_world_store(address, launch, timeout), rank=launch.rank,
                world_size=launch.world_size, timeout=timeout, device_id=device,
            )
        except dist.DistError as error:
            who = f"rank {launch.rank} of {launch.world_size} ({launch.launcher})"
            if "EADDRINUSE" in str(error) or "address already in use" in str(error).lower():
                problem = (f"could not open the rendezvous at {address}: port "
                           f"{launch.master_port} is in use, likely by another job on this host; "
                           "export MASTER_PORT=<a free port> (every rank the same; mpirun: -x "
                           "MASTER_PORT) and start again")
            else:
                problem = (f"could not join the process group at {address} within "
                           f"{timeout.total_seconds():g} s; check that every rank started and "
                           "that MASTER_ADDR/MASTER_PORT reach rank 0")
            raise RendezvousError(f"{who} {problem} ({error})") from error


_STORES: dict[tuple[str, int, int], tuple[Store, int]] = {}
"""The job's store per (address, rank, world size), and how many groups it has served."""


def _world_store(address: str, launch: LaunchEnv, timeout: timedelta) -> Store:
    """The job's key-value store, under a prefix of its own for each group this process joins.

    The store is found once (torch's rendezvous: the launcher's agent store under torchrun,
    else one that rank 0 serves) and kept for the life of the process.  Joining again after
    :func:`shutdown` (``hvd.init()`` after ``hvd.shutdown()``) then neither reads the keys the
    last group left (a fast rank would take a peer's stale address and connect to a closed
    socket) nor meets rank 0 serving its store anew on the same port while another rank still
    talks to the old one.
    """
    key = (address, launch.rank, launch.world_size)
    if key in _STORES:
        store, generation = _STORES[key][0], _STORES[key][1] + 1
    else:
        store, _, _ = next(rendezvous(address, launch.rank, launch.world_size,
                                      timeout=timeout))
        generation = 0
    _STORES[key] = (store, generation)
    store.set_timeout(timeout)
    return PrefixStore(f"scaledl/{generation}", store)


# -- finding the layout -------------------------------------------------------------------------
def _requested_topology(
    topology: Topology | str | None, world_size: int, rank: int, env: Mapping[str, str]
) -> Topology | None:
    """The layout the caller or ``SCALEDL_TOPOLOGY`` asks for, checked against the world size."""
    if isinstance(topology, Topology):
        if topology.world_size != world_size:
            raise ValueError(
                f"topology {topology.spec} describes {topology.world_size} ranks but the world "
                f"size is {world_size}; pass a topology whose axes multiply to {world_size}"
            )
        return topology.with_rank(rank)
    if topology is not None:
        return Topology.parse(topology, world_size, rank)
    spec = env.get(TOPOLOGY_ENV, "").strip()
    if not spec:
        return None
    try:
        return Topology.parse(spec, world_size, rank)
    except ValueError as error:
        raise ValueError(f"{TOPOLOGY_ENV}={spec!r} is invalid: {error}") from None


def topology_from_hosts(hostnames: list[str], rank: int, local_world_size: int) -> Topology:
    """Layout from every rank's host name; one host split by the launcher counts as several.

    When all ranks share a host but the launcher reports fewer ranks per host than the world
    size (emulated multi-node), the axes are ``(local_world_size, world_size/local_world_size)``.
    """
    world_size = len(hostnames)
    one_host = len(set(hostnames)) == 1
    if one_host and 1 <= local_world_size < world_size and world_size % local_world_size == 0:
        axes = (local_world_size, world_size // local_world_size)
        return Topology(axes=axes, rank=rank, explicit=True)
    return Topology.from_hosts(hostnames, rank)


def _agree_on_layout(
    requested: Topology | None, rank: int, world_size: int, local_world_size: int,
) -> tuple[Topology, tuple[str, ...]]:
    """Exchange every rank's host, ranks-per-host and requested layout; check that all asked for
    the same layout and compute the same one on every rank from the same data.

    Hosts holding different numbers of ranks give a flat layout (each host still shares
    memory among its ranks).
    """
    mine: tuple[str, int] = (host_name(), local_world_size)
    everyone: list[tuple[str, int]] = [mine]
    if world_size > 1:
        agree(Signature(Kind.INIT, layout=requested.layout if requested else None),
              over_group(), fix=f"give every rank the same topology= or {TOPOLOGY_ENV}")
        gathered: list[object] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        everyone = [row for row in gathered if isinstance(row, tuple)]
    hosts = tuple(row[0] for row in everyone)
    if requested is not None:
        return requested, hosts
    per_host = {row[1] for row in everyone}
    local = per_host.pop() if len(per_host) == 1 else world_size
    try:
        return topology_from_hosts(list(hosts), rank, local), hosts
    except ValueError:
        logger.info("hosts hold different numbers of ranks: the layout is flat")
        return Topology.flat(world_size, rank), hosts


def _local_world_size_hint(world_size: int, env: Mapping[str, str]) -> int:
    """Ranks per host from the launcher when the group was made elsewhere; else ``world_size``."""
    try:
        launch = read_launch_env(env)
    except ValueError:
        return world_size
    return launch.local_world_size if launch.world_size == world_size else world_size


# -- public entry points ------------------------------------------------------------------------
def init(
    backend: str | None = None,
    timeout: float | timedelta | None = None,
    topology: Topology | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """Join the job's process group (unless already joined) and return its :class:`Topology`.

    ``backend`` defaults to NCCL with CUDA, else Gloo.  ``timeout`` (seconds or a ``timedelta``)
    bounds every blocking call of the group; ``None`` reads ``SCALEDL_TIMEOUT``, else 300 s.
    An existing group is kept as it is (backend and timeout included); only its layout is found.
    ``topology`` (a :class:`Topology` or a spec like ``"4x2"``) overrides ``SCALEDL_TOPOLOGY``,
    which overrides the layout found by exchanging host names.  ``environ`` defaults to
    ``os.environ``.
    """
    env = os.environ if environ is None else environ
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
        resolved_backend, launcher, timeout_text = str(dist.get_backend()), "existing group", "kept"
        ignored = [f"{name}={value!r}" for name, value in
                   (("backend", backend if backend not in (None, resolved_backend) else None),
                    ("timeout", timeout)) if value is not None]
        if ignored:
            warnings.warn(f"scaledl.init: the process group already exists (backend "
                          f"{resolved_backend}), so {' and '.join(ignored)} changed nothing; call "
                          "scaledl.shutdown() first to join with them", stacklevel=2)
        local_world_size = _local_world_size_hint(world_size, env)
        requested = _requested_topology(topology, world_size, rank, env)
    else:
        group_timeout = resolve_timeout(timeout, env)
        launch = read_launch_env(env)
        rank, world_size = launch.rank, launch.world_size
        launcher, local_world_size = launch.launcher, launch.local_world_size
        resolved_backend = _backend(backend)
        requested = _requested_topology(topology, world_size, rank, env)
        _join(resolved_backend, launch, group_timeout, env)
        world = dist.group.WORLD
        _OWNED[:] = [(os.getpid(), weakref.ref(world))] if world is not None else []
        timeout_text = f"{group_timeout.total_seconds():g}s"
    result, hosts = _agree_on_layout(requested, rank, world_size, local_world_size)
    record_job(JobLayout(result, hosts))
    logger.info(
        "scaledl init: launcher=%s rank=%d world_size=%d backend=%s topology=%s timeout=%s",
        launcher, rank, world_size, resolved_backend, result.spec, timeout_text,
    )
    return result


_OWNED: list[tuple[int, weakref.ref[dist.ProcessGroup]]] = []
"""The process and the world group :func:`init` created there (weakly: a script that destroys
the group itself frees it at once), see :func:`owns_world`."""


def owns_world() -> bool:
    """True while the world process group is the one :func:`init` created.  Such a group is
    destroyed at exit when the script did not call :func:`shutdown` (an exit hook that runs
    after scaledl's communicators close): a Gloo group left to the interpreter's teardown
    aborted about one exit in four under mpiexec with "terminate called without an active
    exception" (torch's behaviour; a group the user created is theirs to destroy)."""
    if not _OWNED or not dist.is_initialized():
        return False
    pid, group = _OWNED[0]
    return pid == os.getpid() and dist.group.WORLD is group()  # a forked child's is a copy


EXIT_DESTROY_S = 3.0
"""How long the exit hook waits for the group it destroys.  A clean exit's destroy took
milliseconds here (Gloo, 2 ranks); a script that leaves with a collective still in flight (it
failed, say) would wait for its peers, up to the group's timeout.  After this the process goes
on exiting with the destroy unfinished, which may abort as it would have without the hook."""


def _shutdown_at_exit() -> None:
    if not owns_world():
        return

    def destroy() -> None:
        try:
            shutdown()
        except Exception as error:  # noqa: BLE001 - exiting anyway; say what was not closed
            logger.debug("destroying the process group at exit: %s", error)

    worker = threading.Thread(target=destroy, name="scaledl-exit", daemon=True)
    worker.start()
    worker.join(EXIT_DESTROY_S)
    if worker.is_alive():
        logger.warning("the process group was not destroyed within %g s of exit (a collective "
                       "still waits for a peer); exiting without it", EXIT_DESTROY_S)


# Registered when this module is first imported, before scaledl's communicators (which import
# it) register theirs: exit hooks run last-registered first, so they close before the group goes.
atexit.register(_shutdown_at_exit)


def shutdown() -> None:
    """Destroy the world process group if there is one, and forget the job's layout.

    Cached communicators key on the group object, so a later :func:`init` gets fresh ones.
    """
    forget_job()
    _OWNED.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
