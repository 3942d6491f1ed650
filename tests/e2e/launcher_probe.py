"""One rank of a launcher test: join the job with ``scaledl.init()``, run collectives, report.

Run by a real launcher (``mpirun``, ``mpiexec``, ``srun``, torchrun) as
``python launcher_probe.py OUT_DIR [--kill-rank R]``.  Every rank writes ``OUT_DIR/rank<R>.json``
with what the launcher told it, what ``scaledl.init()`` agreed on (topology, every rank's host)
and the results of each collective, computed on rank-seeded data so the test can check them
against closed forms.  With ``--kill-rank R`` rank ``R`` SIGKILLs itself after one allreduce and
the others go on to the next one, which must fail promptly rather than hang.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import torch

import scaledl
from scaledl.launchers import read_launch_env
from scaledl.topology import current_job

NUMEL = 1001
"""Elements per rank in every collective: odd, so no algorithm splits it evenly."""


def _hierarchical(topology: scaledl.Topology) -> bool:
    """Several axes of more than one rank: the layouts hierarchical allreduce needs."""
    return sum(1 for size in topology.axes if size > 1) > 1


def _collectives(topology: scaledl.Topology) -> dict[str, Any]:
    """Allreduce (each algorithm that fits the layout), allgather and broadcast on rank data."""
    rank, world_size = topology.rank, topology.world_size
    algorithms = ["auto", "native", "ring", "halving_doubling", "tree"]
    if _hierarchical(topology):
        algorithms.append("hierarchical")
    sums = {}
    for algorithm in algorithms:
        tensor = torch.full((NUMEL,), float(rank + 1))
        scaledl.allreduce(tensor, algorithm=algorithm)
        sums[algorithm] = sorted(set(tensor.tolist()))
    gathered = torch.zeros(world_size * 3)
    scaledl.allgather(gathered, torch.full((3,), float(rank)))
    root = world_size - 1
    broadcast = torch.full((5,), float(rank))
    scaledl.broadcast(broadcast, src=root)
    return {"allreduce": sums, "allgather": gathered.tolist(),
            "broadcast": sorted(set(broadcast.tolist()))}


def _kill_after_one_allreduce(rank: int, kill_rank: int) -> None:
    """Every rank completes one allreduce; then ``kill_rank`` dies and the others continue."""
    tensor = torch.ones(NUMEL)
    scaledl.allreduce(tensor, algorithm="ring")
    if rank == kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    scaledl.allreduce(tensor, algorithm="ring")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--kill-rank", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    launch = read_launch_env()
    topology = scaledl.init(timeout=float(os.environ.get("PROBE_TIMEOUT_S", "60")))
    job = current_job()
    assert job is not None
    report: dict[str, Any] = {
        "launcher": launch.launcher, "rank": topology.rank, "world_size": topology.world_size,
        "local_rank": launch.local_rank, "local_world_size": launch.local_world_size,
        "node_rank": launch.node_rank, "master_addr": launch.master_addr,
        "hostname": socket.gethostname(), "topology": topology.spec,
        "hierarchical": _hierarchical(topology), "hosts": list(job.hosts),
        "job_topology": job.topology.spec,
    }
    if args.kill_rank is not None:
        _kill_after_one_allreduce(topology.rank, args.kill_rank)
        report["survived"] = True
    else:
        report.update(_collectives(topology))
    (args.out / f"rank{topology.rank}.json").write_text(json.dumps(report))
    scaledl.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
