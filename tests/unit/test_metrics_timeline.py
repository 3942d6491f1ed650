"""Step metrics (JSONL, run summary), the Chrome-trace timeline and the metric plots."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from scaledl.train.metrics import MetricsWriter, RunStats, StepTimer, StepTimes, read_metrics
from scaledl.train.plots import plot_metrics
from scaledl.train.timeline import Timeline, load_timeline, merge_timelines


# -- metrics ----------------------------------------------------------------------------------
def test_metrics_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter(path, flush_interval_s=60.0) as writer:
        writer.log_run(model="mlp", dataset="digits", world_size=2)
        writer.log_step(1, 0, loss=torch.tensor(2.5), accuracy=0.25, samples_per_s=100.0,
                        comm_s=0.01, wait_s=0.002)
        writer.log_step(2, 0, loss=float("nan"), accuracy=0.5)
        writer.log_eval(2, 0, test_accuracy=0.75)
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    for line in lines:
        json.loads(line, parse_constant=lambda name: pytest.fail(f"non-JSON {name}"))
    steps = read_metrics(path, kind="step")
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["loss"] == 2.5 and steps[0]["comm_s"] == 0.01
    assert steps[1]["loss"] is None  # NaN stored as null
    assert isinstance(steps[0]["time"], float)
    assert read_metrics(path, kind="eval")[0]["test_accuracy"] == 0.75
    with pytest.raises(ValueError, match="closed"):
        writer.log_step(3, 0, loss=1.0)


def test_metrics_flush_on_interval(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, flush_interval_s=0.0)
    writer.log_step(1, 0, loss=1.0)
    assert len(read_metrics(path)) == 1  # readable before close
    writer.close()


def test_read_metrics_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind":"step","step":1}\n{"kind":"step","st')
    assert read_metrics(path) == [{"kind": "step", "step": 1}]
    path.write_text('{"kind":"step","step":1}\nnot json\n{"kind":"step","step":2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)
    with pytest.raises(ValueError, match="missing.jsonl"):
        read_metrics(tmp_path / "missing.jsonl")


def test_metrics_truncate_after_step_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        writer.log_run(model="mlp")
        for step in range(1, 6):
            writer.log_step(step, 0, loss=1.0 / step)
    with MetricsWriter(path, truncate_after_step=3) as writer:
        writer.log_step(4, 0, loss=0.3)
    assert [r.get("step") for r in read_metrics(path)] == [None, 1, 2, 3, 4]


def test_run_summary_definitions() -> None:
    stats = RunStats()
    stats.add(StepTimes(step_s=1.0, comm_s=0.5, wait_s=0.1), samples=64)
    stats.add(StepTimes(step_s=1.0, comm_s=0.5, wait_s=0.3), samples=64)
    summary = stats.summary()
    assert summary.steps == 2 and summary.samples == 128
    assert summary.samples_per_s == pytest.approx(64.0)
    assert summary.comm_share == pytest.approx(0.5)
    assert summary.exposed_share == pytest.approx(0.2)
    assert summary.hidden_fraction == pytest.approx(1 - 0.4 / 1.0)
    assert summary.wall_s >= 0
    json.dumps(summary.to_dict())


def test_hidden_fraction_is_clipped_and_none_without_comm() -> None:
    stats = RunStats()
    assert stats.summary().hidden_fraction is None
    assert stats.summary().samples_per_s == 0.0
    stats.add(StepTimes(step_s=1.0, comm_s=0.1, wait_s=0.5), samples=1)  # wait > comm
    assert stats.summary().hidden_fraction == 0.0


def test_step_timer_counts_comm_from_another_thread_and_waits() -> None:
    timer = StepTimer()
    timer.start()
    worker = threading.Thread(target=lambda: [timer.add_comm(0.001) for _ in range(100)])
    worker.start()
    with timer.waiting():
        worker.join()
        time.sleep(0.01)
    times = timer.stop()
    assert times.comm_s == pytest.approx(0.1)
    assert 0.01 <= times.wait_s <= times.step_s
    with pytest.raises(ValueError, match="start"):
        timer.stop()


# -- timeline ---------------------------------------------------------------------------------
def _by_phase(trace: dict, phase: str) -> list[dict]:
    return [event for event in trace["traceEvents"] if event["ph"] == phase]


def test_timeline_is_a_valid_chrome_trace(tmp_path: Path) -> None:
    timeline = Timeline(rank=3)
    timeline.begin_step(0)
    with timeline.span("forward", "compute", lane="compute", layer=1):
        time.sleep(0.002)
    start = time.perf_counter()
    timeline.record("allreduce", "comm", start, start + 0.005, lane="comm", nbytes=4096,
                    busbw=float("inf"))
    timeline.instant("checkpoint", "io", lane="compute")
    path = timeline.save(tmp_path / "rank3.json")
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    spans = {event["name"]: event for event in _by_phase(trace, "X")}
    assert set(spans) == {"forward", "allreduce"}
    for event in spans.values():
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid"} <= set(event)
        assert event["pid"] == 3 and event["ts"] >= 0
    assert spans["forward"]["dur"] >= 2000  # microseconds
    assert spans["allreduce"]["dur"] == pytest.approx(5000, abs=1)
    assert spans["allreduce"]["args"] == {"nbytes": 4096, "busbw": None}
    assert spans["forward"]["tid"] != spans["allreduce"]["tid"]
    names = {(e["name"], e["args"].get("name")) for e in _by_phase(trace, "M")}
    assert ("process_name", "rank 3") in names
    assert {("thread_name", "compute"), ("thread_name", "comm")} <= names
    assert [e["name"] for e in _by_phase(trace, "i")] == ["step", "checkpoint"]


def test_timeline_records_from_two_threads() -> None:
    timeline = Timeline(rank=0, max_steps=None)
    barrier = threading.Barrier(2)

    def work(lane: str) -> None:
        barrier.wait()
        for index in range(500):
            with timeline.span(f"{lane}-{index}", lane):
                pass

    threads = [threading.Thread(target=work, args=(lane,), name=lane)
               for lane in ("compute", "comm")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trace = timeline.to_dict()
    spans = _by_phase(trace, "X")
    assert len(spans) == 1000
    lanes = {e["tid"]: e["args"]["name"] for e in _by_phase(trace, "M")
             if e["name"] == "thread_name"}
    for event in spans:
        assert event["name"].startswith(lanes[event["tid"]])  # the thread's name is its lane
    json.dumps(trace)


def test_timeline_caps_steps_and_events() -> None:
    timeline = Timeline(rank=0, max_steps=2)
    for step in range(5):
        timeline.begin_step(step)
        with timeline.span("forward", "compute"):
            pass
    spans = _by_phase(timeline.to_dict(), "X")
    assert len(spans) == 2 and not timeline.recording
    small = Timeline(rank=0, max_steps=None, max_events=10)
    for index in range(100):
        small.instant(f"i{index}", "test")
    events = [e for e in small.events() if e["ph"] != "M"]
    assert len(events) == 11 and events[-1]["name"] == "timeline stopped"


def test_merge_aligns_ranks_on_wall_clock(tmp_path: Path) -> None:
    paths = []
    for rank in range(2):
        timeline = Timeline(rank=rank)
        timeline.origin_wall_s = 1000.0 + rank * 0.5  # rank 1 started half a second later
        timeline.record("allreduce", "comm", timeline.origin_s, timeline.origin_s + 0.001,
                        lane="comm")
        paths.append(timeline.save(tmp_path / f"timeline-rank{rank}.json"))
    out = merge_timelines(paths, tmp_path / "timeline.json")
    trace = load_timeline(out)
    spans = sorted(_by_phase(trace, "X"), key=lambda event: event["pid"])
    assert [e["pid"] for e in spans] == [0, 1]
    assert spans[0]["ts"] == 0.0
    assert spans[1]["ts"] == pytest.approx(500_000.0)
    assert {e["args"]["name"] for e in _by_phase(trace, "M") if e["name"] == "process_name"} == {
        "rank 0", "rank 1"}
    assert trace["otherData"]["ranks"] == [0, 1]
    with pytest.raises(ValueError, match="both hold pid"):
        merge_timelines([paths[0], paths[0]], tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="junk.json"):
        merge_timelines([tmp_path / "junk.json"], tmp_path / "bad.json")


# -- plots ------------------------------------------------------------------------------------
def test_plot_metrics_writes_pngs(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        writer.log_run(model="mlp", dataset="digits", world_size=2)
        for step in range(1, 121):
            epoch = (step - 1) // 40
            writer.log_step(step, epoch, loss=2.0 * math.exp(-step / 40), accuracy=step / 130)
            if step % 40 == 0:
                writer.log_eval(step, epoch, test_loss=0.5, test_accuracy=0.8 + epoch / 20)
    written = plot_metrics(path, tmp_path / "plots")
    assert [p.name for p in written] == ["loss.png", "accuracy.png"]
    for png in written:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_plot_metrics_needs_records(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind":"run","model":"mlp"}\n')
    with pytest.raises(ValueError, match="no step or eval records"):
        plot_metrics(path, tmp_path)
