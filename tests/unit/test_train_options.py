"""``scaledl train``'s training options: precision, device, optimizer, learning-rate schedule,
clipping, accumulation, max steps, and the user's own model and data set: parsing, the TOML
keys, the rate at every step, and every refusal as one line before a worker starts."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from scaledl.cli.main import main
from scaledl.strategies.base import Strategy
from scaledl.train.config import OptimConfig, RunConfig, TrainConfig, build_config, load_toml
from scaledl.train.optim import LearningRate, build_optimizer, check_optim_for_strategy
from scaledl.train.precision import MixedPrecision, check_precision


def _config(**overrides: object) -> TrainConfig:
    return build_config({}, overrides)


# -- parsing: flags and TOML keys reach the same fields ------------------------------------------

def test_flags_and_toml_keys_set_the_same_fields(tmp_path: Path) -> None:
    from scaledl.cli.main import build_parser
    from scaledl.cli.train import _config as cli_config

    flags = ["--precision", "bf16", "--device", "cpu", "--optimizer", "adamw",
             "--lr-schedule", "cosine", "--warmup-epochs", "0.5", "--lr-scaling", "linear",
             "--lr-reference-batch", "128", "--clip-grad-norm", "2", "--grad-accum", "3",
             "--max-steps", "7", "--momentum", "0.9"]
    from_flags = cli_config(build_parser().parse_args(["train", *flags]))
    toml = tmp_path / "run.toml"
    toml.write_text(textwrap.dedent("""
        [optim]
        optimizer = "adamw"
        lr_schedule = "cosine"
        warmup_epochs = 0.5
        lr_scaling = "linear"
        lr_reference_batch = 128
        clip_grad_norm = 2
        grad_accum = 3
        max_steps = 7

        [run]
        precision = "bf16"
        device = "cpu"
    """))
    from_toml = build_config(load_toml(toml), {})
    assert from_flags == from_toml
    assert from_toml.optim.clip_grad_norm == 2.0 and from_toml.run.precision == "bf16"


@pytest.mark.parametrize(("cls", "values", "needle"), [
    (OptimConfig, {"optimizer": "lamb"}, "optimizer 'lamb' is not one of sgd, adamw"),
    (OptimConfig, {"lr_schedule": "linear"}, "lr_schedule 'linear'"),
    (OptimConfig, {"lr_scaling": "sqrt"}, "lr_scaling 'sqrt'"),
    (OptimConfig, {"warmup_epochs": -1.0}, "warmup_epochs -1.0"),
    (OptimConfig, {"grad_accum": 0}, "grad_accum 0"),
    (OptimConfig, {"max_steps": 0}, "max_steps 0"),
    (OptimConfig, {"clip_grad_norm": 0.0}, "clip_grad_norm 0.0"),
    (OptimConfig, {"lr_decay": 1.5}, "lr_decay 1.5"),
    (OptimConfig, {"lr_decay": 0.5}, "lr_decay 0.5 is read only with lr_schedule = 'step'"),
    (OptimConfig, {"lr_decay_every": 3, "lr_schedule": "cosine"}, "lr_decay_every 3 is read only"),
    (OptimConfig, {"lr_reference_batch": 64}, "read only with lr_scaling = 'linear'"),
    (RunConfig, {"precision": "fp8"}, "precision 'fp8' is not one of fp32, bf16, fp16"),
    (RunConfig, {"device": "tpu"}, "device 'tpu' is not one of cpu, cuda"),
])
def test_bad_values_are_one_line_naming_them(cls: type, values: dict[str, object],
                                             needle: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        cls(**values)
    assert needle in str(info.value) and "\n" not in str(info.value)


# -- the learning rate at every step --------------------------------------------------------------

def _rate(total: int = 100, per_epoch: int = 10, batch: int = 64, **optim: object) -> LearningRate:
    return LearningRate(OptimConfig(**optim), per_epoch, total, batch)  # type: ignore[arg-type]


def test_constant_rate_and_linear_scaling() -> None:
    assert [_rate(lr=0.1)(s) for s in (0, 50, 99)] == [0.1, 0.1, 0.1]
    scaled = _rate(lr=0.1, lr_scaling="linear", batch=1024)
    assert scaled.base == pytest.approx(0.4)  # Goyal et al.: 0.1 x 1024 / 256
    assert _rate(lr=0.1, lr_scaling="linear", lr_reference_batch=32, batch=64).base == \
        pytest.approx(0.2)


def test_warmup_rises_linearly_from_the_unscaled_rate_with_linear_scaling() -> None:
    rate = _rate(lr=0.1, lr_scaling="linear", batch=1024, warmup_epochs=0.5)  # 5 steps
    assert rate.warmup == 5
    assert [round(rate(s), 6) for s in range(7)] == [0.1, 0.16, 0.22, 0.28, 0.34, 0.4, 0.4]
    plain = _rate(lr=0.5, warmup_epochs=0.5)
    assert [round(plain(s), 6) for s in range(6)] == [0.1, 0.18, 0.26, 0.34, 0.42, 0.5]


def test_step_and_cosine_schedules() -> None:
    step = _rate(lr=1.0, epochs=9, lr_schedule="step")  # decays every 3 epochs = 30 steps
    assert [step(s) for s in (0, 29, 30, 59, 60, 89)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])
    every = _rate(lr=1.0, lr_schedule="step", lr_decay=0.5, lr_decay_every=2, warmup_epochs=1)
    assert [every(s) for s in (10, 29, 30, 50)] == pytest.approx([1, 1, 0.5, 0.25])
    cosine = _rate(lr=1.0, lr_schedule="cosine", total=110, warmup_epochs=1)
    assert cosine(10) == pytest.approx(1.0)
    assert cosine(60) == pytest.approx(0.5)
    assert cosine(110) == pytest.approx(0.0, abs=1e-12)
    assert cosine(35) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)


def test_apply_writes_every_group_and_adamw_is_built() -> None:
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, OptimConfig(optimizer="adamw", weight_decay=0.01))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.01
    assert _rate(lr=0.3).apply(optimizer, 4) == 0.3
    assert all(group["lr"] == 0.3 for group in optimizer.param_groups)
    assert isinstance(build_optimizer(model, OptimConfig()), torch.optim.SGD)


# -- combinations that cannot work: one line each -------------------------------------------------

@pytest.mark.parametrize(("overrides", "needle"), [
    ({"strategy": "async-sgd", "grad_accum": 2}, "grad_accum 2 cannot work with the "
                                                 "asynchronous strategy async-sgd"),
    ({"strategy": "reduce-broadcast", "algorithm": "tree", "grad_accum": 2},
     "cannot work with reduce-broadcast"),
    ({"strategy": "async-sgd", "optimizer": "adamw", "momentum": 0.0}, "optimizer 'adamw' cannot "
                                                                       "run under async-sgd"),
    ({"optimizer": "adamw", "momentum": 0.5}, "momentum 0.5 is SGD's"),
    ({"strategy": "local-sgd", "lr_scaling": "linear"}, "lr_scaling 'linear'"),
])
def test_strategy_combinations_that_make_no_sense_are_refused(
        overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as info:
        check_optim_for_strategy(_config(**overrides))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("overrides", [
    {"grad_accum": 4, "lr_scaling": "linear", "optimizer": "adamw"},
    {"strategy": "local-sgd", "grad_accum": 2, "optimizer": "adamw"},
    {"strategy": "sync-easgd", "grad_accum": 2, "clip_grad_norm": 1.0},
    {"strategy": "async-sgd", "momentum": 0.0, "lr_schedule": "cosine", "warmup_epochs": 1.0},
])
def test_combinations_that_work_pass(overrides: dict[str, object]) -> None:
    check_optim_for_strategy(_config(**overrides))


def test_fp16_is_refused_on_the_cpu_and_where_ranks_would_skip_apart() -> None:
    with pytest.raises(ValueError, match="precision 'fp16' is not done on the CPU.*bf16"):
        check_precision("fp16", "cpu", "allreduce")
    with pytest.raises(ValueError, match="under local-sgd the ranks would decide it apart"):
        check_precision("fp16", "cuda", "local-sgd")
    check_precision("fp16", "cuda", "allreduce")
    check_precision("bf16", "cpu", "async-sgd")


class _OneProcess(Strategy):
    """A strategy of one process: the optimizer's step, counted."""

    steps = 0

    @property
    def model(self) -> nn.Module:
        return self.module

    def step(self) -> None:
        self.steps += 1
        self.optimizer.step()

    @property
    def stats(self) -> object:  # type: ignore[override]
        raise NotImplementedError


def test_bf16_autocast_keeps_parameters_and_gradients_float32() -> None:
    model = nn.Linear(4, 3)
    strategy = _OneProcess(model, torch.optim.SGD(model.parameters(), lr=0.1))
    precision = MixedPrecision("bf16", torch.device("cpu"), strategy)
    with precision.autocast():
        output = model(torch.randn(5, 4))
    assert output.dtype == torch.bfloat16
    precision.backward(nn.functional.cross_entropy(output, torch.tensor([0, 1, 2, 0, 1])))
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32
    before = model.weight.detach().clone()
    assert precision.step() and not torch.equal(before, model.weight)
    assert precision.state_dict() == {}


# -- the device ------------------------------------------------------------------------------------

def test_each_rank_takes_the_gpu_of_its_local_rank() -> None:
    from scaledl.train.device import check_local_ranks, rank_device

    assert rank_device("cpu", 3, 0) == torch.device("cpu")
    assert rank_device("cuda", 0, 1) == torch.device("cuda", 0)
    assert rank_device("cuda", 3, 4) == torch.device("cuda", 3)
    with pytest.raises(ValueError, match="local rank 2 has no GPU: this host has 2"):
        rank_device("cuda", 2, 2)
    check_local_ranks(4, 4)
    with pytest.raises(ValueError, match="3 workers on this host but it has 2 GPU"):
        check_local_ranks(3, 2)


def test_cuda_checks_on_a_gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU host would answer (torch's CUDA queries stand in for one)."""
    from scaledl.train import device

    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device.torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(device.torch.cuda, "get_device_name", lambda _=0: "Tesla V100")
    monkeypatch.setattr(device.dist, "is_nccl_available", lambda: True)
    device.check_device(_config(device="cuda"), 2)
    device.check_device(_config(device="cuda", precision="fp16"), 2)
    with pytest.raises(ValueError, match="3 workers on this host but it has 2 GPU"):
        device.check_device(_config(device="cuda"), 3)
    with pytest.raises(ValueError, match="precision 'bf16' but Tesla V100 has no bfloat16"):
        device.check_device(_config(device="cuda", precision="bf16"), 2)
    with pytest.raises(ValueError, match="strategy 'async-sgd' exchanges host tensors"):
        device.check_device(_config(device="cuda", strategy="async-sgd", momentum=0.0), 2)
    monkeypatch.setattr(device.dist, "is_nccl_available", lambda: False)
    with pytest.raises(ValueError, match="NCCL, which this torch build lacks"):
        device.check_device(_config(device="cuda"), 1)


# -- the CLI: every refusal before any worker, one line, exit code 2 ------------------------------

@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the user's modules, as the directory the command runs in."""
    (tmp_path / "user_nets.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make(input_shape, num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()),
                                                         num_classes))

        def make_class():
            return nn.Linear

        NOT_CALLABLE = 3

        def broken():
            raise RuntimeError("no weights here")

        def pair():
            torch.manual_seed(0)
            x = torch.randn(40, 6)
            y = (x[:, 0] > 0).long()
            return (torch.utils.data.TensorDataset(x[:30], y[:30]),
                    torch.utils.data.TensorDataset(x[30:], y[30:]))

        def listed():
            return [(torch.ones(2, 2) * i, i % 3) for i in range(9)]

        def wrong():
            return 42
    """))
    (tmp_path / "user_broken.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "user_nets", raising=False)
    return tmp_path


@pytest.mark.parametrize(("args", "needle"), [
    (["--precision", "fp16"], "precision 'fp16' is not done on the CPU"),
    (["--device", "cuda"], "device 'cuda' but this host has no usable CUDA GPU"),
    (["--model", "user_missing:make"], "module 'user_missing' does not import"),
    (["--model", "user_broken:make"], "module 'user_broken' does not import (ModuleNotFound"),
    (["--model", "user_nets:nothing"], "module 'user_nets' has no attribute 'nothing'"),
    (["--model", "user_nets:NOT_CALLABLE"], "is a int, not callable"),
    (["--model", "user_nets:make_class"], "returned a type, not an nn.Module"),
    (["--model", "user_nets:broken"], "raised RuntimeError: no weights here"),
    (["--dataset", "user_nets:wrong"], "the train set is a int, not a dataset"),
    (["--dataset", "user_nets:pair", "--data-dir", "."], "takes no data_dir parameter"),
    (["--strategy", "async-sgd", "--momentum", "0", "--grad-accum", "2"],
     "grad_accum 2 cannot work with the asynchronous strategy async-sgd"),
    (["--image-size", "8"], "image_size 8 (--image-size) resizes the images of"),
    (["--compression", "zip"], "unknown compression 'zip'; use 'none', 'bf16'"),
    (["--strategy", "local-sgd", "--compression", "bf16"],
     "compression 'bf16' compresses the gradient buckets of allreduce, and local-sgd has none"),
    (["--dataset", "imagefolder"], "dataset imagefolder needs its directory"),
])
def test_bad_input_is_one_line_before_any_worker(
        args: list[str], needle: str, user_code: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import scaledl.cli.train as train_cli

    def launched(*_: object, **__: object) -> int:
        raise AssertionError("a worker was started")

    monkeypatch.setattr(train_cli, "run_distributed", launched)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only host
    code = main(["train", "--out", str(user_code / "run"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("scaledl: error: ") and needle in err[-1], err[-1]


def test_user_model_and_data_pass_the_check(user_code: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import scaledl.cli.train as train_cli

    monkeypatch.setattr(train_cli, "run_distributed", lambda *_, **__: 0)
    assert main(["train", "--out", str(user_code / "run"), "--model", "user_nets:make",
                 "--dataset", "user_nets:pair", "--workers", "1"]) == 0


# -- the user's data set ---------------------------------------------------------------------------

def test_a_dataset_factory_is_read_whole_or_item_by_item(
        user_code: Path, caplog: pytest.LogCaptureFixture) -> None:
    from scaledl.data import load_dataset

    train = load_dataset("user_nets:pair", split="train")
    test = load_dataset("user_nets:pair", split="test")
    assert (len(train), len(test), train.input_shape, train.num_classes) == (30, 10, (6,), 2)
    assert train.features.dtype == torch.float32 and test.labels.dtype == torch.int64
    with caplog.at_level("WARNING"):
        listed = load_dataset("user_nets:listed", split="test")
    assert "also the test split" in caplog.text
    assert (len(listed), listed.input_shape, listed.num_classes) == (9, (2, 2), 3)
    assert torch.equal(listed.features[4], torch.full((2, 2), 4.0))


# -- imagefolder -----------------------------------------------------------------------------------

def _images(root: Path, split: str, sizes: dict[str, list[tuple[int, int]]],
            mode: str = "RGB") -> None:
    from PIL import Image

    for name, shapes in sizes.items():
        (root / split / name).mkdir(parents=True, exist_ok=True)
        for index, (width, height) in enumerate(shapes):
            value = 40 * (index + 1) + (100 if name == "dog" else 0)
            Image.new(mode, (width, height), (value,) * len(mode) if mode == "RGB"
                      else value).save(root / split / name / f"{index}.png")


def test_imagefolder_reads_classes_by_directory_and_standardizes_with_the_train_split(
        tmp_path: Path) -> None:
    from scaledl.data import load_dataset

    _images(tmp_path, "train", {"cat": [(5, 4)] * 2, "dog": [(5, 4)] * 3})
    _images(tmp_path, "val", {"dog": [(5, 4)]})
    train = load_dataset("imagefolder", tmp_path, "train")
    test = load_dataset("imagefolder", tmp_path, "test")
    assert (len(train), train.input_shape, train.num_classes) == (5, (3, 4, 5), 2)
    assert train.labels.tolist() == [0, 0, 1, 1, 1] and test.labels.tolist() == [1]
    mean = train.features.mean(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=1e-5)
    pixels = np.array([40, 80, 140, 180, 220], dtype=np.float32) / 255.0
    expected = (140 / 255.0 - pixels.mean()) / pixels.std()
    assert test.features[0, 0, 0, 0].item() == pytest.approx(expected, rel=1e-5)


def test_imagefolder_sizes_grayscale_and_layout_errors(tmp_path: Path) -> None:
    from scaledl.data import load_dataset

    _images(tmp_path, "train", {"a": [(6, 6), (8, 8)], "b": [(6, 6)]}, mode="L")
    _images(tmp_path, "test", {"a": [(7, 7)]}, mode="L")
    with pytest.raises(ValueError, match="images of 2 sizes .*give --image-size N"):
        load_dataset("imagefolder", tmp_path, "train")
    resized = load_dataset("imagefolder", tmp_path, "test", image_size=4)
    assert resized.input_shape == (1, 4, 4)  # all grayscale: one channel
    _images(tmp_path, "test", {"zebra": [(6, 6)]}, mode="L")
    with pytest.raises(ValueError, match="has class 'zebra', which .* lacks"):
        load_dataset("imagefolder", tmp_path, "test", image_size=4)
    with pytest.raises(ValueError, match="has no train/ directory; lay it out as"):
        load_dataset("imagefolder", tmp_path / "test", "train")


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"precision": "fp16"}, "precision 'fp16' is not done on the CPU"),
    ({"strategy": "async-sgd", "momentum": 0.0, "grad_accum": 2}, "grad_accum 2 cannot work"),
    ({"device": "cuda"}, "device 'cuda' but this host has no usable CUDA GPU"),
])
def test_under_a_launcher_every_rank_refuses_before_joining(
        overrides: dict[str, object], needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun, mpirun and srun start the workers themselves, so no preflight ran."""
    import scaledl.cli.train as train_cli
    from scaledl import bootstrap

    def joined(*_: object, **__: object) -> None:
        raise AssertionError("the rank joined the process group")

    monkeypatch.setattr(train_cli, "die_with_launcher", lambda: None)
    monkeypatch.setattr(bootstrap, "init", joined)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=needle):
        train_cli._worker(_config(**overrides))


def test_fp16_scaler_skips_the_strategy_update_whose_gradients_overflowed() -> None:
    """The gradient scaler drives the strategy's whole update (``strategy.step()``), not only
    the optimizer's; torch's CPU scaler stands in for CUDA's here."""
    model = nn.Linear(2, 1)
    strategy = _OneProcess(model, torch.optim.SGD(model.parameters(), lr=0.1))
    precision = MixedPrecision("fp16", torch.device("cpu"), strategy)
    assert precision.scaler is not None
    scale = precision.scaler.get_scale()
    strategy.zero_grad()
    precision.backward(model(torch.ones(1, 2)).sum() * float("inf"))
    precision.unscale()
    assert not precision.step() and strategy.steps == 0
    assert precision.scaler.get_scale() == scale / 2
    strategy.zero_grad()
    precision.backward(model(torch.ones(1, 2)).sum())
    precision.unscale()
    assert model.weight.grad is not None and torch.equal(model.weight.grad, torch.ones(1, 2))
    assert precision.step() and strategy.steps == 1
    assert precision.state_dict()["scale"] == scale / 2
