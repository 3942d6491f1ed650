"""Which `auto` choices on Gloo change once native reduce_scatter stages are priced as the whole
allreduce Gloo runs (docs/benchmarks.md, "auto across emulated hosts").

    python benchmarks/cluster/auto-native-stages/choices.py

Compares `choose` with the default cost model against the same model with the stages priced as
a ring reduce_scatter (the earlier stage price; `native` itself was already a whole allreduce),
for one host (2 and 4 ranks) and 2x2, 3x2, 2x4 hosts with shared memory inside each host.
"""

from __future__ import annotations

from dataclasses import replace

from scaledl.collectives import auto
from scaledl.collectives.auto import Fabric, choose
from scaledl.collectives.cost import CostModel
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology

LAYOUTS = {"2": (0, 0), "4": (0,) * 4, "2x2": (0, 0, 1, 1), "3x2": (0, 0, 0, 1, 1, 1),
           "2x4": (0, 0, 1, 1, 2, 2, 3, 3)}
COLLECTIVES = (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALLGATHER)


def main() -> None:
    now = CostModel()
    earlier = replace(now, native_reduce_scatter_allreduce=False)
    whole_native = auto._native_time
    changed = total = 0
    for spec, hosts in LAYOUTS.items():
        topo = Topology.parse(spec) if "x" in spec else Topology((len(hosts),))
        fabric = Fabric(hosts, native_stages=True)
        for collective in COLLECTIVES:
            for nbytes in (4096 << 2 * k for k in range(8)):
                per_rank = 1 if collective is Collective.ALLREDUCE else topo.world_size
                numel = max(nbytes // 4 // per_rank, 1)
                new = choose(collective, topo, numel, 4, now, fabric=fabric).algorithm
                auto._native_time = (  # type: ignore[assignment]
                    lambda c, t, n, i, m, r: whole_native(c, t, n, i, now, r))
                try:
                    old = choose(collective, topo, numel, 4, earlier, fabric=fabric).algorithm
                finally:
                    auto._native_time = whole_native
                total += 1
                if old != new:
                    changed += 1
                    print(f"{spec} {collective.value} {nbytes}: {old} -> {new}")
    print(f"{changed} of {total} choices changed")


if __name__ == "__main__":
    main()
