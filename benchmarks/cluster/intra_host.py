"""Intra-host phase cost: a 2-rank allreduce inside each host, both hosts at once.

That is the traffic of hierarchical's intra-host reduce-scatter + allgather.  Run as
``scaledl cluster run --name N --ranks-per-host 2 -- python benchmarks/cluster/intra_host.py``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    for mib in (16, 64):
        buffer = torch.ones(mib << 18)
        times = []
        for _ in range(6):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer, group=mine)
            dist.barrier()
            times.append(time.perf_counter() - start)
        if rank == 0:
            median = sorted(times[1:])[2]
            print(f"intra-host 2-rank allreduce on both hosts at once, {mib} MiB: "
                  f"{median * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
