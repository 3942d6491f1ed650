"""``scaledl train`` end to end: accuracy, output files, bad input, a killed worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.train.checkpoint import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.distributed


def _scaledl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "scaledl.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_default_training_reaches_90_percent_and_writes_every_output(tmp_path: Path) -> None:
    done = _scaledl("train", "--workers", "2", "--out", str(tmp_path), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result"]["test_accuracy"] >= 0.90
    assert summary["result"]["world_size"] == 2
    # the default MLP's gradients fit one bucket, so none can be hidden; the summary says why
    assert len(summary["result"]["gradient_buckets"]) == 1
    if summary["result"]["hidden_fraction"] < 0.05:
        assert "fit one 25 MiB bucket" in summary["result"]["overlap_note"]
        assert "why none is hidden" in done.stdout
    for name in ("metrics.jsonl", "timeline.json", "loss.png", "accuracy.png", "latest"):
        assert (tmp_path / name).stat().st_size > 0, name
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in steps if r.get("kind") == "step") == summary["result"]["steps"]
    trace = json.loads((tmp_path / "timeline.json").read_text())
    categories = {e.get("cat") for e in trace["traceEvents"]}
    assert {"compute", "comm", "wait"} <= categories
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["world_size"] == 2 and state["epoch"] == 10


@pytest.mark.parametrize(("args", "needle"), [
    (["--workers", "0"], "workers"),
    (["--model", "resnet1000"], "unknown model 'resnet1000'"),
    (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
    (["--strategy", "gossip"], "strategy"),
    (["--algorithm", "bogus"], "algorithm 'bogus'"),
    (["--strategy", "reduce-broadcast", "--algorithm", "ring"], "does not work with strategy"),
    (["--workers", "2", "--topology", "2x2"], "describes 4 ranks but 2 workers"),
    (["--batch-size", "0"], "batch_size"),
    (["--momentum", "1.5"], "momentum"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "/nonexistent/mnist"),
])
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["train", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err and err[-1].startswith("scaledl: error: ") and needle in err[-1], err
    assert "Traceback" not in "\n".join(err)


def test_corrupt_checkpoint_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "checkpoint-step000001.pt"
    broken.write_bytes(b"not a checkpoint")
    code = main(["train", "--out", str(tmp_path), "--resume", str(broken)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and str(broken) in err[-1]


def _worker_pid(out: Path, rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmdline and f"RANK={rank}".encode() in environ and \
                b"torch.distributed.run" not in b" ".join(cmdline):
            return int(entry.name)
    return None


def test_killed_worker_stops_the_job_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaledl.cli.main", "train", "--workers", "2", "--out",
         str(tmp_path), "--epochs", "400", "--checkpoint-every", "20", "--timeout-s", "10",
         "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while latest_checkpoint(tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        victim = _worker_pid(tmp_path, 1)
        assert victim is not None, "could not find worker rank 1"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert time.monotonic() - killed_at < 60
    assert "training failed" in err or "rank 1" in err or "Signal 9" in err, err[-2000:]
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["step"] % 20 == 0 and state["step"] > 0


def test_new_options_from_toml_and_flags_under_torchrun_and_load_model(tmp_path: Path) -> None:
    """The training options of issue 41 from a TOML file and flags, in one run of 2 ranks under
    torchrun (each rank parses them itself, as under mpirun and srun): bf16, AdamW, linear
    scaling with warm-up and a cosine schedule, clipping, accumulation, bf16 compression, and
    max_steps ending the run inside its third epoch; then load_model gives its weights."""
    import torch

    import scaledl

    config = tmp_path / "run.toml"
    config.write_text(
        '[optim]\noptimizer = "adamw"\nlr = 0.003\nlr_schedule = "cosine"\nwarmup_epochs = 0.5\n'
        'grad_accum = 2\nclip_grad_norm = 1.0\nmax_steps = 30\nepochs = 3\n'
        '[parallel]\ncompression = "bf16"\n[run]\nprecision = "bf16"\n')
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "scaledl.cli.main", "train", "--config", str(config), "--lr-scaling", "linear",
         "--lr-reference-batch", "64", "--out", str(run), "--no-progress"],
        env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["optim"]["grad_accum"] == 2
    assert summary["config"]["parallel"]["compression"] == "bf16"
    assert summary["result"]["steps"] == 30 and summary["result"]["test_accuracy"] >= 0.85
    # the summary counts what went on the wire: half the float32 gradients, once per step
    sent = summary["result"]["bytes_sent"] / 30 / sum(summary["result"]["gradient_buckets"])
    assert 0.5 <= sent < 0.501, sent
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in steps if r.get("kind") == "step"]
    # global batch 32 x 2 ranks x 2 = 128: the rate rises from 0.003 to 0.003 x 128 / 64
    assert rates[0] == 0.003 and max(rates) == pytest.approx(0.006) and rates[-1] < rates[10]
    state = load_checkpoint(latest_checkpoint(run))
    assert state["step"] == 30 and state["epoch"] == 2  # inside the third epoch
    model = scaledl.load_model(run).state_dict()
    assert all(torch.equal(model[key], value) for key, value in
               state["strategy"]["model"].items())
