"""The bench's pool of ranks (``scaledl.bench.methods_pool``) gives each run the numbers it gives
as its own ``scaledl train`` process, bitwise: every evaluation's test accuracy and every step's
loss, for a synchronous method (allreduce, 2 workers) and a parameter-server method (async SGD
with 1 worker and 1 server rank: with one worker the server's arrival order is fixed, so the run
is deterministic; with two it is not, not even between two runs of their own).  Both have 2
ranks, so they share one pool, and allreduce runs again after async SGD to show that nothing of
one run reaches the next.  A failed run is reported with its error and stops the pool; a run over
its time limit is reported as ``timeout`` and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scaledl.bench.methods import METHODS, BenchSpec, train_command, train_overrides
from scaledl.bench.methods_pool import Pool
from scaledl.bench.methods_run import Runs, child_environment
from scaledl.processes import group_alive
from scaledl.train.metrics import read_metrics

SPEC = BenchSpec(workers=2, epochs=1, dataset="digits", eval_every=5, target=0.5)
JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "allreduce": ("allreduce", {}),
    "async-sgd": ("async-sgd", {"workers": 2}),  # 1 worker + the server rank
}


def _numbers(run_dir: Path) -> tuple[list[float], list[float]]:
    """Every evaluation's test accuracy and every step's loss."""
    records = read_metrics(run_dir / "metrics.jsonl")
    return ([r["test_accuracy"] for r in records if r.get("kind") == "eval"],
            [r["loss"] for r in records if r.get("kind") == "step"])


def _own_process(name: str, out: Path) -> subprocess.Popen[bytes]:
    """The job as its own ``scaledl train`` process (train_command's flags, --workers as the
    pool's job has it)."""
    strategy, change = JOBS[name]
    args = train_command(METHODS[strategy], SPEC, out)
    if "workers" in change:
        args[args.index("--workers") + 1] = str(change["workers"])
    return subprocess.Popen([sys.executable, "-m", "scaledl.cli.main", *args],
                            env=child_environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_pooled_runs_give_their_own_process_numbers(tmp_path: Path) -> None:
    # the reference runs go beside the pool (each run's numbers do not depend on timing)
    own = {name: _own_process(name, tmp_path / "own" / name) for name in JOBS}
    pool = Pool(2, child_environment())
    try:
        for index, name in enumerate(["allreduce", "async-sgd", "allreduce"]):
            strategy, change = JOBS[name]
            run_dir = tmp_path / "pool" / f"{index}-{name}"
            values = {**train_overrides(METHODS[strategy], SPEC, run_dir), **change}
            outcome = pool.run(values, run_dir, timeout_s=150)
            assert outcome.status == "ok", (outcome.reason,
                                            (run_dir / "stderr.txt").read_text()[-2000:])
            assert (run_dir / "summary.json").is_file()
        bad_dir = tmp_path / "pool" / "bad"
        bad = pool.run({**train_overrides(METHODS["allreduce"], SPEC, bad_dir),
                        "model": "no-such-model"}, bad_dir, timeout_s=60)
        assert bad.status == "failed" and "no-such-model" in (bad.reason or "")
        assert not pool.usable and not group_alive(pool.process.pid, own_session=True)
    finally:
        pool.close()
    for process in own.values():
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr.decode()[-2000:]
    for index, name in enumerate(["allreduce", "async-sgd", "allreduce"]):
        pooled = _numbers(tmp_path / "pool" / f"{index}-{name}")
        alone = _numbers(tmp_path / "own" / name)
        assert len(pooled[0]) >= 5 and len(pooled[1]) >= 23  # an evaluation every 5 steps
        assert pooled == alone, name


class _Recording(Runs):
    """Runs that keep every pool they took, to look at them afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[Pool] = []

    def _take_pool(self, size: int) -> Pool:
        pool = super()._take_pool(size)
        self.taken.append(pool)
        return pool


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_a_run_over_its_limit_stops_its_pool(tmp_path: Path) -> None:
    """Even while the pool is still starting: the run is a timeout, the pool's processes are
    gone, and the bench no longer offers that pool to the next run."""
    runs = _Recording()
    try:
        result = runs.run(METHODS["allreduce"], BenchSpec(workers=2, timeout_s=1.0),
                          tmp_path / "slow")
        assert result.status == "timeout" and "1 s limit" in (result.reason or "")
        assert len(runs.taken) == 1 and not runs.taken[0].usable
        assert not group_alive(runs.taken[0].process.pid, own_session=True)
        assert not runs._pools and not runs.taken[0].directory.exists()
    finally:
        runs.close()
