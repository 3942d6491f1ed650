"""Ctrl-C under ``scaledl run`` of a Horovod-API script ends the job as for any script: exit 130,
each rank's own ``KeyboardInterrupt``, none of Gloo's transport text, nothing left running.

The race the test pins down: rank 1 is in Python code (a sleep) and dies of its interrupt at
once; rank 0 waits inside Gloo (the negotiation of an allreduce rank 1 never makes), so its own
interrupt stays pending until Gloo reports the closed connection.  The interrupt then fired
while scaledl handled that error, and Python printed Gloo's "Connection closed by peer ...
GLHF!" as the context of rank 0's ``KeyboardInterrupt``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

SCRIPT = """
import os, time
import torch
import scaledl.horovod as hvd

hvd.init()
hvd.allreduce(torch.ones(1))  # both ranks are connected
os.write(1, f"ready {hvd.rank()} {os.getpid()}\\n".encode())  # one write: lines stay whole
if hvd.rank() == 0:
    hvd.allreduce(torch.ones(1))  # waits inside Gloo for rank 1, which never calls
else:
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent's wait does not)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_ctrl_c_of_a_horovod_script_shows_no_transport_error(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    job = subprocess.Popen(
        [sys.executable, "-m", "scaledl.cli.main", "run", "-np", "2", sys.executable,
         str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group, as a terminal's foreground job
    pids: list[int] = []
    try:
        assert job.stdout is not None
        while len(pids) < 2:
            line = job.stdout.readline()
            assert line, "the job ended before its ranks were ready"
            pids += [int(pid) for pid in re.findall(r"ready \d (\d+)", line)]
        time.sleep(0.5)  # rank 0 is inside Gloo's wait by now
        os.killpg(job.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        _, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, err[-3000:]
    for needle in ("Connection closed", "GLHF", "During handling", "RuntimeError:",
                   "HorovodInternalError:", "direct cause"):
        assert needle not in err, err[-3000:]
    ends = [line for line in err.splitlines() if line.endswith("KeyboardInterrupt")]
    assert len(ends) == 2, err[-3000:]  # each rank's own interrupt, as in any script
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if _alive(pid)] == []
    segments = [p.name for p in Path("/dev/shm").glob("scaledl-*")
                if any(p.name.endswith(f"-p{pid}") for pid in pids)]
    assert segments == [], segments
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor")] == []
