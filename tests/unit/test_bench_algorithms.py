"""``scaledl bench algorithms`` without training: methods, commands, result extraction from
synthetic metrics files, the table, JSON and plots, and bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from scaledl.bench import methods_report as report
from scaledl.bench.methods import METHODS, BenchSpec, select_methods, train_command
from scaledl.bench.methods_result import (
    MethodResult, failed_result, median_result, read_result, time_to_target,
)
from scaledl.bench.methods_run import child_environment, error_reason
from scaledl.cli.bench_algorithms import render_table
from scaledl.cli.main import main

T0 = 1_000_000.0


def _write_run(path: Path, evals: list[tuple[int, float, float]], steps: int = 8,
               step_s: float = 1.0, summary: bool = True, comm_share: float = 0.25) -> Path:
    """A metrics file: steps every ``step_s`` seconds; ``evals`` = (step, eval seconds,
    accuracy), each evaluation taking that long right after its step."""
    records: list[dict[str, Any]] = [{"kind": "run", "time": T0, "world_size": 4}]
    now, by_step = T0, {}
    for step, seconds, accuracy in evals:
        by_step.setdefault(step, []).append((seconds, accuracy))
    for step in range(1, steps + 1):
        now += step_s
        records.append({"kind": "step", "step": step, "epoch": (step - 1) // 4, "time": now})
        for seconds, accuracy in by_step.get(step, []):
            now += seconds
            records.append({"kind": "eval", "step": step, "epoch": (step - 1) // 4,
                            "time": now, "test_accuracy": accuracy})
    if summary:
        records.append({"kind": "summary", "time": now + 0.5, "steps": steps,
                        "comm_share": comm_share, "exposed_share": 0.125,
                        "samples_per_s": 123.0,
                        "mean_staleness": 1.5})
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


SPEC = BenchSpec(workers=4, epochs=2, dataset="digits", target=0.8)


def test_result_excludes_evaluation_time_and_finds_the_target(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "a", [(2, 10.0, 0.5), (4, 10.0, 0.85), (6, 10.0, 0.8),
                                      (8, 10.0, 0.9)])
    result = read_result(METHODS["async-easgd"], SPEC, run)
    assert [p["time_s"] for p in result.curve] == pytest.approx([2.0, 4.0, 6.0, 8.0])
    assert [p["epoch"] for p in result.curve] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert result.time_to_target_s == pytest.approx(4.0)
    assert result.epochs_to_target == pytest.approx(1.0)
    assert result.final_accuracy == 0.9 and result.best_accuracy == 0.9
    assert result.eval_s == pytest.approx(40.0)
    assert result.train_s == pytest.approx(8.0)  # the last evaluation came after the last step
    assert result.updates_per_s == pytest.approx(8 * 4 / 8.0)
    assert result.comm_share == 0.25 and result.exposed_share == 0.125
    assert result.roughness == pytest.approx(0.05)
    assert result.mean_staleness == 1.5
    assert result.ranks == 5 and result.status == "ok"


def test_target_never_reached_is_none(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "b", [(4, 1.0, 0.6), (8, 1.0, 0.79)])
    result = read_result(METHODS["allreduce"], SPEC, run)
    assert result.time_to_target_s is None and result.epochs_to_target is None
    assert result.ranks == 4 and result.roughness == 0.0
    assert report.table_row(result)[4] == "not reached"
    assert time_to_target([{"time_s": 1.0, "accuracy": 0.8}], 0.8) == 1.0


def test_staleness_of_every_worker_comes_from_summary_json(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "c", [(8, 1.0, 0.9)])
    (run / "summary.json").write_text(json.dumps(
        {"result": {"staleness_per_worker": [2.0, 4.0, None]}}))
    assert read_result(METHODS["async-sgd"], SPEC, run).mean_staleness == pytest.approx(3.0)


def test_unusable_metrics_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be read"):
        read_result(METHODS["allreduce"], SPEC, tmp_path / "missing")
    run = _write_run(tmp_path / "d", [])
    with pytest.raises(ValueError, match="holds no evaluation"):
        read_result(METHODS["allreduce"], SPEC, run)


def test_train_command_gives_each_method_its_options() -> None:
    ps = train_command(METHODS["async-measgd"], SPEC, Path("out"))
    assert ps[0] == "train" and "--no-progress" in ps
    options = {flag: ps[i + 1] for i, flag in enumerate(ps)
               if flag.startswith("--") and flag not in ("--no-progress", "--no-plots")}
    assert options["--workers"] == "5" and options["--servers"] == "1"
    assert options["--momentum"] == "0.9" and options["--tau"] == "1"
    assert float(options["--alpha"]) == pytest.approx(0.9 / 4)
    sync = train_command(METHODS["sync-easgd"], SPEC, Path("out"))
    assert "--servers" not in sync and sync[sync.index("--momentum") + 1] == "0.0"
    assert sync[sync.index("--workers") + 1] == "4"
    common = ("--epochs", "--batch-size", "--lr", "--seed", "--dataset", "--model")
    for name in ("allreduce", "hogwild-sgd", "easgd"):
        args = train_command(METHODS[name], SPEC, Path("out"))
        assert all(args[args.index(f) + 1] == sync[sync.index(f) + 1] for f in common)


def test_median_over_repeats_keeps_every_run() -> None:
    runs = [MethodResult("easgd", "EASGD", final_accuracy=a, time_to_target_s=t, comm_share=c)
            for a, t, c in ((0.8, 5.0, 0.5), (0.9, None, 0.7), (0.85, 7.0, 0.6))]
    runs.append(failed_result(METHODS["easgd"], SPEC, "timeout", "slow"))
    merged = median_result(runs)
    assert merged.final_accuracy == pytest.approx(0.85)
    assert merged.comm_share == pytest.approx(0.6)
    assert merged.time_to_target_s == 7.0
    assert len(merged.repeats) == 4 and merged.repeats[3]["status"] == "timeout"
    assert median_result(runs[3:]).status == "timeout"


def test_table_json_and_plots_are_written(tmp_path: Path) -> None:
    good = read_result(METHODS["sync-easgd"], SPEC,
                       _write_run(tmp_path / "e", [(4, 1.0, 0.7), (8, 1.0, 0.88)]))
    bad = failed_result(METHODS["easgd"], SPEC, "failed", "exit code 1: boom [/x/y.cc:78]")
    buffer = io.StringIO()
    render_table([good, bad], SPEC, Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert "Sync EASGD" in text and "0.8800" in text and "25 %" in text and "12 %" in text
    assert "failed: exit code 1: boom [/x/y.cc:78]" in text
    data = report.to_json([good, bad], SPEC, {"cores": 2}, ["scaledl"], ["hogwild-sgd"])
    report.write_json(data, tmp_path / "out" / "r.json")
    loaded = json.loads((tmp_path / "out" / "r.json").read_text())
    assert [r["status"] for r in loaded["results"]] == ["ok", "failed"]
    assert loaded["spec"]["workers"] == 4 and loaded["not_available"] == ["hogwild-sgd"]
    assert loaded["methods"]["sync-easgd"]["elastic"] is True
    paths = report.write_plots([good, bad], SPEC, tmp_path / "plots")
    assert [p.name for p in paths] == list(report.PLOT_NAMES)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    markdown = report.markdown_table([good, bad]).splitlines()
    assert len(markdown) == 4 and markdown[2].startswith("| Sync EASGD | 4 | 0.8800 |")


def test_error_reason_picks_the_cause() -> None:
    assert error_reason("noise\nscaledl: error: strategy 'x' is unknown\n") == \
        "strategy 'x' is unknown"
    logged = "[rank 1] 10:00 ERROR scaledl.cli.train: training stopped on rank 1: peer died\nx"
    assert "peer died" in error_reason(logged)
    assert error_reason("Traceback\n  File y\nRuntimeError: bad\n") == "RuntimeError: bad"
    both = "TypeError: f() missing 1 required argument\n" + logged
    assert error_reason(both) == "TypeError: f() missing 1 required argument"
    assert error_reason("") == "no output on stderr"
    assert len(error_reason("z" * 1000)) == 240
    env = child_environment({"RANK": "3", "MASTER_PORT": "1", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


def test_selection_and_spec_reject_bad_values() -> None:
    assert [m.name for m in select_methods(None, ["easgd", "allreduce"])] == [
        "allreduce", "easgd"]
    assert [m.name for m in select_methods("easgd, allreduce", ["easgd", "allreduce"])] == [
        "allreduce", "easgd"]
    with pytest.raises(ValueError, match="unknown method 'bogus'"):
        select_methods("allreduce,bogus", ["allreduce"])
    with pytest.raises(ValueError, match="not implemented in this build"):
        select_methods("hogwild-easgd", ["allreduce"])
    with pytest.raises(ValueError, match="--workers 1 must be at least 2"):
        BenchSpec(workers=1)
    for target in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"--target {target} must be"):
            BenchSpec(target=target)


@pytest.mark.parametrize(("args", "message"), [
    (["--methods", "bogus"], "unknown method 'bogus' in --methods"),
    (["--workers", "1"], "--workers 1 must be at least 2"),
    (["--target", "1.2"], "--target 1.2 must be a test accuracy in (0, 1]"),
    (["--target", "0"], "--target 0.0 must be a test accuracy in (0, 1]"),
    (["--dataset", "nope"], "unknown dataset 'nope' for --dataset"),
    (["--repeats", "0"], "--repeats 0 must be at least 1"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "/nonexistent/mnist"),
    (["--dataset", "digits", "--data-dir", "/tmp"], "data_dir /tmp (--data-dir) names files"),
    (["--dataset", "auto", "--data-dir", "/nonexistent/f"], "no Fashion-MNIST files there"),
    (["--tune-lr", "0.05"], "--tune-lr '0.05' has one rate"),
    (["--tune-lr", "0.4..0.1"], "--tune-lr '0.4..0.1' is not a grid of positive rates"),
    (["--seeds", "0"], "--seeds 0 must be at least 1"),
    (["--tune-jobs", "0"], "--tune-jobs 0 must be at least 1"),
    (["--workload", "cnn", "--model", "lenet"], "--workload cnn sets the model"),
])
def test_cli_bad_input_is_one_line(args: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "algorithms", "--methods", "allreduce", "--dataset", "digits", *args])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scaledl: error: ") and message in err[0]


def test_a_data_dir_reaches_every_run_and_its_files_are_read_first(tmp_path: Path) -> None:
    """The data set loads before any run starts, from ``--data-dir``, which every method's
    ``scaledl train`` then gets."""
    from scaledl.bench.methods import check_loads
    from tests.unit.test_datasets import _write_mnist

    with pytest.raises(ValueError, match="--data-dir"):
        check_loads(BenchSpec(workers=2, dataset="mnist"))
    _write_mnist(tmp_path)
    _write_mnist(tmp_path, "t10k")
    spec = BenchSpec(workers=2, dataset="mnist", data_dir=str(tmp_path))
    check_loads(spec)
    args = train_command(METHODS["async-sgd"], spec, Path("out"))
    assert args[args.index("--data-dir") + 1] == str(tmp_path)
    assert "--data-dir" not in train_command(METHODS["async-sgd"], SPEC, Path("out"))


def _fake_runner(calls: list[tuple[str, float, int, str]]) -> Any:
    """A runner whose epochs to target depend on the rate: 0.1 is best for allreduce, 0.4 for
    diloco; the report phase (test split) adds the seed to the epochs."""
    best = {"allreduce": 0.1, "diloco": 0.4}

    def run(method: Any, spec: BenchSpec, out: Path) -> MethodResult:
        calls.append((method.name, spec.lr, spec.seed, spec.dataset))
        epochs = 1.0 + abs(spec.lr - best[method.name]) * 10 + spec.seed
        reached = None if epochs > spec.epochs else epochs
        return MethodResult(method=method.name, label=method.label, steps=10, train_s=2.0,
                            wall_s=3.0,
                            final_accuracy=0.9 - 0.01 * spec.seed, best_accuracy=0.95,
                            epochs_to_target=reached, time_to_target_s=reached,
                            comm_share=0.4, exposed_share=0.3,
                            curve=[{"time_s": 1.0, "epoch": 1.0, "accuracy": 0.9}])
    return run


def test_tuning_picks_each_methods_rate_on_validation_then_reports_over_seeds(
    tmp_path: Path,
) -> None:
    from scaledl.cli import bench_algorithms as cli
    from scaledl.bench.methods_tune import parse_grid

    calls: list[tuple[str, float, int, str]] = []
    args = cli_args(tmp_path, ["--methods", "allreduce,diloco", "--tune-lr", "0.1..0.4",
                               "--epochs", "4", "--tune-jobs", "2"])
    methods = select_methods(args.methods, ["allreduce", "diloco"])
    spec = cli.build_spec(args)
    console = Console(file=io.StringIO(), width=200)
    code = cli.run_tuned(args, methods, spec, parse_grid(args.tune_lr), console, {},
                         runner=_fake_runner(calls))
    assert code == 0
    tune_calls = [c for c in calls if c[3] == "npz"]  # the validation split
    assert sorted((c[0], c[1]) for c in tune_calls) == [
        ("allreduce", 0.1), ("allreduce", 0.2), ("allreduce", 0.4),
        ("diloco", 0.1), ("diloco", 0.2), ("diloco", 0.4)]
    report_calls = [c for c in calls if c[3] == "digits"]
    assert report_calls == [("allreduce", 0.1, 0, "digits"), ("diloco", 0.4, 0, "digits"),
                            ("allreduce", 0.1, 1, "digits"), ("diloco", 0.4, 1, "digits"),
                            ("allreduce", 0.1, 2, "digits"), ("diloco", 0.4, 2, "digits")]
    data = json.loads((tmp_path / "r.json").read_text())
    rows = {row["method"]: row for row in data["summary"]}
    assert rows["diloco"]["lr"] == 0.4 and rows["diloco"]["reached"] == 3
    # the work done, beside the seconds: 6 runs per phase of 10 steps x 4 workers x batch 32
    work = data["work"]
    for phase in ("tune", "report"):
        assert work[phase]["runs"] == 6 and work[phase]["samples"] == 6 * 10 * 4 * 32
        assert work[phase]["epochs"] == pytest.approx(6.0)
    assert work["report"]["run_s"] == pytest.approx(6 * 3.0)
    assert work["report"]["startup_share"] == pytest.approx(1 / 3)  # 2 of 3 s train
    assert "tune: 6 runs, 6 epochs, 7,680 samples" in console.file.getvalue()
    assert rows["allreduce"]["mean"]["epochs_to_target"] == pytest.approx(2.0)
    assert rows["allreduce"]["spread"]["epochs_to_target"] == pytest.approx(1.0)
    assert rows["allreduce"]["mean"]["final_accuracy"] == pytest.approx(0.89)
    table = (tmp_path / "table.md").read_text()
    assert "| Sync SGD (allreduce) | 0.1 | 3/3 | 2.00 ± 1.00 |" in table
    assert "1.00 *" in table  # the picked rate's cell in the tuning grid
    validation = tmp_path / "runs" / "data" / "validation"
    from scaledl.data.formats import read_npz

    held, kept = read_npz(validation / "test.npz")[1], read_npz(validation / "train.npz")[1]
    assert len(held) == 288 and len(kept) == 1437 - 288  # 20 % of digits' train split


def cli_args(tmp_path: Path, extra: list[str]) -> Any:
    """``scaledl bench algorithms`` arguments as the parser makes them."""
    from scaledl.cli.main import build_parser

    return build_parser().parse_args(
        ["bench", "algorithms", "--dataset", "digits", "--out", str(tmp_path / "runs"),
         "--json", str(tmp_path / "r.json"), "--plot-dir", str(tmp_path), *extra])


def test_grid_and_pick() -> None:
    from scaledl.bench.methods_tune import parse_grid, pick_lr

    assert parse_grid("0.0125..0.4") == pytest.approx((0.0125, 0.025, 0.05, 0.1, 0.2, 0.4))
    assert parse_grid("0.3,0.1") == (0.1, 0.3)
    for bad in ("0.1", "0.1,0.1", "a..b", "0..0.4", "0.1,-1"):
        with pytest.raises(ValueError, match="--tune-lr"):
            parse_grid(bad)

    def result(epochs: float | None, best: float, status: str = "ok") -> MethodResult:
        return MethodResult("allreduce", "x", status=status, epochs_to_target=epochs,
                            best_accuracy=best)

    assert pick_lr([(0.1, result(2.0, 0.9)), (0.2, result(1.5, 0.8)),
                    (0.4, result(None, 0.99))]) == 0.2
    assert pick_lr([(0.1, result(None, 0.7)), (0.2, result(None, 0.8)),
                    (0.4, result(None, 0.0, "failed"))]) == 0.2
    assert pick_lr([(0.1, result(1.0, 0.9)), (0.2, result(1.0, 0.9))]) == 0.1


def test_cnn_workload_is_cifar_shaped_learnable_digits(tmp_path: Path) -> None:
    import numpy as np

    from scaledl.bench.methods_data import workload_spec

    spec = workload_spec(SPEC, "cnn", tmp_path)
    assert spec.model == "lenet" and spec.dataset == "npz"
    from scaledl.data.formats import read_npz

    x, y = read_npz(Path(spec.data_dir or "") / "train.npz")
    assert x.shape == (4 * 1437, 3, 32, 32) and x.dtype == np.uint8
    test_x, test_y = read_npz(Path(spec.data_dir or "") / "test.npz")
    assert test_x.shape == (360, 3, 32, 32)
    # learnable: a nearest-class-mean classifier on the pixels beats chance by far
    means = np.stack([x[y == c].reshape((y == c).sum(), -1).mean(0) for c in range(10)])
    flat = test_x.reshape(len(test_x), -1).astype(np.float64)
    guess = ((flat[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (guess == test_y).mean() > 0.5


def test_quick_is_two_methods_tuned_two_runs_at_a_time(tmp_path: Path) -> None:
    """--quick (CI, under 2 minutes: 6 runs, 86 s at load 7) fills only what is left open."""
    from scaledl.cli import bench_algorithms as cli

    args = cli_args(tmp_path, ["--quick"])
    cli._apply_quick(args)
    assert args.methods == "allreduce,diloco" and args.tune_lr == cli.QUICK_GRID
    assert (args.workers, args.epochs, args.seeds, args.tune_jobs) == (2, 3, 1, 2)
    given = cli_args(tmp_path, ["--quick", "--tune-jobs", "1", "--methods", "allreduce"])
    cli._apply_quick(given)
    assert given.tune_jobs == 1 and given.methods == "allreduce"
    with pytest.raises(ValueError, match="--tune-jobs 0 must be at least 1"):
        cli.build_spec(cli_args(tmp_path, ["--tune-jobs", "0"]))
