"""Signals while a cluster is built or its ranks are stopped, without root: a fake ``ip`` and
real signals sent to this process (SIGINT twice during creation, SIGTERM during the stop grace)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.cluster import netns, runner, state
from scaledl.cluster.runner import RankLaunch, run_ranks


class InterruptingIp:
    """A fake ``ip``/``tc`` that sends this process SIGINT on the ``first`` create command and
    again on the first ``ip netns del`` (a second Ctrl-C while the cluster is torn down)."""

    def __init__(self, first: int) -> None:
        self.namespaces: set[str] = set()
        self.first, self.calls, self.second_sent = first, 0, False

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = list(command)
        if command[:3] == ["ip", "netns", "add"]:
            self.namespaces.add(command[3])
        if command[:3] == ["ip", "netns", "del"]:
            if not self.second_sent:
                self.second_sent = True
                os.kill(os.getpid(), signal.SIGINT)
            self.namespaces.discard(command[3])
        if command[0] == "tc" or command[:3] in (["ip", "netns", "add"], ["ip", "link", "add"]):
            self.calls += 1
            if self.calls == self.first:
                os.kill(os.getpid(), signal.SIGINT)
        stdout = "\n".join(sorted(self.namespaces)) if command == ["ip", "netns", "list"] else ""
        return subprocess.CompletedProcess(command, 0, stdout, "")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("first", [1, 4])
def test_two_ctrl_c_during_ephemeral_creation_leave_nothing(
        first: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path / "clusters"))
    monkeypatch.setattr(state, "DIRECTORIES_FILE", str(tmp_path / "record-dirs"))
    monkeypatch.setattr(netns, "preflight", lambda: None)
    ip = InterruptingIp(first)
    monkeypatch.setattr(netns, "_run", ip)
    code = main(["cluster", "run", "--hosts", "3", "--rate", "1gbit", "--", "true"])
    assert code == 130
    assert ip.second_sent and ip.namespaces == set()
    assert not list((tmp_path / "clusters").glob("*.json")), "record left behind"


def _gone(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _local(rank: int, code: str) -> RankLaunch:
    return RankLaunch(rank, 0, rank, [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"})


def _wait_pid(path: Path) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"no pid in {path}")


@pytest.mark.timeout(60)
def test_helper_in_the_group_of_a_rank_that_exited_is_stopped(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    leader = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(120)']); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))")
    assert run_ranks([_local(0, leader), _local(1, "import time; time.sleep(0.5)")],
                     timeout=30) == 0
    helper = _wait_pid(pidfile)
    assert _wait_gone(helper, 5), "a helper in a finished rank's process group survived"


_STOP_PHASE = """
import os, subprocess, sys
from scaledl.cluster import runner
from scaledl.processes import signals_raise
runner.STOP_GRACE_S = 2.0
stubborn = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({sys.argv[1]!r}, 'w').write(str(os.getpid())); time.sleep(120)")
killer = subprocess.Popen(["sh", "-c", f"sleep 2; kill -TERM {os.getpid()}"])
hooks = []
try:
    with signals_raise(RuntimeError):  # outside run_ranks, SIGTERM raises
        code = runner.run_ranks(
            [runner.RankLaunch(0, 0, 0, [sys.executable, "-c", stubborn], {"PATH": "/bin"})],
            timeout=1.0, after_stop=lambda: hooks.append("after"))
    print("code", code, hooks, flush=True)
finally:
    killer.wait(timeout=10)
"""


@pytest.mark.timeout(60)
def test_signal_during_the_stop_grace_still_reaches_sigkill(tmp_path: Path) -> None:
    # the SIGTERM comes 1 s into the 2 s grace (timeout 1 s); run in a child to keep pytest safe
    pidfile = tmp_path / "rank.pid"
    out = subprocess.run([sys.executable, "-c", _STOP_PHASE, str(pidfile)], capture_output=True,
                         text=True, timeout=40)
    assert out.stdout.strip() == f"code {runner.TIMED_OUT} ['after']", out.stderr[-2000:]
    assert "SIGTERM arrived while the ranks were being stopped" in out.stderr
    assert _wait_gone(_wait_pid(pidfile), 2)


@pytest.mark.timeout(60)
def test_ranks_die_with_a_sigkilled_supervisor(tmp_path: Path) -> None:
    pidfile = tmp_path / "rank.pid"
    rank = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    supervisor = ("import sys; from scaledl.cluster.runner import RankLaunch, run_ranks; "
                  f"run_ranks([RankLaunch(0, 0, 0, [sys.executable, '-c', {rank!r}], "
                  "{'PATH': '/usr/bin:/bin'})], timeout=60)")
    proc = subprocess.Popen([sys.executable, "-c", supervisor])
    try:
        pid = _wait_pid(pidfile)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert _wait_gone(pid, 5), "a rank outlived its SIGKILLed supervisor"


def test_cli_rejects_bad_timeout_and_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path))
    monkeypatch.setattr(netns, "preflight", lambda: None)
    assert main(["cluster", "run", "--hosts", "2", "--timeout", "-1", "--", "true"]) == 2
    assert "--timeout -1 must be a positive number" in capsys.readouterr().err  # as given
    for rate, words in (("0", "not a rate"), ("100tbit", "out of range")):
        assert main(["cluster", "run", "--hosts", "2", "--rate", rate, "--", "true"]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1


def test_a_group_number_reused_outside_its_session_is_not_signalled() -> None:
    """stop_groups signals the groups of ranks that may have exited long before: a process
    that now leads a group of that number in another session (an interactive shell's job)
    is not one of them."""
    import subprocess
    import sys

    from scaledl.processes import stop_groups

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             process_group=0)  # a group of its own, in this session
    try:
        stop_groups([other.pid], grace_s=0.5, kill_grace_s=0.5)
        assert other.poll() is None, "another session's group was killed"
    finally:
        other.kill()
        other.wait()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    stop_groups([ours.pid], grace_s=5, kill_grace_s=5)
    assert ours.wait(timeout=5) == -15  # SIGTERM
