"""The CLI on a GPU host and on other torch releases (found on a lent H100 with torch 2.11).

``scaledl train`` and ``scaledl bench`` move tensors in host memory, so they join Gloo even
where :func:`scaledl.bootstrap.init` would default to NCCL; and every launch passes torch's
elastic agent only the options the installed release has (2.11's ``LaunchConfig`` has no
``shutdown_timeout``, which failed every ``scaledl train`` there).
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.launcher.api import LaunchConfig

from scaledl import bootstrap
from scaledl.cli import bench_collectives, bench_train, train
from scaledl.launch.policy import SHUTDOWN_GRACE_S, supported_options
from scaledl.train.config import TrainConfig


class _Joined(Exception):
    """Raised by the stand-in ``init``: the worker got as far as joining."""


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """CUDA and NCCL present; ``bootstrap.init`` records the backend asked for and stops."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(train, "die_with_launcher", lambda: None)
    asked: list[str | None] = []

    def init(backend: str | None = None, **_: Any) -> None:
        asked.append(backend)
        raise _Joined

    monkeypatch.setattr(bootstrap, "init", init)
    return asked


def test_a_gpu_host_defaults_to_nccl(gpu_host: list[str | None]) -> None:
    assert bootstrap._backend(None) == "nccl"


@pytest.mark.parametrize("command", ["train", "bench collectives", "bench train"])
def test_host_tensor_commands_join_gloo_on_a_gpu_host(
    gpu_host: list[str | None], command: str
) -> None:
    args = argparse.Namespace(timeout=10.0)
    with pytest.raises(_Joined):
        if command == "train":
            train._worker(TrainConfig())  # the default: --device cpu
        elif command == "bench collectives":
            bench_collectives._worker(args, SimpleNamespace(topology=None))  # type: ignore[arg-type]
        else:
            bench_train._worker(args, SimpleNamespace())  # type: ignore[arg-type]
    assert gpu_host == [bootstrap.HOST_BACKEND] == ["gloo"]


def test_supported_options_drop_what_the_release_lacks() -> None:
    @dataclass
    class OldLaunchConfig:  # torch 2.11's has no shutdown_timeout
        min_nodes: int
        max_restarts: int = 0

    assert supported_options(OldLaunchConfig, shutdown_timeout=5, max_restarts=2) == \
        {"max_restarts": 2}

    def takes_anything(**kwargs: object) -> None: ...

    assert supported_options(takes_anything, shutdown_timeout=5) == {"shutdown_timeout": 5}


def test_the_installed_release_gets_the_grace_period_if_it_has_one() -> None:
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1,
                          **supported_options(LaunchConfig, shutdown_timeout=SHUTDOWN_GRACE_S))
    has_option = "shutdown_timeout" in inspect.signature(LaunchConfig).parameters
    assert getattr(config, "shutdown_timeout", None) == (SHUTDOWN_GRACE_S if has_option else None)
    agent_options = supported_options(LocalElasticAgent, shutdown_timeout=SHUTDOWN_GRACE_S)
    assert agent_options in ({"shutdown_timeout": SHUTDOWN_GRACE_S}, {})
