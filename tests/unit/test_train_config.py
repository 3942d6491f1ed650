"""Training config: defaults, validation messages, TOML and CLI overrides, dict round trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scaledl.bootstrap import DEFAULT_TIMEOUT_S
from scaledl.train.config import (
    FIELD_SECTION, SECTIONS, DataConfig, ModelConfig, OptimConfig, ParallelConfig, RunConfig,
    TrainConfig, build_config, load_toml,
)


def test_defaults_are_valid_and_small() -> None:
    config = TrainConfig()
    assert config.model.name == "mlp"
    assert config.data.dataset == "digits"
    assert config.parallel.strategy == "allreduce"
    assert config.parallel.timeout_s == DEFAULT_TIMEOUT_S == 300  # one default everywhere
    assert 1 <= config.optim.epochs <= 20
    assert config.run.checkpoint_every is None


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().optim.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(("cls", "name", "value"), [
    (DataConfig, "batch_size", 0),
    (DataConfig, "prefetch", -1),
    (DataConfig, "synthetic_size", 0),
    (DataConfig, "dataset", ""),
    (ModelConfig, "name", ""),
    (OptimConfig, "lr", 0.0),
    (OptimConfig, "lr", -0.1),
    (OptimConfig, "momentum", 1.0),
    (OptimConfig, "momentum", -0.5),
    (OptimConfig, "weight_decay", -1.0),
    (OptimConfig, "epochs", 0),
    (ParallelConfig, "workers", 0),
    (ParallelConfig, "strategy", "gossip"),
    (ParallelConfig, "topology", "2xq"),
    (ParallelConfig, "bucket_mb", 0.0),
    (ParallelConfig, "timeout_s", -1.0),
    (ParallelConfig, "timeout_s", 0.01),
    (RunConfig, "checkpoint_every", 0),
    (RunConfig, "log_every", 0),
    (RunConfig, "seed", -3),
])
def test_bad_values_raise_one_line_naming_the_value(cls: type, name: str, value: object) -> None:
    with pytest.raises(ValueError) as info:
        cls(**{name: value})
    message = str(info.value)
    assert "\n" not in message
    assert repr(value) in message or str(value) in message


@pytest.mark.parametrize(("cls", "name", "value"), [
    (DataConfig, "batch_size", "32"),
    (DataConfig, "batch_size", True),
    (DataConfig, "drop_last", 1),
    (OptimConfig, "lr", "0.1"),
    (ParallelConfig, "workers", 2.0),
    (RunConfig, "progress", "yes"),
])
def test_wrong_types_raise(cls: type, name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        cls(**{name: value})


def test_int_accepted_where_float_expected() -> None:
    optim = OptimConfig(lr=1, momentum=0)
    assert isinstance(optim.lr, float) and isinstance(optim.momentum, float)


def test_dict_round_trip_is_json_safe() -> None:
    config = TrainConfig(optim=OptimConfig(lr=0.1), parallel=ParallelConfig(workers=4,
                                                                              topology="2x2"))
    values = json.loads(json.dumps(config.to_dict()))
    assert TrainConfig.from_dict(values) == config
    assert set(values) == set(SECTIONS)


def test_from_dict_rejects_unknown_section_and_key() -> None:
    with pytest.raises(ValueError, match="'optimizer'.*optim"):
        TrainConfig.from_dict({"optimizer": {}})
    with pytest.raises(ValueError, match=r"'learning_rate' in \[optim\].*lr, momentum"):
        TrainConfig.from_dict({"optim": {"learning_rate": 0.1}})


def test_field_section_covers_every_field_once() -> None:
    targets = sorted(FIELD_SECTION.values())
    expected = sorted((section, f.name) for section, cls in SECTIONS.items()
                      for f in dataclasses.fields(cls))
    assert targets == expected
    assert FIELD_SECTION["lr"] == ("optim", "lr")
    assert FIELD_SECTION["model"] == ("model", "name")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(text)
    return path


def test_toml_then_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path, '[optim]\nlr = 0.2\nepochs = 3\n[parallel]\nworkers = 2\n'
                            '[model]\nname = "cnn"\n')
    config = build_config(load_toml(path), {"lr": 0.5, "workers": None, "batch_size": 8})
    assert config.optim.lr == 0.5  # the flag wins
    assert config.optim.epochs == 3  # from the file
    assert config.parallel.workers == 2  # flag unset (None): the file's value stays
    assert config.data.batch_size == 8
    assert config.model.name == "cnn"
    assert build_config({}, {"model": "lenet"}).model.name == "lenet"


def test_toml_unknown_key_names_it_and_the_allowed_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, "[data]\nbatchsize = 8\n")
    with pytest.raises(ValueError, match=r"'batchsize'.*batch_size"):
        build_config(load_toml(path), {})


def test_toml_key_outside_its_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'lr' must be inside the \[optim\] table"):
        build_config(load_toml(_write(tmp_path, "lr = 0.1\n")), {})
    with pytest.raises(ValueError, match="'training'"):
        build_config(load_toml(_write(tmp_path, "[training]\nx = 1\n")), {})


def test_unknown_override_raises() -> None:
    with pytest.raises(ValueError, match="'learning_rate'"):
        build_config({}, {"learning_rate": 0.1})


def test_bad_value_in_toml_names_the_value(tmp_path: Path) -> None:
    path = _write(tmp_path, '[parallel]\nstrategy = "gossip"\n')
    with pytest.raises(ValueError, match="'gossip'.*allreduce"):
        build_config(load_toml(path), {})


def test_missing_or_malformed_toml_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ValueError, match=str(missing)):
        load_toml(missing)
    broken = _write(tmp_path, "[optim\nlr = \n")
    with pytest.raises(ValueError, match=str(broken)) as info:
        load_toml(broken)
    assert "\n" not in str(info.value)


def test_without_a_bar_rank_0_logs_every_log_every_steps(
        caplog: pytest.LogCaptureFixture) -> None:
    """``log_every`` sets the steps between log lines when there is no progress bar, and the
    last step is always logged."""
    from scaledl.train.progress import LogProgress

    progress = LogProgress(3)
    progress.start(total=8, done=0)
    with caplog.at_level("INFO", logger="scaledl.train.progress"):
        for step in range(8):
            progress.advance(1.0 / (step + 1), 0.5, 100.0)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == ["step 3/8", "step 6/8", "step 8/8"]
    assert lines[0] == "step 3/8: loss 0.3333, accuracy 0.500, 100 samples/s"
    with pytest.raises(ValueError, match="log_every 0 must be at least 1 step"):
        LogProgress(0)


def test_workers_left_to_the_launch_are_recorded_as_launched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The config a run logs (and its workers write to summary.json) said ``workers: null``."""
    import scaledl.cli.train as train_cli
    from scaledl.cli.main import main

    assert build_config({}, {}).with_workers(3).parallel.workers == 3
    assert build_config({}, {"workers": 2}).with_workers(3).parallel.workers == 2
    monkeypatch.setattr(train_cli.os, "sched_getaffinity", lambda _: {0, 1, 2})
    monkeypatch.setattr(train_cli, "run_distributed", lambda workers, *_, **__: 0)
    assert main(["train", "--out", str(tmp_path), "--model", "mlp"]) == 0
    logged = next(line for line in capsys.readouterr().err.splitlines() if " config: " in line)
    assert json.loads(logged.split(" config: ", 1)[1])["parallel"]["workers"] == 3


@pytest.mark.parametrize(("argv", "timeout"), [
    ([], None), (["--timeout", "7"], 7.0), (["--timeout-s", "8.5"], 8.5),
])
def test_train_takes_timeout_as_every_command_does_and_timeout_s_as_before(
    argv: list[str], timeout: float | None
) -> None:
    from scaledl.cli.main import build_parser
    from scaledl.cli.train import _config

    args = build_parser().parse_args(["train", *argv])
    assert args.timeout_s == timeout
    assert _config(args).parallel.timeout_s == (timeout or DEFAULT_TIMEOUT_S)


def test_a_too_short_timeout_names_the_real_default() -> None:
    """It said '(default 60)' after the default became 300 s."""
    with pytest.raises(ValueError, match=r"give at least 1 s \(default 300\)"):
        ParallelConfig(timeout_s=0.0)


def test_toml_value_of_the_wrong_type_names_its_table_in_toml_words(tmp_path: Path) -> None:
    path = _write(tmp_path, '[optim]\nmax_steps = "30"\n')
    with pytest.raises(ValueError, match=r"^\[optim\] max_steps = '30' must be an integer or "
                                         r"left out$"):
        build_config(load_toml(path), {})
