"""scaledl under real MPI launchers: Open MPI's ``mpirun`` and MPICH's ``mpiexec`` (Hydra).

Each launcher starts ``scaledl train`` (which must train exactly as 2 local workers do) and
``launcher_probe.py`` (what ``scaledl.init()`` detected, and collectives against closed forms)
on one host, oversubscribed, and on emulated hosts: the launchers' own remote start-up
(``ssh``) replaced by a stand-in that runs the remote command here inside a UTS namespace
named after the host, so each emulated host has its own host name and the launcher its own
idea of which ranks share a host (2+2 ranks, numbered host by host or round-robin: a 2x2
layout; 2+1: uneven, so flat).  A rank
killed with SIGKILL must end the job promptly with the launcher's report, leaving nothing.

Skipped, with the reason, where a launcher is not installed (.ci/run installs both) or, for the
emulated hosts, where UTS namespaces cannot be made (they need root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.launcher_helpers import (
    Job, check_collectives, clean_env, probe_command, read_reports, require, run_job,
    step_losses, survivors_name, train_args, train_summary,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(200)]

AGENT = """#!/bin/sh
# Stand-in for ssh: 'agent [-options] HOST COMMAND...' runs COMMAND on this machine, through a
# shell as ssh does, in a new UTS namespace whose host name is HOST.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec unshare --uts sh -c "hostname $host && $*"
"""


def _physical_cores() -> int:
    """Cores this process may run on, counted as Open MPI counts slots (not hardware threads)."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(),
                       (topology / "core_id").read_text()))
        except OSError:
            return len(os.sched_getaffinity(0))
    return len(cores)


@dataclass(frozen=True)
class Mpi:
    """One MPI launcher and how it is called."""

    binary: str
    """The launcher's own name (Debian installs both; plain ``mpirun`` is an alternative)."""
    launcher: str
    """What ``scaledl.init()`` must detect under it."""
    command: Callable[[int, str | None, Path | None, list[str]], list[str]]
    """``(ranks, hosts, agent, exported names)`` -> the command line up to the program."""


def _openmpi(ranks: int, hosts: str | None, agent: Path | None, export: list[str]) -> list[str]:
    command = ["mpirun.openmpi", "-np", str(ranks)]
    if ranks > _physical_cores():
        command.append("--oversubscribe")
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    if hosts:
        command += ["--mca", "plm_rsh_agent", str(agent), "-H", hosts]
    elif not (shutil.which("ssh") or shutil.which("rsh")):
        # Open MPI 4 refuses even a one-host job when its remote agent (ssh, else rsh) is not
        # on PATH, as on the H200 host of benchmarks/device/README.md; a one-host job never
        # runs the agent, so any program that exists will do
        command += ["--mca", "plm_rsh_agent", "false"]
    for name in export:
        command += ["-x", name]
    return command


def _mpich(ranks: int, hosts: str | None, agent: Path | None, export: list[str]) -> list[str]:
    command = ["mpiexec.hydra", "-n", str(ranks)]
    if hosts:
        command += ["-launcher", "ssh", "-launcher-exec", str(agent), "-hosts", hosts]
    if export:
        command += ["-genvlist", ",".join(export)]
    return command


OPENMPI = Mpi("mpirun.openmpi", "openmpi", _openmpi)
MPICH = Mpi("mpiexec.hydra", "pmi", _mpich)
LAUNCHERS = [pytest.param(OPENMPI, id="openmpi"), pytest.param(MPICH, id="mpich")]


def _skip_without(mpi: Mpi) -> None:
    reason = require(mpi.binary)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ssh stand-in; skips where a UTS namespace cannot be made."""
    reason = require("unshare")
    if reason is None:
        check = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True)
        if check.returncode != 0:
            reason = ("emulated hosts need UTS namespaces (root): unshare --uts failed: "
                      + check.stderr.strip())
    if reason:
        pytest.skip(reason)
    path = tmp_path_factory.mktemp("agent") / "ssh-stand-in"
    path.write_text(AGENT)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("mpi", LAUNCHERS)
def test_train_matches_local_workers(
    mpi: Mpi, tmp_path: Path, local_training: list[float]
) -> None:
    _skip_without(mpi)
    env = clean_env()
    job = run_job([*mpi.command(2, None, None, ["MASTER_PORT"]), *train_args(tmp_path / "run")],
                  env, tmp_path)
    result = train_summary(tmp_path / "run", job)
    assert result["world_size"] == 2 and result["steps"] == 23
    assert f"launcher={mpi.launcher} rank=0 world_size=2" in job.output
    assert step_losses(tmp_path / "run") == pytest.approx(local_training, rel=1e-5, abs=1e-6)
    assert not job.left_running


@pytest.mark.parametrize("mpi", LAUNCHERS)
def test_three_ranks_on_one_host(mpi: Mpi, tmp_path: Path) -> None:
    _skip_without(mpi)
    job = run_job([*mpi.command(3, None, None, ["MASTER_PORT"]), *probe_command(tmp_path)],
                  clean_env(), tmp_path)
    reports = read_reports(tmp_path, 3, job)
    host = socket.gethostname()
    for rank, report in enumerate(reports):
        assert report["launcher"] == mpi.launcher
        assert (report["local_rank"], report["local_world_size"]) == (rank, 3)
        assert report["master_addr"] == "127.0.0.1"  # one host: loopback without MASTER_ADDR
        assert report["hosts"] == [host] * 3
        assert report["topology"] == "3"
    check_collectives(reports)


A, B = "nodea", "nodeb"
EMULATED = [
    pytest.param(OPENMPI, "nodea:2,nodeb:2", [], [A, A, B, B], "2x2", id="openmpi-block"),
    pytest.param(OPENMPI, "nodea:2,nodeb:2", ["--map-by", "node"], [A, B, A, B], "2x2",
                 id="openmpi-cyclic"),
    pytest.param(OPENMPI, "nodea:2,nodeb:1", [], [A, A, B], "3", id="openmpi-uneven"),
    pytest.param(MPICH, "nodea,nodeb", [], [A, B, A, B], "2x2", id="mpich-cyclic"),
    pytest.param(MPICH, "nodea:2,nodeb:1", [], [A, A, B], "3", id="mpich-uneven"),
]
"""(launcher, host list, placement options, host of each rank, layout scaledl must find)."""


@pytest.mark.parametrize(("mpi", "hosts", "placement", "expected_hosts", "topology"), EMULATED)
def test_emulated_hosts(mpi: Mpi, hosts: str, placement: list[str], expected_hosts: list[str],
                        topology: str, tmp_path: Path, agent: Path) -> None:
    _skip_without(mpi)
    world_size = len(expected_hosts)
    # the emulated host names resolve nowhere: Gloo is told to use loopback
    env = clean_env(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    command = mpi.command(world_size, hosts, agent, ["MASTER_ADDR", "MASTER_PORT"])
    job = run_job([*command, *placement, *probe_command(tmp_path)], env, tmp_path)
    reports = read_reports(tmp_path, world_size, job)
    for rank, report in enumerate(reports):
        host = expected_hosts[rank]
        assert report["launcher"] == mpi.launcher
        assert report["hostname"] == host
        assert report["local_rank"] == expected_hosts[:rank].count(host)
        assert report["local_world_size"] == expected_hosts.count(host)
        assert report["hosts"] == expected_hosts
        assert report["topology"] == report["job_topology"] == topology
    assert reports[0]["hierarchical"] == (topology == "2x2")
    assert ("hierarchical" in reports[0]["allreduce"]) == (topology == "2x2")
    check_collectives(reports)
    assert not job.left_running


def test_ranks_across_hosts_need_master_addr(tmp_path: Path, agent: Path) -> None:
    _skip_without(OPENMPI)
    command = OPENMPI.command(3, "nodea:2,nodeb:1", agent, ["MASTER_PORT"])
    job = run_job([*command, *train_args(tmp_path / "run")], clean_env(), tmp_path)
    errors = [line for line in job.output.splitlines() if line.startswith("scaledl: error:")]
    assert job.returncode == 2, job.output[-4000:]
    assert errors and all("MASTER_ADDR is unset for a 3-rank openmpi job" in line
                          and "-x MASTER_ADDR=" in line for line in errors), job.output[-4000:]
    assert "Traceback" not in job.output


@pytest.mark.parametrize("mpi", LAUNCHERS)
def test_killed_rank_ends_the_job(mpi: Mpi, tmp_path: Path) -> None:
    _skip_without(mpi)
    job = run_job([*mpi.command(3, None, None, ["MASTER_PORT"]),
                   *probe_command(tmp_path, "--kill-rank", "1")], clean_env(), tmp_path)
    assert job.returncode != 0, job.output[-4000:]
    assert not list(tmp_path.glob("rank*.json")), "a rank went on after its peer died"
    assert _launcher_report(mpi, job), job.output[-4000:]
    assert not job.left_running


def _launcher_report(mpi: Mpi, job: Job) -> bool:
    """The launcher's clean report, and the dead rank named by it or by a survivor: the launcher
    reports the first process to end, normally the killed one (Hydra names its pid and signal
    only), but a survivor may get there first, having named the dead rank in its error."""
    if mpi is OPENMPI:
        report = "mpirun.openmpi noticed that process rank" in job.output or (
            "detected that one or more processes exited with non-zero status" in job.output)
        named = "process rank 1 with PID" in job.output and "signal 9" in job.output
    else:
        report = "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in job.output
        named = "Killed (signal 9)" in job.output
    return report and (named or survivors_name(job.output, 1))
