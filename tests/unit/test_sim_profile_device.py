"""A measured profile's times are its device's: ``scaledl simulate --profile`` predicts the
device the profile was measured on (``--device`` defaults to it: ``cpu``, or the GPU preset CUDA's
name for the GPU matches) and refuses, in one line, a ``--device`` of another kind or another
GPU, instead of pricing, say, 16 P100s with a CPU's layer times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.sim.scenario import resolve
from scaledl.sim.job import Job
from scaledl.sim.presets import DEVICES, devices_named

ROOT = Path(__file__).resolve().parents[2] / "benchmarks"
CPU = ROOT / "sim_validation" / "raw" / "profile-mlp.json"
H100 = ROOT / "device" / "h100-2026-11-26" / "rate-resnet50-tf32.json"


def _on_gpu(tmp_path: Path, name: str) -> Path:
    """The VM's MLP profile, as if measured on the CUDA device ``name``."""
    data = json.loads(CPU.read_text())
    data["device"] = {**data["device"], "type": "cuda", "name": name}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name, presets", [
    ("NVIDIA H100 80GB HBM3", ("h100",)), ("NVIDIA H200", ("h200",)),
    ("NVIDIA A100-SXM4-80GB", ("a100-80gb", "a100")), ("NVIDIA A100-SXM4-40GB", ("a100",)),
    ("NVIDIA A100 80GB PCIe", ("a100-80gb", "a100")), ("Tesla V100-SXM2-32GB", ("v100",)),
    ("Tesla P100-PCIE-16GB", ("p100",)), ("Tesla K80", ("k80",)),
    ("NVIDIA RTX A1000", ()), ("NVIDIA GH200 480GB", ()), ("NVIDIA GeForce RTX 4090", ()),
])
def test_cuda_names_find_their_preset_by_whole_words(name: str, presets: tuple[str, ...]
                                                     ) -> None:
    assert devices_named(name) == presets
    assert all(DEVICES[p].is_gpu for p in presets)


@pytest.mark.parametrize("profile, header", [(CPU, "mlp x 4 cpu ranks"),
                                             (H100, "resnet50 x 4 h100 GPUs")])
def test_the_device_defaults_to_the_profiles(profile: Path, header: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--profile", str(profile), "--gpus", "4", "--batch", "64"]) == 0
    assert capsys.readouterr().out.startswith(header)


@pytest.mark.parametrize("profile, wrong, told", [
    (CPU, "v100", "measured on a CPU; drop --device (cpu is used)"),
    (H100, "cpu", "measured on NVIDIA H100 80GB HBM3 (h100); drop --device (h100 is used)"),
    (H100, "a100", "measured on NVIDIA H100 80GB HBM3 (h100); drop --device (h100 is used)"),
])
def test_another_device_is_one_line(profile: Path, wrong: str, told: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--profile", str(profile), "--device", wrong, "--gpus", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"--device {wrong} but the profile {profile} was {told}" in captured.err
    with pytest.raises(ValueError, match=f"^device {wrong} but"):  # the field, not the flag
        resolve(Job(model="mlp", device=wrong, gpus=4, profile_path=profile)).run()


def test_a_gpu_no_preset_names_needs_a_device(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _on_gpu(tmp_path, "NVIDIA GeForce RTX 4090")
    assert main(["simulate", "--profile", str(path), "--gpus", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which no device preset names; give --device" in err
    assert main(["simulate", "--profile", str(path), "--device", "a100", "--gpus", "4"]) == 0
    assert "x 4 a100 GPUs" in capsys.readouterr().out
    assert main(["simulate", "--profile", str(path), "--device", "cpu", "--gpus", "4"]) == 2
    assert "measured on NVIDIA GeForce RTX 4090; give the GPU preset" in capsys.readouterr().err


def test_either_a100_preset_takes_an_80gb_profile(tmp_path: Path) -> None:
    path = _on_gpu(tmp_path, "NVIDIA A100-SXM4-80GB")
    for name in ("a100-80gb", "a100"):
        Job(model="mlp", device=name, gpus=4, profile_path=path).check()


def test_a_profile_measured_at_mixed_precision_is_checked_against_mixed_points(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The precision and layout a profile was measured in are the job's: the header says so and
    the published check draws on mixed-precision points, though --mixed-precision itself is
    refused beside --profile."""
    amp = ROOT / "device" / "h200-2026-11-26" / "rate-resnet50-amp.json"
    assert main(["simulate", "--profile", str(amp), "--gpus", "16", "--batch", "128"]) == 0
    out = capsys.readouterr().out
    assert "channels last, mixed precision" in out.splitlines()[0]
    assert "(convolutional, mixed precision)" in out
    assert main(["simulate", "--profile", str(H100), "--gpus", "16", "--batch", "128"]) == 0
    out = capsys.readouterr().out
    assert "mixed precision" not in out.splitlines()[0] and "full precision" in out
