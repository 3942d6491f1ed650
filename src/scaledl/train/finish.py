"""The end of a run: every rank's timeline and staleness brought to rank 0, which writes the
merged timeline, the summary record and the plots.

Synchronous strategies end with collectives over every rank (an allgather of the staleness
counts, a barrier so every timeline part is on disk).  Asynchronous strategies must not: a
worker that died was dropped by the parameter server, and a collective would wait for it until
the timeout.  There each rank leaves a small report file in ``<run>/.ranks/`` instead (workers
before they tell the server they are done, servers once every worker is done or dropped), and
rank 0, once its server has seen every worker finish or drop (or, with dedicated servers, once
every server's report is there), reads the reports of the ranks that were not dropped.  The run
directory is shared between hosts anyway (checkpoints are loaded on every rank).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaledl import collectives
from scaledl.strategies.parameter_server import ParameterServerStrategy
from scaledl.train.metrics import RunStats

__all__ = ["gather_staleness", "end_asynchronously", "write_report", "wait_for_reports",
           "clear_reports", "staleness_of", "world_barrier", "REPORTS_DIR"]

log = logging.getLogger(__name__)

REPORTS_DIR = ".ranks"
"""Directory of the run holding the asynchronous ranks' end-of-run reports."""
_POLL_S = 0.05
_NOTICE_EVERY_S = 60.0


def staleness_of(pairs: list[tuple[int, int] | None]) -> list[float | None] | None:
    """Mean staleness per rank from ``(pushes, staleness sum)`` pairs (None for a rank that
    pushed nothing or did not report); None when no rank pushed."""
    if not any(pair and pair[0] for pair in pairs):
        return None
    return [pair[1] / pair[0] if pair and pair[0] else None for pair in pairs]


def gather_staleness(pushes: int, staleness_sum: int, world_size: int,
                     device: torch.device | None = None) -> list[float | None] | None:
    """Every rank's mean staleness, gathered on every rank (a collective of every rank, on
    ``device``: the process group's, the CPU by default)."""
    mine = torch.tensor([pushes, staleness_sum], dtype=torch.int64, device=device)
    everyone = torch.zeros(world_size * 2, dtype=torch.int64, device=device)
    collectives.allgather(everyone, mine, algorithm="native")
    rows = everyone.view(-1, 2).tolist()
    return staleness_of([(int(a), int(b)) for a, b in rows])


def _path(out: Path, rank: int) -> Path:
    return out / REPORTS_DIR / f"rank-{rank:05d}.json"


def write_report(out: Path, rank: int, report: dict[str, Any]) -> None:
    """Leave this rank's end-of-run report (atomically: a reader never sees half of it)."""
    path = _path(out, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)


def wait_for_reports(out: Path, ranks: list[int], timeout_s: float | None
                     ) -> dict[int, dict[str, Any]]:
    """The reports of ``ranks``, waiting up to ``timeout_s`` (None: as long as it takes, with a
    log line every minute) for the missing ones; a rank whose report does not come is left out
    with a warning."""
    found: dict[int, dict[str, Any]] = {}
    start = last_notice = time.monotonic()
    while True:
        for rank in ranks:
            if rank not in found and _path(out, rank).is_file():
                found[rank] = json.loads(_path(out, rank).read_text())
        missing = [rank for rank in ranks if rank not in found]
        now = time.monotonic()
        if not missing:
            return found
        if timeout_s is not None and now - start > timeout_s:
            log.warning("no end-of-run report from rank(s) %s after %g s; leaving them out of "
                        "the summary", missing, timeout_s)
            return found
        if now - last_notice > _NOTICE_EVERY_S:
            log.info("waiting for the end-of-run reports of rank(s) %s", missing)
            last_notice = now
        time.sleep(_POLL_S)


def clear_reports(out: Path) -> None:
    """Remove the reports directory (rank 0, at the end and when a run starts)."""
    shutil.rmtree(out / REPORTS_DIR, ignore_errors=True)


def world_barrier() -> None:
    """Every rank has reached the end (synchronous strategies)."""
    dist.barrier()


def end_asynchronously(strategy: ParameterServerStrategy, out: Path, rank: int,
                       world_size: int, stats: RunStats, timeout_s: float
                       ) -> tuple[list[float | None] | None, list[int]]:
    """Reports instead of collectives: every rank but 0 leaves its report (a worker before it
    says DONE, so rank 0 finds it once its server has seen the DONE); rank 0 says DONE, learns
    who was dropped from its own server thread or the dedicated servers' reports, and reads the
    others' reports.  Returns rank 0's ``(staleness per rank, dropped ranks)``."""
    report = {"pushes": stats.pushes, "staleness_sum": stats.staleness_sum,
              "dropped": strategy.dropped_workers}
    if rank != 0:
        write_report(out, rank, report)
        strategy.finish()
        return None, []
    strategy.finish()
    layout = strategy.layout
    servers = [] if layout is None or layout.servers == 0 else layout.server_ranks
    dropped = set(strategy.dropped_workers)
    for other in wait_for_reports(out, servers, None).values():
        dropped.update(other["dropped"])
    live = [r for r in range(1, world_size) if r not in dropped]
    reports = wait_for_reports(out, live, timeout_s)
    reports[0] = report
    if dropped:
        log.warning("worker rank(s) %s died and were dropped; the others finished",
                    sorted(dropped))
    pairs = [(int(reports[r]["pushes"]), int(reports[r]["staleness_sum"]))
             if r in reports else None for r in range(world_size)]
    return staleness_of(pairs), sorted(dropped)
