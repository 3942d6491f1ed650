"""``scaledl bench algorithms`` end to end: a tiny real comparison (2 methods, 2 workers,
digits, 1 epoch), a run that fails or overruns is reported, not fatal, and SIGTERM or Ctrl-C
leave no run behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl.bench.methods import METHODS, BenchSpec, available_methods
from scaledl.bench.methods_run import LAUNCH_VARIABLES, run_method
from scaledl.processes import group_alive

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
    assert not (out / "allreduce" / "accuracy.png").exists()  # a tenth of a run: skipped
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



def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is no zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.timeout(90)
def test_sigterm_stops_the_runs_before_the_bench_exits(tmp_path: Path) -> None:
    """Each run's processes are a session of their own, out of reach of a signal to the bench's
    group: the bench must stop them itself before it exits (they outlived it before).  Two
    tuning runs at a time, so the runs of ``--tune-jobs`` threads are stopped too, not only the
    main thread's; each goes to a pool of ranks (a launcher, the bench's child, and its 2 ranks),
    and the signal comes once the ranks are up, so they must be gone too."""
    count = 2
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    bench = subprocess.Popen(
        [sys.executable, "-m", "scaledl.cli.main", "bench", "algorithms", "--methods",
         "allreduce", "--workers", "2", "--epochs", "500", "--dataset", "digits",
         "--out", str(tmp_path / "runs"), "--tune-lr", "0.05,0.1", "--tune-jobs", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
        start_new_session=True,
    )
    runs: list[int] = []
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while (len(runs) < count or len(ranks) < 2 * count) and bench.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
            runs = _children(bench.pid)
            ranks = [rank for run in runs for rank in _children(run)]
        assert len(runs) == count, f"the bench started {runs} (exit {bench.poll()})"
        assert len(ranks) == 2 * count, f"the runs' ranks {ranks} did not all start"
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=45)
        left = [pid for pid in runs if group_alive(pid, own_session=True)]
        left += [pid for pid in ranks if _alive(pid)]
        assert not left, f"runs {left} outlived the bench: {stderr.decode()[-800:]}"
        assert bench.returncode == 130, stderr.decode()[-800:]
    finally:
        for pid in [bench.pid, *runs]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
