"""Measured profiles: measure, write, load, predict; how leaf modules map onto layers; errors
for missing or malformed files.

No timing is asserted: the machine is shared, so only structure and exact identities are
checked here.  Whether the prediction lands within 15% of a separately measured iteration is a
timing check; ``benchmarks/sim_validation/run.sh profile`` and ``analyze.py`` do it and record
the load average (docs/simulation.md, "Validation here")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.profiling.measure import measure_profile, robust_cv
from scaledl.profiling.profile_file import MeasuredProfile, ModuleTimes, load_profile, save_profile
from scaledl.sim.compute import MeasuredCompute, measured_compute
from scaledl.sim.scenario import resolve
from scaledl.sim.job import Job
from scaledl.sim.profile import Layer, ModelProfile


@pytest.fixture(scope="module")
def lenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "lenet.json"
    save_profile(measure_profile("lenet", (1, 28, 28), 10, [2, 4], repeats=3, warmup=1), path)
    return path


def test_profile_round_trip_and_structure(lenet: Path) -> None:
    profile = load_profile(lenet)
    assert profile.batches == (2, 4) and profile.model == "lenet"
    assert json.loads(lenet.read_text())["schema"] == "scaledl.simulate.profile/1"
    save_profile(profile, lenet.with_name("again.json"))
    assert load_profile(lenet.with_name("again.json")) == profile
    kinds = {m.kind for m in profile.modules}
    assert {"Conv2d", "Linear", "ReLU"} <= kinds  # every leaf, with or without parameters
    assert all(min(m.forward_s) >= 0 and min(m.backward_s) >= 0 for m in profile.modules)
    assert all(h > 0 for h in profile.hooked_s) and all(c > 0 for c in profile.coverage)
    assert profile.parameter_bytes == sum(m.parameter_bytes for m in profile.modules)
    assert profile.activation_bytes[1] > profile.activation_bytes[0] > 0
    assert profile.tcp_beta > 0 and profile.interference >= 0 and profile.jitter_cv >= 0


def test_prediction_from_a_profile_reproduces_its_measurement(lenet: Path) -> None:
    """At a measured batch on one GPU, the per-layer times add up to the measured iteration."""
    measured = load_profile(lenet)
    for k, batch in enumerate(measured.batches):
        job = Job(model="lenet", device="cpu", gpus=1, batch=batch, profile_path=lenet)
        result = resolve(job).run()
        expected = measured.forward_backward_s[k] + measured.update_seconds
        assert result.iteration_s == pytest.approx(expected, rel=1e-9)
    two = resolve(Job(model="lenet", device="cpu", gpus=2, topology="2", batch=4,
                      profile_path=lenet, network="1gbit")).run()
    assert two.iteration_s > two.single_gpu_s


def test_cli_profile_then_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mlp.json"
    assert main(["simulate", "profile", "--model", "mlp", "--batches", "2,3", "--repeats", "3",
                 "--warmup", "0", "--threads", "1", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["simulate", "--profile", str(out), "--device", "cpu", "--network", "1gbit",
                 "--gpus", "4", "--topology", "2x2", "--cores", "2", "--batch", "8"]) == 0
    printed = capsys.readouterr().out
    assert "mlp x 4 cpu ranks" in printed and "scaling efficiency" in printed


def _profile(batches: tuple[int, ...], modules: list[tuple[str, int, list[float]]],
             whole: list[float]) -> MeasuredProfile:
    times = tuple(ModuleTimes(name, "X", nbytes, tuple(t), tuple(2 * v for v in t))
                  for name, nbytes, t in modules)
    return MeasuredProfile("toy", (1,), 2, {"type": "cpu"}, batches, times, tuple(whole),
                           tuple(0.001 for _ in batches), 0, tuple(0 for _ in batches), 3,
                           0.0, 0.0, 0.0)


def test_modules_without_parameters_join_the_layer_before_them() -> None:
    layers = ModelProfile("toy", (Layer("conv", 40, 1.0), Layer("fc", 40, 1.0)),
                          ((10, (1,)), (10, (0,))))
    measured = _profile((4,), [("conv", 40, [1.0]), ("relu", 0, [0.5]), ("fc", 40, [2.0])],
                        [3 * 3.5 * 1.2])  # the hooks saw 1/1.2 of the iteration
    compute = measured_compute(measured, layers)
    assert compute.forward == ((1.5 * 1.2,), (2.0 * 1.2,))
    assert compute.backward == ((3.0 * 1.2,), (4.0 * 1.2,))


def test_measured_times_are_affine_in_the_batch() -> None:
    compute = MeasuredCompute((8, 32), ((1.0, 3.0),), ((2.0, 6.0),))
    layers = ModelProfile("toy", (Layer("a", 4, 1.0),), ((1, (0,)),))
    assert compute.layer_times(layers, 20) == ([2.0], [4.0])
    assert compute.layer_times(layers, 64)[0] == [pytest.approx(5.6667, rel=1e-4)]
    assert compute.layer_times(layers, 1)[0] == [pytest.approx(0.4167, rel=1e-3)]
    single = MeasuredCompute((8,), ((1.0,),), ((2.0,),))
    assert single.layer_times(layers, 16) == ([2.0], [4.0])


def test_robust_cv_ignores_one_outlier() -> None:
    assert robust_cv([1.0, 1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0
    assert robust_cv([1.0, 2.0]) == 0.0


@pytest.mark.parametrize("content,message", [
    (None, "cannot read profile"),
    ("{not json", "is malformed"),
    (json.dumps({"schema": "other/1"}), "not a `scaledl simulate profile` file"),
    (json.dumps({"schema": "scaledl.simulate.profile/1", "batches": [4]}),
     "missing field 'modules'"),
])
def test_cli_rejects_missing_or_malformed_profiles(
        tmp_path: Path, content: str | None, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    assert main(["simulate", "--profile", str(path), "--device", "cpu", "--gpus", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("scaledl: error:") and message in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""


def test_cli_rejects_negative_times_and_other_models(
        lenet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(lenet.read_text())
    data["modules"][0]["forward_s"][0] = -1.0
    bad = tmp_path / "negative.json"
    bad.write_text(json.dumps(data))
    assert main(["simulate", "--profile", str(bad), "--device", "cpu", "--gpus", "2"]) == 2
    assert "negative or non-finite" in capsys.readouterr().err
    data = json.loads(lenet.read_text())
    data["modules"] = data["modules"][1:]  # the first convolution is missing
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    assert main(["simulate", "--profile", str(other), "--device", "cpu", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "has no module" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,asked,measured", [
    (["--model", "resnet50"], "--model resnet50 but the profile", "measured lenet"),
    (["--input-shape", "3x32x32"], "--input-shape 3x32x32 but the profile", "measured 1x28x28"),
])
def test_cli_rejects_a_model_or_shape_the_profile_did_not_measure(
        lenet: Path, argv: list[str], asked: str, measured: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The profile's model is the one predicted: naming another beside it is an error, not a
    prediction of the profile's model printed under the user's question."""
    assert main(["simulate", "--profile", str(lenet), *argv, "--device", "cpu",
                 "--gpus", "2"]) == 2
    captured = capsys.readouterr()
    assert asked in captured.err and measured in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert main(["simulate", "--profile", str(lenet), "--model", "LeNet", "--input-shape",
                 "1x28x28", "--device", "cpu", "--gpus", "2"]) == 0  # the same, named

@pytest.mark.parametrize("argv,message", [
    (["--batches", "0,4"], "--batches '0,4'"),
    (["--batches", "x"], "--batches 'x'"),
    (["--repeats", "2"], "--repeats 2"),
    (["--model", "nope"], "unknown model 'nope'"),
])
def test_cli_profile_options_are_checked(argv: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "profile", "--model", "mlp", *argv, "-o",
                 str(tmp_path / "p.json")]) == 2
    assert message in capsys.readouterr().err


def test_a_prediction_from_a_profile_names_the_profiles_model(
        lenet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --model the job is the profile's model, in the --json record too (it used to
    say resnet50, the default, beside lenet's times)."""
    out = tmp_path / "p.json"
    assert main(["simulate", "--profile", str(lenet), "--device", "cpu", "--gpus", "2",
                 "--json", str(out)]) == 0
    job = json.loads(out.read_text())["job"]
    assert job["model"] == "lenet" and job["input_shape"] == [1, 28, 28]
