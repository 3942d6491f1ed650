"""``scaledl cluster up | down | list | run``: an emulated multi-host cluster on this machine.

``up`` builds network namespaces (hosts) joined through a bridge by links shaped with ``tc``;
``run`` starts a command as ``--ranks-per-host`` ranks on every host (on a named cluster, or on an
ephemeral one built for the run and always torn down); ``down`` removes clusters; ``list`` shows
them.  Needs root and iproute2 (see docs/cluster.md).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import random
from pathlib import Path
from typing import Any

from scaledl.cli.logs import label_logs
from scaledl.cli.outputs import check_output_file
from scaledl.cluster import netns, state
from scaledl.cluster.runner import PLACEMENTS, run_on_cluster
from scaledl.cluster.spec import MAX_HOSTS, SHAPERS, ClusterSpec, parse_rate
from scaledl.processes import signals_blocked, signals_raise

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)

MAX_PORT = 65535
"""Highest TCP port number."""
DEFAULT_RATE, DEFAULT_SHAPER = "1gbit", "tbf"
"""A new cluster's links: 1 Gbit/s per host and direction, shaped by a token bucket."""


def _add_link_options(p: argparse.ArgumentParser, hosts_required: bool) -> None:
    p.add_argument("--hosts", type=int, required=hosts_required, default=None,
                   help=f"emulated hosts (1..{MAX_HOSTS})")
    p.add_argument("--rate", default=None,
                   help="link rate per host and direction, tc units (1gbit, 100mbit) or 'none' "
                        f"(default {DEFAULT_RATE})")
    p.add_argument("--shaper", default=None, choices=SHAPERS,
                   help=f"qdisc (default {DEFAULT_SHAPER})")


def _links(args: argparse.Namespace) -> tuple[int | None, str]:
    """``--rate`` in bits/s (None: unshaped) and ``--shaper``, their defaults where not given."""
    return parse_rate(args.rate or DEFAULT_RATE), args.shaper or DEFAULT_SHAPER


def add_parser(subparsers: Any) -> None:
    """Register ``cluster`` and its subcommands."""
    cluster = subparsers.add_parser(
        "cluster", help="emulated multi-host cluster (network namespaces, shaped links)",
        description="Emulate hosts with network namespaces joined by bandwidth-shaped links "
                    "(root and iproute2 needed; no latency emulation: tc netem is missing).")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    up = commands.add_parser("up", help="create a cluster and keep it")
    _add_link_options(up, hosts_required=True)
    up.add_argument("--name", default=None, help="cluster name (default: a fresh c + 6 hex)")
    down = commands.add_parser("down", help="remove clusters (idempotent)")
    down.add_argument("names", nargs="*", help="clusters to remove")
    down.add_argument("--all", action="store_true", help="every cluster and leftover namespace")
    down.add_argument("--stale", action="store_true",
                      help="clusters whose creating process is gone (ephemeral or half built)")
    commands.add_parser("list", help="show clusters")
    run_p = commands.add_parser(
        "run", help="run a command with R ranks on every host",
        description="Run COMMAND as --ranks-per-host ranks on every host of cluster --name, or "
                    "of an ephemeral cluster (--hosts, --rate) created for the run and always "
                    "torn down.  'scaledl ...' runs with this Python.")
    run_p.add_argument("--name", default=None, help="an existing cluster (from 'cluster up')")
    _add_link_options(run_p, hosts_required=False)
    run_p.add_argument("--ranks-per-host", type=int, default=1, help="ranks on each host")
    run_p.add_argument("--placement", default="block", choices=PLACEMENTS,
                       help="rank numbering: block (host by host, default) or cyclic")
    run_p.add_argument("--port", type=int, default=None, help="MASTER_PORT (default random)")
    run_p.add_argument("--timeout", type=float, default=None,
                       help="seconds before every rank is stopped (exit code 124); default: no "
                            "limit, as a job's length is unknown (failures still stop it)")
    run_p.add_argument("--counters", type=Path, default=None,
                       help="write bytes sent/received per host link and loopback here (JSON)")
    run_p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    cluster.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the cluster subcommand."""
    label_logs("scaledl cluster")
    netns.preflight()
    action = args.cluster_command
    if action == "up":
        return _up(args)
    if action == "down":
        return _down(args)
    if action == "list":
        return _list()
    return _run(args)


def _up(args: argparse.Namespace) -> int:
    record = netns.create(args.hosts, *_links(args), args.name)
    spec = record.spec
    print(f"cluster {spec.name}: {spec.hosts} hosts, links {spec.links_text}, "
          f"host 0 at {spec.address(0)}")
    print(f"  run:    scaledl cluster run --name {spec.name} --ranks-per-host 2 -- "
          "scaledl bench collectives")
    print(f"  remove: scaledl cluster down {spec.name}")
    return 0


def _down(args: argparse.Namespace) -> int:
    if not (args.names or args.all or args.stale):
        raise ValueError("'cluster down' needs cluster names, --stale or --all; see "
                         "'scaledl cluster list'")
    records = []
    for name in args.names:
        if state.exists(name):
            records.append(state.load(name))
        else:  # idempotent: a second 'down' finds nothing to do
            print(f"cluster {name} is not recorded in {state.state_dir()}; nothing to remove")
    if args.all or args.stale:
        chosen = {r.spec.name for r in records}
        records += [r for r in state.load_all()
                    if (args.all or r.stale) and r.spec.name not in chosen]
    for record in records:
        deleted = netns.destroy(record.spec)
        print(f"removed cluster {record.spec.name} ({len(deleted)} namespaces)")
    if args.all:
        for namespace in netns.orphan_namespaces():
            netns.destroy_namespace(namespace)
            print(f"removed leftover namespace {namespace}")
    return 0


def _list() -> int:
    records = state.load_all()
    present = netns.existing_namespaces()
    if not records:
        print("no clusters")
    for record in records:
        spec = record.spec
        status = "stale" if record.stale else record.status
        if status == "up" and not set(spec.namespaces) <= present:
            status = "broken (namespaces removed outside scaledl)"
        kind = "ephemeral" if record.ephemeral else "kept"
        print(f"{spec.name:<12} {spec.hosts:>3} hosts  {spec.links_text:>14}  "
              f"10.231.{spec.subnet}.0/24  {status} ({kind}, pid {record.owner_pid})")
    for namespace in netns.orphan_namespaces():
        print(f"leftover namespace {namespace} (remove with 'scaledl cluster down --all')")
    return 0


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command given; end the options with '--' and the command, e.g. "
                         "'-- scaledl bench collectives'")
    return command


def _run(args: argparse.Namespace) -> int:
    command = _command(args)
    if (args.name is None) == (args.hosts is None):
        raise ValueError("'cluster run' needs either --name of a cluster or --hosts for an "
                         "ephemeral one (not both)")
    for flag, value in (("--rate", args.rate), ("--shaper", args.shaper)):
        if args.name is not None and value is not None:
            raise ValueError(f"{flag} {value} does not apply to cluster {args.name}, whose "
                             "links were set by 'cluster up'; drop it, or run on an ephemeral "
                             "cluster (--hosts) with those links")
    if args.ranks_per_host < 1:
        raise ValueError(f"--ranks-per-host {args.ranks_per_host} must be at least 1")
    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout {args.timeout:g} must be a positive number of seconds; leave "
                         "it out to wait without limit")
    if args.port is not None and not 1 <= args.port <= MAX_PORT:
        raise ValueError(f"--port {args.port} is not a TCP port; give one in 1..{MAX_PORT}, or "
                         "leave it out for a random free one")
    if args.counters is not None:
        check_output_file(args.counters, "--counters")
    port = args.port if args.port is not None else random.randint(20000, 40000)
    if args.name is not None:
        spec = state.load(args.name).spec
        missing = sorted(set(spec.namespaces) - netns.existing_namespaces())
        if missing:
            raise ValueError(f"cluster {spec.name} has lost namespace {missing[0]} (removed "
                             f"outside scaledl); remove it with 'scaledl cluster down "
                             f"{spec.name}' and create it again")
        with signals_raise(KeyboardInterrupt):
            try:
                return _run_on(spec, args, command, port)
            except KeyboardInterrupt:
                return 130
    return _run_ephemeral(args, command, port)


def _run_ephemeral(args: argparse.Namespace, command: list[str], port: int) -> int:
    """Allocate, build, run and always tear down a cluster made for this run.

    The spec is in ``spec_holder`` (seen by ``finally`` and the ``atexit`` backstop) from the
    moment its record exists: allocation and the push happen with signals held off.
    """
    rate, shaper = _links(args)
    ClusterSpec("check", args.hosts, rate, 0, shaper)  # bad --hosts/--shaper: fail now
    with signals_raise(KeyboardInterrupt):
        spec_holder: list[ClusterSpec] = []
        teardown = _teardown_once(spec_holder)
        atexit.register(teardown)
        try:
            with signals_blocked() as arrived:
                taken = netns.existing_namespaces()
                record = state.allocate(args.hosts, rate, shaper, None, True, taken)
                spec_holder.append(record.spec)
            if arrived:
                raise KeyboardInterrupt(arrived[0])
            netns.build(record)
            return _run_on(record.spec, args, command, port)
        except KeyboardInterrupt:
            return 130
        finally:
            teardown()
            atexit.unregister(teardown)


def _run_on(spec: ClusterSpec, args: argparse.Namespace, command: list[str], port: int) -> int:
    return run_on_cluster(spec, args.ranks_per_host, command, mode=args.placement, port=port,
                          timeout=args.timeout, counters=args.counters)


def _teardown_once(holder: list[ClusterSpec]) -> Any:
    """Destroy the held cluster with Ctrl-C/SIGTERM/SIGHUP held off, so a second one cannot cut
    it short.

    The spec leaves ``holder`` only after it is gone, so the ``atexit`` backstop retries a
    teardown that failed.
    """
    def teardown() -> None:
        with signals_blocked() as arrived:
            while holder:
                deleted = netns.destroy(holder[-1])
                spec = holder.pop()
                log.info("ephemeral cluster %s removed (%d namespaces)", spec.name, len(deleted))
        if arrived:
            log.warning("%s arrived during the teardown, which finished first", ", ".join(arrived))
    return teardown
