"""Reliability figures of ``scaledl train`` under faults (docs/reliability.md).

    python benchmarks/reliability/run.py [--trials 20] [--seed 0] [--json results.json]

1. **With restarts** (``--max-restarts 1``): each trial starts a 3-worker run of one strategy
   (allreduce, reduce-broadcast, sync-easgd, async-easgd, hogwild-sgd in turn), waits until it
   trains, and SIGKILLs a random rank at a random moment of its training (uniform over the
   uninterrupted run's training time).  A trial passes when the run finishes and, for the
   synchronous strategies, its final model and optimizer state is bitwise equal to the
   uninterrupted run's (computed once per strategy, same seed).
2. **Without restarts**: the same kills, no restart.  A trial passes when the job ends within
   ``--timeout-s`` + 5 s of the kill with an error naming the killed rank (an asynchronous run
   whose killed rank was a plain worker must instead finish and name it as dropped), nothing
   hangs (a run still going after 180 s is a hang), and nothing is left: no process of the
   job, no shared-memory segment of its processes, nothing in its private TMPDIR, no temporary
   file in its run directory.
3. **Bad input**: the project's lists of bad command lines (every test that checks a one-line
   ``scaledl: error:`` and exit code 2) are run with pytest; the count that pass is reported.

A kill that finds its victim already gone (the run ended first) is retried at a new moment.
The load average is recorded before and after (``uptime``), as other work on the machine
stretches the timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from scaledl.train.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from scaledl.train.metrics import read_metrics  # noqa: E402

STRATEGIES: dict[str, list[str]] = {
    "allreduce": ["--algorithm", "ring"],
    "reduce-broadcast": ["--algorithm", "tree"],
    "sync-easgd": ["--tau", "2"],
    "async-easgd": [],
    "hogwild-sgd": [],
}
SYNCHRONOUS = ("allreduce", "reduce-broadcast", "sync-easgd")
WORKERS = 3
TIMEOUT_S = 5
COMMON = ["--workers", str(WORKERS), "--epochs", "8", "--batch-size", "16",
          "--checkpoint-every", "10", "--timeout-s", str(TIMEOUT_S), "--seed", "1",
          "--no-progress"]
HANG_S = 180.0
BAD_INPUT_TESTS = [
    "tests/e2e/test_cli_errors.py",
    "tests/e2e/test_train_cli.py::test_bad_input_is_one_line_and_exit_code_2",
    "tests/e2e/test_train_cli.py::test_corrupt_checkpoint_is_refused",
    "tests/e2e/test_train_strategies_cli.py::test_bad_strategy_options_are_one_line_and_exit_code_2",
    "tests/e2e/test_train_faults.py::test_bad_fault_options_are_one_line_and_exit_code_2",
    "tests/e2e/test_scaledl_run.py::test_bad_input_is_one_line_and_exit_code_2",
    "tests/e2e/test_cli_bench.py::test_bad_input_is_one_line_exit_2",
    "tests/e2e/test_train_slurm_batch.py::test_srun_with_other_worker_count_is_one_line",
    "tests/unit/test_bench_algorithms.py::test_cli_bad_input_is_one_line",
    "tests/unit/test_sim_cli.py::test_user_errors_are_one_line",
    "tests/unit/test_cluster_runner.py::test_cli_errors",
    "tests/e2e/test_cluster_signals.py::test_cli_rejects_bad_timeout_and_rates",
    "tests/unit/test_cli_debug.py",
    "tests/distributed/test_bad_input.py",
]
"""Every list of bad input: command lines answered with one line and exit code 2, and (the
last file) library calls refused with one line on every rank."""


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def final_digest(out: Path) -> str:
    """SHA-256 of the last checkpoint's model and optimizer tensors."""
    state = load_checkpoint(latest_checkpoint(out))
    digest = hashlib.sha256()
    model, optimizer = state["strategy"]["model"], state["strategy"]["optimizer"]["state"]
    for name in sorted(model):
        digest.update(name.encode() + model[name].numpy().tobytes())
    for index in sorted(optimizer):
        for key, value in sorted(optimizer[index].items()):
            if hasattr(value, "numpy"):
                digest.update(f"{index}.{key}".encode() + value.numpy().tobytes())
    digest.update(str(state["step"]).encode())
    return digest.hexdigest()


def start(out: Path, scratch: Path, strategy: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    env.pop("SCALEDL_FAULT", None)
    command = [sys.executable, "-m", "scaledl.cli.main", "train", "--out", str(out),
               "--strategy", strategy, *STRATEGIES[strategy], *COMMON, *extra]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=ROOT)


def training_started(out: Path) -> float | None:
    """Unix time of the first step record, once there is one."""
    try:
        steps = read_metrics(out / "metrics.jsonl", kind="step")
    except ValueError:
        return None
    return float(steps[0]["time"]) if steps else None


def job_processes(out: Path) -> dict[int, dict[str, str]]:
    """pid -> environment of every process whose command line names ``out``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmdline:
            pairs = [item.decode(errors="replace").partition("=") for item in environ]
            found[int(entry.name)] = {key: value for key, _, value in pairs}
    return found


def worker_pid(out: Path, rank: int) -> int | None:
    for pid, env in job_processes(out).items():
        if env.get("RANK") == str(rank) and "TORCHELASTIC_RUN_ID" in env:
            return pid
    return None


def baseline(strategy: str, work: Path) -> tuple[str | None, float]:
    """The uninterrupted run's final digest and training time."""
    out, scratch = work / f"baseline-{strategy}", work / f"tmp-baseline-{strategy}"
    scratch.mkdir()
    proc = start(out, scratch, strategy)
    _, err = proc.communicate(timeout=HANG_S)
    if proc.returncode != 0:
        raise RuntimeError(f"baseline {strategy} failed:\n{err[-3000:]}")
    steps = read_metrics(out / "metrics.jsonl", kind="step")
    duration = float(steps[-1]["time"]) - float(steps[0]["time"])
    return (final_digest(out) if strategy in SYNCHRONOUS else None), duration


def leftovers(out: Path, scratch: Path, seen: set[int]) -> list[str]:
    found = [f"process {pid}" for pid in seen if Path(f"/proc/{pid}").exists()]
    for segment in Path("/dev/shm").glob("scaledl-*"):
        match = re.search(r"-p(\d+)$", segment.name)
        if match and int(match.group(1)) in seen:
            found.append(f"segment {segment.name}")
    found += [f"tmp {p.name}" for p in scratch.iterdir() if not p.name.startswith("torchinductor")]
    found += [f"run dir {p.name}" for p in out.glob(".tmp-*")]
    return found


def trial(index: int, strategy: str, restarts: bool, work: Path, rng: random.Random,
          reference: tuple[str | None, float]) -> dict[str, Any]:
    """One run with one SIGKILL; retried at a new moment if the victim was already gone."""
    for attempt in range(5):
        name = f"{'restart' if restarts else 'stop'}-{index}-{attempt}"
        out, scratch = work / f"trial-{name}", work / f"tmp-{name}"
        scratch.mkdir()
        rank, moment = rng.randrange(WORKERS), rng.uniform(0.0, 0.9) * reference[1]
        proc = start(out, scratch, strategy, "--max-restarts", "1" if restarts else "0")
        began = time.monotonic()
        seen: set[int] = set()
        while training_started(out) is None and proc.poll() is None \
                and time.monotonic() - began < HANG_S:
            seen.update(job_processes(out))
            time.sleep(0.02)
        time.sleep(moment)
        seen.update(job_processes(out))
        victim = worker_pid(out, rank)
        if victim is None or proc.poll() is not None:
            proc.kill()
            proc.wait()
            shutil.rmtree(out, ignore_errors=True)
            continue
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            _, err = proc.communicate(timeout=HANG_S)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            hung = True
        ended = time.monotonic() - killed_at
        return judge(index, strategy, restarts, rank, moment, out, scratch, seen, proc.returncode,
                     err, ended, hung, reference[0], attempt)
    raise RuntimeError(f"trial {index}: the run ended before every kill")


def judge(index: int, strategy: str, restarts: bool, rank: int, moment: float, out: Path,
          scratch: Path, seen: set[int], code: int, err: str, ended: float, hung: bool,
          digest: str | None, retries: int) -> dict[str, Any]:
    record: dict[str, Any] = {"trial": index, "strategy": strategy, "restarts": restarts,
                              "killed_rank": rank, "moment_s": round(moment, 3),
                              "exit_code": code, "ended_after_kill_s": round(ended, 2),
                              "hung": hung, "retries": retries}
    summary = out / "summary.json"
    result = json.loads(summary.read_text())["result"] if summary.is_file() else {}
    dropped = result.get("dropped_workers") or []
    record["dropped"] = dropped
    record["leftovers"] = leftovers(out, scratch, seen)
    if restarts:
        record["finished"] = code == 0
        record["restarts_recorded"] = result.get("restarts")
        if digest is not None and code == 0:
            record["bitwise_equal"] = final_digest(out) == digest
        record["passed"] = record["finished"] and record.get("bitwise_equal", True) \
            and not record["leftovers"]
    else:
        named = f"worker rank {rank} died (SIGKILL)" in err
        if strategy not in SYNCHRONOUS and rank != 0:
            record["outcome"] = "dropped, finished"
            record["passed"] = code == 0 and dropped == [rank] and named
        else:
            record["outcome"] = "stopped"
            record["passed"] = code != 0 and named and ended < TIMEOUT_S + 5
        record["passed"] = record["passed"] and not hung and not record["leftovers"]
    if not record["passed"]:
        record["stderr_tail"] = err[-1500:]
    return record


def bad_inputs(work: Path) -> dict[str, Any]:
    report = work / "bad-input.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", *BAD_INPUT_TESTS], cwd=ROOT,
                   capture_output=True, text=True, timeout=1800)
    per_file: dict[str, list[int]] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "")
        counts = per_file.setdefault(name, [0, 0])
        counts[1] += 1
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            counts[0] += 1
    passed = sum(c[0] for c in per_file.values())
    total = sum(c[1] for c in per_file.values())
    return {"passed": passed, "total": total,
            "per_file": {name: f"{c[0]}/{c[1]}" for name, c in sorted(per_file.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=str(Path(__file__).with_name("results.json")))
    parser.add_argument("--skip-bad-input", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results: dict[str, Any] = {"load_before": uptime(), "trials": []}
    names = list(STRATEGIES)
    with tempfile.TemporaryDirectory(prefix="scaledl-reliability-") as tmp:
        work = Path(tmp)
        reference = {strategy: baseline(strategy, work) for strategy in names}
        results["baseline_training_s"] = {k: round(v[1], 2) for k, v in reference.items()}
        for restarts in (True, False):
            for index in range(args.trials):
                strategy = names[index % len(names)]
                record = trial(index, strategy, restarts, work, rng, reference[strategy])
                results["trials"].append(record)
                print(json.dumps({k: v for k, v in record.items() if k != "stderr_tail"}),
                      flush=True)
        if not args.skip_bad_input:
            results["bad_input"] = bad_inputs(work)
    results["load_after"] = uptime()
    for restarts in (True, False):
        runs = [r for r in results["trials"] if r["restarts"] is restarts]
        key = "with_restarts" if restarts else "without_restarts"
        results[key] = {"passed": sum(r["passed"] for r in runs), "trials": len(runs),
                        "hangs": sum(r["hung"] for r in runs),
                        "leftovers": sum(bool(r["leftovers"]) for r in runs)}
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "trials"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
