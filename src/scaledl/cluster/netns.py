"""Building and removing clusters with ``ip`` and ``tc`` (iproute2), and reading link counters.

:func:`create` records the cluster, runs :meth:`ClusterSpec.create_commands` and, if any command
fails, tears down what was made before raising.  :func:`destroy` is idempotent: it kills what still
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

__all__ = ["preflight", "create", "destroy", "destroy_namespace", "existing_namespaces",
           "orphan_namespaces", "link_counters", "CommandError", "Runner"]

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
"""Runs one command and returns its completed process (tests substitute a fake)."""

COMMAND_TIMEOUT_S = 30.0


class CommandError(RuntimeError):
    """An ``ip`` or ``tc`` command failed."""


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False)


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


def _check(command: Sequence[str], runner: Runner) -> str:
    result = runner(command)
    if result.returncode != 0:
        raise CommandError(f"'{' '.join(command)}' failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def existing_namespaces(runner: Runner = _run) -> set[str]:
    """Names of the network namespaces that exist now."""
    out = _check(["ip", "netns", "list"], runner)
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def create(
    hosts: int, rate: int | None, shaper: str = "tbf", name: str | None = None,
    ephemeral: bool = False, runner: Runner = _run,
) -> state.ClusterRecord:
    """Build a cluster of ``hosts`` hosts with links of ``rate`` bits/s; return its record."""
    record = state.allocate(hosts, rate, shaper, name, ephemeral, existing_namespaces(runner))
    spec = record.spec
    try:
        for command in spec.create_commands():
            _check(command, runner)
    except BaseException:
        log.error("creating cluster %s failed; tearing down what was built", spec.name)
        destroy(spec, runner)
        raise
    record.status = "up"
    state.save(record)
    log.info("cluster %s is up: %d hosts, links %s (%s)", spec.name, spec.hosts, spec.rate_text,
             spec.shaper)
    return record


def _kill_inside(namespace: str, runner: Runner) -> None:
    """SIGKILL every process still running inside ``namespace`` (ranks left behind)."""
    result = runner(["ip", "netns", "pids", namespace])
    if result.returncode != 0:
        return
    for pid in result.stdout.split():
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                continue


def destroy_namespace(namespace: str, runner: Runner = _run) -> str | None:
    """Kill what runs in ``namespace`` and delete it; return the error text, or None on success."""
    _kill_inside(namespace, runner)
    result = runner(["ip", "netns", "del", namespace])
    return None if result.returncode == 0 else result.stderr.strip() or "unknown error"


def destroy(spec: ClusterSpec, runner: Runner = _run) -> list[str]:
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


def orphan_namespaces(runner: Runner = _run) -> list[str]:
    """``scaledl-*`` namespaces that belong to no recorded cluster."""
    known = {ns for r in state.load_all() for ns in r.spec.namespaces}
    return sorted(ns for ns in existing_namespaces(runner)
                  if ns.startswith(NAMESPACE_PREFIX) and ns not in known)


def link_counters(spec: ClusterSpec, runner: Runner = _run) -> dict[str, dict[str, int]]:
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
