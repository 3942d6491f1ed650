"""``scaledl simulate calibrate`` and ``validate`` on benchmark files a user broke, and on bad
options: one ``scaledl: error:`` line naming the value and the file, exit code 2, no output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scaledl.calibration.fit import load_natives
from scaledl.cli.main import main
from scaledl.sim.calibrate import load_points
from tests.helpers_cli import one_error

CPU = ["simulate", "--device", "cpu", "--network", "emulated-1gbit"]
BAD_ROW = 2
"""The row each broken file changes (after rows that load)."""


def _rows() -> list[dict[str, Any]]:
    """Ring and native allreduce of 1-8 MiB on 2x2, with plausible medians for 1 Gbit/s."""
    return [{"collective": "allreduce", "algorithm": algorithm, "resolved": algorithm,
             "nbytes": nbytes, "world_size": 4, "median_us": 300.0 + nbytes / 50.0}
            for algorithm in ("ring", "native") for nbytes in (1 << 20, 2 << 20, 4 << 20, 8 << 20)]


def _bench_file(path: Path, change: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A small bench JSON, with ``change`` applied to it."""
    data: dict[str, Any] = {"schema": "scaledl.bench.collectives/1",
                            "config": {"topology": "2x2", "dtype": "float32"},
                            "environment": {"topology": "2x2"}, "results": _rows()}
    if change is not None:
        change(data)
    path.write_text(json.dumps(data))
    return path


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["results"][BAD_ROW][key] = value
    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        del data["results"][BAD_ROW][key]
    return change


def _replace_row(value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["results"][BAD_ROW] = value
    return change


def _actions(bench: Path, tmp_path: Path) -> list[list[str]]:
    return [[*CPU, "calibrate", str(bench), "-o", str(tmp_path / "cal.json")],
            [*CPU, "validate", str(bench)]]


WHERE = f"results[{BAD_ROW}]"
RERUN = "rerun `scaledl bench collectives --json`"
"""How to make a good file: the fix every error names but a layout's (--bench-topology)."""
BROKEN_ROWS = [
    pytest.param(lambda d: d.__setitem__("results", "x"), ["results 'x'", "list"],
                 id="results-not-a-list"),
    pytest.param(_replace_row(None), [WHERE, "None", "not a result object"], id="null-row"),
    pytest.param(_drop("median_us"), [WHERE, "median_us is missing"], id="no-median"),
    pytest.param(_set("median_us", 0), [WHERE, "median_us 0 must be a finite number > 0"],
                 id="median-zero"),
    pytest.param(_set("median_us", float("nan")), [WHERE, "median_us nan must be"],
                 id="median-nan"),
    pytest.param(_set("median_us", -5.0), [WHERE, "median_us -5.0 must be"],
                 id="median-negative"),
    pytest.param(_set("median_us", "fast"), [WHERE, "median_us 'fast' must be"],
                 id="median-string"),
    pytest.param(_set("median_us", 10 ** 400), [WHERE, "median_us 1000", "must be"],
                 id="median-beyond-any-float"),
    pytest.param(_set("collective", "nosuch"), [WHERE, "collective 'nosuch'", "allreduce"],
                 id="unknown-collective"),
    pytest.param(_set("algorithm", 7), [WHERE, "algorithm 7"], id="algorithm-not-a-string"),
    pytest.param(_set("resolved", "ring[x"), [WHERE, "'ring[x'"], id="malformed-resolved"),
    pytest.param(_set("nbytes", -1), [WHERE, "nbytes -1 must be a whole number >= 0"],
                 id="negative-nbytes"),
    pytest.param(_set("nbytes", 1.5), [WHERE, "nbytes 1.5"], id="fractional-nbytes"),
    pytest.param(_set("world_size", 0), [WHERE, "world_size 0 must be a whole number >= 1"],
                 id="world-size-zero"),
    pytest.param(_set("world_size", 3), [WHERE, "world size is 3", "--bench-topology"],
                 id="world-size-not-2x2"),
    pytest.param(lambda d: d["config"].__setitem__("dtype", "float8"), ["dtype 'float8'"],
                 id="unknown-dtype"),
    pytest.param(lambda d: d.__setitem__("config", "x"), ["config 'x'"], id="config-not-object"),
]


@pytest.mark.parametrize("change,expected", BROKEN_ROWS)
def test_a_broken_benchmark_file_is_one_line_naming_it(
        change: Callable[[dict[str, Any]], None], expected: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_file(tmp_path / "bench.json", change)
    for argv in _actions(bench, tmp_path):
        assert main(argv) == 2, argv
        line = one_error(capsys)
        assert f"benchmark file {bench}" in line
        assert RERUN in line or "--bench-topology" in line
        for text in expected:
            assert text in line
    assert not (tmp_path / "cal.json").exists()


def test_a_file_that_is_no_json_object_is_not_bench_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "list.json"
    bench.write_text("[1, 2]")
    for argv in _actions(bench, tmp_path):
        assert main(argv) == 2
        assert f"{bench} is not `scaledl bench collectives --json` output" in one_error(capsys)


def test_rows_bench_can_write_still_load(tmp_path: Path) -> None:
    """A message smaller than one element (bench --min-bytes 1) is 0 bytes; torch's rows have
    ``resolved: null``; both are fine."""
    def change(data: dict[str, Any]) -> None:
        data["results"][0]["nbytes"] = 0
        data["results"].append({**data["results"][1], "algorithm": "torch", "resolved": None})

    bench = _bench_file(tmp_path / "bench.json", change)
    points = load_points([bench])
    assert [p.nbytes for p in points] == [0, 2 << 20, 4 << 20, 8 << 20]
    assert points[1].measured_s == pytest.approx((300.0 + (2 << 20) / 50.0) * 1e-6)
    assert [n.nbytes for n in load_natives([bench])] == [1 << 20, 2 << 20, 4 << 20, 8 << 20]


@pytest.mark.parametrize("tolerance", ["-1", "0", "nan", "inf", "-inf"])
def test_validate_tolerance_must_be_a_finite_fraction_above_zero(
        tolerance: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_file(tmp_path / "bench.json")
    assert main([*CPU, "validate", str(bench), f"--tolerance={tolerance}"]) == 2
    line = one_error(capsys)
    assert f"--tolerance {float(tolerance)}" in line and "finite number > 0" in line


def test_validate_with_a_good_file_and_tolerance_still_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_file(tmp_path / "bench.json")
    assert main([*CPU, "validate", str(bench), "--tolerance", "0.5"]) == 0
    assert "within 50%" in capsys.readouterr().out


def test_a_file_that_is_no_calibration_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_file(tmp_path / "bench.json")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema": "scaledl.profile/1", "model": "resnet50"}))
    assert main([*CPU, "--calibration", str(profile), "validate", str(bench)]) == 2
    line = one_error(capsys)
    assert f"{profile} is not a calibration" in line
    assert "scaledl simulate calibrate" in line and "-o" in line


def test_json_nested_too_deeply_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main([*CPU, "validate", str(deep)]) == 2
    assert "nested too deeply" in one_error(capsys)
