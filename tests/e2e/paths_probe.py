"""Run by every rank of an emulated cluster: shared memory joins exactly the ranks of each host,
and every path per level gives torch.distributed's result.  Prints one JSON line per rank."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives.communicator import communicator_for


def main() -> int:
    topology = scaledl.init()
    rank, p = dist.get_rank(), dist.get_world_size()
    comm = communicator_for(None)
    joined = sorted(peer.global_rank for peer in comm.shm.peers) if comm.shm else []
    failures = []
    for spec in ("hierarchical[shm,p2p]", "torus[shm,p2p]", "hierarchical", "auto"):
        for numel in (5, 70_001, (1 << 22) + 7):
            x = torch.arange(numel, dtype=torch.float64) * (rank + 1)
            want = x.clone()
            scaledl.allreduce(x, algorithm=spec)
            dist.all_reduce(want)
            if not torch.equal(x, want):
                failures.append(f"{spec} {numel}")
    print(json.dumps({"rank": rank, "world": p, "topology": topology.spec, "joined": joined,
                      "failures": failures}), flush=True)
    scaledl.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
