"""One (alpha, beta) pair: LinkCost serves the cost model, the replay and the simulator, and
calibration files written before it existed still load."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scaledl.collectives.cost import CostModel, LinkCost
from scaledl.sim.network import LinkClass, Network

OLD_CALIBRATION = """{
  "links": [{"alpha": 3e-05, "beta": 4e-10}, {"alpha": 0.00015, "beta": 8.5e-09}],
  "overhead": 2e-05, "gamma": 1.25e-10, "chunk_bytes": 1048576,
  "native_overhead": 1e-05, "native_beta_factor": 1.3
}"""
"""A calibration file as ``scaledl bench collectives --calibrate`` wrote it before the
shared-memory link class existed (its ``links`` entries are the same alpha/beta objects)."""


def test_an_older_calibration_file_loads_into_link_costs() -> None:
    model = CostModel.from_json(OLD_CALIBRATION)
    assert model.links == (LinkCost(3e-05, 4e-10), LinkCost(0.00015, 8.5e-09))
    assert model.shm == CostModel().shm
    with_shm = OLD_CALIBRATION.replace('"overhead"', '"shm": {"alpha": 1e-06, "beta": 2e-10}, '
                                                     '"overhead"')
    assert CostModel.from_json(with_shm).shm == LinkCost(1e-06, 2e-10)
    assert CostModel.from_json(model.to_json()) == model


def test_a_link_class_is_a_named_link_cost() -> None:
    link = LinkClass.from_bandwidth("10gbe", 10e-6, 10.0 / 8)
    assert isinstance(link, LinkCost) and link.name == "10gbe"
    assert link.time(1250) == pytest.approx(10e-6 + 1e-6)
    assert link.gbytes_per_s == pytest.approx(1.25)
    moved = dataclasses.replace(link, alpha=1.0)
    assert (moved.name, moved.alpha, moved.beta) == ("10gbe", 1.0, link.beta)
    model = Network("n", link, link).to_cost_model()
    assert all(type(cost) is LinkCost for cost in model.links)
    assert CostModel.from_json(model.to_json()) == model


@pytest.mark.parametrize(("alpha", "beta"), [(-1.0, 0.0), (0.0, -1e-9), (math.nan, 0.0),
                                             (0.0, math.inf)])
def test_a_negative_or_non_finite_cost_is_refused(alpha: float, beta: float) -> None:
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        LinkCost(alpha, beta)
    with pytest.raises(ValueError, match="link 'uplink' has"):
        LinkClass("uplink", alpha, beta)
