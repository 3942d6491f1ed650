"""The per-worker-agents launcher's decisions, with stand-in agents (small processes that write
an agent report and exit, or hang): a dead plain worker of an asynchronous job is dropped, a
dead rank 0 stops the job, a worker still running long after rank 0 finished is stopped, and a
lost node (an agent gone without a report) does not fail an elastic job."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from scaledl.launch import agents
from scaledl.launch.policy import FaultPolicy

ASYNC = FaultPolicy(drop_dead_workers=True, essential_ranks=(0,))


def _stand_ins(monkeypatch: pytest.MonkeyPatch, behaviours: list[str]) -> None:
    """Node ``i`` runs ``behaviours[i]``: ``ok``, ``dies``, ``hangs`` or ``lost``."""
    def command(node: int, port: int, run_id: str, nproc: int, policy: FaultPolicy,
                directory: Path, entrypoint: str, args: Sequence[str]) -> list[str]:
        behaviour = behaviours[node]
        report: dict[str, Any] = {"failures": {}, "succeeded": [node]}
        if behaviour == "dies":
            report = {"failures": {str(node): {"exitcode": -9, "cause": "died (SIGKILL)",
                                               "time": time.time()}}, "succeeded": []}
        script = (f"import json, os, time, signal\n"
                  f"if {behaviour!r} == 'hangs': time.sleep(600)\n"
                  f"if {behaviour!r} == 'lost': os.kill(os.getpid(), signal.SIGKILL)\n"
                  f"open({str(directory / f'agent-{node}.json')!r}, 'w').write("
                  f"{json.dumps(json.dumps(report))})\n")
        return [sys.executable, "-c", script]

    monkeypatch.setattr(agents, "_agent_command", command)


def _launch(tmp_path: Path, policy: FaultPolicy, nproc: int) -> agents.JobOutcome:
    return agents._run_once(nproc, policy, tmp_path, sys.executable, [], "run")


def test_a_dead_plain_worker_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch, ["ok", "ok", "dies"])
    outcome = _launch(tmp_path, ASYNC, 3)
    assert outcome.code == 0 and outcome.dropped == (2,)


def test_a_dead_rank_0_stops_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch, ["dies", "hangs", "ok"])
    started = time.monotonic()
    outcome = _launch(tmp_path, ASYNC, 3)
    assert (outcome.code, outcome.rank, outcome.cause) == (137, 0, "died (SIGKILL)")
    assert time.monotonic() - started < 30, "the hanging agent was not stopped"


def test_a_worker_running_long_after_rank_0_finished_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agents, "STRAGGLER_GRACE_S", 0.5)
    _stand_ins(monkeypatch, ["ok", "hangs"])
    started = time.monotonic()
    assert _launch(tmp_path, ASYNC, 2).code == 0
    assert time.monotonic() - started < 30


def test_a_lost_node_does_not_fail_an_elastic_job(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch, ["ok", "ok", "lost"])
    elastic = FaultPolicy(max_restarts=1, min_workers=2)
    assert _launch(tmp_path, elastic, 3).code == 0
    (tmp_path / "all").mkdir()
    _stand_ins(monkeypatch, ["lost", "lost"])
    outcome = _launch(tmp_path / "all", elastic, 2)
    assert (outcome.code, outcome.cause) == (1, "lost every node")
