"""``scaledl run``: start a training command as N local processes, like ``horovodrun``.

    scaledl run -np 4 python train.py --epochs 3
    scaledl run -np 4 -H localhost:4 --algorithm ring python train.py

The command runs under torch's elastic launcher (the machinery of torchrun, which ``scaledl
train`` also uses) with a standalone rendezvous on this machine: every process gets torchrun's
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...), so ``hvd.init()`` and
``scaledl.init()`` join without arguments.  When a process fails the launcher stops the others
(their process groups get SIGTERM, then SIGKILL) and ``scaledl run`` exits with the exit code of
the first process that failed (``128 + N`` when signal ``N`` killed it); Ctrl-C or SIGTERM stops
everything.  When the job has ended, however it ended, whatever a rank left running in its
process group is stopped the same way, and a rank dies with a launcher killed by SIGKILL (each
starts through :mod:`scaledl.launch.exec_rank`).  The launcher's logs go to a temporary directory
removed at the end.

``-H``/``--hosts`` and ``--hostfile`` take Horovod's host lists, but only this machine's names
(``localhost``, ``127.0.0.1``, ``::1``, its host name): processes on other hosts are refused,
with the launchers to use instead (torchrun on every host, ``mpirun``, ``srun``; see
docs/horovod.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from scaledl.launch.exec_rank import PID_DIR_ENV
from scaledl.cli.logs import label_logs
from scaledl.launch.shared_agent import run_agent
from scaledl.launch.local import under_launcher
from scaledl.launch.policy import SHUTDOWN_GRACE_S
from scaledl.horovod.runtime import ALGORITHM_ENV, Algorithms
from scaledl.processes import stop_groups

__all__ = ["add_parser", "run", "parse_hosts", "local_slots"]

log = logging.getLogger(__name__)

def add_parser(subparsers: Any) -> None:
    """Register ``scaledl run``."""
    parser = subparsers.add_parser(
        "run", help="run a command as N local processes (like horovodrun)",
        description="Start COMMAND as N processes on this machine under torch's elastic "
                    "launcher, e.g. scaledl run -np 4 python train.py",
    )
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, default=None,
                        help="number of processes (default: the slots of -H/--hostfile)")
    parser.add_argument("-H", "--hosts", default=None,
                        help="host list host:slots,... (this machine's names only)")
    parser.add_argument("--hostfile", default=None,
                        help="file of 'host slots=N' or 'host:N' lines (this machine only)")
    parser.add_argument("--algorithm", default=None,
                        help=f"collective algorithm(s) for scaledl.horovod (sets {ALGORITHM_ENV})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command to run, e.g. python train.py --lr 0.1")
    parser.set_defaults(handler=run)


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"a:2,b"`` -> ``[("a", 2), ("b", 1)]``; ``ValueError`` naming a malformed entry."""
    hosts = []
    for entry in text.replace("\n", ",").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, colon, slots = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if not colon:
            name, slots = entry, "1"
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"host entry {entry!r} is not HOST or HOST:SLOTS with SLOTS >= 1")
        hosts.append((name, int(slots)))
    if not hosts:
        raise ValueError(f"host list {text!r} names no host; write e.g. localhost:4")
    return hosts


def _hostfile(path: str) -> str:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read --hostfile {path!r}: {error.strerror}") from None
    entries = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = [w.removeprefix("slots=") for w in words[1:] if w.startswith("slots=")]
        entries.append(f"{words[0]}:{slots[0]}" if slots else words[0])
    return ",".join(entries)


def _this_machine() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
    for name in (socket.gethostname(), socket.getfqdn()):
        names.update({name, name.split(".")[0]})
    return names


def local_slots(hosts: list[tuple[str, int]]) -> int:
    """Slots of a host list that names only this machine; ``ValueError`` for any other host."""
    local = {name.lower() for name in _this_machine()}  # host names know no case
    for name, _ in hosts:
        if name.lower() not in local:
            raise ValueError(
                f"host {name!r} is not this machine: scaledl run starts processes here only; on "
                "several hosts use torchrun on each host, mpirun or srun (see docs/horovod.md)")
    return sum(slots for _, slots in hosts)


def _process_count(args: argparse.Namespace) -> int:
    if args.hosts is not None and args.hostfile is not None:
        raise ValueError("give -H/--hosts or --hostfile, not both")
    text = args.hosts if args.hosts is not None else (
        _hostfile(args.hostfile) if args.hostfile is not None else None)
    slots = local_slots(parse_hosts(text)) if text is not None else None
    count = args.num_proc if args.num_proc is not None else slots
    if count is None:
        raise ValueError("give the number of processes: scaledl run -np N COMMAND")
    if count < 1:
        raise ValueError(f"-np {count} must be at least 1")
    if slots is not None and count > slots:
        raise ValueError(f"-np {count} exceeds the {slots} slots of the host list; raise the "
                         "slots (-H localhost:N) or lower -np")
    return count


_INTERPRETERS = {".py": "python", ".sh": "bash"}
"""The interpreter to suggest for a script without a ``#!`` line, by its suffix."""


def _interpreter(path: Path) -> str | None:
    """The program that runs script ``path``: its ``#!`` line's (``env`` looked through), else
    the usual one for its suffix; None when neither tells."""
    try:
        with path.open("rb") as script:
            first = script.readline(256).decode("utf-8", "replace")
    except OSError:
        first = ""
    words = first[2:].split() if first.startswith("#!") else []
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
    if words:
        return Path(words[0]).name
    return _INTERPRETERS.get(path.suffix.lower())


def _not_runnable(name: str, count: int, rest: list[str]) -> str:
    """Why ``name``, which exec cannot start, is no command, and how to run it instead."""
    path = Path(name)
    if path.is_dir():
        return f"command {name!r} is a directory; name the program to run in it"
    if not path.is_file():
        return f"command {name!r} was not found (not a file, nor on PATH)"
    interpreter = _interpreter(path)
    line = " ".join(["scaledl run -np", str(count), interpreter or "INTERPRETER", name, *rest])
    run_it = f"run it with its interpreter ({line})"
    if not os.access(path, os.X_OK):
        return (f"command {name!r} is not executable (a file without execute permission); "
                f"{run_it}, or make it executable (chmod +x {name})"
                + ("" if "/" in name else f" and write ./{name}"))
    return (f"command {name!r} is a file here, but a command without a '/' is looked up on PATH; "
            f"write ./{name}, or {run_it}")


def _command(args: argparse.Namespace, count: int) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("give the command to run, e.g. scaledl run -np 2 python train.py")
    if shutil.which(command[0]) is None:
        raise ValueError(_not_runnable(command[0], count, command[1:]))
    return command


def run(args: argparse.Namespace) -> int:
    """Check the arguments, then run the command on the processes; return the exit code."""
    label_logs("scaledl run")
    count = _process_count(args)
    command = _command(args, count)
    if under_launcher():
        raise ValueError("scaledl run is itself a launcher; under torchrun, mpirun or srun run "
                         "the command directly")
    if args.algorithm is not None:
        try:
            Algorithms.parse(args.algorithm)  # every rank would fail alike after launch
        except ValueError as error:
            raise ValueError(f"--algorithm {args.algorithm!r}: {error}") from None
        os.environ[ALGORITHM_ENV] = args.algorithm
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return _launch(count, command)


def _launch(count: int, command: list[str]) -> int:
    log.info("%d processes: %s", count, " ".join(command))
    with tempfile.TemporaryDirectory(prefix="scaledl-run-") as pids:
        try:
            outcome = run_agent(count, sys.executable, ["-m", "scaledl.launch.exec_rank", *command],
                                env={PID_DIR_ENV: pids})
        finally:  # what the ranks left running in their process groups
            stop_groups([int(p.name) for p in Path(pids).iterdir() if p.name.isdigit()],
                        SHUTDOWN_GRACE_S, SHUTDOWN_GRACE_S)
    if outcome.rank is not None:
        log.error("rank %d %s; the other processes were stopped", outcome.rank,
                  outcome.cause)
    return outcome.code
