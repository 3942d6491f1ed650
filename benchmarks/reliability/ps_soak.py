"""Soak of the parameter server's wire protocol under random delays (docs/reliability.md).

    python benchmarks/reliability/ps_soak.py [--requests 12000] [--calls 100] [--configs 6]
        [--seed 0] [--json benchmarks/reliability/ps_soak.json]

Runs ``tests/ps_schedules.py``'s random request sequences on 2, 3 and 4 ranks in turn, each run
with its own seed and ``--configs`` parameter-server jobs drawn from it (Async SGD, Async MSGD,
Hogwild SGD, Async EASGD, Hogwild EASGD; the server thread beside rank 0 or 1..world_size-1
dedicated shard servers; 1 to 1000 parameters of float32, float64, float16 or bfloat16), each
worker sending up to ``--calls`` random requests (step, push, exchange, pull, state, a request
the server must reject) and DONE per job.
Runs cycle through the delays of ``JITTERS`` (``SCALEDL_WIRE_JITTER``: before and after posting
every send and receive and around every wait, on workers and servers).  Every reply is checked
exactly against a replay of each shard's updates in version order; a run that does not finish
within its deadline is a hang (every wait of the protocol gives up after
``ps_schedules.TIMEOUT_S``, naming the peer).  The soak stops after ``--requests`` requests
(a worker's request to all shards counts once) and reports requests, seeds, hangs, wrong
results, time and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import ps_schedules  # noqa: E402
from tests.harness import RankFailure, run_ranks  # noqa: E402

JITTERS = ("1:0.3", "0.2:0.5", "5:0.05", "")
"""Delays per run, in turn (MAX_MS:PROBABILITY): up to 1 ms at 30% of the points, up to 0.2 ms
at half, up to 5 ms at 5%, none."""


SOURCES = ("src/scaledl/strategies", "src/scaledl/transport", "tests/ps_schedules.py",
           "tests/harness.py")
"""What the soak exercises (other engineers' uncommitted work elsewhere does not count)."""


def _commit() -> str:
    """The checkout's commit (``+dirty`` when :data:`SOURCES` have uncommitted changes), or
    ``unknown``."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *SOURCES], cwd=ROOT,
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def torch_version() -> str:
    """The torch version the ranks run."""
    import torch

    return str(torch.__version__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--calls", type=int, default=100, help="requests per worker per job")
    parser.add_argument("--configs", type=int, default=6, help="jobs per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()
    totals = {"requests": 0, "shard_requests": 0, "runs": 0, "jobs": 0, "hangs": 0, "wrong": 0,
              "errors": 0}
    by_kind: dict[str, int] = {}
    runs = []
    run = 0
    while totals["requests"] < args.requests:
        world_size = (2, 3, 4)[run % 3]
        jitter = JITTERS[(run // 3) % len(JITTERS)]
        seed = args.seed * 1_000_000 + run
        env = {"SCALEDL_WIRE_JITTER": f"{seed}:{jitter}" if jitter else ""}
        row: dict[str, object] = {"world_size": world_size, "seed": seed,
                                  "jitter_ms_probability": jitter or "none"}
        t0 = time.monotonic()
        try:
            results = run_ranks(world_size, ps_schedules.run, seed, args.calls, None,
                                args.configs, timeout=120 + args.configs * args.calls,
                                env=env)
            wrong = [f for result in results for f in result["failures"]]
            totals["wrong"] += len(wrong)
            requests = results[0]["requests"]
            row.update(requests=requests, configs=results[0]["configs"], wrong=len(wrong),
                       first_wrong=wrong[:3],
                       pauses=sum(sum(result["pauses"]) for result in results))
            totals["shard_requests"] += results[0]["shard_requests"]
            for kind, count in results[0]["kinds"].items():
                by_kind[kind] = by_kind.get(kind, 0) + count
        except RankFailure as failure:
            text = str(failure)
            hang = "did not finish" in text or "within" in text
            totals["hangs" if hang else "errors"] += 1
            requests = 0
            row.update(failure=text[-800:])
        totals["requests"] += requests or args.configs * args.calls  # a failed run counts too
        totals["runs"] += 1
        totals["jobs"] += args.configs
        row["seconds"] = round(time.monotonic() - t0, 1)
        runs.append(row)
        print(json.dumps(row), flush=True)
        run += 1
    seeds = [int(str(r["seed"])) for r in runs]
    summary = {"commit": _commit(), "torch": torch_version(), "cpus": os.cpu_count(),
               "settings": {"calls_per_worker": args.calls, "configs_per_run": args.configs,
                            "world_sizes": [2, 3, 4], "jitter_ms_probability": list(JITTERS),
                            "timeout_s": ps_schedules.TIMEOUT_S},
               "totals": totals, "by_kind": by_kind, "seeds": f"{seeds[0]}..{seeds[-1]}",
               "failed_seeds": [r["seed"] for r in runs if r.get("wrong") or "failure" in r],
               "seconds": round(time.monotonic() - started, 1),
               "load_average_before": [round(v, 2) for v in load_before],
               "load_average_after": [round(v, 2) for v in os.getloadavg()]}
    print(json.dumps(summary, indent=1))
    if args.json:  # the short figures; each run's row is on stdout
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if totals["hangs"] == totals["wrong"] == totals["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
