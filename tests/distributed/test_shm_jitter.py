"""The shared-memory protocol under skewed schedules: random delays at every control-word read,
write and wait (``SCALEDL_SHM_JITTER``), random sequences of every call kind that shares it
(``tests/shm_schedules.py``), every result checked exactly, on 2, 3 and 4 ranks.

A short seeded version of ``benchmarks/reliability/shm_soak.py`` (docs/reliability.md has the
soak's figures).  A hang fails within ``SCALEDL_TIMEOUT`` with the waiting rank named.
"""

from __future__ import annotations

import pytest

from scaledl.transport.shm_jitter import Jitter
from tests import shm_schedules
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(("world_size", "seed", "calls"), [(2, 11, 120), (3, 12, 80), (4, 13, 60)])
def test_random_calls_with_random_delays_are_exact(world_size: int, seed: int, calls: int) -> None:
    env = {**shm_schedules.WINDOW_ENV, "SCALEDL_SHM_JITTER": f"{seed}:1:0.3",
           "SCALEDL_TIMEOUT": "20"}
    results = run_ranks(world_size, shm_schedules.run, seed, calls, timeout=150, env=env)
    assert [f for result in results for f in result["failures"]] == []
    counts = results[0]["counts"]
    staged = 0 if world_size == 4 else 2  # hierarchical and torus need a 2x2 layout
    assert sum(counts.values()) == calls and len(counts) == len(shm_schedules.KINDS) - staged
    assert all(result["pauses"] > 10 * calls for result in results)  # the delays were on


def test_jitter_setting_is_checked() -> None:
    assert Jitter.parse("7:2", rank=1).max_s == pytest.approx(0.002)
    assert Jitter.parse("7:2:0.25", rank=0).probability == 0.25
    for bad in ("7", "x:2", "7:2:1.5", "7:-1"):
        with pytest.raises(ValueError, match="SCALEDL_SHM_JITTER"):
            Jitter.parse(bad, rank=0)
