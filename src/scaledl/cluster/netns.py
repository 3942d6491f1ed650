"""Building and removing clusters with ``ip`` and ``tc`` (iproute2), and reading link counters.

:func:`create` records the cluster (:func:`state.allocate`) and :func:`build` runs
:meth:`ClusterSpec.create_commands`; if any command fails or a signal interrupts it, it tears down
what was made, with SIGINT/SIGTERM/SIGHUP held off so a second Ctrl-C cannot cut that short,
before raising.  :func:`destroy` is idempotent: it kills what still
runs inside the cluster's namespaces, deletes every namespace that exists (which removes its veth
ends) and forgets the record; running it twice, or on a half-built cluster, is fine.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence

from scaledl.cluster import state
from scaledl.cluster.spec import HOST_IFNAME, NAMESPACE_PREFIX, ClusterSpec
from scaledl.processes import signals_blocked

__all__ = ["preflight", "create", "build", "destroy", "destroy_namespace", "existing_namespaces",
           "orphan_namespaces", "kill_inside", "link_counters", "CommandError", "Runner"]

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
"""Runs one command and returns its completed process (tests substitute a fake)."""

COMMAND_TIMEOUT_S = 30.0


class CommandError(ValueError):
    """An ``ip`` or ``tc`` command failed (one line: the command and its message)."""


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False)


def _runner(runner: Runner | None) -> Runner:
    """``runner``, or the real one (looked up at call time, so tests can replace ``_run``)."""
    return _run if runner is None else runner


def preflight(
    euid: int | None = None, which: Callable[[str], str | None] = shutil.which
) -> None:
    """Raise ``ValueError`` saying what is missing when clusters cannot be built here."""
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        raise ValueError(
            f"scaledl cluster needs root to create network namespaces (effective uid is {uid}); "
            "run it as root, e.g. with sudo"
        )
    missing = [tool for tool in ("ip", "tc") if which(tool) is None]
    if missing:
        raise ValueError(
            f"scaledl cluster needs iproute2, but {' and '.join(missing)} is not on PATH; "
            "install the iproute2 package (apt-get install iproute2)"
        )


def _check(command: Sequence[str], runner: Runner | None) -> str:
    result = _runner(runner)(command)
    if result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip() or "no message"
        message = "; ".join(line.strip() for line in message.splitlines() if line.strip())
        raise CommandError(f"'{' '.join(command)}' failed ({result.returncode}): {message}")
    return result.stdout


def existing_namespaces(runner: Runner | None = None) -> set[str]:
    """Names of the network namespaces that exist now."""
    out = _check(["ip", "netns", "list"], runner)
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def create(
    hosts: int, rate: int | None, shaper: str = "tbf", name: str | None = None,
    ephemeral: bool = False, runner: Runner | None = None,
) -> state.ClusterRecord:
    """Build a cluster of ``hosts`` hosts with links of ``rate`` bits/s; return its record."""
    record = state.allocate(hosts, rate, shaper, name, ephemeral, existing_namespaces(runner))
    return build(record, runner)


def build(record: state.ClusterRecord, runner: Runner | None = None) -> state.ClusterRecord:
    """Run the commands that build the recorded cluster and mark it ``up``.

    On any failure or interruption everything built is torn down (signals held off meanwhile)
    and the error is raised again.
    """
    spec = record.spec
    try:
        for command in spec.create_commands():
            _check(command, runner)
    except BaseException:
        with signals_blocked():
            log.error("creating cluster %s failed; tearing down what was built", spec.name)
            destroy(spec, runner)
        raise
    record.status = "up"
    state.save(record)
    log.info("cluster %s is up: %d hosts, links %s (%s)", spec.name, spec.hosts, spec.rate_text,
             spec.shaper)
    return record


def kill_inside(namespace: str, runner: Runner | None = None) -> int:
    """SIGKILL every process still running inside ``namespace``; return how many were signalled."""
    result = _runner(runner)(["ip", "netns", "pids", namespace])
    if result.returncode != 0:
        return 0
    killed = 0
    for pid in result.stdout.split():
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
    return killed


def destroy_namespace(namespace: str, runner: Runner | None = None) -> str | None:
    """Kill what runs in ``namespace`` and delete it; return the error text, or None on success."""
    kill_inside(namespace, runner)
    result = _runner(runner)(["ip", "netns", "del", namespace])
    return None if result.returncode == 0 else result.stderr.strip() or "unknown error"


def destroy(spec: ClusterSpec, runner: Runner | None = None) -> list[str]:
    """Remove every namespace of ``spec`` that exists and forget it; return what was deleted."""
    present = existing_namespaces(runner)
    deleted, errors = [], []
    for namespace in reversed(spec.namespaces):
        if namespace not in present:
            continue
        error = destroy_namespace(namespace, runner)
        if error is None:
            deleted.append(namespace)
        else:
            errors.append(f"{namespace}: {error}")
    if errors:
        raise CommandError(f"could not delete {'; '.join(errors)}; the record of cluster "
                           f"{spec.name!r} is kept so 'scaledl cluster down' can retry")
    state.remove(spec.name)
    return deleted


def orphan_namespaces(runner: Runner | None = None) -> list[str]:
    """``scaledl-*`` namespaces that no record claims, in any record directory known here.

    Known directories are this one, the default one and every directory where a cluster was
    ever allocated on this machine since boot (:func:`state.known_dirs`).
    """
    known = {ns for r in state.load_all_known() for ns in r.spec.namespaces}
    return sorted(ns for ns in existing_namespaces(runner)
                  if ns.startswith(NAMESPACE_PREFIX) and ns not in known)


def link_counters(spec: ClusterSpec, runner: Runner | None = None) -> dict[str, dict[str, int]]:
    """Bytes sent and received so far on each host's link and loopback.

    ``{"h0": {"eth0_tx": .., "eth0_rx": .., "lo_tx": ..}, ...}``; ``eth0`` counts the bytes that
    crossed the (shaped) link, ``lo`` the traffic between ranks on the same host.
    """
    counters: dict[str, dict[str, int]] = {}
    for host in range(spec.hosts):
        out = _check(["ip", "-n", spec.host_namespace(host), "-s", "-j", "link", "show"], runner)
        values: dict[str, int] = {}
        for link in json.loads(out):
            if link.get("ifname") in (HOST_IFNAME, "lo"):
                stats = link["stats64"]
                values[f"{link['ifname']}_tx"] = int(stats["tx"]["bytes"])
                values[f"{link['ifname']}_rx"] = int(stats["rx"]["bytes"])
        counters[f"h{host}"] = values
    return counters
