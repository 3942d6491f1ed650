"""Soak of the shared-memory protocol under random delays (docs/reliability.md, "The
shared-memory protocol under skewed schedules").

    python benchmarks/reliability/shm_soak.py [--calls 100000] [--per-run 2000] [--seed 0]
        [--json benchmarks/reliability/shm_soak.json]

Runs ``tests/shm_schedules.py``'s random call sequences (windowed and arena allreduce, async
calls, broadcast and reduce from every root, allgather, reduce_scatter, hierarchical and torus
stages on 2x2, a second communicator, DataParallel steps with float, integer, BatchNorm and no
buffers) on 2, 3 and 4 ranks in turn, each run with its own seed.  Runs alternate between
injected delays (``SCALEDL_SHM_JITTER=SEED:MAX_MS:PROBABILITY``, before and after every
control-word read and write and around every wait) and none.  Every result is checked exactly;
a run that does not finish within its deadline is a hang (each wait gives up after
``SCALEDL_TIMEOUT``, naming the peer).  The soak stops after ``--calls`` calls (counted once per
collective call, not per rank) and reports calls, seeds, hangs, wrong results and time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import shm_schedules  # noqa: E402
from tests.harness import RankFailure, run_ranks  # noqa: E402

JITTERS = ("1:0.3", "0.2:0.5", "")
"""Delays per run, in turn: up to 1 ms at 30% of the points, up to 0.2 ms at half, none."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--per-run", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    totals = {"calls": 0, "runs": 0, "hangs": 0, "wrong": 0, "errors": 0}
    by_kind: dict[str, int] = {}
    runs = []
    run = 0
    while totals["calls"] < args.calls:
        world_size = (2, 3, 4)[run % 3]
        jitter = JITTERS[(run // 3) % len(JITTERS)]
        seed = args.seed * 1_000_000 + run
        calls = min(args.per_run, args.calls - totals["calls"])
        env = {**shm_schedules.WINDOW_ENV, "SCALEDL_TIMEOUT": "20",
               "SCALEDL_SHM_JITTER": f"{seed}:{jitter}" if jitter else ""}
        t0 = time.monotonic()
        row: dict[str, object] = {"world_size": world_size, "seed": seed, "calls": calls,
                                  "jitter_ms_probability": jitter or "none"}
        try:
            results = run_ranks(world_size, shm_schedules.run, seed, calls,
                                timeout=60 + calls * 0.5, env=env)
            wrong = [f for result in results for f in result["failures"]]
            row.update(wrong=len(wrong), first_wrong=wrong[:3])
            totals["wrong"] += len(wrong)
            for kind, count in results[0]["counts"].items():
                by_kind[kind] = by_kind.get(kind, 0) + count
        except RankFailure as failure:
            text = str(failure)
            hang = "did not finish" in text or "within" in text
            totals["hangs" if hang else "errors"] += 1
            row.update(failure=text[-600:])
        row["seconds"] = round(time.monotonic() - t0, 1)
        totals["calls"] += calls
        totals["runs"] += 1
        runs.append(row)
        print(json.dumps(row), flush=True)
        run += 1
    summary = {"totals": totals, "by_kind": by_kind,
               "seconds": round(time.monotonic() - started, 1),
               "load_average": os.getloadavg(), "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if totals["hangs"] == totals["wrong"] == totals["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
