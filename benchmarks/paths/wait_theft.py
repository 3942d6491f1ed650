"""What a waiting rank takes from the rank it shares a core with.

A shared-memory wait (``scaledl.transport.shm``) spins, yields, then naps.  With more ranks
than cores the awaited peer often runs on the waiter's own core, and every wake-up of the
waiter preempts it.  This script times a one-thread matrix loop (the "worker") alone and beside
a process that waits, both pinned to core 0 (``--unpinned --workers 2 --waiters 2``: two of
each, placed by the scheduler on every core), the waiting done in one of these ways:

- ``scaledl``: ``ShmGroup._wait`` itself (``SPINS`` checks, ``sched_yield`` for ``YIELD_S``,
  then naps of :func:`scaledl.transport.shm.nap_seconds`), for a peer that arrives every
  ``--wait-ms`` (a straggler per training step);
- ``before``: the same wait with every nap 50 us (``NAP_MAX_S = NAP_S``), as it was before
  its naps grew;
- ``nap1ms``: naps of 1 ms; ``yield``: ``sched_yield`` in a loop; ``none``: no second process.

Modes run interleaved, ``--repeats`` rounds of each; prints one JSON line per mode with the
worker's median time and its ratio to ``none``.

Usage (repository root, venv active, nothing else running; Linux):
    python benchmarks/paths/wait_theft.py [--repeats 5] [--wait-ms 30] [--samples 5]
                                          [--unpinned] [--workers 1] [--waiters 1]
                                          [--threads 1]   (0: torch's default threads)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MODES = ("none", "before", "scaledl", "nap1ms", "yield")

_WAITER = """
import os, sys, time
from types import SimpleNamespace
import numpy as np
from scaledl.transport import shm
mode, period, pinned = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
if pinned:
    os.sched_setaffinity(0, {0})
if mode == "before":
    shm.NAP_MAX_S = shm.NAP_S  # every nap 50 us: the schedule before naps grew
deadline = [0.0]
# The wait's own code on a word that never arrives, ended by the clock instead (``_done``);
# it spins first, as it does when every rank has a core (``ShmGroup.spins``).
group = SimpleNamespace(_words=[np.zeros(1, np.int64)], spins=shm.SPINS,
                        waits=shm.WaitCounts(), _pause=lambda point: None,
                        _done=lambda *args: time.monotonic() >= deadline[0],
                        _check_peer=lambda *args: None)
print("ready", flush=True)
while True:
    if mode == "nap1ms":
        time.sleep(1e-3)
    elif mode == "yield":
        os.sched_yield()
    else:  # the shared-memory wait itself, for a peer that arrives every period
        deadline[0] = time.monotonic() + period
        shm.ShmGroup._wait(group, 0, 0, 1, "arrive")
"""


_WORKER = """
import os, statistics, sys, time
import torch
if int(sys.argv[3]):
    torch.set_num_threads(int(sys.argv[3]))
if sys.argv[1] == "1":
    os.sched_setaffinity(0, {0})
def work():
    a = torch.randn(256, 256)
    begin = time.perf_counter()
    for _ in range(300):
        a = (a @ a).tanh_()
    return time.perf_counter() - begin
work()
print("ready", flush=True)
sys.stdin.readline()
print(statistics.median(work() for _ in range(int(sys.argv[2]))), flush=True)
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    """A child running ``code``, once it has printed that it is ready (torch's import alone
    takes a core for a second, which must not overlap the measurement)."""
    child = subprocess.Popen([sys.executable, "-c", code, *args], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()
    return child


def _measure(mode: str, args: argparse.Namespace) -> float:
    """The workers' median loop time beside ``args.waiters`` waiters of ``mode``."""
    pinned = "1" if args.pinned else "0"
    waiters = [] if mode == "none" else [
        _start(_WAITER, mode, str(args.wait_ms / 1e3), pinned) for _ in range(args.waiters)]
    workers = [_start(_WORKER, pinned, str(args.samples), str(args.threads))
               for _ in range(args.workers)]
    try:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        return statistics.median(float(w.stdout.readline()) for w in workers if w.stdout)
    finally:
        for child in waiters + workers:
            child.kill()
            child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wait-ms", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=5, help="worker loops per measurement")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--waiters", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per worker (0: torch's default)")
    parser.add_argument("--unpinned", dest="pinned", action="store_false",
                        help="leave every process to the scheduler instead of core 0")
    args = parser.parse_args()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            times[mode].append(_measure(mode, args))
    alone = statistics.median(times["none"])
    for mode in MODES:
        median = statistics.median(times[mode])
        print(json.dumps({"mode": mode, "workers": args.workers, "waiters": args.waiters,
                          "threads": args.threads or "default",
                          "pinned": args.pinned, "wait_ms": args.wait_ms,
                          "median_ms": round(median * 1e3, 1), "ratio": round(median / alone, 3),
                          "runs_ms": [round(t * 1e3, 1) for t in times[mode]],
                          "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
