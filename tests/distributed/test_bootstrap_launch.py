"""``scaledl.bootstrap.init`` in real processes started the way launchers start them.

Each test spawns ``python -c`` workers whose environment mimics one launcher, lets every worker
call ``init`` and one ``all_reduce``, and reads what each printed.  Every spawn has a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import free_port

pytestmark = pytest.mark.distributed

PROCESS_TIMEOUT_S = 60.0

WORKER = """
import torch
import torch.distributed as dist
from scaledl import bootstrap

topology = bootstrap.init(timeout=30)
tensor = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(tensor)
print(f"spec={topology.spec} rank={topology.rank} world={dist.get_world_size()} "
      f"sum={tensor.item():g}")
bootstrap.shutdown()
"""

LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "MPI_LOCAL", "SLURM_", "SCALEDL_", "TORCHELASTIC_")
LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT"}


def _base_env() -> dict[str, str]:
    """This environment without any launcher's variables, with one thread per worker."""
    env = {
        name: value for name, value in os.environ.items()
        if name not in LAUNCHER_NAMES and not name.startswith(LAUNCHER_PREFIXES)
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _launch(
    envs: list[dict[str, str]], timeout: float = PROCESS_TIMEOUT_S, worker: str = WORKER,
) -> list[subprocess.CompletedProcess[str]]:
    """Start one worker per environment; wait for all, killing every one after ``timeout``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", worker], env={**_base_env(), **env}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for env in envs
    ]
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def _assert_ok(results: list[subprocess.CompletedProcess[str]]) -> list[str]:
    """Each worker's output, without the line torch 2.8's Gloo prints to standard output for
    every group it connects (``[Gloo] Rank 0 is connected to 1 peer ranks. ...``)."""
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"worker {rank} failed:\n{result.stderr}"
    return ["\n".join(line for line in result.stdout.strip().splitlines()
                      if not line.startswith("[Gloo] ")) for result in results]


def test_torchrun_variables_two_emulated_nodes() -> None:
    port = str(free_port())
    envs = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        for rank in range(2)
    ]
    assert _assert_ok(_launch(envs)) == [
        "spec=1x2 rank=0 world=2 sum=3", "spec=1x2 rank=1 world=2 sum=3"
    ]


def test_openmpi_variables_on_one_host_default_to_loopback() -> None:
    port = str(free_port())
    envs = [
        {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
         "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
         "MASTER_PORT": port}
        for rank in range(2)
    ]
    assert _assert_ok(_launch(envs)) == [
        "spec=2 rank=0 world=2 sum=3", "spec=2 rank=1 world=2 sum=3"
    ]


def test_openmpi_variables_two_nodes_with_explicit_topology() -> None:
    port = str(free_port())
    envs = [
        {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
         "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "SCALEDL_TOPOLOGY": "2"}
        for rank in range(2)
    ]
    assert _assert_ok(_launch(envs)) == [
        "spec=2 rank=0 world=2 sum=3", "spec=2 rank=1 world=2 sum=3"
    ]


def test_no_launcher_is_a_world_of_one() -> None:
    assert _assert_ok(_launch([{}])) == ["spec=1 rank=0 world=1 sum=1"]


def test_topology_that_does_not_match_world_size_fails_with_one_line() -> None:
    port = str(free_port())
    envs = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
         "SCALEDL_TOPOLOGY": "2x2"}
        for rank in range(2)
    ]
    for result in _launch(envs):
        assert result.returncode != 0 and result.stdout == ""
        last_line = result.stderr.strip().splitlines()[-1]
        assert last_line.startswith("ValueError: SCALEDL_TOPOLOGY='2x2' is invalid: ")
        assert "describes 4 ranks but the world size is 2" in last_line


def test_missing_rank_fails_within_the_timeout() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "SCALEDL_TIMEOUT": "2"}
    worker = WORKER.replace("init(timeout=30)", "init()")
    proc = subprocess.run(
        [sys.executable, "-c", worker], env={**_base_env(), **env}, text=True,
        capture_output=True, timeout=PROCESS_TIMEOUT_S,
    )
    assert proc.returncode != 0
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line.startswith("scaledl.bootstrap.RendezvousError: rank 0 of 2 (torchrun) could "
                                "not join the process "
                                f"group at tcp://127.0.0.1:{env['MASTER_PORT']} within 2 s")


REJOIN = """
import time
import torch
import torch.distributed as dist
from scaledl import bootstrap

for group in range(3):
    bootstrap.init(timeout=20)
    tensor = torch.tensor([float(group + dist.get_rank())])
    dist.all_reduce(tensor)
    print(f"group {group} sum={tensor.item():g}")
    if dist.get_rank() == 0:
        time.sleep(1.0)  # the other rank joins its next group while rank 0 holds this one
    bootstrap.shutdown()
"""


@pytest.mark.parametrize("agent_store", [False, True])
def test_init_after_shutdown_joins_a_fresh_group(agent_store: bool) -> None:
    # A fast rank's next init read the last group's keys (a peer's closed address) under
    # torchrun's agent store, or reached rank 0's old store before rank 0 served a new one.
    import torch.distributed as dist

    port = free_port()
    agent = (dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
             if agent_store else None)
    envs = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port), **({"TORCHELASTIC_USE_AGENT_STORE": "True"} if agent else {})}
        for rank in range(2)
    ]
    expected = "group 0 sum=1\ngroup 1 sum=3\ngroup 2 sum=5"
    assert _assert_ok(_launch(envs, worker=REJOIN)) == [expected, expected]
    del agent
