"""The compiled plans shared by all simulators of a process: reused, read-only, bounded."""

from __future__ import annotations

import numpy as np
import pytest

import scaledl.sim.collective as collective
from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import CollectiveSimulator, compile_collective, shared_plan
from scaledl.sim.network import LinkClass, Network
from scaledl.topology import Topology

TWO_BY_TWO = Topology((2, 2), explicit=True)


def test_another_simulator_reuses_the_plan_and_predicts_the_same() -> None:
    slow = Network("slow", LinkClass.from_bandwidth("in", 1e-5, 1.0),
                   LinkClass.from_bandwidth("out", 1e-4, 0.1))
    fast = Network("fast", LinkClass.from_bandwidth("in", 1e-6, 10.0),
                   LinkClass.from_bandwidth("out", 1e-5, 1.0))
    first = CollectiveSimulator(TWO_BY_TWO, slow)
    second = CollectiveSimulator(TWO_BY_TWO, fast)
    plan = first.compiled("ring", Collective.ALLREDUCE, 4096)
    assert second.compiled("ring", Collective.ALLREDUCE, 4096) is plan
    fresh = CollectiveSimulator(TWO_BY_TWO, fast, _plans={})
    fresh._plans[("ring", Collective.ALLREDUCE, 4096, 0)] = compile_collective(
        "ring", Collective.ALLREDUCE, TWO_BY_TWO, 4096)
    assert second.time("ring", Collective.ALLREDUCE, 4096) == \
        fresh.time("ring", Collective.ALLREDUCE, 4096)


def test_a_shared_plan_cannot_be_changed() -> None:
    plan = shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 1000, 0, 4))
    with pytest.raises(ValueError, match="read-only"):
        plan.send_bytes[0] = 1


def test_the_cache_drops_the_least_recently_used_plans_past_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collective, "_SHARED", type(collective._SHARED)())
    monkeypatch.setattr(collective, "_shared_entries", 0)
    one = shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 64, 0, 4))
    size = len(one.send_bytes) + len(one.recv_bytes)
    monkeypatch.setattr(collective, "SHARED_PLAN_ENTRIES", 2 * size)
    shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 128, 0, 4))
    assert shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 64, 0, 4)) is one
    shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 256, 0, 4))  # drops 128, not 64
    keys = [key[3] for key in collective._SHARED]
    assert keys == [64, 256]
    assert collective._shared_entries == 2 * size
    again = shared_plan(("ring", Collective.ALLREDUCE, TWO_BY_TWO, 64, 0, 4))
    assert np.array_equal(again.send_bytes, one.send_bytes)
