"""A pool of rank processes that run the bench's training runs one after another.

Started as its own ``scaledl train`` process, a run of ``scaledl bench algorithms`` spends 30-45 s
on a shared 2-core machine starting processes (torchrun, one process per rank importing torch
and scaledl, the rendezvous) around a few seconds of training.  A :class:`Pool` pays that once:
it starts ``ranks`` processes under ``scaledl run`` (torch's elastic agent, as ``scaledl train``
launches its ranks), which join one process group and then wait for jobs.  A job is one run:

1. the bench writes ``job-<k>.json`` into the pool's folder: the run's config values
   (:func:`scaledl.bench.methods.train_overrides`, the same values ``scaledl train`` would parse
   from the run's flags) and its run directory;
2. every rank reads it, sends its output to the run directory's ``stdout.txt`` and
   ``stderr.txt`` (appended to by every rank, as a launched run's ranks share their launcher's
   streams), and trains with :func:`scaledl.train.in_group.train_in_group`: data, model,
   optimizer, strategy and seeds are built afresh from the config, so a run gives what it gives
   as its own process; rank 0 writes ``metrics.jsonl`` and ``summary.json`` as always;
3. every rank leaves ``done-<k>-rank<r>.json`` (whether it finished, else why not) and the
   ranks meet at a barrier before the next job, so an asynchronous run's last messages are
   gone before the next run starts.

Only runs with the same number of ranks share a pool (the bench keeps one pool per size; the
thread setting and the device are the bench's own, the same for all its runs).  A rank whose run
fails leaves the pool, so the launcher stops the others; the bench then reports the run as
failed and starts a new pool for the next run, as it does after a run that overran its time
(:meth:`Pool.stop`).  Ranks leave on their own when the folder is removed or the bench's process
is gone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaledl.processes import stop_process_groups

__all__ = ["Pool", "PoolOutcome", "serve", "main"]

log = logging.getLogger(__name__)

_POLL_S = 0.02
"""How often the bench looks for the ranks' done files, and a rank for its next job at first."""
_IDLE_POLL_S = 0.25
"""How often an idle rank looks, after a second without a job (so idle pools take next to no
CPU)."""
_CLOSE_GRACE_S = 10.0
"""How long a pool asked to stop may take before its processes are killed."""


@dataclass
class PoolOutcome:
    """How one job of a pool ended."""

    status: str
    """``ok``, ``failed`` or ``timeout``."""
    reason: str | None
    """Why it did not finish; ``None`` when it did, or when the pool's processes ended
    during the job (their error is then in the run's ``stderr.txt`` or the pool's,
    :attr:`Pool.stderr`)."""
    wall_s: float
    """Seconds from handing the job to the pool to every rank's done file (a new pool's
    start-up included)."""


def _write_atomically(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Pool:
    """``ranks`` rank processes that run jobs one at a time (module docstring).  Not
    thread-safe: one job at a time, from one thread."""

    def __init__(self, ranks: int, env: Mapping[str, str]) -> None:
        self.ranks = ranks
        """Processes of the pool's group (the world size of every run it takes)."""
        self.directory = Path(tempfile.mkdtemp(prefix="scaledl-pool-"))
        """The folder of job and done files, and the ranks' own ``TMPDIR``."""
        (self.directory / "tmp").mkdir()
        command = [sys.executable, "-m", "scaledl.cli.main", "run", "-np", str(ranks),
                   sys.executable, "-m", "scaledl.bench.methods_pool", str(self.directory),
                   str(os.getpid())]
        with (self.directory / "stdout.txt").open("wb") as out, \
                (self.directory / "stderr.txt").open("wb") as err:
            # a session of its own: stopping the pool stops everything it started
            self.process = subprocess.Popen(
                command, stdout=out, stderr=err, start_new_session=True,
                env={**env, "TMPDIR": str(self.directory / "tmp")})
        self._next = 0

    @property
    def stderr(self) -> Path:
        """The pool's own error output (its launcher's, and its ranks' between jobs)."""
        return self.directory / "stderr.txt"

    @property
    def usable(self) -> bool:
        """Whether the pool's processes are still there to take a job."""
        return self.process.poll() is None

    def run(self, values: Mapping[str, Any], run_dir: Path, timeout_s: float,
            stopping: Callable[[], bool] = lambda: False) -> PoolOutcome:
        """Run one job: ``values`` (config values for
        :func:`scaledl.train.config.build_config`) into ``run_dir``, within ``timeout_s``
        seconds.  After a failure or a timeout the pool is stopped (:attr:`usable` is then
        false): its ranks may be stuck in a collective of the failed run.  Returns early, with
        status ``failed``, once ``stopping()`` is true."""
        index = self._next
        self._next += 1
        start = time.perf_counter()
        _write_atomically(self.directory / f"job-{index}.json",
                          {"values": dict(values), "out": str(run_dir)})
        deadline = start + timeout_s
        done: dict[int, dict[str, Any]] = {}
        while len(done) < self.ranks:
            for rank in range(self.ranks):
                path = self.directory / f"done-{index}-rank{rank}.json"
                if rank not in done and path.is_file():
                    done[rank] = json.loads(path.read_text())
            failed = [rank for rank, report in done.items() if not report["ok"]]
            if failed:
                self.stop()
                return PoolOutcome("failed", done[min(failed)]["reason"],
                                   time.perf_counter() - start)
            if len(done) == self.ranks:
                break
            if self.process.poll() is not None:  # the caller reads why from the output
                return PoolOutcome("failed", None, time.perf_counter() - start)
            if time.perf_counter() > deadline:
                self.stop()
                return PoolOutcome("timeout", f"stopped after the {timeout_s:.0f} s limit",
                                   time.perf_counter() - start)
            if stopping():
                return PoolOutcome("failed", "the bench is stopping", time.perf_counter() - start)
            time.sleep(_POLL_S)
        return PoolOutcome("ok", None, time.perf_counter() - start)

    def stop(self) -> None:
        """Stop the pool's processes at once (their whole session: SIGTERM, a grace, SIGKILL)."""
        stop_process_groups([self.process])

    def ask_to_leave(self) -> None:
        """Write the stop job (the ranks leave once their current job is done)."""
        if self.usable:
            _write_atomically(self.directory / f"job-{self._next}.json", {"stop": True})
            self._next += 1

    def close(self) -> None:
        """Ask the ranks to leave, stop them if they do not within a grace, remove the
        folder.  (Several pools close at once by :meth:`ask_to_leave` on each first.)"""
        self.ask_to_leave()
        try:
            self.process.wait(timeout=_CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


# -- the rank side ------------------------------------------------------------------------------
def _owner_alive(owner: int) -> bool:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but not ours to signal
        return True
    return True


def _next_job(directory: Path, index: int, owner: int) -> dict[str, Any] | None:
    """Job ``index`` once the bench writes it; ``None`` when the pool is to end (a stop job, or
    its folder or its owner gone)."""
    path = directory / f"job-{index}.json"
    waited, checked = 0.0, 0.0
    while not path.is_file():
        if waited - checked >= 1.0:
            checked = waited
            if not directory.is_dir() or not _owner_alive(owner):
                return None
        pause = _POLL_S if waited < 1.0 else _IDLE_POLL_S
        time.sleep(pause)
        waited += pause
    job: dict[str, Any] = json.loads(path.read_text())
    return None if job.get("stop") else job


@contextmanager
def _output_to(stdout: Path, stderr: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, so logging and anything
    torch writes) appended to the run's files for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with stdout.open("ab") as out, stderr.open("ab") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


def _reason(error: BaseException) -> str:
    """A failure in one line: a user's mistake by its message, anything else with its type."""
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if isinstance(error, (ValueError, TypeError)):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _run_job(job: Mapping[str, Any], topology: Any) -> dict[str, Any]:
    """Train one job on this rank; what its done file says."""
    from scaledl.train.config import build_config
    from scaledl.train.in_group import train_in_group

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    with _output_to(out / "stdout.txt", out / "stderr.txt"):
        try:
            config = build_config({}, job["values"])
            if topology.rank == 0:
                log.info("config: %s", json.dumps(config.with_workers(topology.world_size)
                                                  .to_dict(), sort_keys=True))
            train_in_group(config, topology)
        except Exception as error:  # noqa: BLE001  # the run's failure is reported, not fatal
            traceback.print_exc()
            log.error("run failed on rank %d: %s", topology.rank, _reason(error))
            return {"ok": False, "reason": _reason(error)}
    return {"ok": True, "reason": None}


def _configure_logging(rank: int) -> None:
    """``[rank N]`` log lines as ``scaledl train``'s ranks write them (rank 0 at INFO, the
    others at WARNING), which ``benchmarks/algorithms/phases.py`` reads."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for noisy in ("matplotlib", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def serve(directory: Path, owner: int) -> int:
    """One rank of a pool: join the group, run every job the bench writes into ``directory``
    until a stop job (or the folder or the bench process ``owner`` is gone); 0 on a clean end,
    1 after a failed run (the launcher then stops the other ranks)."""
    import torch.distributed as dist

    import scaledl
    from scaledl import bootstrap
    from scaledl.processes import die_with_parent

    die_with_parent()  # a killed launcher leaves no rank behind
    _configure_logging(int(os.environ.get("RANK", "0")))
    topology = bootstrap.init(backend="gloo")
    try:
        index = 0
        while (job := _next_job(directory, index, owner)) is not None:
            done = _run_job(job, topology)
            _write_atomically(directory / f"done-{index}-rank{topology.rank}.json", done)
            if not done["ok"]:
                return 1
            dist.barrier()  # every rank is done with this run before any starts the next
            index += 1
    finally:
        scaledl.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m scaledl.bench.methods_pool DIRECTORY OWNER_PID``: a pooled rank's private
    entry point, which :class:`Pool` starts under ``scaledl run`` (not a user command)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        sys.stderr.write("usage: python -m scaledl.bench.methods_pool DIRECTORY OWNER_PID\n")
        return 2
    return serve(Path(args[0]), int(args[1]))


if __name__ == "__main__":
    _code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is closed by now (runs' files written, the group destroyed, shared memory
    # unlinked as soon as it was mapped); the interpreter's own teardown of torch's objects took
    # 2-7 s per rank on the loaded 2-core machine, which every bench would wait for at its end.
    os._exit(_code)
