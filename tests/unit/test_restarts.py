"""A restarted worker finds its own job's checkpoint (and only its own); the restart's cost is
read from the metrics the failed attempt left; the sample log keeps the last attempt's steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scaledl.train.checkpoint import checkpoint_path, write_checkpoint
from scaledl.train.config import build_config
from scaledl.train.metrics import MetricsWriter
from scaledl.launchers import LAUNCH_ID_ENV
from scaledl.train.restarts import job_id, restart_record, restart_totals
from scaledl.train.resume import JOB_KEY, find_resume
from scaledl.train.sample_log import SampleLog, effective_samples


def test_job_id_prefers_scaledl_and_ignores_torchruns_placeholder() -> None:
    assert job_id({LAUNCH_ID_ENV: "abc", "TORCHELASTIC_RUN_ID": "x"}) == "abc"
    assert job_id({"TORCHELASTIC_RUN_ID": "rdzv7"}) == "rdzv7"
    assert job_id({"TORCHELASTIC_RUN_ID": "none"}) is None and job_id({}) is None


def _checkpoint(out: Path, step: int, job: str | None) -> None:
    write_checkpoint(out, step, {"step": step, "epoch": 0, "world_size": 2, "config": {},
                                 JOB_KEY: job, "w": torch.full((2,), float(step))})


@pytest.mark.parametrize(("resume", "job", "expected"), [
    (None, "job-a", (6, True)),      # a restart of job a resumes on its own
    (None, "job-b", (None, False)),  # another job starts fresh
    (None, None, (None, False)),     # no identity: no restart
    ("auto", "job-b", (6, False)),   # --resume auto continues someone else's run
])
def test_find_resume(tmp_path: Path, resume: str | None, job: str | None,
                     expected: tuple[int | None, bool]) -> None:
    _checkpoint(tmp_path, 3, "job-a")
    _checkpoint(tmp_path, 6, "job-a")
    config = build_config({}, {"out": str(tmp_path), "resume": resume})
    found = find_resume(config, tmp_path, job)
    step = None if found.state is None else found.state["step"]
    assert (step, found.restarted) == expected


def _metrics(path: Path, job: str, steps: int, start: float = 1000.0) -> None:
    with MetricsWriter(path) as metrics:
        metrics.write({"kind": "run", "time": start, "launch_id": job})
        for step in range(1, steps + 1):
            metrics.write({"kind": "step", "step": step, "epoch": 0, "time": start + step})


def test_restart_record_counts_the_steps_redone_and_the_time_lost(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _metrics(path, "job-a", 13)
    record = restart_record(path, "job-a", 8, 2, 3)
    assert record is not None
    assert record["steps_redone"] == 5 and record["failed_after_step"] == 13
    assert record["time_lost_s"] > 0 and (record["world_size"], record["previous_world_size"]) \
        == (2, 3)
    assert restart_record(path, "job-b", 8, 2, 3) is None  # another job's metrics
    assert restart_record(tmp_path / "none.jsonl", "job-a", 8, 2, 3) is None
    from_scratch = restart_record(path, "job-a", 0, 2, None)
    assert from_scratch is not None and from_scratch["steps_redone"] == 13


def test_restart_totals_add_up_every_restart(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as metrics:
        for redone, lost, before, after in ((3, 2.0, 3, 3), (4, 1.5, 3, 2)):
            metrics.write({"kind": "restart", "steps_redone": redone, "time_lost_s": lost,
                           "previous_world_size": before, "world_size": after})
    assert restart_totals(path) == {"restarts": 2, "steps_redone": 7, "time_lost_s": 3.5,
                                    "world_sizes": [3, 3, 2]}
    assert restart_totals(tmp_path / "none.jsonl")["restarts"] == 0


def test_effective_samples_keep_the_last_attempt_of_every_step(tmp_path: Path) -> None:
    first = [SampleLog(tmp_path, rank, 2, 1.0, None, "job") for rank in range(2)]
    for step in (1, 2, 3):  # step 3 is lost: the restart resumes from step 2
        for rank, log in enumerate(first):
            log.record(step, 0, torch.tensor([10 * step + rank]))
    second = SampleLog(tmp_path, 0, 1, 2.0, 2, "job")  # one worker left
    second.record(3, 0, torch.tensor([99]))
    for log in (*first, second):
        log.close()
    assert sorted(effective_samples(tmp_path)[0]) == [10, 11, 20, 21, 99]
    lines = (tmp_path / "samples" / "rank-00000.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["resumed_step"] == 2


def test_tidy_run_dir_removes_what_killed_writers_leave(tmp_path: Path) -> None:
    from scaledl.train.resume import tidy_run_dir

    _checkpoint(tmp_path, 3, "job")
    (tmp_path / ".tmp-checkpoint-step000006.pt.0a1b").write_bytes(b"half")
    (tmp_path / ".metrics.jsonl.tmp").write_text("{")
    (tmp_path / ".ranks").mkdir()
    (tmp_path / ".ranks" / "rank-00001.json").write_text("{}")
    assert sorted(tidy_run_dir(tmp_path)) == [".metrics.jsonl.tmp", ".ranks",
                                              ".tmp-checkpoint-step000006.pt.0a1b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-step000003.pt", "latest"]
    assert tidy_run_dir(tmp_path / "missing") == []


def test_a_fresh_run_clears_every_output_of_an_earlier_one(tmp_path: Path) -> None:
    """An earlier run's checkpoints, metrics, summary, timeline, plots and sample log all go,
    so a fresh run that fails early leaves nothing that reads as its own; the user's other
    files stay."""
    from scaledl.train.resume import clear_old_run

    _checkpoint(tmp_path, 3, "job")
    for name in ("metrics.jsonl", "summary.json", "timeline.json", "loss.png", "accuracy.png",
                 "notes.txt"):
        (tmp_path / name).write_text("earlier run")
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "rank-00000.jsonl").write_text("{}")
    clear_old_run(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_failed_run_says_whether_a_checkpoint_is_left_to_resume(
        checkpointed: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from scaledl.cli.train import _report_failure

    if checkpointed:
        _checkpoint(tmp_path, 3, "job")
    config = build_config({}, {"out": str(tmp_path)})
    with caplog.at_level("ERROR"):
        _report_failure(137, config)
    message = caplog.records[-1].getMessage()
    assert message.startswith("training failed (exit code 137)")
    if checkpointed:
        assert "keeps the last good checkpoint (--resume auto continues from it)" in message
    else:
        assert "before its first checkpoint; there is nothing to resume" in message


@pytest.mark.parametrize("resume", ["auto", "file"])
def test_a_checkpoint_of_another_model_is_refused_before_launch(
        resume: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, every worker loaded the checkpoint after launch and failed alike."""
    import scaledl.cli.train as train_cli
    from scaledl.cli.main import main

    write_checkpoint(tmp_path, 4, {"step": 4, "epoch": 0, "world_size": 2, JOB_KEY: "job",
                                   "config": {"model": {"name": "resnet20"}}})
    path = "auto" if resume == "auto" else str(checkpoint_path(tmp_path, 4))

    def launched(*_: object, **__: object) -> int:
        raise AssertionError("workers were launched")

    monkeypatch.setattr(train_cli, "run_distributed", launched)
    assert main(["train", "--out", str(tmp_path), "--resume", path, "--model", "mlp",
                 "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "was trained with model.name='resnet20', not 'mlp'; resume with the same name" in err
