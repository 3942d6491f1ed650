"""The framework integrations: import cost, argument errors, and the DDP-model check."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from scaledl.integrations.accelerate import register_comm_hook
from tests.harness import run_ranks
from tests.helpers_imports import modules_loaded_by


def test_import_scaledl_imports_no_framework() -> None:
    assert modules_loaded_by("import scaledl, scaledl.integrations",
                             ("lightning", "pytorch_lightning", "accelerate")) == []


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="lightning is not installed (pip install -e '.[lightning]')")
def test_lightning_strategy_argument_errors() -> None:
    from scaledl.integrations.lightning import ScaledlStrategy

    with pytest.raises(TypeError, match="sets ddp_comm_hook itself"):
        ScaledlStrategy(ddp_comm_hook=lambda state, bucket: None)
    with pytest.raises(ValueError, match="nope"):
        ScaledlStrategy(algorithm="nope")
    assert ScaledlStrategy(algorithm="ring", find_unused_parameters=True).algorithm == "ring"
    # these were accepted and ignored (post-local SGD), or failed on every rank at setup
    with pytest.raises(TypeError, match="does not take ddp_comm_state or model_averaging_period"):
        ScaledlStrategy(ddp_comm_state=object(), model_averaging_period=4)
    with pytest.raises(ValueError, match="'bad'"):
        ScaledlStrategy(topology="bad")
    with pytest.raises(TypeError, match="topology must be a spec"):
        ScaledlStrategy(topology=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="algorithm must be a name"):
        ScaledlStrategy(algorithm=None)  # type: ignore[arg-type]


def test_register_comm_hook_on_one_process_changes_nothing() -> None:
    model = nn.Linear(2, 2)
    assert register_comm_hook(model, algorithm="ring") is model
    with pytest.raises(ValueError, match="nope"):
        register_comm_hook(model, algorithm="nope")


def _not_ddp(rank: int, world_size: int) -> str:
    try:
        register_comm_hook(nn.Linear(2, 2))
    except TypeError as error:
        return str(error)
    return "no error"


@pytest.mark.distributed
def test_register_comm_hook_needs_the_prepared_ddp_model() -> None:
    messages = run_ranks(2, _not_ddp)
    assert all("needs the DistributedDataParallel model" in m and "2-process job, not Linear" in m
               and "Accelerator(cpu=True)" in m for m in messages), messages


def _hooked_step(rank: int, world_size: int) -> list[float]:
    import scaledl

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    assert register_comm_hook(model, algorithm="ring") is model
    with pytest.raises(ValueError, match="already has a communication hook"):
        register_comm_hook(model, algorithm="ring")  # torch's "can only be called once"
    model(torch.full((2, 3), float(rank + 1))).sum().backward()
    grad = model.module.weight.grad
    assert grad is not None
    scaledl.shutdown()
    return [float(value) for value in grad.flatten()]


@pytest.mark.distributed
def test_register_comm_hook_averages_gradients() -> None:
    grads = run_ranks(2, _hooked_step)
    # d(sum(w.x + b))/dw = sum over the batch of x: 2 * (rank + 1) per element, averaged = 3
    assert grads == [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]


def _hook_without_layout(rank: int, world_size: int) -> list[str]:
    import scaledl

    messages = []
    for make in (lambda: scaledl.ddp_hook(algorithm="hierarchical"),
                 lambda: scaledl.ddp_hook(algorithm="ring",
                                          topology="1x2"),  # type: ignore[arg-type]
                 lambda: scaledl.ddp_hook(algorithm=None)):  # type: ignore[arg-type]
        try:
            make()
            messages.append("no error")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages


@pytest.mark.distributed
def test_ddp_hook_checks_its_algorithm_when_built() -> None:
    # the layout error came at the first backward, inside DDP's hook, on every rank
    for messages in run_ranks(2, _hook_without_layout):
        assert "needs the network layout" in messages[0]
        assert "topology must be a scaledl.Topology" in messages[1]
        assert "algorithm must be a name" in messages[2]


def _failed_bucket(rank: int, world_size: int) -> str:
    import scaledl

    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    model.register_comm_hook(None, scaledl.ddp_hook(algorithm="ring"))
    if rank == 1:
        return "left"
    try:
        model(torch.ones(2, 3)).sum().backward()
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return "no error"


@pytest.mark.distributed
def test_a_failed_bucket_reaches_ddp_with_its_message() -> None:
    # DDP said "Unable to cast <the error> to Tensor"
    message = run_ranks(2, _failed_bucket, env={"SCALEDL_TIMEOUT": "3"}, timeout=60)[0]
    assert "Unable to cast" not in message and "rank 1" in message, message
