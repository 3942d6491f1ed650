"""Hierarchical and torus with each level on each path, against torch.distributed's results.

The layouts 2x2 and 3x2 are declared with SCALEDL_TOPOLOGY on this one host, so every level's
groups share memory and every path is open to every level (the emulated-cluster tests cover
real host boundaries).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import scaledl
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

PATHS = ("p2p", "shm", "native")


def _specs(collective: str) -> list[str]:
    specs = []
    for inner, outer in itertools.product(PATHS, PATHS):
        specs.append(f"torus[{inner},{outer}]")
        specs.append(f"hierarchical[{inner},{outer}]")
    if collective == "allreduce":
        specs += ["hierarchical[shm,halving_doubling]", "hierarchical[native,tree]"]
    specs += ["hierarchical", "torus", "auto"]
    if collective in ("broadcast", "reduce"):
        specs = [s for s in specs if not s.startswith("torus")]
    return specs


def _compare(collective: str, spec: str, rank: int, p: int, numel: int) -> bool:
    x = torch.arange(numel, dtype=torch.float64) * (rank + 1) + 1000 * rank
    root = p - 1
    if collective == "allreduce":
        got, want = x.clone(), x.clone()
        scaledl.allreduce(got, algorithm=spec)
        dist.all_reduce(want)
    elif collective == "broadcast":
        got, want = x.clone(), x.clone()
        scaledl.broadcast(got, src=root, algorithm=spec)
        dist.broadcast(want, src=root)
    elif collective == "reduce":
        got, want = x.clone(), x.clone()
        scaledl.reduce(got, dst=root, algorithm=spec)
        dist.all_reduce(want)
        want = want if rank == root else x
    elif collective == "reduce_scatter":
        full = torch.arange(numel * p, dtype=torch.float64) + 1000 * rank
        got = torch.empty(numel, dtype=torch.float64)
        scaledl.reduce_scatter(got, full, algorithm=spec)
        dist.all_reduce(full)
        want = full[rank * numel:(rank + 1) * numel]
    else:
        got = torch.empty(numel * p, dtype=torch.float64)
        scaledl.allgather(got, x, algorithm=spec)
        parts = [torch.empty(numel, dtype=torch.float64) for _ in range(p)]
        dist.all_gather(parts, x)
        want = torch.cat(parts)
    return torch.equal(got, want)


def _every_path(rank: int, p: int) -> list[str]:
    scaledl.init()
    failures = []
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        for spec in _specs(collective):
            for numel in (1, p + 1, 5003):
                if not _compare(collective, spec, rank, p, numel):
                    failures.append(f"{collective} {spec} numel={numel}")
    return failures


@pytest.mark.parametrize("layout", ["2x2", "3x2"])
def test_every_level_on_every_path_matches_torch(layout: str) -> None:
    axes = [int(a) for a in layout.split("x")]
    env = {"SCALEDL_TOPOLOGY": layout, "SCALEDL_SHM_WINDOW_MB": "0.0625"}
    results = run_ranks(axes[0] * axes[1], _every_path, timeout=300, env=env)
    assert [f for per_rank in results for f in per_rank] == []


def _explained(rank: int, p: int) -> str:
    scaledl.init()
    scaledl.allreduce(torch.ones(4))
    return scaledl.explain("allreduce", 1 << 20)


def test_explain_shows_the_path_of_each_level() -> None:
    text = run_ranks(4, _explained, timeout=60, env={"SCALEDL_TOPOLOGY": "2x2"})[0]
    assert "hierarchical[" in text and "torus[" in text, text


def _wrong_path(rank: int, p: int) -> str:
    scaledl.init()
    try:
        scaledl.allreduce(torch.ones(8), algorithm="hierarchical[shm,bogus]")
    except ValueError as error:
        return str(error)
    return "NO ERROR"


def test_unknown_level_path_is_a_one_line_error() -> None:
    for message in run_ranks(2, _wrong_path, timeout=60, env={"SCALEDL_TOPOLOGY": "1x2"}):
        assert "unknown level path" in message and "\n" not in message
