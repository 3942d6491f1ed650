"""init, shutdown and the questions Horovod scripts ask: rank, size, local rank, hosts, builds.

``hvd.init()`` joins the job through :func:`scaledl.init` (so it works under ``scaledl run``,
torchrun, ``mpirun``, ``srun``, or on an existing ``torch.distributed`` group), takes the local
and cross ranks from the topology scaledl found (hosts by name, or ``SCALEDL_TOPOLOGY``),
registers the global process set and any ``process_sets``, and picks the collective algorithms
(``algorithm=``, else ``SCALEDL_HOROVOD_ALGORITHM``, else ``auto``).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from scaledl import bootstrap, collectives
from scaledl.collectives.communicator import forget_communicators
from scaledl.horovod import runtime
from scaledl.horovod.errors import unsupported
from scaledl.horovod.process_sets import ProcessSet, add_process_set, bind_global, release_all
from scaledl.horovod.runtime import ALGORITHM_ENV, AUTO, Algorithms, Runtime
from scaledl.topology import Topology

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
           "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
           "cuda_built", "rocm_built"]

log = logging.getLogger(__name__)
_EXIT_HOOK: list[bool] = []


def _algorithms(algorithm: str | None) -> Algorithms:
    spec = algorithm if algorithm is not None else os.environ.get(ALGORITHM_ENV, AUTO)
    try:
        return Algorithms.parse(spec)
    except ValueError as error:
        origin = "algorithm=" if algorithm is not None else f"{ALGORITHM_ENV}="
        raise ValueError(f"{origin}{spec!r}: {error}") from None


def init(
    comm: Sequence[int] | None = None, process_sets: Sequence[ProcessSet] | str | None = None,
    *, algorithm: str | None = None, backend: str | None = None, timeout: float | None = None,
) -> None:
    """Join the job and set up Horovod's state (a second call does nothing).

    ``comm`` may list all ranks (anything else, or an MPI communicator, is refused);
    ``process_sets`` registers sets at once (``"dynamic"`` is accepted: sets can always be
    added later).  ``algorithm`` (scaledl's: ``"ring"``, ``"allreduce=ring,broadcast=tree"``),
    ``backend`` and ``timeout`` (seconds) are scaledl's additions.
    """
    if runtime.peek() is not None:
        return
    owns_world = not dist.is_initialized()
    topology = bootstrap.init(backend=backend, timeout=timeout)
    try:
        _start(comm, process_sets, algorithm, timeout, owns_world, topology)
    except BaseException:
        _stop(owns_world)
        raise
    if not _EXIT_HOOK:
        atexit.register(shutdown)
        _EXIT_HOOK.append(True)


def _start(comm: Sequence[int] | None, process_sets: Sequence[ProcessSet] | str | None,
           algorithm: str | None, timeout: float | None, owns_world: bool,
           topology: Topology) -> None:
    world_rank, world_size = dist.get_rank(), dist.get_world_size()
    if comm is not None and (isinstance(comm, (str, bytes)) or not isinstance(comm, Sequence)
                             or sorted(comm) != list(range(world_size))):
        raise unsupported("hvd.init(comm=...) with an MPI communicator or a subset of the ranks",
                          "start only the ranks you need, or use an hvd.ProcessSet")
    backend = str(dist.get_backend())
    algorithms = _algorithms(algorithm)
    for collective, name in algorithms.items():
        if name != AUTO:
            collectives.resolve_topology(name, collective, topology)
    state = Runtime(
        rank=world_rank, size=world_size, local_rank=topology.local_rank(world_rank),
        local_size=topology.ranks_per_node, cross_rank=topology.node(world_rank),
        cross_size=topology.num_nodes, topology=topology, algorithms=algorithms,
        backend=backend, timeout=bootstrap.resolve_timeout(timeout), owns_world=owns_world)
    runtime.install(state)
    bind_global(state)
    if process_sets is not None and process_sets != "dynamic":
        if isinstance(process_sets, str):
            raise ValueError(f"process_sets={process_sets!r}: give a list of hvd.ProcessSet or "
                             "'dynamic'")
        for process_set in process_sets:
            add_process_set(process_set)
    log.info("scaledl.horovod: rank %d of %d, %d per host, algorithms %s", world_rank,
             world_size, state.local_size, algorithms.describe())


def _stop(owns_world: bool) -> None:
    state = runtime.peek()
    if state is not None:
        release_all(state)
        runtime.install(None)
    if owns_world:
        forget_communicators()
        bootstrap.shutdown()


def shutdown() -> None:
    """Release the process sets; destroy the default group if ``hvd.init()`` created it."""
    state = runtime.peek()
    if state is not None:
        _stop(state.owns_world)


def is_initialized() -> bool:
    """Whether ``hvd.init()`` has run (and ``shutdown`` has not)."""
    return runtime.peek() is not None


def rank() -> int:
    """This process's rank in the job."""
    return runtime.current().rank


def size() -> int:
    """Number of processes in the job."""
    return runtime.current().size


def local_rank() -> int:
    """This process's position on its host (its GPU index)."""
    return runtime.current().local_rank


def local_size() -> int:
    """Number of processes on this host."""
    return runtime.current().local_size


def cross_rank() -> int:
    """Index of this process's host."""
    return runtime.current().cross_rank


def cross_size() -> int:
    """Number of hosts (each holds the same number of ranks in scaledl's layouts)."""
    return runtime.current().cross_size


def is_homogeneous() -> bool:
    """True: scaledl's layouts have the same number of ranks on every host."""
    runtime.current()
    return True


def mpi_threads_supported() -> bool:
    """False: scaledl does not run on MPI, so do not mix in mpi4py calls."""
    return False


def mpi_enabled() -> bool:
    """Whether the default group uses torch.distributed's MPI backend."""
    return runtime.current().backend == "mpi"


def mpi_built() -> bool:
    """Whether torch was built with the MPI backend."""
    return dist.is_mpi_available()


def gloo_enabled() -> bool:
    """Whether the default group uses Gloo."""
    return runtime.current().backend == "gloo"


def gloo_built() -> bool:
    """Whether torch has the Gloo backend."""
    return dist.is_gloo_available()


def nccl_built() -> bool:
    """Whether torch has the NCCL backend."""
    return dist.is_nccl_available()


def ddl_built() -> bool:
    """False: IBM DDL is not used."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not used."""
    return False


def cuda_built() -> bool:
    """Whether torch was built with CUDA."""
    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def rocm_built() -> bool:
    """Whether torch was built with ROCm."""
    return torch.version.hip is not None
