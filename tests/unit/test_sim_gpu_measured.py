"""What a lent H100 and a lent H200 measured (benchmarks/device/h100-2026-11-26,
h200-2026-11-26) against the simulator.

The profiles there were taken on CUDA by ``scaledl.profiling.measure``
(``benchmarks/device/rates.py``): a profile predicts a batch it did not measure, the rates in
``device_checks`` are the ones in those files, and the H100 and H200 presets (whose ``e`` is the
A100's, carried over) predict the convolutional networks' measured rates within 15% (H100 -10%
to +1%, H200 -6% to +15%; EfficientNet's depthwise layers excepted, docs/simulation.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaledl.cli.simulate_report import format_profile
from scaledl.sim.device_checks import RATE_CHECKS, RateCheck, predicted_rate
from scaledl.sim.scenario import job_losses, resolve
from scaledl.sim.job import Job
from scaledl.sim.presets import device
from scaledl.profiling.profile_file import load_profile

DEVICE_RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "device"
RUN = DEVICE_RUNS / "h100-2026-11-26"
GPUS = {"h100": (RUN, "NVIDIA H100 80GB HBM3"),
        "h200": (DEVICE_RUNS / "h200-2026-11-26", "NVIDIA H200")}
"""Preset: the folder of its rates and profiles, and the name CUDA gave the GPU."""


def _measured(run: Path) -> dict[tuple[str, int, bool], float]:
    rows = [json.loads(line) for line in (run / "rates.jsonl").read_text().splitlines()]
    return {(r["model"], r["batch"], r["precision"] == "amp"): r["samples_per_s"] for r in rows}


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_profiles_were_taken_on_that_gpu_with_cuda(gpu: str) -> None:
    run, name = GPUS[gpu]
    paths = list(run.glob("rate-*.json"))
    assert len(paths) == 9
    for path in paths:
        device = load_profile(path).device
        assert device["type"] == "cuda" and device["name"] == name, path.name


def test_a_cuda_profile_predicts_a_batch_it_did_not_measure() -> None:
    held_out = load_profile(RUN / "rate-resnet50-tf32-b192.json")
    assert held_out.batches == (192,)
    measured = held_out.forward_backward_s[0] + held_out.update_s[0]
    job = Job(model="resnet50", gpus=1, topology="1", device="h100", batch=192,
              profile_path=str(RUN / "rate-resnet50-tf32.json"))
    assert load_profile(RUN / "rate-resnet50-tf32.json").batches == (64, 128, 256)
    assert resolve(job).run().iteration_s == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_rate_table_carries_the_measured_rates(gpu: str) -> None:
    measured = _measured(GPUS[gpu][0])
    checks = [c for c in RATE_CHECKS if c.device == gpu]
    assert len(checks) == len(measured) == 12
    for check in checks:
        rate = measured[(check.model, check.batch, check.mixed_precision)]
        assert check.published == pytest.approx(rate, abs=0.05)
        assert GPUS[gpu][0].name in check.source


@pytest.mark.parametrize("check", [c for c in RATE_CHECKS if c.device in GPUS
                                   and c.model in ("resnet50", "resnext101_32x4d")],
                         ids=lambda c: f"{c.device}-{c.model}-{c.batch}-{c.mixed_precision}")
def test_the_preset_predicts_the_measured_convnets(check: RateCheck) -> None:
    assert predicted_rate(check) == pytest.approx(check.published, rel=0.15)


def test_a_cuda_profile_keeps_the_devices_interference() -> None:
    cuda_path = RUN / "rate-resnet50-tf32.json"
    assert load_profile(cuda_path).interference > 0.3  # a whole-GPU kernel beside the model
    on_gpu = Job(model="resnet50", gpus=8, device="h100", batch=64, profile_path=str(cuda_path))
    assert job_losses(on_gpu).interference == device("h100").interference
    cpu_path = RUN.parents[1] / "sim_validation" / "raw" / "profile-resnet20.json"
    on_cpu = Job(model="resnet20", gpus=4, device="cpu", batch=32, profile_path=str(cpu_path))
    assert job_losses(on_cpu).interference == load_profile(cpu_path).interference
    assert "an upper bound" in format_profile(load_profile(cuda_path), cuda_path)
    assert "an upper bound" not in format_profile(load_profile(cpu_path), cpu_path)
