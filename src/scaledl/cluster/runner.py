"""Run a command as ``R`` ranks on every host of a cluster, and supervise them.

Each rank is ``ip netns exec <host namespace> <command>`` with the torchrun variables set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``
= host 0's address, ``MASTER_PORT``), so any ``scaledl`` command acts as one worker of the job.
``GLOO_SOCKET_IFNAME=eth0`` makes Gloo use the host's link (without it Gloo resolves the host
name to 127.0.0.1 and cannot reach other namespaces), and ``SCALEDL_HOSTNAME`` gives each host its
own name for topology discovery (all namespaces share the machine's real host name).

Ranks are numbered host by host (``block``, as torchrun does) or round-robin over the hosts
(``cyclic``, as ``mpirun --map-by node``).  The supervisor returns the first non-zero exit code
and stops every other rank at once (no hangs), stops all ranks on a timeout (124), on Ctrl-C or
SIGTERM/SIGHUP (130).

What is guaranteed when :func:`run_ranks` returns: the process group (session) of every rank has
been sent SIGTERM and, after the grace, SIGKILL, whether its leader still ran or not; the stop
phase runs with SIGINT/SIGTERM/SIGHUP held off, so it always reaches SIGKILL.  Each rank also
gets ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies with the supervisor even if the supervisor is
SIGKILLed.  Descendants that start sessions of their own (torchrun's workers do) are outside those
groups: :func:`run_on_cluster` therefore kills every process left inside the cluster's host
namespaces after each run.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaledl.cluster.netns import kill_inside, link_counters
from scaledl.cluster.spec import HOST_IFNAME, ClusterSpec
from scaledl.processes import signals_blocked, signals_raise, stop_process_groups

__all__ = ["RankLaunch", "PLACEMENTS", "placement", "plan_ranks", "run_ranks", "run_on_cluster",
           "CLEARED_PREFIXES", "TIMED_OUT", "INTERRUPTED", "STOP_GRACE_S"]

log = logging.getLogger(__name__)

PLACEMENTS = ("block", "cyclic")
"""How ranks are numbered over the hosts."""
TIMED_OUT, INTERRUPTED = 124, 130
STOP_GRACE_S = 5.0
"""Seconds a rank gets between SIGTERM and SIGKILL."""
CLEARED_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "OMPI_COMM_WORLD_",
                    "PMI_", "MPI_LOCAL", "SLURM_", "GLOO_SOCKET_IFNAME", "SCALEDL_HOSTNAME")
"""Variables of an outer launcher that must not leak into the ranks (exact names or prefixes)."""


class _Stopped(Exception):
    """SIGTERM or SIGHUP arrived while ranks ran."""


@dataclass(frozen=True)
class RankLaunch:
    """How one rank is started."""

    rank: int
    """Global rank."""
    host: int
    """Host index."""
    local_rank: int
    """Index among the ranks of its host."""
    argv: list[str]
    """Full command line, ``ip netns exec <ns> ...`` included."""
    env: dict[str, str] = field(repr=False)
    """Environment of the process."""


def placement(hosts: int, ranks_per_host: int, mode: str = "block") -> list[int]:
    """The host of every rank: ``block`` fills host 0 first, ``cyclic`` deals ranks round-robin."""
    if mode not in PLACEMENTS:
        raise ValueError(f"--placement {mode!r} is unknown; use one of {', '.join(PLACEMENTS)}")
    if ranks_per_host < 1:
        raise ValueError(f"--ranks-per-host {ranks_per_host} must be at least 1")
    world = hosts * ranks_per_host
    if mode == "block":
        return [rank // ranks_per_host for rank in range(world)]
    return [rank % hosts for rank in range(world)]


def _command(argv: Sequence[str]) -> list[str]:
    """``scaledl ...`` runs as ``<this python> -m scaledl.cli.main ...`` (same venv in every ns)."""
    if not argv:
        raise ValueError("no command to run on the cluster; put it after '--', e.g. "
                         "'scaledl cluster run ... -- scaledl bench collectives'")
    if argv[0] == "scaledl":
        return [sys.executable, "-m", "scaledl.cli.main", *argv[1:]]
    if shutil.which(argv[0]) is None:  # the namespaces share this file system
        raise ValueError(f"command {argv[0]!r} was not found (not an executable file, nor on "
                         "PATH)")
    return list(argv)


def _clean_env(base: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in base.items()
            if not any(k == p or (p.endswith("_") and k.startswith(p)) for p in CLEARED_PREFIXES)}


def plan_ranks(
    spec: ClusterSpec, ranks_per_host: int, argv: Sequence[str], mode: str = "block",
    port: int = 29500, base_env: Mapping[str, str] | None = None,
) -> list[RankLaunch]:
    """The launch of every rank (pure: nothing starts)."""
    hosts_of = placement(spec.hosts, ranks_per_host, mode)
    command = _command(argv)
    env = _clean_env(os.environ if base_env is None else base_env)
    env.setdefault("OMP_NUM_THREADS", "1")
    launches, seen = [], [0] * spec.hosts
    for rank, host in enumerate(hosts_of):
        local, seen[host] = seen[host], seen[host] + 1
        rank_env = dict(env, RANK=str(rank), WORLD_SIZE=str(len(hosts_of)),
                        LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(ranks_per_host),
                        GROUP_RANK=str(host), MASTER_ADDR=spec.address(hosts_of[0]),
                        MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=HOST_IFNAME,
                        SCALEDL_HOSTNAME=f"{spec.name}-h{host}", SCALEDL_CLUSTER=spec.name)
        argv_ns = ["ip", "netns", "exec", spec.host_namespace(host), *command]
        launches.append(RankLaunch(rank, host, local, argv_ns, rank_env))
    return launches


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _supervise(procs: list[subprocess.Popen[bytes]], launches: list[RankLaunch],
               timeout: float | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        for launch, code in zip(launches, codes):
            if code is not None and code != 0:
                others = sum(1 for c in codes if c is None)
                log.error("rank %d (host h%d) exited with code %d; stopping the %d ranks still "
                          "running", launch.rank, launch.host, _exit_code(code), others)
                return _exit_code(code)
        if all(code == 0 for code in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            log.error("the ranks did not finish within %.0f s; stopping them", timeout)
            return TIMED_OUT
        time.sleep(0.05)


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGKILL this child when ``parent`` dies (also if it already has)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(INTERRUPTED)
    return preexec


def run_ranks(launches: list[RankLaunch], timeout: float | None = None,
              after_stop: Callable[[], None] | None = None) -> int:
    """Start every rank, wait, and make sure none outlives this call; return the job's code.

    ``after_stop`` runs after the ranks' process groups are stopped, still with SIGINT, SIGTERM
    and SIGHUP held off (a signal that arrives then makes the code 130 if it was 0).
    """
    procs: list[subprocess.Popen[bytes]] = []
    code = INTERRUPTED
    try:
        with signals_raise(_Stopped):
            preexec = _die_with(os.getpid())
            for launch in launches:
                procs.append(subprocess.Popen(launch.argv, env=launch.env,
                                              start_new_session=True, preexec_fn=preexec))
            code = _supervise(procs, launches, timeout)
    except (KeyboardInterrupt, _Stopped) as reason:
        log.error("interrupted (%s); stopping %d ranks", str(reason) or "Ctrl-C", len(procs))
    finally:
        with signals_blocked() as arrived:
            stop_process_groups(procs, STOP_GRACE_S, STOP_GRACE_S, include_finished=True)
            if after_stop is not None:
                after_stop()
        if arrived:
            log.error("%s arrived while the ranks were being stopped; they are stopped",
                      ", ".join(arrived))
            code = code or INTERRUPTED
    return code


def _kill_leftovers(spec: ClusterSpec) -> None:
    """SIGKILL whatever still runs inside the cluster's hosts (descendants in own sessions)."""
    for host in range(spec.hosts):
        killed = kill_inside(spec.host_namespace(host))
        if killed:
            log.warning("killed %d processes left inside host h%d after the run", killed, host)


def run_on_cluster(
    spec: ClusterSpec, ranks_per_host: int, argv: Sequence[str], mode: str = "block",
    port: int = 29500, timeout: float | None = None, counters: Path | None = None,
) -> int:
    """Run ``argv`` as ``ranks_per_host`` ranks on every host; optionally record link bytes.

    With ``counters``, the bytes each host sent and received on its link (``eth0``) and on its
    loopback during the run are written there as JSON.
    """
    launches = plan_ranks(spec, ranks_per_host, argv, mode, port)
    before = link_counters(spec) if counters is not None else None
    log.info("cluster %s: %d ranks (%d per host, %s) of: %s", spec.name, len(launches),
             ranks_per_host, mode, " ".join(argv))
    start = time.perf_counter()
    code = run_ranks(launches, timeout, after_stop=lambda: _kill_leftovers(spec))
    if counters is not None and before is not None:
        after = link_counters(spec)
        delta = {host: {key: after[host][key] - before[host].get(key, 0) for key in after[host]}
                 for host in after}
        record = {
            "cluster": spec.name, "hosts": spec.hosts, "rate": spec.rate_text,
            "shaper": spec.shaper if spec.rate is not None else None,
            "ranks_per_host": ranks_per_host, "placement": mode,
            "command": list(argv), "exit_code": code, "seconds": time.perf_counter() - start,
            "bytes": delta,
        }
        counters.parent.mkdir(parents=True, exist_ok=True)
        counters.write_text(json.dumps(record, indent=1) + "\n")
    return code
