"""Fixtures shared by the real-launcher tests."""

from __future__ import annotations


import pytest

from tests.e2e.launcher_helpers import clean_env, run_job, step_losses, train_args, train_summary


@pytest.fixture(scope="session")
def local_training(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Rank 0's step losses of the launcher tests' ``scaledl train`` run on 2 local workers
    (torchrun, started by scaledl itself): what every launcher's 2-rank run must reproduce."""
    out = tmp_path_factory.mktemp("local-training")
    job = run_job([*train_args(out / "run"), "--workers", "2"], clean_env(), out)
    train_summary(out / "run", job)
    return step_losses(out / "run")
