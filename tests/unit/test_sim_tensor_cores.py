"""Convolutions on tensor cores: an NCHW model pays cuDNN's transposes to NHWC around every
convolution (closed form on one operation), a channels-last model does not, presets without
tensor cores never do, and the A100 presets share the efficiency fitted on the part that
measured it."""

from __future__ import annotations

from dataclasses import replace as replace_job
from pathlib import Path

import pytest
from torch import nn

from scaledl.cli.main import main
from scaledl.models.trace import OpCost, operation_costs
from scaledl.sim.compute import RooflineCompute
from scaledl.sim.scenario import job_device, job_profile, resolve, update_seconds
from scaledl.sim.job import Job
from scaledl.sim.presets import DEVICES
from scaledl.sim.profile import Layer, ModelProfile, profile_model
from scaledl.profiling.profile_file import load_profile

CONV = OpCost("aten.convolution.default", 1e8, 4e5, 2e4, 5e4, convolution=True)
"""FLOPs, activation bytes per sample, filter bytes, outputs per sample."""


def _profile(path: Path, *flags: str) -> int:
    """``scaledl simulate profile`` of LeNet at batch 2, quickly, written to ``path``."""
    return main(["simulate", "profile", "--model", "lenet", "--batches", "2", "--repeats", "3",
                 "--warmup", "0", "--threads", "1", *flags, "-o", str(path)])


def _one_layer(*ops: OpCost) -> ModelProfile:
    return ModelProfile("toy", (Layer("conv", 20_000, 1e8, 50_000, ops=ops),), ((5_000, (0,)),))


def test_the_trace_marks_convolutions_and_nothing_else() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 4))
    costs = operation_costs(model, [model[0], model[3]], (3, 8, 8))
    marked = {op.name for ops in costs for op in ops if op.convolution}
    assert marked == {"aten.convolution.default"}
    assert any(not op.convolution for op in costs[1])


def test_grouped_transposed_and_one_dimensional_convolutions_are_not_marked() -> None:
    dense, depthwise = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1, groups=4)
    transposed = nn.ConvTranspose2d(4, 4, 2, stride=2)
    model = nn.Sequential(dense, depthwise, transposed)
    costs = operation_costs(model, list(model), (4, 8, 8))
    marks = [next(op for op in ops if "convolution" in op.name).convolution for ops in costs]
    assert marks == [True, False, False]
    line = nn.Conv1d(4, 4, 3)
    (ops,) = operation_costs(line, [line], (4, 16))
    assert not any(op.convolution for op in ops)


def test_an_nchw_convolution_on_tensor_cores_pays_its_transposes_in_closed_form() -> None:
    device, batch = DEVICES["a100-80gb"], 16
    bandwidth = device.memory_gbps * 1e9
    rate = device.peak_tflops * 1e12 * device.compute_efficiency
    own = max(batch * CONV.flops / rate, (CONV.fixed_bytes + batch * CONV.bytes_per_sample)
              / bandwidth)
    transposes = 2 * (CONV.fixed_bytes + batch * CONV.bytes_per_sample) / bandwidth
    (forward,), (backward,) = RooflineCompute(device).layer_times(_one_layer(CONV), batch)
    assert forward == pytest.approx(own + transposes + device.launch_s)
    assert backward == pytest.approx(2 * forward)
    (last,), _ = RooflineCompute(device, channels_last=True).layer_times(_one_layer(CONV), batch)
    assert last == pytest.approx(own + device.launch_s)


@pytest.mark.parametrize("name", ["k80", "p100", "v100", "cpu"])
def test_presets_without_tensor_cores_never_transpose(name: str) -> None:
    device = DEVICES[name]
    assert not device.nhwc_convolutions
    profile = _one_layer(CONV)
    assert RooflineCompute(device).layer_times(profile, 8) == \
        RooflineCompute(device, channels_last=True).layer_times(profile, 8)


def test_other_operations_and_a_layer_priced_alone() -> None:
    device = DEVICES["h100"]
    gemm = OpCost("aten.mm.default", 1e8, 4e5, 2e4, 5e4)
    assert RooflineCompute(device).layer_times(_one_layer(gemm), 8) == \
        RooflineCompute(device, channels_last=True).layer_times(_one_layer(gemm), 8)
    alone = ModelProfile("toy", (Layer("c", 20_000, 1e8, 50_000, convolution=True),),
                         ((5_000, (0,)),))
    nchw = RooflineCompute(device).layer_times(alone, 8)[0][0]
    nhwc = RooflineCompute(device, channels_last=True).layer_times(alone, 8)[0][0]
    assert nchw - nhwc == pytest.approx(2 * (20_000 + 8 * 2 * 50_000 * 4) / (device.memory_gbps
                                                                             * 1e9))


def test_the_profile_marks_convolution_layers() -> None:
    layers = profile_model("resnet50").layers
    assert layers[0].convolution and not layers[1].convolution  # the stem's conv, its norm
    assert not layers[-1].convolution  # the classifier
    assert sum(layer.convolution for layer in layers) == 53  # 49 + 4 projection shortcuts


def test_the_a100_presets_share_the_efficiency_fitted_on_the_80_gb_part() -> None:
    small, large = DEVICES["a100"], DEVICES["a100-80gb"]
    assert small.compute_efficiency == large.compute_efficiency
    assert (small.memory_gbps, large.memory_gbps) == (1555.0, 2039.0)
    assert all(DEVICES[name].nhwc_convolutions for name in ("a100", "a100-80gb", "h100"))


def test_channels_last_speeds_up_convolutional_models_only() -> None:
    def rate(model: str, device: str, channels_last: bool, shape: tuple[int, ...] | None = None
             ) -> float:
        job = Job(model=model, gpus=1, topology="1", device=device, batch=64,
                  input_shape=shape, channels_last=channels_last)
        return 1.0 / resolve(job).run().iteration_s
    assert rate("resnet50", "a100-80gb", True) > 1.1 * rate("resnet50", "a100-80gb", False)
    assert rate("resnet50", "v100", True) == rate("resnet50", "v100", False)
    assert rate("bert_base", "a100-80gb", True, (128,)) == \
        rate("bert_base", "a100-80gb", False, (128,))


def test_the_cli_option_reaches_the_job_and_the_header(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--device", "a100", "--model", "resnet20", "--gpus", "1"]
    assert main(args) == 0
    nchw = capsys.readouterr().out
    assert main([*args, "--channels-last"]) == 0
    nhwc = capsys.readouterr().out
    assert "channels last" in nhwc.splitlines()[0] and "channels last" not in nchw
    assert nhwc.splitlines()[1] != nchw.splitlines()[1]
    assert main([*args, "--channels-last", "--ideal"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--channels-last does not apply to --ideal" in err


def test_a_profile_measured_channels_last_says_so_and_refuses_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    assert _profile(path, "--channels-last") == 0
    assert "channels last" in capsys.readouterr().out.splitlines()[0]
    assert load_profile(path).device["memory_format"] == "channels_last"
    assert main(["simulate", "--profile", str(path), "--device", "cpu", "--gpus", "2",
                 "--channels-last"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--channels-last does not apply to --profile" in err
    assert main(["simulate", "--profile", str(path), "--device", "v100", "--gpus", "2",
                 "--mixed-precision"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mixed-precision does not apply to --profile" in err


def test_mixed_precision_in_closed_form_on_one_convolution() -> None:
    device, batch = DEVICES["v100"], 16
    rate = device.mixed_tflops * 1e12 * device.tensor_efficiency
    bandwidth = 2 * device.memory_gbps * 1e9  # every tensor at 2 bytes instead of 4
    moved = CONV.fixed_bytes + batch * CONV.bytes_per_sample
    own = max(batch * CONV.flops / rate, moved / bandwidth)
    mixed = RooflineCompute(device, mixed_precision=True)
    (forward,), (backward,) = mixed.layer_times(_one_layer(CONV), batch)
    assert forward == pytest.approx(own + 2 * moved / bandwidth + device.launch_s)
    assert backward == pytest.approx(2 * forward)  # tensor cores: the V100 transposes too
    (nhwc,), _ = RooflineCompute(device, True, True).layer_times(_one_layer(CONV), batch)
    assert nhwc == pytest.approx(own + device.launch_s)
    with pytest.raises(ValueError, match="no mixed-precision"):
        RooflineCompute(DEVICES["p100"], mixed_precision=True).layer_times(_one_layer(CONV), 1)


def test_a_device_needs_both_or_neither_mixed_precision_constant() -> None:
    from dataclasses import replace
    with pytest.raises(ValueError, match="both set or both 0"):
        replace(DEVICES["v100"], tensor_efficiency=0.0)
    with pytest.raises(ValueError, match="both set or both 0"):
        replace(DEVICES["p100"], mixed_tflops=21.2)


def test_device_efficiency_overrides_the_tensor_core_efficiency_under_mixed_precision() -> None:
    job = Job(model="resnet20", gpus=1, topology="1", device="v100", efficiency=0.5,
              mixed_precision=True)
    dev = job_device(job)
    assert dev.tensor_efficiency == 0.5
    assert dev.compute_efficiency == DEVICES["v100"].compute_efficiency


@pytest.mark.parametrize("extra,message", [
    (["--device", "p100"], "--mixed-precision needs a device with tensor cores; p100"),
    (["--device", "a100", "--ideal"], "--mixed-precision does not apply to --ideal"),
])
def test_mixed_precision_refusals_are_one_line(
        extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "resnet20", "--gpus", "2", "--mixed-precision",
                 *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


def test_mixed_precision_reaches_the_header_and_speeds_up_compute(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--device", "v100", "--model", "resnet50", "--gpus", "1"]
    assert main(args) == 0
    fp32 = capsys.readouterr().out.splitlines()
    assert main([*args, "--mixed-precision"]) == 0
    mixed = capsys.readouterr().out.splitlines()
    assert "mixed precision" in mixed[0] and "mixed precision" not in fp32[0]
    assert float(mixed[1].split()[2]) < float(fp32[1].split()[2])


def test_the_ideal_reproduction_drops_precision_and_layout() -> None:
    from scaledl.sim.reproduce import idealised
    job = Job(device="a100", mixed_precision=True, channels_last=True)
    ideal = idealised(job, True)
    assert ideal.lossless and not ideal.mixed_precision and not ideal.channels_last
    assert idealised(job, False) is job
    ideal.check()


def test_mixed_precision_leaves_the_update_and_the_wire_alone() -> None:
    plain = Job(model="resnet50", gpus=8, topology="8", device="v100", intra="nvlink2")
    mixed = replace_job(plain, mixed_precision=True)
    profile = job_profile(plain)
    assert update_seconds(mixed, profile) == update_seconds(plain, profile)
    a, b = resolve(plain).run(), resolve(mixed).run()
    assert b.compute_s < a.compute_s
    assert b.communication_s == pytest.approx(a.communication_s, rel=1e-9)
    half = resolve(replace_job(mixed, allreduce_bytes=2)).run()
    assert half.communication_s < 0.6 * b.communication_s


@pytest.mark.parametrize("action", [["calibrate", "absent.json"], ["reproduce"]])
def test_subcommands_refuse_mixed_precision_in_one_line(
        action: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--mixed-precision", *action]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mixed-precision does not apply to `simulate" in err


def test_a_profile_measured_under_autocast_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    assert _profile(path, "--mixed-precision") == 0
    assert "autocast bfloat16" in capsys.readouterr().out.splitlines()[0]
    measured = load_profile(path)
    assert measured.device["precision"] == "bfloat16"
    assert measured.device["memory_format"] == "contiguous_format"
    plain = tmp_path / "q.json"
    assert _profile(plain) == 0
    assert "autocast" not in capsys.readouterr().out
    assert load_profile(plain).device["precision"] == "float32"


def test_the_hopper_presets_differ_in_memory_only() -> None:
    h100, h200 = DEVICES["h100"], DEVICES["h200"]
    assert replace_job(h200, name="h100", memory_gbps=h100.memory_gbps, source=h100.source,
                       cuda_names=h100.cuda_names) == h100
    assert (h100.memory_gbps, h200.memory_gbps) == (3350.0, 4800.0)

    def rate(device: str) -> float:
        return 256 / resolve(Job(model="resnet50", gpus=1, topology="1", device=device,
                         batch=256)).run().iteration_s

    assert rate("h100") < rate("h200") < rate("h100") * 4800.0 / 3350.0
