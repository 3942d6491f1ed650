"""``scaledl bench algorithms`` end to end: a tiny real comparison (2 methods, 2 workers,
digits, 1 epoch), and a run that fails or overruns is reported, not fatal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl.bench.methods import METHODS, BenchSpec, available_methods
from scaledl.bench.methods_run import LAUNCH_VARIABLES, run_method

TIMEOUT_S = 120


def _second_method() -> str:
    """Round-robin EASGD (an elastic method: --alpha and --tau) when this build has it, else the
    other synchronous baseline; a parameter-server method would add a rank and its start-up
    time, too slow for this test's budget on a busy 2-core machine."""
    return "easgd" if "easgd" in available_methods() else "reduce-broadcast"


@pytest.mark.distributed
@pytest.mark.timeout(TIMEOUT_S)
def test_two_methods_on_digits(tmp_path: Path) -> None:
    second = _second_method()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    out, report = tmp_path / "runs", tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "bench", "algorithms", "--methods",
         f"allreduce,{second}", "--workers", "2", "--epochs", "1", "--dataset", "digits",
         "--eval-every", "5", "--target", "0.5", "--timeout", str(TIMEOUT_S - 15),
         "--out", str(out), "--json", str(report), "--plot-dir", str(tmp_path / "plots")],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S - 5, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Sync SGD (allreduce)" in result.stdout and "s to target" in result.stdout
    data = json.loads(report.read_text())
    rows = {r["method"]: r for r in data["results"]}
    assert set(rows) == {"allreduce", second}
    assert rows[second]["ranks"] == 2
    for row in rows.values():
        assert row["status"] == "ok", row["reason"]
        assert 0.5 <= row["final_accuracy"] <= 1.0
        assert row["steps"] == 23  # 1437 digits / 2 workers / 32 per batch, rounded up
        assert row["curve"][-1]["epoch"] == pytest.approx(1.0)
        assert row["time_to_target_s"] is not None and row["time_to_target_s"] <= row["train_s"]
        assert row["updates_per_s"] > 0 and 0 <= row["comm_share"] <= 1
    assert (out / "allreduce" / "metrics.jsonl").is_file()
    assert "| Sync SGD (allreduce) | 2 |" in (tmp_path / "plots" / "table.md").read_text()
    for name in ("accuracy_vs_time.png", "accuracy_vs_epoch.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(60)
def test_failed_and_overrunning_runs_are_reported(tmp_path: Path) -> None:
    bad = run_method(METHODS["allreduce"], BenchSpec(workers=2, model="no-such-model"),
                     tmp_path / "bad")
    assert bad.status == "failed"
    assert "exit code 2" in bad.reason and "unknown model 'no-such-model'" in bad.reason
    begin = time.perf_counter()
    slow = run_method(METHODS["allreduce"], BenchSpec(workers=2, timeout_s=1.0),
                      tmp_path / "slow")
    assert slow.status == "timeout" and "1 s limit" in (slow.reason or "")
    assert time.perf_counter() - begin < 20

