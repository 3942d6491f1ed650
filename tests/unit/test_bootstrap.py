"""Bootstrap: launcher variables, SLURM host lists, errors, and ``init`` without other processes.

Every test passes its own ``environ`` mapping; none touches ``os.environ``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from scaledl import bootstrap
from scaledl.bootstrap import LaunchEnv, first_slurm_host, read_launch_env, topology_from_hosts
from scaledl.launchers import RANK_VARIABLES
from scaledl.topology import Topology

TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "MASTER_ADDR": "host0", "MASTER_PORT": "1234",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MASTER_ADDR": "head",
}
PMI = {
    "PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
    "MASTER_ADDR": "head",
}
SLURM = {
    "SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_ID": "0",
}
"""A task of an srun step (the batch script without a step id: tests/unit/test_slurm_batch.py)."""


# -- each launcher ----------------------------------------------------------------------------
def test_no_launcher_is_a_job_of_one() -> None:
    assert read_launch_env({}) == LaunchEnv(0, 1, 0, 1, None, 29500, "none", 0)


def test_torchrun() -> None:
    assert read_launch_env(TORCHRUN) == LaunchEnv(3, 8, 1, 2, "host0", 1234, "torchrun", 1)


def test_torchrun_without_local_variables_assumes_one_host() -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}
    launch = read_launch_env(environ)
    assert (launch.local_rank, launch.local_world_size, launch.node_rank) == (1, 2, None)


def test_empty_optional_variable_means_not_given() -> None:
    assert read_launch_env({**TORCHRUN, "LOCAL_RANK": ""}).local_rank == 3 % 2


def test_openmpi() -> None:
    assert read_launch_env(OPENMPI) == LaunchEnv(5, 6, 2, 3, "head", 29500, "openmpi", None)


def test_pmi() -> None:
    assert read_launch_env(PMI) == LaunchEnv(2, 4, 0, 2, "head", 29500, "pmi", None)


def test_slurm_takes_master_from_nodelist() -> None:
    assert read_launch_env(SLURM) == LaunchEnv(6, 8, 2, 4, "gpu07", 29500, "slurm", 1)


def test_slurm_step_counts_win_over_inherited_ntasks_per_node() -> None:
    # a task of `srun --ntasks=2` in `sbatch --ntasks-per-node=3` (as Slurm 22.05 starts it):
    # SLURM_NTASKS_PER_NODE is the script's, inherited (srun reads it as --ntasks-per-node)
    environ = {**SLURM, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
               "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "vm", "SLURM_NTASKS_PER_NODE": "3",
               "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}
    assert read_launch_env(environ).local_world_size == 2


def test_slurm_step_tasks_per_node_reads_this_node() -> None:
    environ = {**SLURM, "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_NODEID": "1",
               "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2",
               "SLURM_STEP_TASKS_PER_NODE": "2,1"}
    assert read_launch_env(environ).local_world_size == 1


def test_slurm_uneven_tasks_per_node_reads_this_node() -> None:
    environ = {**SLURM, "SLURM_NTASKS": "7", "SLURM_NODEID": "2", "SLURM_PROCID": "6",
               "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "3(x2),1"}
    assert read_launch_env(environ).local_world_size == 1


def test_master_variables_override_launcher_defaults() -> None:
    environ = {**SLURM, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "4000"}
    launch = read_launch_env(environ)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.9", 4000)


def test_mpi_on_one_host_defaults_to_loopback() -> None:
    environ = {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"}
    environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "6"
    assert read_launch_env(environ).master_addr == "127.0.0.1"


@pytest.mark.parametrize(
    ("environ", "launcher"),
    [
        ({**SLURM, **OPENMPI, **TORCHRUN}, "torchrun"),
        ({**SLURM, **PMI, **OPENMPI}, "openmpi"),
        ({**SLURM, **PMI}, "pmi"),
        ({"SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"}, "none"),
    ],
)
def test_launcher_priority(environ: dict[str, str], launcher: str) -> None:
    assert read_launch_env(environ).launcher == launcher


# -- SLURM host lists -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("node[01-04,07],gpu5", "node01"),
        ("a[1-2]-ib,b", "a1-ib"),
        ("gpu5", "gpu5"),
        ("gpu5,node[1-3]", "gpu5"),
        ("node[7,3-4]", "node7"),
        ("rack[2-3]-node[010-012]", "rack2-node010"),
    ],
)
def test_first_slurm_host(nodelist: str, host: str) -> None:
    assert first_slurm_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "node[01-04", "node]1[", "[]", "a b"])
def test_first_slurm_host_rejects_malformed_lists(nodelist: str) -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        first_slurm_host(nodelist)


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "pattern"),
    [
        ({**TORCHRUN, "RANK": "x"}, "RANK='x' is not an integer"),
        ({**TORCHRUN, "WORLD_SIZE": "2.0"}, "WORLD_SIZE='2.0' is not an integer"),
        ({**TORCHRUN, "RANK": "-1"}, "RANK='-1' is below 0"),
        ({**TORCHRUN, "RANK": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
        ({**TORCHRUN, "WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0' is below 1"),
        ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "9"}, "LOCAL_WORLD_SIZE=9 exceeds WORLD_SIZE=8"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0' is below 1"),
        ({"RANK": "0"}, "RANK='0' is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE='2' is set but RANK is not"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not"),
        ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "6"}, "OMPI_COMM_WORLD_RANK=6 is not below"),
        ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "q"}, "OMPI_COMM_WORLD_LOCAL_RANK='q'"),
        ({**PMI, "PMI_SIZE": "two"}, "PMI_SIZE='two' is not an integer"),
        ({**PMI, "MPI_LOCALRANKID": "5"}, "MPI_LOCALRANKID=5 is not below MPI_LOCALNRANKS=2"),
        ({**SLURM, "SLURM_PROCID": "8"}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
        ({**SLURM, "SLURM_LOCALID": "4"}, "SLURM_LOCALID=4 is not below SLURM_TASKS_PER_NODE=4"),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "4(2)"}, "SLURM_TASKS_PER_NODE='4\\(2\\)'"),
        ({**SLURM, "SLURM_NODEID": "one"}, "SLURM_NODEID='one'"),
        ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a port number"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0' is not a port number"),
    ],
)
def test_errors_name_the_variable(environ: dict[str, str], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as caught:
        read_launch_env(environ)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "environ",
    [
        {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"},
        {k: v for k, v in PMI.items() if k != "MASTER_ADDR"},
        {k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"},
        {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"},
    ],
)
def test_missing_master_addr_for_a_multi_host_job(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="MASTER_ADDR is unset for a .*-rank .* job"):
        read_launch_env(environ)


def test_single_rank_job_needs_no_master_addr() -> None:
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    assert read_launch_env(environ).master_addr is None


# -- layout from host names -------------------------------------------------------------------
def test_topology_from_hosts_emulated_nodes_on_one_host() -> None:
    topology = topology_from_hosts(["h"] * 4, rank=3, local_world_size=1)
    assert (topology.axes, topology.explicit, topology.rank) == ((1, 4), True, 3)
    assert topology_from_hosts(["h"] * 4, 0, 2).axes == (2, 2)


def test_topology_from_hosts_real_hosts_and_flat() -> None:
    assert topology_from_hosts(["a", "b", "a", "b"], 0, 2).order == (0, 2, 1, 3)
    assert topology_from_hosts(["h"] * 4, 0, 4).axes == (4,)
    assert topology_from_hosts(["h"] * 4, 0, 3).axes == (4,)


# -- init, in this process --------------------------------------------------------------------
@pytest.fixture()
def clean_group() -> Iterator[None]:
    assert not dist.is_initialized()
    try:
        yield
    finally:
        bootstrap.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"backend": "ucc"}, "backend 'ucc' is unknown; use one of gloo, nccl, mpi"),
        ({"environ": {"SCALEDL_TIMEOUT": "soon"}}, "SCALEDL_TIMEOUT='soon' is not a number"),
        ({"timeout": 0}, "timeout 0:00:00 must be positive"),
        ({"topology": "3"}, "'3' describes 3 ranks but the world size is 1"),
        ({"topology": Topology(axes=(2,))}, "topology 2 describes 2 ranks but the world size is 1"),
        ({"environ": {"SCALEDL_TOPOLOGY": "2x2"}}, "SCALEDL_TOPOLOGY='2x2' is invalid"),
    ],
)
def test_init_rejects_bad_arguments_before_joining(
    clean_group: None, kwargs: dict[str, Any], pattern: str
) -> None:
    kwargs.setdefault("environ", {})
    with pytest.raises(ValueError, match=pattern):
        bootstrap.init(**kwargs)
    assert not dist.is_initialized()


def test_init_single_process_and_reuse(clean_group: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="scaledl.bootstrap"):
        topology = bootstrap.init(environ={})
    assert topology == Topology.flat(1) and dist.get_world_size() == 1
    assert "launcher=none rank=0 world_size=1 backend=gloo topology=1 timeout=300s" in caplog.text
    assert caplog.text.count("scaledl init:") == 1
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    group = dist.group.WORLD
    with caplog.at_level("INFO", logger="scaledl.bootstrap"), pytest.warns(
            UserWarning, match=r"already exists \(backend gloo\), so backend='nccl' and "
                               r"timeout=5 changed nothing; call scaledl.shutdown\(\) first"):
        again = bootstrap.init(environ={}, topology="1", timeout=5, backend="nccl")
    assert again.explicit and dist.group.WORLD is group
    assert "launcher=existing group" in caplog.text and "timeout=kept" in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the group's own backend, no timeout: nothing to say
        bootstrap.init(environ={}, backend="gloo")
    bootstrap.shutdown()
    assert not dist.is_initialized()
    bootstrap.shutdown()  # a second shutdown is harmless


def test_init_multi_rank_passes_address_rank_and_timeout(
    clean_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    met: list[tuple[str, int, int, timedelta]] = []

    def rendezvous(url: str, rank: int, world: int, timeout: timedelta) -> Any:
        met.append((url, rank, world, timeout))
        yield dist.HashStore(), rank, world  # type: ignore[attr-defined]

    monkeypatch.setattr(bootstrap, "rendezvous", rendezvous)
    monkeypatch.setattr(bootstrap, "_STORES", {})
    # every (pretend) rank reports the same host and layout request as this one
    monkeypatch.setattr(dist, "all_gather_object",
                        lambda out, obj: out.__setitem__(slice(None), [obj] * len(out)))
    monkeypatch.setattr(bootstrap, "over_group",
                        lambda *a, **k: lambda values: [list(values)] * 8)
    environ = {**TORCHRUN, "SCALEDL_TIMEOUT": "12.5"}
    topology = bootstrap.init(backend="gloo", topology="2x4", environ=environ)
    assert (topology.axes, topology.rank) == ((2, 4), 3)
    assert met == [("tcp://host0:1234", 3, 8, timedelta(seconds=12.5))]
    (args, kwargs), = calls
    assert args == ("gloo",) and isinstance(kwargs.pop("store"), dist.PrefixStore)
    assert kwargs == {"rank": 3, "world_size": 8, "timeout": timedelta(seconds=12.5),
                      "device_id": None}
    calls.clear()
    bootstrap.init(backend="GLOO", timeout=timedelta(seconds=3), topology="8",
                   environ={**environ, "MASTER_ADDR": "::1"})
    assert met[1][0] == "tcp://[::1]:1234"
    assert calls[0][1]["timeout"] == timedelta(seconds=3)


def _group_left_at_exit(statements: str) -> str:
    """What a hook that runs after scaledl's exit hooks sees: is a process group still up?"""
    code = ("import atexit, torch.distributed as dist\n"  # registered first, so it runs last
            "atexit.register(lambda: print('left', dist.is_initialized()))\n" + statements)
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_group_init_made_is_destroyed_at_exit_and_a_users_group_is_left() -> None:
    """A script that never calls scaledl.shutdown() (docs/launching.md's one-liner) left its
    Gloo group to the interpreter's teardown, which aborted 4 exits in 16 under mpiexec on
    2 ranks ("terminate called without an active exception"); none in 16 after."""
    assert _group_left_at_exit("import scaledl\nscaledl.init()") == "left False"
    theirs = ("dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
              "import scaledl\nscaledl.init()")
    assert _group_left_at_exit(theirs) == "left True"


def test_a_rendezvous_port_in_use_is_named_with_the_fix() -> None:
    """A second job on the host with the same MASTER_PORT: torch fails at once with EADDRINUSE,
    which the message called a timeout ("within 300 s") and blamed on the address."""
    import socket

    try:  # bound as TCPStore binds (every address, IPv6 and IPv4), so its bind must fail
        taken = socket.socket(socket.AF_INET6)
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        taken.bind(("::", 0))
    except OSError:
        taken = socket.socket(socket.AF_INET)
        taken.bind(("0.0.0.0", 0))
    with taken:
        taken.listen()
        port = taken.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        with pytest.raises(bootstrap.RendezvousError,
                           match=rf"port {port} is in use, likely by another job on this host; "
                                 r"export MASTER_PORT=<a free port>"):
            bootstrap.init(environ=env, timeout=5)
    assert not dist.is_initialized()


def test_a_group_the_script_destroys_itself_is_freed_at_once() -> None:
    """init() remembers the group it made only weakly: ``dist.destroy_process_group()`` right
    after it (torch's usual idiom) must free the group, its threads and its sockets then, not
    at the interpreter's very end."""
    import gc
    import weakref

    bootstrap.init(environ={}, topology="1")
    assert bootstrap.owns_world()
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()
    assert group() is None and not bootstrap.owns_world()
