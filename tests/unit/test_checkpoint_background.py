"""Background checkpoints: the snapshot is taken at submit, one write at a time (a periodic one
is skipped while another is in flight, a required one waits), errors come back; and the
schedule by steps and seconds, agreed at probe steps."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from scaledl.train import checkpoint_writer
from scaledl.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from scaledl.train.checkpoint_schedule import FIRST_PROBE_STEPS, CheckpointSchedule
from scaledl.train.checkpoint_writer import CheckpointWriter, snapshot


def _state(step: int, weight: torch.Tensor) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "world_size": 1, "config": {}, "model": {"w": weight}}


def test_snapshot_copies_every_tensor_and_keeps_the_containers() -> None:
    weight = torch.ones(3)
    state = {"a": [weight, (weight, 2)], "b": {"c": weight}, "n": 1}
    copied = snapshot(state)
    weight.add_(1)
    assert torch.equal(copied["a"][0], torch.ones(3)) and type(copied["a"][1]) is tuple
    assert copied["b"]["c"].data_ptr() != weight.data_ptr() and copied["n"] == 1


def test_the_written_state_is_the_one_at_submit(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path)
    weight = torch.zeros(1000)
    assert writer.submit(5, _state(5, weight))
    weight.add_(7)  # the next step changes the live tensor while the write goes on
    writer.wait()
    saved = load_checkpoint(latest_checkpoint(tmp_path))
    assert torch.equal(saved["model"]["w"], torch.zeros(1000)) and writer.written == [5]


def test_a_periodic_checkpoint_is_skipped_while_one_is_written_and_a_required_one_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = checkpoint_writer.write_checkpoint

    def slow(*args: Any, **kwargs: Any) -> Path:
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_writer, "write_checkpoint", slow)
    writer = CheckpointWriter(tmp_path)
    assert writer.submit(1, _state(1, torch.ones(2)))
    assert not writer.submit(2, _state(2, torch.ones(2)))  # one in flight: skipped
    assert writer.busy and writer.skipped == [2]
    threading.Timer(0.2, release.set).start()
    assert writer.submit(3, _state(3, torch.ones(2)), wait=True)  # waits for 1, writes 3
    assert writer.written == [1, 3] and not writer.busy
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1, 3]


def test_a_failed_write_is_raised_on_the_training_thread(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = CheckpointWriter(blocker / "run")  # a directory under a file: cannot be made
    writer.submit(1, _state(1, torch.ones(2)))
    with pytest.raises(OSError):
        writer.wait()
    writer.close(5)  # the error was consumed; nothing in flight


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_steps() -> None:
    schedule = CheckpointSchedule(4, None)
    assert [step for step in range(1, 13) if schedule.due(step)] == [4, 8, 12]


def test_every_seconds_alone_decides_every_step() -> None:
    clock = _Clock()
    schedule = CheckpointSchedule(None, 10.0, clock=clock)
    schedule.start(0)
    due = []
    for step in range(1, 40):
        clock.now += 1.0
        if schedule.due(step):
            due.append(step)
            schedule.saved(step)
    assert due == [10, 20, 30]


def test_every_seconds_is_agreed_at_probe_steps_only() -> None:
    clock = _Clock()
    probes: list[int] = []

    def agree(decision: torch.Tensor) -> None:
        probes.append(step)
        assert decision.dtype == torch.int64  # what rank 0 broadcasts

    schedule = CheckpointSchedule(None, 100.0, agree=agree, clock=clock)
    schedule.start(0)
    due = []
    for step in range(1, 400):
        clock.now += 1.0
        if schedule.due(step):
            due.append(step)
            schedule.saved(step)
    assert probes[0] == FIRST_PROBE_STEPS
    assert due and all(100 <= b - a <= 110 for a, b in zip([0, *due], due))
    assert len(probes) < 60  # a few per interval, not one per step


def test_a_disabled_schedule_never_agrees() -> None:
    schedule = CheckpointSchedule(None, 0.0, agree=lambda tensor: pytest.fail("agreed"))
    schedule.start(0)
    assert not any(schedule.due(step) for step in range(1, 50))
