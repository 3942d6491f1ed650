"""``scaledl run`` end to end: a Horovod-style script on two processes, the first failing rank's
exit code with nothing left running, and one-line errors for bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl.cli.main import main

pytestmark = pytest.mark.distributed

SCRIPT = """
import os, sys, time
import torch
import scaledl.horovod as hvd

hvd.init()
model = torch.nn.Linear(3, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
model(torch.full((2, 3), float(hvd.rank()))).sum().backward()
optimizer.step()
weights = hvd.allgather(model.weight.detach())
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
print(f"rank {hvd.rank()}/{hvd.size()} local {hvd.local_rank()} sum {total} "
      f"same {bool(torch.equal(weights[0], weights[-1]))} "
      f"algorithm {os.environ.get('SCALEDL_HOROVOD_ALGORITHM')}|", flush=True)
fail = int(os.environ.get("FAIL_CODE", "0"))
if fail:
    pid_file = os.environ["PID_FILE"]
    if hvd.rank() == 1:  # fail once rank 0 has recorded its pid
        while not os.path.exists(pid_file):
            time.sleep(0.05)
        sys.exit(fail)
    with open(pid_file + ".part", "w") as out:
        out.write(str(os.getpid()))
    os.rename(pid_file + ".part", pid_file)
    time.sleep(120)
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch), **env}
    return subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "run", *args, sys.executable, str(script)],
        env=environ, capture_output=True, text=True, timeout=120)


def test_two_processes_run_a_horovod_script(tmp_path: Path) -> None:
    done = _run(tmp_path, "-np", "2", "-H", "localhost:2", "--algorithm", "ring")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(re.findall(r"rank [^|]*\|", done.stdout))  # the ranks' lines may interleave
    assert lines == [f"rank {r}/2 local {r} sum 1.0 same True algorithm ring|" for r in (0, 1)]
    left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor")]
    assert left == [], "scaledl run left temporary files"  # torch's own compile cache aside


def test_first_failing_rank_gives_the_exit_code_and_nothing_is_left(tmp_path: Path) -> None:
    pid_file = tmp_path / "rank0.pid"
    started = time.monotonic()
    done = _run(tmp_path, "-np", "2", FAIL_CODE="3", PID_FILE=str(pid_file))
    assert done.returncode == 3, done.stderr[-3000:]
    assert time.monotonic() - started < 60, "the surviving rank was not stopped"
    assert "rank 1 exited with code 3" in done.stderr
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(("args", "needle"), [
    (["-np", "2", "-H", "node7:2", "python", "x.py"], "host 'node7' is not this machine"),
    (["-np", "3", "-H", "localhost:2", "python", "x.py"], "-np 3 exceeds the 2 slots"),
    (["python", "x.py"], "give the number of processes"),
    (["-np", "2"], "give the command to run"),
    (["-np", "2", "no-such-command-xyz"], "'no-such-command-xyz' was not found"),
    (["-np", "0", "python", "x.py"], "-np 0 must be at least 1"),
    (["-H", "localhost:x", "python", "x.py"], "'localhost:x' is not HOST or HOST:SLOTS"),
    (["-np", "2", "--algorithm", "bogus", "python", "x.py"],  # each rank failed after launch
     "--algorithm 'bogus': algorithm 'bogus' is not a scaledl algorithm"),
])
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_a_script_that_is_not_executable_is_named_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_text("echo hi\n")
    assert main(["run", "-np", "1", str(script)]) == 2
    assert f"command '{script}' is not executable" in capsys.readouterr().err


@pytest.mark.parametrize(("script", "mode", "needle"), [
    ("train.py", 0o644, "command 'train.py' is not executable (a file without execute "
     "permission); run it with its interpreter (scaledl run -np 2 python train.py --lr 1), or "
     "make it executable (chmod +x train.py) and write ./train.py"),
    ("job", 0o755, "command 'job' is a file here, but a command without a '/' is looked up on "
     "PATH; write ./job, or run it with its interpreter (scaledl run -np 2 bash job --lr 1)"),
    ("tool", 0o644, "(scaledl run -np 2 python3 tool --lr 1)"),
])
def test_a_script_in_this_directory_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    script: str, mode: int, needle: str
) -> None:
    """``scaledl run -np 2 train.py`` said the existing file was 'not a file'."""
    monkeypatch.chdir(tmp_path)
    shebang = {"job": "#!/bin/bash\n", "tool": "#!/usr/bin/env python3\n"}.get(script, "")
    (tmp_path / script).write_text(shebang + "print(1)\n")
    (tmp_path / script).chmod(mode)
    (tmp_path / "folder").mkdir()
    assert main(["run", "-np", "2", script, "--lr", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert main(["run", "-np", "2", "folder"]) == 2
    assert "command 'folder' is a directory" in capsys.readouterr().err


LEAVER = """
import os, subprocess, sys
child = subprocess.Popen(["sleep", "90"])  # in the rank's process group, left running
with open(os.path.join(sys.argv[1], f"{child.pid}.child"), "w"):
    pass
sys.exit(int(sys.argv[2]))
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.parametrize("code", [0, 3])
def test_what_the_ranks_leave_running_is_stopped(tmp_path: Path, code: int) -> None:
    """A rank's helper held the output pipe (and the caller) until it ended on its own."""
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "scaledl.cli.main", "run", "-np", "2",
                           sys.executable, str(script), str(tmp_path), str(code)],
                          capture_output=True, text=True, timeout=80)
    assert done.returncode == code, done.stderr[-3000:]
    assert time.monotonic() - started < 60
    children = [int(p.name.split(".")[0]) for p in tmp_path.glob("*.child")]
    # on failure the other rank may be stopped before it starts its helper
    assert len(children) == (2 if code == 0 else len(children)) >= 1, children
    assert all(_gone(pid) for pid in children), children


def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import os, sys, time\n"
                      "open(os.path.join(sys.argv[1], f'{os.getpid()}.rank'), 'w').close()\n"
                      "time.sleep(90)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "scaledl.cli.main", "run", "-np", "2",
                                 sys.executable, str(script), str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.rank"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.kill()
    launcher.wait(timeout=10)
    ranks = [int(p.name.split(".")[0]) for p in tmp_path.glob("*.rank")]
    assert len(ranks) == 2
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in ranks), "a rank outlived its killed launcher"
