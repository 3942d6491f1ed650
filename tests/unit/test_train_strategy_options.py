"""Strategy options of ``scaledl train``: alpha/rho, tau, servers, Sync EASGD's form, and the
checks that run before any worker starts."""

from __future__ import annotations

import pytest

from scaledl.strategies.catalogue import names_with, strategies
from scaledl.train.config import ParallelConfig, TrainConfig, build_config
from scaledl.train.setup import _strategy_options, algorithms_for, elastic_alpha, validate_config


def _config(**overrides: object) -> TrainConfig:
    return build_config({}, overrides)


@pytest.mark.parametrize(("options", "named"), [
    ({"alpha": 0.0}, "alpha 0.0"),
    ({"alpha": 1.0}, "alpha 1.0"),
    ({"alpha": -0.5}, "alpha -0.5"),
    ({"rho": 0.0}, "rho 0.0"),
    ({"alpha": 0.2, "rho": 1.0}, "alpha 0.2 and rho 1.0"),
    ({"tau": 0}, "tau 0"),
    ({"servers": -1}, "servers -1"),
    ({"easgd_form": "ring"}, "easgd_form 'ring'"),
    ({"servers": 1}, "servers 1 does not apply to strategy 'allreduce'"),
    ({"tau": 4}, "tau 4 does not apply to strategy 'allreduce'"),
    ({"strategy": "async-sgd", "alpha": 0.1}, "alpha 0.1 does not apply to strategy 'async-sgd'"),
    ({"strategy": "local-sgd", "rho": 1.0}, "rho 1.0 does not apply"),
    ({"strategy": "easgd", "easgd_form": "allreduce"}, "easgd_form 'allreduce' does not apply"),
])
def test_bad_strategy_options_name_the_value(options: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named) as caught:
        ParallelConfig(**options)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_every_server_and_periodic_strategy_is_known() -> None:
    assert set(names_with("server")) <= set(strategies())
    assert set(names_with("periodic")) <= set(strategies())
    assert ParallelConfig(strategy="async-sgd", servers=2).servers == 2


def test_alpha_defaults_to_beta_over_workers_and_follows_rho() -> None:
    assert elastic_alpha(_config(strategy="sync-easgd"), 4) == pytest.approx(0.9 / 4)
    assert elastic_alpha(_config(strategy="easgd", alpha=0.3), 4) == 0.3
    assert elastic_alpha(_config(strategy="easgd", lr=0.05, rho=2.0), 4) == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"alpha = lr \* rho = 0.5 \* 4.0 = 2"):
        elastic_alpha(_config(strategy="easgd", lr=0.5, rho=4.0), 4)


def test_sync_easgd_needs_beta_below_one() -> None:
    with pytest.raises(ValueError, match=r"beta = workers \* alpha = 4 \* 0.3 = 1.2"):
        validate_config(_config(strategy="sync-easgd", alpha=0.3), 4)
    validate_config(_config(strategy="sync-easgd", alpha=0.2), 4)
    validate_config(_config(strategy="easgd", alpha=0.3), 4)


def test_servers_must_leave_a_worker() -> None:
    with pytest.raises(ValueError, match="servers 3 leaves no worker among 3 ranks"):
        validate_config(_config(strategy="async-sgd", servers=3), 3)


def test_algorithm_choice_follows_strategy_and_form() -> None:
    assert algorithms_for("async-easgd") == ("auto",)
    assert algorithms_for("easgd") == ("auto",)
    assert "tree" in algorithms_for("sync-easgd", "tree")
    assert "ring" not in algorithms_for("sync-easgd", "tree")
    assert "ring" in algorithms_for("sync-easgd", "allreduce")
    assert "ring" in algorithms_for("local-sgd")
    with pytest.raises(ValueError, match="algorithm 'ring' does not work with strategy"):
        validate_config(_config(strategy="async-sgd", algorithm="ring"), 2)
    # a misspelt name was said not to work with the strategy
    with pytest.raises(ValueError, match="algorithm 'rign' is unknown; use one of: auto, ring"):
        validate_config(_config(strategy="allreduce", algorithm="rign"), 2)


def test_options_passed_to_each_kind_of_strategy() -> None:
    sync = _strategy_options(_config(strategy="sync-easgd", tau=4, easgd_form="allreduce"),
                             None, None, world_size=4)
    assert sync["tau"] == 4 and sync["form"] == "allreduce"
    assert sync["alpha"] == pytest.approx(0.9 / 4)
    assert set(sync) == {"algorithm", "topology", "timeline", "alpha", "tau", "form"}
    server = _strategy_options(_config(strategy="async-measgd", servers=1, momentum=0.5),
                               None, None, world_size=5)
    assert server["servers"] == 1 and server["momentum"] == 0.5 and server["tau"] == 1
    assert server["alpha"] == pytest.approx(0.9 / 4), "alpha counts workers, not the server"
    plain = _strategy_options(_config(strategy="allreduce"), None, None, world_size=2)
    assert set(plain) == {"algorithm", "topology", "timeline", "bucket_mb", "compression"}


@pytest.mark.parametrize(("model", "dataset", "message"), [
    ("inception_v3", "synthetic", "inception_v3 needs images of at least 75x75, got 32x32"),
    ("alexnet", "cifar10", "alexnet needs images of at least 64x64, got 32x32"),
    ("lenet", "synthetic:64", "lenet needs an image input"),
])
def test_a_model_that_cannot_take_the_datasets_samples_fails_before_launch(
        model: str, dataset: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_config(_config(model=model, dataset=dataset), 2)


def test_models_that_fit_their_data_pass_and_npz_waits_for_its_files() -> None:
    validate_config(_config(model="inception_v3", dataset="synthetic:3x75x75:10"), 2)
    validate_config(_config(model="resnet20", dataset="cifar10"), 2)
    validate_config(_config(model="inception_v3", dataset="npz"), 2)  # shape only in the files


@pytest.mark.parametrize(("overrides", "message"), [
    ({"strategy": "async-sgd", "momentum": 0.5},
     "momentum 0.5 is not applied by async-sgd, whose update takes none; drop it (of the server "
     "strategies, async-measgd, async-msgd apply momentum)"),
    ({"strategy": "hogwild-easgd", "momentum": 0.3}, "not applied by hogwild-easgd"),
    ({"strategy": "async-sgd", "bucket_mb": 1.0},
     "bucket_mb 1.0 sizes the gradient buckets of allreduce, and async-sgd has none; drop it"),
    ({"strategy": "reduce-broadcast", "bucket_mb": 4.0}, "reduce-broadcast has none"),
])
def test_a_run_value_the_strategy_does_not_read_is_refused(
        overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(_config(**overrides), 2)


@pytest.mark.parametrize("overrides", [
    {"strategy": "async-sgd", "momentum": 0.0},  # what it does anyway (the bench passes it)
    {"strategy": "async-sgd", "momentum": 0.9},  # the default
    {"strategy": "async-msgd", "momentum": 0.5}, {"strategy": "local-sgd", "momentum": 0.5},
    {"strategy": "allreduce", "bucket_mb": 1.0},
])
def test_run_values_the_strategy_reads_pass(overrides: dict[str, object]) -> None:
    validate_config(_config(**overrides), 2)
