"""``scaledl cluster`` end to end: real namespaces, shaped links, ranks across hosts, teardown.

Needs root and iproute2; skipped with the reason otherwise.  Every test uses its own record
directory and checks that no namespace of its cluster is left, also after a failing command and
after Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl.launchers import RANK_VARIABLES
from scaledl.cluster.state import STATE_ENV

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="scaledl cluster needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="scaledl cluster needs iproute2 (ip and tc)"),
]

TIMEOUT_S = 150


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.pop("SCALEDL_TOPOLOGY", None)
    env[STATE_ENV] = str(tmp_path / "clusters")
    env["SCALEDL_CALIBRATION"] = str(tmp_path / "calibration.json")
    return env


def _scaledl(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scaledl.cli.main", *args], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _assert_torn_down(tmp_path: Path, before: set[str]) -> None:
    left = {ns for ns in _namespaces() - before if ns.startswith("scaledl-")}
    assert not left, f"namespaces left behind: {left}"
    assert not list((tmp_path / "clusters").glob("*.json")), "cluster record left behind"


@pytest.mark.timeout(TIMEOUT_S)
def test_up_list_down(tmp_path: Path) -> None:
    before = _namespaces()
    up = _scaledl(["cluster", "up", "--hosts", "2", "--rate", "100mbit", "--name", "e2eup"],
                  tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        assert {"scaledl-e2eup-sw", "scaledl-e2eup-h0", "scaledl-e2eup-h1"} <= _namespaces()
        qdisc = subprocess.run(["tc", "-n", "scaledl-e2eup-h1", "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        listing = _scaledl(["cluster", "list"], tmp_path)
        assert "e2eup" in listing.stdout and "100mbit" in listing.stdout
        assert " up " in listing.stdout
        again = _scaledl(["cluster", "up", "--hosts", "2", "--name", "e2eup"], tmp_path)
        assert again.returncode == 2 and "is taken" in again.stderr
    finally:
        down = _scaledl(["cluster", "down", "e2eup"], tmp_path)
    assert down.returncode == 0, down.stderr
    _assert_torn_down(tmp_path, before)


@pytest.mark.distributed
@pytest.mark.timeout(TIMEOUT_S)
def test_allreduce_across_two_hosts(tmp_path: Path) -> None:
    before = _namespaces()
    out, counters = tmp_path / "bench.json", tmp_path / "bytes.json"
    result = _scaledl([
        "cluster", "run", "--hosts", "2", "--rate", "1gbit", "--ranks-per-host", "2",
        "--timeout", "120", "--counters", str(counters), "--",
        "scaledl", "bench", "collectives", "--algorithms", "ring,hierarchical", "--topology",
        "2x2", "--min-bytes", "1M", "--max-bytes", "1M", "--iters", "2", "--warmup", "1",
        "--p2p-bytes", "4K", "--json", str(out),
    ], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["environment"]["world_size"] == 4
    assert {r["algorithm"] for r in data["results"]} == {"ring", "hierarchical"}
    moved = json.loads(counters.read_text())["bytes"]
    for host in ("h0", "h1"):
        # 4 ring + 4 hierarchical allreduces of 1 MiB: at least 4 * (1.5 + 1) MiB cross each link
        assert moved[host]["eth0_tx"] > 10 * 2**20
        assert moved[host]["lo_tx"] > 2**20  # ranks of one host talk over its loopback
    _assert_torn_down(tmp_path, before)


@pytest.mark.timeout(TIMEOUT_S)
def test_failing_rank_stops_the_job_and_tears_down(tmp_path: Path) -> None:
    before = _namespaces()
    script = ("import os, sys, time; r = int(os.environ['RANK']); "
              "time.sleep(0.2) if r == 1 else time.sleep(60); sys.exit(3)")
    start = time.monotonic()
    result = _scaledl(["cluster", "run", "--hosts", "2", "--ranks-per-host", "2", "--",
                       sys.executable, "-c", script], tmp_path)
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - start < 30, "the other ranks were not stopped promptly"
    assert "rank 1 (host h0) exited with code 3" in result.stderr
    _assert_torn_down(tmp_path, before)


@pytest.mark.timeout(TIMEOUT_S)
def test_ctrl_c_tears_down(tmp_path: Path) -> None:
    before = _namespaces()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaledl.cli.main", "cluster", "run", "--hosts", "2", "--",
         sys.executable, "-c", "import time; time.sleep(60)"],
        env=_env(tmp_path), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(ns.startswith("scaledl-") for ns in _namespaces() - before):
        assert time.monotonic() < deadline and proc.poll() is None, "cluster never came up"
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    _assert_torn_down(tmp_path, before)


@pytest.mark.timeout(TIMEOUT_S)
def test_owner_killed_leaves_a_stale_cluster_that_down_removes(tmp_path: Path) -> None:
    before = _namespaces()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaledl.cli.main", "cluster", "run", "--hosts", "2", "--",
         sys.executable, "-c", "import time; time.sleep(60)"],
        env=_env(tmp_path), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "clusters").glob("*.json")) or not any(
            ns.startswith("scaledl-") for ns in _namespaces() - before):
        assert time.monotonic() < deadline and proc.poll() is None, "cluster never came up"
        time.sleep(0.2)
    time.sleep(1.0)
    proc.kill()  # SIGKILL: no handler runs, the cluster stays (its ranks die: PDEATHSIG)
    proc.wait(timeout=30)
    listing = _scaledl(["cluster", "list"], tmp_path)
    assert "stale" in listing.stdout, listing.stdout
    down = _scaledl(["cluster", "down", "--stale"], tmp_path)
    assert down.returncode == 0 and "removed cluster" in down.stdout, down.stderr
    _assert_torn_down(tmp_path, before)


@pytest.mark.timeout(TIMEOUT_S)
def test_descendants_in_own_sessions_do_not_outlive_a_run_on_a_named_cluster(
        tmp_path: Path) -> None:
    before = _namespaces()
    pidfile = tmp_path / "escaped.pid"
    script = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(120)'], start_new_session=True); "
              f"open({str(pidfile)!r} + os.environ['RANK'], 'w').write(str(p.pid))")
    up = _scaledl(["cluster", "up", "--hosts", "2", "--rate", "none", "--name", "e2eesc"],
                  tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        run = _scaledl(["cluster", "run", "--name", "e2eesc", "--timeout", "60", "--",
                        sys.executable, "-c", script], tmp_path)
        assert run.returncode == 0, run.stderr
        assert "[rank" not in run.stderr and "killed 1 processes left inside" in run.stderr
        for rank in (0, 1):
            pid = int(Path(f"{pidfile}{rank}").read_text())
            time.sleep(0.2)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                if Path(f"/proc/{pid}/stat").exists() else "gone"
            assert state in ("gone", "Z", "X"), f"descendant {pid} of rank {rank} survived"
    finally:
        down = _scaledl(["cluster", "down", "e2eesc"], tmp_path)
    assert down.returncode == 0, down.stderr
    _assert_torn_down(tmp_path, before)
