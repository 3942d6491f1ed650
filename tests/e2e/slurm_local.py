"""A single-node Slurm for tests: munged, slurmctld and slurmd in a temporary directory.

:func:`local_slurm` writes a minimal ``slurm.conf`` (this machine as the one node, 4 CPUs
whatever it has, so ``srun -n 3`` fits; no cgroups, no accounting), starts a private ``munged``
with a fresh key, ``slurmctld`` and ``slurmd`` in the foreground as children of the test,
waits until the node is idle and yields the environment that points ``srun``/``sbatch`` at it.
On the way out, also after a failure, every job is cancelled, the daemons are stopped (SIGTERM,
then SIGKILL) and the directory removed; should the test process itself be killed, the daemons
get SIGTERM from the kernel (``PR_SET_PDEATHSIG``).  Nothing outside the directory is touched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.harness import free_port

__all__ = ["local_slurm", "missing_slurm", "SLURM_BINARIES"]

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scancel")
START_TIMEOUT_S = 30.0
"""How long the node may take to register as idle."""
PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h)."""
CPUS = 4
"""CPUs the node claims (``SlurmdParameters=config_overrides``): room for 3-4 small tasks."""


def missing_slurm() -> str | None:
    """Why a local Slurm cannot run here, or ``None``."""
    missing = [name for name in SLURM_BINARIES if shutil.which(name) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing; CI installs slurmctld, "
                "slurmd, slurm-client and munge: see .ci/run)")
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd starts every task as its owner)"
    return None


def _node_name() -> str:
    """This machine's short host name when it resolves (the master address scaledl takes from
    the node list must), else ``localhost``."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
    except OSError:
        return "localhost"
    return name


def _config(root: Path, node: str) -> str:
    return "\n".join([
        "ClusterName=scaledltest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _die_with_parent() -> None:
    """In the daemon, before exec: SIGTERM when the test process dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _start(command: list[str], stack: ExitStack, log: Path) -> subprocess.Popen[bytes]:
    """Start a daemon in the foreground; on exit it gets SIGTERM, then SIGKILL after 10 s."""
    with log.open("ab") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    stack.callback(stop)
    return proc


def _wait_idle(env: dict[str, str], daemons: list[subprocess.Popen[bytes]], root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in daemons):
            break
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        if state == "idle":
            return
        time.sleep(0.2)
    logs = "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}"
                     for path in sorted(root.glob("*.log")))
    raise RuntimeError(f"the local Slurm did not come up within {START_TIMEOUT_S} s:\n{logs}")


def _cancel_jobs(env: dict[str, str]) -> None:
    """Cancel every job of this Slurm and wait (bounded) until none is left; never raises, so
    the daemons are stopped whatever happens here."""
    try:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True,
                       timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True,
                                   timeout=10)
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.2)
    except (OSError, subprocess.SubprocessError):
        return


@contextmanager
def local_slurm() -> Iterator[dict[str, str]]:
    """Run a one-node Slurm for the block; yield an environment whose ``SLURM_CONF`` is it."""
    root = Path(tempfile.mkdtemp(prefix="scaledl-slurm-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        root.chmod(0o755)  # munged wants its socket's directory searchable by everyone
        (root / "state").mkdir()
        (root / "spool").mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        node = _node_name()
        conf = root / "slurm.conf"
        conf.write_text(_config(root, node))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        daemons = [_start(["munged", "--foreground", "--force", f"--socket={root}/munge.socket",
                           f"--key-file={key}", f"--pid-file={root}/munged.pid",
                           f"--seed-file={root}/munged.seed", f"--log-file={root}/munged.log"],
                          stack, root / "munged.out")]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (root / "munge.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        daemons.append(_start(["slurmctld", "-D", "-f", str(conf)], stack, root / "ctld.out"))
        daemons.append(_start(["slurmd", "-D", "-f", str(conf), "-N", node], stack,
                              root / "slurmd.out"))
        stack.callback(_cancel_jobs, env)  # runs first: jobs go before their daemons
        _wait_idle(env, daemons, root)
        yield env
