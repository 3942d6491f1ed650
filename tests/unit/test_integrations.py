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
