"""Launchers: where this process sits in its job, from the variables its launcher left.

:func:`read_launch_env` reads the variables a launcher leaves behind, first match wins:

1. torchrun / ``torch.distributed.run``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
2. Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}``;
3. MPICH / Intel MPI (Hydra, PMI): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
   ``MPI_LOCALNRANKS``;
4. SLURM's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
   ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``, else
   ``SLURM_NTASKS_PER_NODE``), and the first host of
   ``SLURM_JOB_NODELIST`` as the master address; only in a task of a job step that ``srun``
   launched, which ``SLURM_STEP_ID`` tells apart from an ``sbatch`` script (see
   :func:`in_srun_step`).

With none of them the process is a job of one.  ``MASTER_ADDR`` and ``MASTER_PORT`` always
override a launcher's default.  Nothing here communicates: :mod:`scaledl.bootstrap` joins the
ranks.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "LaunchEnv", "read_launch_env", "first_slurm_host", "detect_launcher", "in_srun_step",
    "host_name", "DEFAULT_PORT", "HOSTNAME_ENV", "LOOPBACK", "RANK_VARIABLES", "launcher_rank",
    "LAUNCH_VARIABLES", "LAUNCH_ID_ENV",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29500
"""``MASTER_PORT`` when neither the environment nor the launcher gives one (torchrun's default)."""
HOSTNAME_ENV = "SCALEDL_HOSTNAME"
"""Host name used for topology discovery instead of the machine's (``scaledl cluster`` sets it:
its emulated hosts are network namespaces that all share the machine's real host name)."""

LAUNCH_ID_ENV = "SCALEDL_LAUNCH_ID"
"""Identity of one ``scaledl`` launch, the same for every worker and every restart (set by
scaledl's own launchers, read by :func:`scaledl.train.restarts.job_id`)."""

LOOPBACK = "127.0.0.1"
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000
"""Under srun without ``MASTER_PORT``: 20000 + (job id x 131 + step id) mod 10000."""


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in its job, as the launcher described it."""

    rank: int
    """This process's rank in the job, ``0..world_size-1``."""
    world_size: int
    """Number of processes in the job."""
    local_rank: int
    """This process's index among the processes on its host (also its GPU index)."""
    local_world_size: int
    """Number of processes on this host."""
    master_addr: str | None
    """Host of rank 0, where the rendezvous store listens; ``None`` when not needed (one rank)."""
    master_port: int
    """TCP port of the rendezvous store."""
    launcher: str
    """Which variables were read: ``torchrun``, ``openmpi``, ``pmi``, ``slurm`` or ``none``."""
    node_rank: int | None
    """Index of this host in the job when the launcher says; ``None`` when it does not."""


# -- reading the environment --------------------------------------------------------------------
def _int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = env[name]
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not an integer; set {name} to a whole number >= {minimum}"
        ) from None
    if number < minimum:
        raise ValueError(f"{name}={value!r} is below {minimum}; set {name} to at least {minimum}")
    return number


def _optional_int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    return _int_var(env, name, minimum) if env.get(name, "").strip() else None


@dataclass(frozen=True)
class _Variables:
    """The names one launcher gives its rank variables."""

    launcher: str
    """Value of :attr:`LaunchEnv.launcher`."""
    rank: str
    """Variable holding the rank."""
    world_size: str
    """Variable holding the world size."""
    local_rank: str
    """Variable holding the local rank."""
    local_world_size: str
    """Variable holding the number of ranks on this host."""
    node_rank: str | None
    """Variable holding the host index, if the launcher sets one."""


_LAUNCHERS = (
    _Variables("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    _Variables("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", None),
    _Variables("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    _Variables("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
               "SLURM_NODEID"),
)
"""Launchers in priority order; the first whose rank or world-size variable is set wins."""

RANK_VARIABLES = tuple(names.rank for names in _LAUNCHERS)
"""Where the launchers put this process's rank, in priority order."""

LAUNCH_VARIABLES = (
    *(name for names in _LAUNCHERS for name in (names.rank, names.world_size, names.local_rank,
                                                  names.local_world_size, names.node_rank)
      if name is not None),
    "MASTER_ADDR", "MASTER_PORT",
)
"""Every variable a launcher sets that :func:`read_launch_env` reads: a job started from inside
another must not inherit them."""


def launcher_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as its launcher tells it (0 when not launched or not a number): for
    the log prefix, before anything is checked."""
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _tasks_per_node(name: str, value: str, node_rank: int | None) -> int:
    """A Slurm task list such as ``"4(x2),3"`` (variable ``name``): the count of host
    ``node_rank``.

    Every count and repetition must be at least 1: a host with no task cannot hold this rank.
    """
    counts: list[int] = []
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise ValueError(
                f"{name}={value!r} is not a list of task counts >= 1 like '4(x2),3'; unset it "
                "or set SLURM_NTASKS_PER_NODE"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_rank] if node_rank is not None and node_rank < len(counts) else counts[0]


_SLURM_STEP_COUNTS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
"""What srun tells its tasks about the step's tasks per node, most specific first.

``SLURM_NTASKS_PER_NODE`` is no such count: it is an *input* of srun (the same as
``--ntasks-per-node``) that a task inherits from its batch script, so ``srun --ntasks=2`` inside
``sbatch --ntasks-per-node=3`` gives its tasks ``SLURM_NTASKS_PER_NODE=3`` beside
``SLURM_STEP_TASKS_PER_NODE=2`` (seen on Slurm 22.05).  It counts only when neither is set."""


def _local_world_size(
    env: Mapping[str, str], names: _Variables, node_rank: int | None
) -> tuple[int | None, str]:
    """The launcher's ranks-per-host and the variable it came from (``None`` if not given)."""
    size = _optional_int(env, names.local_world_size, 1)
    if names.launcher == "slurm":
        for name in _SLURM_STEP_COUNTS:
            if env.get(name, "").strip():
                return _tasks_per_node(name, env[name], node_rank), name
    return size, names.local_world_size


_FIRST_HOST = re.compile(r"((?:[^,\[\]\s]|\[[^\[\]\s]+\])+)(?:,|$)")
"""First item of a SLURM host list: name characters and ``[ranges]`` up to a top-level comma."""


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM host list: ``"node[01-04,07],gpu5"`` -> ``"node01"``."""
    match = _FIRST_HOST.match(nodelist.strip())
    if match is None:
        raise ValueError(
            f"SLURM_JOB_NODELIST={nodelist!r} is not a host list like 'node[01-04],gpu5'; set "
            "MASTER_ADDR to the host of rank 0"
        )
    return re.sub(r"\[([^\]]*)\]", _first_of_range, match.group(1))


def _first_of_range(brackets: re.Match[str]) -> str:
    """``[01-04,07]`` -> ``01``: the first number, zero padding kept."""
    return brackets.group(1).split(",")[0].split("-")[0]


def _check_ranks(
    names: _Variables, rank: int, world_size: int, local_rank: int, local: tuple[int, str]
) -> None:
    if rank >= world_size:
        raise ValueError(
            f"{names.rank}={rank} is not below {names.world_size}={world_size}; ranks run "
            f"0..{world_size - 1}, so fix the launcher's rank or world size"
        )
    local_world_size, local_name = local
    if local_world_size > world_size:
        raise ValueError(
            f"{local_name}={local_world_size} exceeds {names.world_size}={world_size}; a host "
            "cannot hold more ranks than the job, so fix the launcher's sizes"
        )
    if local_rank >= local_world_size:
        raise ValueError(
            f"{names.local_rank}={local_rank} is not below {local_name}={local_world_size}; local "
            f"ranks run 0..{local_world_size - 1}, so fix the launcher's local rank or size"
        )


def _master_addr(
    env: Mapping[str, str], launcher: str, world_size: int, one_host: bool
) -> str | None:
    """``MASTER_ADDR``, else the launcher's: SLURM's first host, loopback when on one host."""
    if env.get("MASTER_ADDR", "").strip():
        return env["MASTER_ADDR"].strip()
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if launcher == "slurm" and nodelist:
        return first_slurm_host(nodelist)
    if world_size == 1:
        return None
    if one_host:
        return LOOPBACK
    raise ValueError(
        f"MASTER_ADDR is unset for a {world_size}-rank {launcher} job whose ranks may span hosts; "
        "export MASTER_ADDR=<host of rank 0> to every rank (mpirun: -x MASTER_ADDR=...)"
    )


def _master_port(env: Mapping[str, str], launcher: str = "none") -> int:
    """``MASTER_PORT``; unset under srun, a port derived from the job and step ids (two steps
    of one node do not fight for 29500); else :data:`DEFAULT_PORT`."""
    value = env.get("MASTER_PORT", "").strip()
    if not value and launcher == "slurm":
        job, step = env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_STEP_ID", "").strip()
        if job.isdigit():
            serial = int(job) * 131 + (int(step) if step.isdigit() else 0)
            return SLURM_PORT_BASE + serial % SLURM_PORT_SPAN
    if not value:
        return DEFAULT_PORT
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise ValueError(
            f"MASTER_PORT={value!r} is not a port number; set MASTER_PORT to a free TCP port in "
            "1..65535"
        )
    return int(value)


_SLURM_STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
"""Where ``srun`` puts the id of the job step it launched (``SLURM_STEPID``: the older name)."""
_SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0
"""``SLURM_MAX_NORMAL_STEP_ID`` of ``slurm.h``: ids from here up name Slurm's special steps."""


def in_srun_step(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process is a task of a job step launched by ``srun``.

    Slurm gives ``SLURM_PROCID`` (and ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``) to
    every task it starts, the batch script of ``sbatch`` included: sbatch(1) lists
    ``SLURM_PROCID`` among its output environment variables, and slurmstepd's ``setup_env``
    (src/common/env.c) sets it for the batch step as for any other.  So ``SLURM_PROCID=0`` alone
    does not mean that srun started this process.  A step id does: srun(1) lists
    ``SLURM_STEP_ID`` ("the step ID of the current job", ``SLURM_STEPID`` kept for backwards
    compatibility) among the variables it sets for its tasks, and sbatch(1) does not.  The batch
    step carries the special id ``SLURM_BATCH_SCRIPT`` (0xfffffffb in slurm.h, beside the
    extern and interactive steps, all at or above ``SLURM_MAX_NORMAL_STEP_ID`` 0xfffffff0);
    Slurm up to 25.11 sets ``SLURM_STEP_ID`` only for a step id that is non-negative as a C
    ``int``, which leaves it unset in the batch script, and Slurm 26.05 writes the special ids
    with ``%d``, as negative numbers (``-5``).  Hence the rule: a task of an srun step has
    ``SLURM_STEP_ID`` (or ``SLURM_STEPID``) holding a whole number below 0xfffffff0; unset,
    negative or special means the batch script (or an interactive step), where
    ``scaledl <command> --workers N`` must start its own workers.
    """
    env = os.environ if environ is None else environ
    for name in _SLURM_STEP_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value.isdigit() and int(value) < _SLURM_MAX_NORMAL_STEP_ID
    return False


def _detect(env: Mapping[str, str]) -> _Variables | None:
    """The first launcher whose rank variable is set (torchrun: or ``WORLD_SIZE``).

    An allocation without a launched step (``salloc``) sets ``SLURM_NTASKS`` alone, so only a
    rank variable reveals a launcher; ``WORLD_SIZE`` alone is a half-written torchrun setup.
    SLURM's variables count only in a task of an srun step (:func:`in_srun_step`): an ``sbatch``
    script has ``SLURM_PROCID=0`` too, but nothing launched it as one of several ranks.
    """
    for names in _LAUNCHERS:
        torchrun_size = names.launcher == "torchrun" and names.world_size in env
        if names.rank not in env and not torchrun_size:
            continue
        if names.launcher == "slurm" and not in_srun_step(env):
            logger.debug("SLURM_PROCID is set but no srun step id: an sbatch script, not a rank")
            continue
        for present, missing in ((names.rank, names.world_size), (names.world_size, names.rank)):
            if present in env and missing not in env:
                raise ValueError(
                    f"{present}={env[present]!r} is set but {missing} is not; set both (as "
                    f"{names.launcher} does), or neither for a single-process run"
                )
        return names
    return None


def detect_launcher(environ: Mapping[str, str] | None = None) -> str:
    """Which launcher started this process: ``torchrun``, ``openmpi``, ``pmi``, ``slurm`` or
    ``none`` (the same rule as :func:`read_launch_env`, without reading the values).

    ``environ`` defaults to ``os.environ``.  Raises ``ValueError`` when a launcher's rank
    variable is set without its world size, or the other way round.
    """
    names = _detect(os.environ if environ is None else environ)
    return "none" if names is None else names.launcher


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read rank, world size and rendezvous address from the launcher's variables.

    ``environ`` defaults to ``os.environ``.  Raises ``ValueError`` naming the variable, its value
    and the fix when a value is not an integer, out of range, or a needed address is missing.
    """
    env = os.environ if environ is None else environ
    names = _detect(env)
    port = _master_port(env, names.launcher if names is not None else "none")
    if names is None:
        return LaunchEnv(0, 1, 0, 1, env.get("MASTER_ADDR", "").strip() or None, port, "none", 0)
    rank = _int_var(env, names.rank)
    world_size = _int_var(env, names.world_size, 1)
    node_rank = _optional_int(env, names.node_rank) if names.node_rank else None
    local_given, local_name = _local_world_size(env, names, node_rank)
    local_world_size = world_size if local_given is None else local_given
    local_rank = _optional_int(env, names.local_rank)
    local_rank = rank % local_world_size if local_rank is None else local_rank
    _check_ranks(names, rank, world_size, local_rank, (local_world_size, local_name))
    one_host = local_given == world_size
    return LaunchEnv(
        rank=rank, world_size=world_size, local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=_master_addr(env, names.launcher, world_size, one_host),
        master_port=port, launcher=names.launcher, node_rank=node_rank,
    )


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """This rank's host for topology discovery: ``SCALEDL_HOSTNAME`` if set, else the real one."""
    env = os.environ if environ is None else environ
    return env.get(HOSTNAME_ENV, "").strip() or socket.gethostname()
