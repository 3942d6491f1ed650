"""Cross-host point-to-point throughput under ``scaledl cluster run --ranks-per-host 2``.

``python p2p_flows.py MIB FLOWS``: with FLOWS=1 rank 0 sends MIB to rank 2 (other host); with
FLOWS=2 ranks 0 -> 2 and 1 -> 3 each send MIB/2 at the same time.  Median of 3 after a warm-up.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total, flows = int(sys.argv[1]) << 20, int(sys.argv[2])
    times = []
    for _ in range(4):
        dist.barrier()
        start = time.perf_counter()
        if flows == 1:
            buffer = torch.zeros(total // 4)
            if rank == 0:
                dist.send(buffer, 2)
            elif rank == 2:
                dist.recv(buffer, 0)
        else:
            buffer = torch.zeros(total // 8)
            if rank in (0, 1):
                dist.send(buffer, rank + 2)
            else:
                dist.recv(buffer, rank - 2)
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        median = sorted(times[1:])[1]
        print(f"flows={flows} total={total >> 20}MiB time={median * 1e3:.1f}ms "
              f"rate={total / median / 1e6:.1f}MB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
