"""Run the methods of ``scaledl bench algorithms``, one run after another.

By default the runs go to pools of rank processes kept alive between runs
(:mod:`scaledl.bench.methods_pool`), one pool per number of ranks (the parameter-server methods
have one rank more), so a run pays no process start-up; with ``pool=False`` (``--no-pool``)
each method runs as its own ``python -m scaledl.cli.main train ... --no-progress`` process
(which launches its ranks under torchrun) in its own session.  Either way a run's output is in
``<run dir>/stdout.txt`` and ``stderr.txt`` and its result is read from the same files.  Runs
of one thread never overlap: on a small machine two jobs would share the cores and distort each
other's times.  A run that exceeds the time limit is stopped (its process group, or its pool's)
and reported as ``timeout``; one that fails is reported with the error line of its stderr;
either way the next method runs (in a new pool when the old one was stopped).

A :class:`Runs` starts the runs of one bench and knows which processes are running, also those
started by ``--tune-jobs`` threads: on an interrupt (Ctrl-C, or SIGTERM turned into one by the
command) :meth:`Runs.stop` stops every run's and every pool's process group and refuses new
runs, before the bench exits, so that a failure leaves no process behind; :meth:`Runs.close`
ends the pools when the bench is done.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from scaledl import launchers
from scaledl.bench.methods import BenchSpec, Method, ranks, train_command, train_overrides
from scaledl.bench.methods_pool import Pool
from scaledl.bench.methods_result import MethodResult, failed_result, read_result
from scaledl.processes import stop_process_groups
from scaledl.topology import TOPOLOGY_ENV

__all__ = ["Runs", "run_method", "run_all", "error_reason", "child_environment",
           "LAUNCH_VARIABLES"]

LAUNCH_VARIABLES = (*launchers.LAUNCH_VARIABLES, TOPOLOGY_ENV)
"""Variables of an enclosing launch that must not leak into a run (it starts its own): the
launchers' table and the topology override."""

_EXCEPTION = re.compile(r"^\s*([\w.]+(Error|Exception)):\s*(.+)$")


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a run: ``base`` (default: this one) without launch variables, with
    one compute thread per rank unless ``OMP_NUM_THREADS`` is set."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in LAUNCH_VARIABLES}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def error_reason(stderr: str, limit: int = 240) -> str:
    """The line of a failed run's stderr that says why: scaledl's one-line error, else the
    first exception line (a traceback's root cause), else the first logged ERROR, else the
    last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "no output on stderr"
    picks = (
        [line.split("scaledl: error:", 1)[1].strip() for line in lines
         if "scaledl: error:" in line],
        [m.group(1) + ": " + m.group(3) for m in map(_EXCEPTION.match, lines) if m][:1],
        [line for line in lines if " ERROR " in line and "torch.distributed" not in line][:1],
        lines[-1:],
    )
    reason = next(pick[0] for pick in picks if pick)
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


class Runs:
    """The runs of one bench: each in a pool of ranks of its size (or, with ``pool=False``, as a
    process in a session of its own), and every process still running stopped by :meth:`stop`
    (from any thread)."""

    def __init__(self, env: Mapping[str, str] | None = None, pool: bool = True) -> None:
        self.env = env
        """The environment runs start from (default: this process's)."""
        self.pool = pool
        """Whether runs go to pools of rank processes kept between runs."""
        self._running: set[subprocess.Popen[bytes]] = set()
        self._idle: dict[int, list[Pool]] = {}
        """Pools waiting for a run, by their number of ranks."""
        self._pools: list[Pool] = []
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        """Stop every run and pool in progress (its whole process group: SIGTERM, a grace,
        SIGKILL) and refuse new runs; returns once they are gone."""
        with self._lock:
            self._stopped = True
            running = list(self._running)
            pools, self._pools, self._idle = list(self._pools), [], {}
        stop_process_groups(running + [pool.process for pool in pools])
        for pool in pools:
            pool.close()

    def close(self) -> None:
        """End the pools (the bench is done with them); runs may still start afterwards, in new
        pools."""
        with self._lock:
            pools, self._pools, self._idle = list(self._pools), [], {}
        for pool in pools:  # all at once: each takes a few seconds to wind down
            pool.ask_to_leave()
        for pool in pools:
            pool.close()

    def run(self, method: Method, spec: BenchSpec, run_dir: Path) -> MethodResult:
        """Train ``method`` into ``run_dir`` and read its result (a failed result on error);
        ``KeyboardInterrupt`` once :meth:`stop` was called."""
        run_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "scaledl.cli.main", *train_command(method, spec, run_dir)]
        if not self.pool:
            (run_dir / "command.txt").write_text(" ".join(command) + "\n")
            return self._run_process(method, spec, run_dir, command)
        (run_dir / "command.txt").write_text(
            f"# run in a pool of {ranks(method, spec)} ranks kept between runs; as its own "
            "process:\n" + " ".join(command) + "\n")
        return self._run_in_pool(method, spec, run_dir)

    def _run_process(self, method: Method, spec: BenchSpec, run_dir: Path,
                     command: list[str]) -> MethodResult:
        start = time.perf_counter()
        with (run_dir / "stdout.txt").open("wb") as out, \
                (run_dir / "stderr.txt").open("wb") as err:
            with self._lock:  # no run starts after stop() took the list of running ones
                if self._stopped:
                    raise KeyboardInterrupt("the bench is stopping")
                proc = subprocess.Popen(command, stdout=out, stderr=err,
                                        env=child_environment(self.env), start_new_session=True)
                self._running.add(proc)
            try:
                code = proc.wait(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                stop_process_groups([proc])
                code = None
            except BaseException:
                stop_process_groups([proc])
                raise
            finally:
                with self._lock:
                    self._running.discard(proc)
        wall_s = time.perf_counter() - start
        if self._stopped:
            raise KeyboardInterrupt("the bench is stopping")
        if code is None:
            return failed_result(method, spec, "timeout",
                                 f"stopped after the {spec.timeout_s:.0f} s limit", wall_s)
        stderr = (run_dir / "stderr.txt").read_text(errors="replace")
        if code != 0:
            return failed_result(method, spec, "failed",
                                 f"exit code {code}: {error_reason(stderr)}", wall_s)
        return self._read(method, spec, run_dir, wall_s)

    def _take_pool(self, size: int) -> Pool:
        """An idle pool of ``size`` ranks, else a new one."""
        with self._lock:
            if self._stopped:
                raise KeyboardInterrupt("the bench is stopping")
            idle = self._idle.setdefault(size, [])
            while idle:
                pool = idle.pop()
                if pool.usable:
                    return pool
                self._pools.remove(pool)
            pool = Pool(size, child_environment(self.env))
            self._pools.append(pool)
            return pool

    def _give_back(self, pool: Pool) -> None:
        with self._lock:
            if pool not in self._pools:  # stop() or close() took it meanwhile
                return
            if pool.usable and not self._stopped:
                self._idle.setdefault(pool.ranks, []).append(pool)
                return
            self._pools.remove(pool)
        pool.close()

    def _run_in_pool(self, method: Method, spec: BenchSpec, run_dir: Path) -> MethodResult:
        for name in ("stdout.txt", "stderr.txt"):  # the ranks append: start them empty
            (run_dir / name).write_bytes(b"")
        pool = self._take_pool(ranks(method, spec))
        try:
            outcome = pool.run(train_overrides(method, spec, run_dir), run_dir, spec.timeout_s,
                               lambda: self._stopped)
        finally:
            self._give_back(pool)
        if self._stopped:
            raise KeyboardInterrupt("the bench is stopping")
        if outcome.status == "timeout":
            return failed_result(method, spec, "timeout", outcome.reason or "", outcome.wall_s)
        if outcome.status != "ok":
            return failed_result(method, spec, "failed",
                                 outcome.reason or _pool_exit_reason(pool, run_dir),
                                 outcome.wall_s)
        return self._read(method, spec, run_dir, outcome.wall_s)

    @staticmethod
    def _read(method: Method, spec: BenchSpec, run_dir: Path, wall_s: float) -> MethodResult:
        try:
            result = read_result(method, spec, run_dir)
        except ValueError as error:
            return failed_result(method, spec, "failed", str(error), wall_s)
        result.wall_s = wall_s
        return result


def _pool_exit_reason(pool: Pool, run_dir: Path) -> str:
    """Why a pool's processes ended during a run: the error line of the run's output, else of
    the pool's own."""
    code = pool.process.returncode
    for path in (run_dir / "stderr.txt", pool.stderr):
        text = path.read_text(errors="replace") if path.is_file() else ""
        if text.strip():
            return f"the pool's ranks exited (code {code}): {error_reason(text)}"
    return f"the pool's ranks exited (code {code}) without output"


def run_method(method: Method, spec: BenchSpec, run_dir: Path,
               env: Mapping[str, str] | None = None) -> MethodResult:
    """One run as its own ``scaledl train`` process (:meth:`Runs.run` without a pool)."""
    return Runs(env, pool=False).run(method, spec, run_dir)


def run_all(methods: list[Method], spec: BenchSpec, out: Path, repeats: int = 1,
            echo: Callable[[str], None] | None = None, runs: Runs | None = None
            ) -> list[list[MethodResult]]:
    """Every method ``repeats`` times, one run at a time (round r runs every method once, so a
    slow phase of the machine does not hit one method only), started by ``runs``; results per
    method."""
    own = runs is None
    runs = runs or Runs()
    results: list[list[MethodResult]] = [[] for _ in methods]
    try:
        for repeat in range(repeats):
            for index, method in enumerate(methods):
                run_dir = out / (method.name if repeats == 1 else f"{method.name}-{repeat + 1}")
                if echo is not None:
                    echo(f"[{repeat * len(methods) + index + 1}/{repeats * len(methods)}] "
                         f"{method.label}: {run_dir}")
                result = runs.run(method, spec, run_dir)
                if echo is not None:
                    echo(_one_line(result))
                results[index].append(result)
    finally:
        if own:
            runs.close()
    return results


def _one_line(result: MethodResult) -> str:
    if result.status != "ok":
        return f"    {result.status}: {result.reason}"
    reached = ("-" if result.time_to_target_s is None else f"{result.time_to_target_s:.1f} s")
    return (f"    final accuracy {result.final_accuracy:.4f}, to target {reached}, "
            f"{result.wall_s or 0.0:.0f} s in all")
