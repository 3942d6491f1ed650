"""The trainer reports progress through the StepProgress it is given, on rank 0 only."""

from __future__ import annotations

import pytest

from scaledl.topology import Topology
from scaledl.train.config import build_config
from scaledl.train.trainer import Trainer
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.total = -1

    def start(self, total: int, done: int) -> None:
        self.events.append("start")
        self.total = total

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        assert samples_per_s > 0
        self.events.append("advance")

    def stop(self) -> None:
        self.events.append("stop")


def _train(rank: int, world_size: int, out: str, progress: bool) -> tuple[list[str], int]:
    config = build_config({}, {"out": out, "epochs": 1, "progress": progress})
    recorder = Recorder()
    Trainer(config, Topology.flat(world_size, rank), recorder).run()
    return recorder.events, recorder.total


@pytest.mark.timeout(180)
def test_rank_zero_reports_every_step_and_others_nothing(tmp_path: object) -> None:
    results = run_ranks(2, _train, str(tmp_path), True, timeout=150)
    (events, total), (others, _) = results
    assert events[0] == "start" and events[-1] == "stop"
    assert events.count("advance") == total > 0
    assert others == []


@pytest.mark.timeout(180)
def test_progress_off_reports_nothing(tmp_path: object) -> None:
    results = run_ranks(2, _train, str(tmp_path), False, timeout=150)
    assert [events for events, _ in results] == [[], []]
