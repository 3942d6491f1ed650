"""One-line errors before any work: layouts, output paths, ports, and a rendezvous timeout.

Each bad command must answer ``scaledl: error: ...`` on one line with exit code 2 *before* it
launches workers, runs a benchmark or builds a cluster: those steps are replaced by stubs that
fail the test if reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scaledl.cli import bench_collectives, cluster, train
from scaledl.launchers import RANK_VARIABLES
from scaledl.cli.main import main
from tests.harness import free_port


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fail the test if a command gets as far as launching, benchmarking or building."""
    def reached(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the command started its work before refusing the bad option")

    from scaledl.bench import methods_run
    from scaledl.cli import bench_algorithms, bench_train
    from scaledl.cluster import netns

    for module in (train, bench_collectives, bench_train):
        monkeypatch.setattr(module, "run_distributed", reached)
    monkeypatch.setattr(methods_run, "run_all", reached)
    monkeypatch.setattr(bench_algorithms, "report_console", reached)
    monkeypatch.setattr(netns, "preflight", lambda: None)  # no root needed to check options
    monkeypatch.setattr(cluster, "_run_ephemeral", reached)
    monkeypatch.setattr(cluster, "_run_on", reached)
    monkeypatch.setenv("SCALEDL_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.delenv("SCALEDL_TOPOLOGY", raising=False)
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _refused(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err and err[-1].startswith("scaledl: error: ") and needle in err[-1], err
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("algorithm", ["torus", "hierarchical"])
def test_train_algorithm_needing_a_layout_without_topology(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    _refused(["train", "--workers", "4", "--algorithm", algorithm, "--out", str(tmp_path)],
             f"algorithm {algorithm!r} needs the network layout: pass --topology", capsys)


def test_train_algorithm_with_topology_passes_the_check(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(AssertionError, match="started its work"):
        main(["train", "--workers", "4", "--algorithm", "torus", "--topology", "2x2",
              "--out", str(tmp_path)])


def _paths(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    return {"dir": tmp_path / "adir", "file": tmp_path / "afile",
            "under_file": tmp_path / "afile" / "x.json", "unwritable": Path("/proc/x.json")}


@pytest.mark.parametrize(("kind", "needle"), [
    ("file", "is an existing file, not a directory"),
    ("under_file", "which is a file, not a directory"),
    ("unwritable", "cannot be written"),
])
def test_train_out_that_cannot_be_a_run_directory(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, needle: str
) -> None:
    out = _paths(tmp_path)[kind]
    _refused(["train", "--workers", "2", "--out", str(out)], f"--out {out} ", capsys)
    _refused(["train", "--workers", "2", "--out", str(out)], needle, capsys)


OUTPUT_CASES = [
    (["bench", "collectives", "--p2p-bytes", "0"], "--p2p-bytes 0 must be at least 1 byte"),
    (["bench", "collectives", "--json", "{dir}"], "--json {dir} is a directory"),
    (["bench", "collectives", "--plot", "{dir}"], "--plot {dir} is a directory"),
    (["bench", "collectives", "--json", "{under_file}"], "which is a file"),
    (["bench", "collectives", "--json", "{unwritable}"], "cannot be written"),
    (["bench", "collectives", "--plot", "{tmp}/plot.txt"], "not an image format"),
    (["bench", "train", "--json", "{dir}"], "--json {dir} is a directory"),
    (["bench", "train", "--plot", "{dir}"], "--plot {dir} is a directory"),
    (["bench", "train", "--json", "{unwritable}"], "cannot be written"),
    (["bench", "algorithms", "--methods", "allreduce", "--json", "{dir}"], "is a directory"),
    (["bench", "algorithms", "--methods", "allreduce", "--out", "{file}"], "--out {file} is an"),
    (["bench", "algorithms", "--methods", "allreduce", "--out", "{tmp}/runs", "--plot-dir",
      "{file}"], "--plot-dir {file} is an existing file"),
    (["cluster", "run", "--hosts", "2", "--port", "70000", "--", "true"], "--port 70000"),
    (["cluster", "run", "--hosts", "2", "--port", "0", "--", "true"], "--port 0"),
    (["cluster", "run", "--hosts", "2", "--counters", "{dir}", "--", "true"], "is a directory"),
]


@pytest.mark.parametrize(("argv", "needle"), OUTPUT_CASES)
def test_bad_output_or_port_is_refused_before_the_work(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
    needle: str,
) -> None:
    names = {key: str(value) for key, value in _paths(tmp_path).items()}
    names["tmp"] = str(tmp_path)
    _refused([arg.format(**names) for arg in argv], needle.format(**names), capsys)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "gpt2"], "--model gpt2 reads token ids, and bench train feeds random float"),
    (["--model", "bert_base", "--input-shape", "8"], "--model bert_base reads token ids"),
    (["--model", "resnet20", "--input-shape", "3x0x5"], "--input-shape '3x0x5' is not positive"),
    (["--model", "alexnet", "--input-shape", "3x8x8"], "alexnet needs images of at least 64x64"),
])
def test_bench_train_checks_its_model_before_launch(
    no_work: None, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str,
) -> None:
    _refused(["bench", "train", "--workers", "2", *argv], needle, capsys)


def test_bench_calibration_file_is_checked(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCALEDL_CALIBRATION", str(tmp_path))
    _refused(["bench", "collectives", "--calibrate"], f"{tmp_path} is a directory", capsys)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_rendezvous_timeout_is_one_line(tmp_path: Path) -> None:
    """Rank 0 of 2 waits for a rank 1 that never starts: one line naming the address, exit 1."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "train", "--timeout-s", "3", "--epochs", "1",
         "--no-progress", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=100,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert lines[-1].startswith("scaledl: error: rank 0 of 2 (torchrun) could not join"), lines
    assert "127.0.0.1" in lines[-1] and "within 3 s" in lines[-1]
    assert "Traceback" not in done.stderr


def _npz(tmp_path: Path) -> Path:
    import numpy as np

    path = tmp_path / "vectors.npz"
    np.savez(path, x=np.random.default_rng(0).random((16, 8), dtype=np.float32),
             y=np.arange(16) % 4)
    return path


@pytest.mark.parametrize(("model", "needle"), [
    ("lenet", "lenet needs an image input (C, H, W), got (8,); use 'mlp' for vector data"),
    ("bert_base", "model 'bert_base' reads token ids and dataset 'npz' holds float features of "
                  "shape (8,); train one of: mlp"),
    ("resnet1000", "unknown model 'resnet1000'; use one of: mlp (the models that train on npz: "
                   "samples of shape (8,))"),
])
def test_train_checks_the_model_against_npz_samples_before_launch(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, needle: str
) -> None:
    """npz's sample shape is only in its file: it is read in the parent, before the workers
    (which each failed on their own)."""
    _refused(["train", "--workers", "2", "--dataset", "npz", "--data-dir", str(_npz(tmp_path)),
              "--model", model, "--out", str(tmp_path / "run")], needle, capsys)


@pytest.mark.parametrize(("dataset", "models"), [
    ("digits", "mlp, lenet, resnet20, resnet56 (the models that train on digits: samples of "
               "shape (1, 8, 8))"),
    ("synthetic:64:3", "mlp (the models that train on synthetic:64:3: samples of shape (64,))"),
])
def test_train_unknown_model_lists_only_the_models_that_train_on_the_dataset(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, models: str
) -> None:
    _refused(["train", "--dataset", dataset, "--model", "resnet1000", "--out", str(tmp_path)],
             f"unknown model 'resnet1000'; use one of: {models}", capsys)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--workers", "2", "--epochs", "1", "--inject-fault", "rank:1,step:24,kind:crash"],
     "--inject-fault 'rank:1,step:24,kind:crash': step:24 is beyond the run's 23 training steps"),
    (["--workers", "3", "--epochs", "1", "--strategy", "async-sgd", "--servers", "1",
      "--inject-fault", "rank:2,step:3,kind:crash"], "rank:2 serves parameters"),
    (["--workers", "2", "--inject-fault", "rank:2,step:20,kind:hang"],
     "rank:2 is outside the 2 workers"),
])
def test_train_refuses_a_fault_that_would_never_fire(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
    needle: str
) -> None:
    """digits: 1437 training samples, 719 per worker, 23 steps of 32 in an epoch."""
    _refused(["train", *argv, "--out", str(tmp_path)], needle, capsys)


def test_train_accepts_a_fault_at_the_last_step_of_an_elastic_run(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --min-workers 1 a lone worker would take 45 steps: step 45 can come."""
    with pytest.raises(AssertionError, match="started its work"):
        main(["train", "--workers", "2", "--epochs", "1", "--min-workers", "1",
              "--max-restarts", "1", "--inject-fault", "rank:0,step:45,kind:crash",
              "--out", str(tmp_path)])
