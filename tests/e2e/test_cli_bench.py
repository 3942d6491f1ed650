"""``scaledl bench collectives`` end to end: two real workers under torchrun, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaledl.launchers import RANK_VARIABLES
from scaledl.collectives.auto import CostModel

TIMEOUT_S = 120


def _scaledl(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env["SCALEDL_CALIBRATION"] = str(tmp_path / "calibration.json")
    env.pop("SCALEDL_TOPOLOGY", None)
    return subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", *args], env=env, capture_output=True,
        text=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )


@pytest.mark.distributed
def test_bench_collectives_two_ranks(tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "bench.json", tmp_path / "plots" / "bench.png"
    result = _scaledl([
        "bench", "collectives", "--ranks", "2", "--min-bytes", "4K", "--max-bytes", "64K",
        "--iters", "3", "--warmup", "1", "--p2p-bytes", "1M", "--calibrate", "--explain",
        "--json", str(out_json), "--plot", str(out_png),
    ], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "busbw GB/s" in result.stdout and "ring / torch busbw" in result.stdout
    assert "the shared-memory ceiling" in result.stdout
    assert "auto chose" in result.stdout

    data = json.loads(out_json.read_text())
    assert data["environment"]["world_size"] == 2
    assert data["environment"]["backend"] == "gloo"
    assert {"cpu", "cores", "torch", "python"} <= set(data["environment"])
    assert data["p2p"]["gbps"] > 0 and data["memcpy"]["gbps"] > 0
    rows = data["results"]
    expected = {(a, n) for a in ("ring", "multiring", "halving_doubling", "shm", "auto", "native",
                                 "torch")
                for n in (4096, 16384, 65536)}
    assert {(r["algorithm"], r["nbytes"]) for r in rows} == expected
    for row in rows:
        assert row["iterations"] == 3 and len(row["times_us"]) == 3
        assert row["min_us"] <= row["avg_us"] <= row["max_us"]
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(p-1)/p = 1 at p = 2
        if row["algorithm"] == "torch":
            assert row["resolved"] is None
        elif row["algorithm"] == "auto":  # what auto chose, as the call ran it
            assert row["resolved"] in {"ring", "multiring", "halving_doubling", "tree", "shm",
                                       "native"}
        else:
            assert row["resolved"] == row["algorithm"]
    assert {r["algorithm"] for r in data["ratios_vs_native"]} == {
        "ring", "multiring", "halving_doubling", "shm", "auto", "torch"}
    assert len(data["ratios_vs_torch"]) == 6 * 3  # every algorithm at every size

    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    calibration = data["calibration"]
    assert calibration["link"]["points"] == 9
    assert calibration["shm"]["points"] == 3
    model = CostModel.load(tmp_path / "calibration.json")
    assert model.link(0).beta == pytest.approx(calibration["link"]["beta_s_per_byte"])


@pytest.mark.distributed
def test_bench_reduce_times_torch_beside_scaledl(tmp_path: Path) -> None:
    """torch's reduce leaves partial sums in a non-root rank's buffer (Gloo does); only
    scaledl promises to leave it unchanged, so the bench checks torch's root alone.  Before,
    every ``--collectives reduce`` run stopped on torch's "wrong result".  And a size that is
    not a whole number of elements was rounded down without a word."""
    out_json = tmp_path / "reduce.json"
    result = _scaledl([
        "bench", "collectives", "--ranks", "2", "--collectives", "reduce", "--min-bytes",
        "4098", "--max-bytes", "4098", "--iters", "2", "--warmup", "1", "--json", str(out_json),
    ], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out_json.read_text())["results"]
    assert {row["algorithm"] for row in rows} == {"tree", "chain", "shm", "auto", "native",
                                                  "torch"}
    # a size that is no whole number of elements is timed one element short, and said so
    assert {row["nbytes"] for row in rows} == {4096}
    assert "reduce of 4098 bytes is not a whole number of float32 elements: timing 4096" \
        in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--algorithms", "bogus"], "unknown algorithm 'bogus'; choose from: ring"),
    (["--ranks", "0"], "--ranks/--workers 0 must be at least 1"),
    (["--workers", "0"], "--ranks/--workers 0 must be at least 1"),  # the other commands' name
    (["--algorithms", "torus"], "needs the network layout: pass --topology"),
    (["--max-bytes", "12Q"], "not a byte count"),
    (["--topology", "3x2"], "describes 6 ranks but the world size is 2"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = _scaledl(["bench", "collectives", *args], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("scaledl: error: ") and message in lines[0]
    assert "Traceback" not in result.stderr


def test_version(tmp_path: Path) -> None:
    result = _scaledl(["--version"], tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("scaledl ")
