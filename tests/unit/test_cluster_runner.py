"""The cluster runner without root: rank placement, each rank's command and environment, and the
supervisor (first failure stops the rest, timeout, success) on plain local processes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.cluster import runner
from scaledl.cluster.runner import RankLaunch, placement, plan_ranks, run_ranks
from scaledl.cluster.spec import ClusterSpec
from scaledl.cluster.state import STATE_ENV


def test_placement() -> None:
    assert placement(2, 2, "block") == [0, 0, 1, 1]
    assert placement(2, 2, "cyclic") == [0, 1, 0, 1]
    assert placement(3, 1) == [0, 1, 2]
    with pytest.raises(ValueError, match="--placement 'random'"):
        placement(2, 2, "random")
    with pytest.raises(ValueError, match="--ranks-per-host 0"):
        placement(2, 0)


def test_plan_ranks_sets_launcher_variables_per_host() -> None:
    spec = ClusterSpec("lab1", 2, 10**9, 4)
    outer = {"PATH": "/bin", "RANK": "9", "LOCAL_RANK": "3", "TORCHELASTIC_RUN_ID": "x",
             "OMPI_COMM_WORLD_RANK": "2", "SLURM_PROCID": "1", "OMP_NUM_THREADS": "2"}
    launches = plan_ranks(spec, 2, ["scaledl", "bench", "collectives"], "cyclic", 29999, outer)
    assert [(r.rank, r.host, r.local_rank) for r in launches] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    second = launches[1]
    assert second.argv[:5] == ["ip", "netns", "exec", "scaledl-lab1-h1", sys.executable]
    assert second.argv[5:] == ["-m", "scaledl.cli.main", "bench", "collectives"]
    env = second.env
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "1", "4", "0", "2")
    assert env["MASTER_ADDR"] == "10.231.4.1" and env["MASTER_PORT"] == "29999"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["GROUP_RANK"] == "1"
    assert env["SCALEDL_HOSTNAME"] == "lab1-h1" and env["OMP_NUM_THREADS"] == "2"
    for leaked in ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        assert leaked not in env
    assert env["PATH"] == "/bin"
    with pytest.raises(ValueError, match="no command"):
        plan_ranks(spec, 1, [])


def _local(rank: int, code: str) -> RankLaunch:
    return RankLaunch(rank, 0, rank, [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"})


def test_supervisor_success_and_first_failure_stops_the_rest() -> None:
    assert run_ranks([_local(0, "pass"), _local(1, "pass")], timeout=60) == 0
    start = time.monotonic()
    code = run_ranks([_local(0, "import time; time.sleep(60)"),
                      _local(1, "import sys, time; time.sleep(0.3); sys.exit(5)")], timeout=60)
    assert code == 5
    assert time.monotonic() - start < 20


def test_supervisor_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "STOP_GRACE_S", 1.0)
    start = time.monotonic()
    sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    assert run_ranks([_local(0, sleeper)], timeout=1.0) == runner.TIMED_OUT
    assert time.monotonic() - start < 15  # SIGKILL after the grace when SIGTERM is ignored


def test_cli_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.setattr("scaledl.cluster.netns.preflight", lambda: None)
    assert main(["cluster", "run", "--hosts", "2"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["cluster", "run", "--hosts", "2", "--name", "a", "--", "true"]) == 2
    assert "either --name" in capsys.readouterr().err
    assert main(["cluster", "run", "--name", "nope", "--", "true"]) == 2
    assert "no cluster named 'nope'" in capsys.readouterr().err
    assert main(["cluster", "up", "--hosts", "2", "--rate", "fast"]) == 2
    assert "link rate 'fast'" in capsys.readouterr().err
    assert main(["cluster", "down"]) == 2
    assert "needs cluster names" in capsys.readouterr().err


def test_cli_without_root(monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["cluster", "list"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_cli_refusals_and_idempotent_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from scaledl.cluster import state

    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.setattr("scaledl.cluster.netns.preflight", lambda: None)
    monkeypatch.setattr("scaledl.cluster.netns.orphan_namespaces", lambda: [])
    # no namespace is asked of ip: the test runs where iproute2 is missing (the H200 host)
    monkeypatch.setattr("scaledl.cluster.netns.existing_namespaces", lambda runner=None: set())
    state.allocate(2, None, "tbf", "open", False, set())
    for flag, value in (("--rate", "8kbit"), ("--shaper", "htb")):  # were ignored
        assert main(["cluster", "run", "--name", "open", flag, value, "--", "true"]) == 2
        assert f"{flag} {value} does not apply to cluster open" in capsys.readouterr().err
    assert main(["cluster", "list"]) == 0
    assert "unshaped" in capsys.readouterr().out  # not 'none (tbf)'
    for _ in range(2):  # a second 'down' is no error
        assert main(["cluster", "down", "gone"]) == 0
        assert "cluster gone is not recorded" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{oops")
    assert main(["cluster", "run", "--name", "bad", "--", "true"]) == 2
    assert f"cluster record {tmp_path / 'bad.json'} is unreadable" in capsys.readouterr().err
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "bad.json"))
    assert main(["cluster", "list"]) == 2
    assert f"cannot be kept in {STATE_ENV}={tmp_path / 'bad.json'}" in capsys.readouterr().err


def test_a_cluster_whose_namespaces_are_gone_and_an_unknown_command_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `list` said up and `run` failed with ip's exit code 255; an unknown command
    failed on every rank."""
    import dataclasses

    from scaledl.cluster import netns, state

    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.setattr(netns, "preflight", lambda: None)
    monkeypatch.setattr(netns, "orphan_namespaces", lambda: [])
    record = state.allocate(2, 10**9, "tbf", "lab", False, set())
    state.save(dataclasses.replace(record, status="up"))
    monkeypatch.setattr(netns, "existing_namespaces", lambda *_: set())
    assert main(["cluster", "list"]) == 0
    assert "broken (namespaces removed outside scaledl)" in capsys.readouterr().out
    assert main(["cluster", "run", "--name", "lab", "--", "true"]) == 2
    assert "cluster lab has lost namespace scaledl-lab-" in capsys.readouterr().err
    monkeypatch.setattr(netns, "existing_namespaces", lambda *_: set(record.spec.namespaces))
    assert main(["cluster", "run", "--name", "lab", "--", "no-such-command-xyz"]) == 2
    assert "command 'no-such-command-xyz' was not found" in capsys.readouterr().err
