"""Run the methods of ``scaledl bench algorithms``, one ``scaledl train`` process after another.

Each method runs as its own ``python -m scaledl.cli.main train ... --no-progress`` process
(which launches its ranks under torchrun) in its own session, with its output in
``<run dir>/stdout.txt`` and ``stderr.txt``.  Runs never overlap: on a small machine two jobs
would share the cores and distort each other's times.  A run that exceeds the time limit is
stopped (its whole process group) and reported as ``timeout``; one that fails is reported with
the error line of its stderr; either way the next method runs.

A :class:`Runs` starts the runs of one bench and knows which are running, also those started by
``--tune-jobs`` threads: on an interrupt (Ctrl-C, or SIGTERM turned into one by the command)
:meth:`Runs.stop` stops every run's process group and refuses new runs, before the bench exits,
so that a failure leaves no process behind.
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
from scaledl.bench.methods import BenchSpec, Method, train_command
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
    """The runs of one bench: each started in a session of its own, and every one still running
    stopped by :meth:`stop` (from any thread)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env
        """The environment runs start from (default: this process's)."""
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        """Stop every run in progress (its whole process group: SIGTERM, a grace, SIGKILL) and
        refuse new ones; returns once they are gone."""
        with self._lock:
            self._stopped = True
            running = list(self._running)
        stop_process_groups(running)

    def run(self, method: Method, spec: BenchSpec, run_dir: Path) -> MethodResult:
        """Train ``method`` into ``run_dir`` and read its result (a failed result on error);
        ``KeyboardInterrupt`` once :meth:`stop` was called."""
        run_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "scaledl.cli.main", *train_command(method, spec, run_dir)]
        (run_dir / "command.txt").write_text(" ".join(command) + "\n")
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
        try:
            result = read_result(method, spec, run_dir)
        except ValueError as error:
            return failed_result(method, spec, "failed", str(error), wall_s)
        result.wall_s = wall_s
        return result


def run_method(method: Method, spec: BenchSpec, run_dir: Path,
               env: Mapping[str, str] | None = None) -> MethodResult:
    """One run on its own (:meth:`Runs.run`)."""
    return Runs(env).run(method, spec, run_dir)


def run_all(methods: list[Method], spec: BenchSpec, out: Path, repeats: int = 1,
            echo: Callable[[str], None] | None = None, runs: Runs | None = None
            ) -> list[list[MethodResult]]:
    """Every method ``repeats`` times, one run at a time (round r runs every method once, so a
    slow phase of the machine does not hit one method only), started by ``runs``; results per
    method."""
    runs = runs or Runs()
    results: list[list[MethodResult]] = [[] for _ in methods]
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
    return results


def _one_line(result: MethodResult) -> str:
    if result.status != "ok":
        return f"    {result.status}: {result.reason}"
    reached = ("-" if result.time_to_target_s is None else f"{result.time_to_target_s:.1f} s")
    return (f"    final accuracy {result.final_accuracy:.4f}, to target {reached}, "
            f"{result.wall_s or 0.0:.0f} s in all")
