"""``scaledl simulate profile`` and ``--profile`` facing a user's mistakes: output paths checked
before anything is measured, a failed write that leaves nothing behind, devices it cannot
measure, files that are not profiles, and profiles measured on a busy machine (a warning, the
profile still used).

The CLI's measurement is replaced by one LeNet profile measured once, with its times set to
fixed values: no test here depends on how busy the machine is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from scaledl.cli.main import main
from scaledl.profiling.measure import measure_profile
from scaledl.profiling.profile_file import MeasuredProfile, save_profile
from tests.helpers_cli import one_error

QUIET_CPU = ["--device", "cpu", "--network", "1gbit", "--gpus", "2", "--batch", "4"]
"""A ``simulate`` command line that prints no warning of its own (at a batch the profiles of
``measured`` hold)."""


@pytest.fixture(scope="module")
def measured() -> MeasuredProfile:
    """LeNet at batches 2 and 4, its times replaced by those of a quiet machine."""
    profile = measure_profile("lenet", (1, 28, 28), 10, [2, 4], repeats=3, warmup=0)
    return replace(profile, forward_backward_s=(0.001, 0.0015), jitter_cv=0.05)


@pytest.fixture
def profiled(monkeypatch: pytest.MonkeyPatch, measured: MeasuredProfile
             ) -> Iterator[list[MeasuredProfile]]:
    """``simulate profile`` returns what the test puts first in the list (``measured`` unless
    replaced); an empty list means measuring must not happen."""
    returned = [measured]

    def fake(*_: Any, **__: Any) -> MeasuredProfile:
        if not returned:
            pytest.fail("measured before the mistake was reported")
        return returned[0]

    monkeypatch.setattr("scaledl.profiling.measure.measure_profile", fake)
    yield returned


def _profile_cli(output: Path | str, *flags: str) -> int:
    return main(["simulate", "profile", "--model", "lenet", "--batches", "2,4", "--repeats",
                 "3", "--warmup", "0", *flags, "-o", str(output)])


def _one_warning(err: str, *fragments: str) -> None:
    lines = [line for line in err.strip().splitlines() if "busy machine" in line]
    assert len(lines) == 1 and lines[0].startswith("scaledl: warning: profile "), err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory that refuses new files even to root (``chattr +i``)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    (directory / "old.json").write_text("old\n")
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.mark.parametrize("name,fragment", [
    ("new.json", "refuses new files"),
    ("old.json", "refuses new files"),  # the file is writable, its directory is not
])
def test_profile_into_a_read_only_directory_fails_before_measuring(
        read_only_dir: Path, name: str, fragment: str, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    profiled.clear()
    assert _profile_cli(read_only_dir / name) == 2
    one_error(capsys, f"-o {read_only_dir / name}", fragment, "choose a writable location")
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["old.json"]


def test_profile_under_a_regular_file_fails_before_measuring(
        tmp_path: Path, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.json").write_text("{}")
    profiled.clear()
    assert _profile_cli(tmp_path / "x.json" / "y.json") == 2
    one_error(capsys, f"{tmp_path / 'x.json'}, which is a file")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_profile_to_a_full_device_is_one_line(
        profiled: list[MeasuredProfile], capsys: pytest.CaptureFixture[str]) -> None:
    assert _profile_cli("/dev/full") == 2
    one_error(capsys, "cannot write /dev/full", "No space left on device")
    assert Path("/dev/full").is_char_device()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
        tmp_path: Path, profiled: list[MeasuredProfile], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A disk that fills while the profile is written (emulated): the older profile survives
    whole and the temporary file beside it is gone."""
    output = tmp_path / "p.json"
    output.write_text("old\n")

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("scaledl.files.os.replace", full)
    assert _profile_cli(output) == 2
    one_error(capsys, f"cannot write {output}", "No space left on device")
    assert output.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_a_written_profile_is_whole_with_the_usual_mode(
        tmp_path: Path, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "sub" / "p.json"
    assert _profile_cli(output) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    assert json.loads(output.read_text())["batches"] == [2, 4]
    plain = tmp_path / "plain"
    plain.write_text("")
    assert output.stat().st_mode == plain.stat().st_mode  # 0o666 less the umask, not 0o600
    assert [p.name for p in output.parent.iterdir()] == ["p.json"]


@pytest.mark.parametrize("device", ["nosuch", "meta", "cuda:x", "cpu:1", "mps"])
def test_profile_rejects_devices_it_cannot_measure(
        device: str, tmp_path: Path, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    profiled.clear()
    assert _profile_cli(tmp_path / "p.json", "--on", device) == 2
    one_error(capsys, f"--on {device!r}", "use --on cpu, cuda or cuda:N")
    assert not (tmp_path / "p.json").exists()


def test_profile_on_a_missing_gpu_is_one_line(
        tmp_path: Path, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    profiled.clear()
    if torch.cuda.is_available():
        wanted = f"cuda:{torch.cuda.device_count()}"
        assert _profile_cli(tmp_path / "p.json", "--on", wanted) == 2
        one_error(capsys, f"--on {wanted}", "pick one of them")
    else:
        for wanted in ("cuda", "cuda:0", "CUDA"):
            assert _profile_cli(tmp_path / "p.json", "--on", wanted) == 2
            one_error(capsys, f"--on {wanted}: no CUDA device here; use --on cpu")


def test_profile_accepts_cpu_in_any_case(
        tmp_path: Path, profiled: list[MeasuredProfile],
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _profile_cli(tmp_path / "p.json", "--on", "CPU") == 0
    assert "wrote" in capsys.readouterr().out


def test_a_binary_file_is_not_a_profile(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert main(["simulate", "--profile", str(png), *QUIET_CPU]) == 2
    one_error(capsys, str(png), "not a `scaledl simulate profile` JSON file", "0x89")


@pytest.mark.parametrize("field,value,fragment", [
    ("input_shape", [3, -1], "input_shape [3, -1] must be"),
    ("input_shape", [1, 28], "lenet needs an image input"),
    ("model", "nosuch", "unknown model 'nosuch'"),
    ("model", "mlp", "has no module 'layers.1', which mlp has"),
    ("num_classes", 0, "num_classes 0 must be"),
    ("batches", [2.5, 4], "batch 2.5 must be an integer"),
    ("activation_bytes", [1], "activation_bytes must be a list of 2"),
    ("device", "cpu", "device \"cpu\" must be an object"),
    ("modules", [1], "a module is a JSON int"),
    ("jitter_cv", "x", "jitter_cv \"x\" must be a number"),
    pytest.param("interference", 10 ** 400, "interference 1000", id="interference-huge"),
])
def test_every_error_in_a_profile_names_the_file(
        field: str, value: object, fragment: str, tmp_path: Path, measured: MeasuredProfile,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(measured.to_json())
    data[field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["simulate", "--profile", str(path), *QUIET_CPU]) == 2
    one_error(capsys, f"profile {path} is malformed", fragment,
               "write it again with `scaledl simulate profile`")


@pytest.mark.parametrize("changes,fragments", [
    ({"jitter_cv": 20.5}, ["jitter_cv 20.50 is above 0.5"]),
    ({"forward_backward_s": (0.256, 0.0209)},
     ["batch 4 took 20.9 ms forward+backward, under 67% of batch 2's 256 ms"]),
])
def test_a_profile_from_a_busy_machine_warns_when_written_and_loaded(
        changes: dict[str, Any], fragments: list[str], tmp_path: Path,
        profiled: list[MeasuredProfile], measured: MeasuredProfile,
        capsys: pytest.CaptureFixture[str]) -> None:
    profiled[0] = replace(measured, **changes)
    output = tmp_path / "busy.json"
    assert _profile_cli(output) == 0
    captured = capsys.readouterr()
    assert f"wrote {output}" in captured.out
    _one_warning(captured.err, str(output), *fragments, "profile again on a quiet machine")
    assert main(["simulate", "--profile", str(output), *QUIET_CPU]) == 0
    captured = capsys.readouterr()
    assert "iteration time" in captured.out
    _one_warning(captured.err, str(output), *fragments, "more --repeats")


def test_a_quiet_profile_gives_no_warning(tmp_path: Path, measured: MeasuredProfile,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "quiet.json"
    save_profile(replace(measured, forward_backward_s=(0.001, 0.0009)), path)  # noise
    assert main(["simulate", "--profile", str(path), *QUIET_CPU]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("batch, warned", [(1, True), (2, False), (3, False), (4, False),
                                           (8, True)])
def test_a_batch_the_profile_did_not_bracket_warns(
        batch: int, warned: bool, tmp_path: Path, measured: MeasuredProfile,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Between measured batches the times are interpolated; outside them, extended, which the
    user is told in one line naming the profile and the command that measures the batch."""
    path = tmp_path / "quiet.json"
    save_profile(replace(measured, forward_backward_s=(0.001, 0.0009)), path)
    args = ["simulate", "--profile", str(path), *QUIET_CPU[:-1], str(batch)]
    assert main(args) == 0
    err = capsys.readouterr().err
    if not warned:
        assert err == ""
        return
    wanted = ",".join(map(str, sorted({2, 4, batch})))
    assert err.count("\n") == 1 and err.startswith(f"scaledl: warning: batch {batch} is "
                                                   f"outside the batches the profile {path} "
                                                   "measured (2, 4)")
    assert f"`scaledl simulate profile --batches {wanted}`" in err
    assert main([*args, "--compute-time", "0.01"]) == 0  # the profile's times are not used
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("threads, ranks, cores, warned", [
    (2, 2, 2, True), (2, 1, 2, False), (1, 2, 2, False), (2, 2, 4, False), (4, 2, 8, False)])
def test_a_threaded_profile_on_shared_cores_warns(
        threads: int, ranks: int, cores: int, warned: bool, tmp_path: Path,
        measured: MeasuredProfile, capsys: pytest.CaptureFixture[str]) -> None:
    """``--cores`` prices ranks of one thread each: a profile that several threads measured is
    too fast for ranks that get fewer cores than it had, and the user is told so."""
    path = tmp_path / "threads.json"
    save_profile(replace(measured, forward_backward_s=(0.001, 0.0009),
                         device={**measured.device, "threads": threads}), path)
    args = ["simulate", "--profile", str(path), "--network", "1gbit", "--batch", "4",
            "--gpus", str(ranks), "--cores", str(cores)]
    assert main(args) == 0
    err = capsys.readouterr().err
    if not warned:
        assert err == ""
        return
    assert err.count("\n") == 1 and err.startswith(
        f"scaledl: warning: the profile {path} was measured with {threads} threads, and "
        f"{ranks} ranks on {cores} cores get fewer each")
    assert "`scaledl simulate profile --threads 1`" in err
    assert main([*args, "--compute-time", "0.01"]) == 0  # the profile's times are not used
    assert capsys.readouterr().err == ""
