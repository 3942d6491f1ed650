"""How PowerSGD's host placement cuts a bucket into shares (scaledl.sync.host_shares)."""

from __future__ import annotations

import pytest
import torch

from scaledl.sync import BucketLayout, PowerSGD
from scaledl.sync.host_shares import share_bounds
from scaledl.sync.powersgd import HOST_SPLIT_MARGIN, memory_passes


def test_shares_are_contiguous_cut_at_gradient_starts_and_balanced() -> None:
    starts = [0, 10, 30, 60, 100]
    costs = [10.0, 20.0, 30.0, 40.0, 50.0]  # total 150: halves at 75
    assert share_bounds(starts, costs, 160, 2) == ((0, 60), (60, 160))
    assert share_bounds(starts, costs, 160, 1) == ((0, 160),)
    # three parts: targets 50 and 100; cut before gradient 3 (cost 60) and 4 (cost 100)
    assert share_bounds(starts, costs, 160, 3) == ((0, 60), (60, 100), (100, 160))


def test_more_shares_than_gradients_leaves_some_empty() -> None:
    bounds = share_bounds([0, 5], [1.0, 1.0], 8, 4)
    assert bounds[0][0] == 0 and bounds[-1][1] == 8
    assert all(lo <= hi for lo, hi in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert sum(hi > lo for lo, hi in bounds) == 2


def test_bad_share_counts_raise() -> None:
    with pytest.raises(ValueError, match="0 shares"):
        share_bounds([0], [1.0], 1, 0)
    with pytest.raises(ValueError, match="2 gradient starts but 1 costs"):
        share_bounds([0, 1], [1.0], 2, 2)


def test_powersgd_balances_shares_by_compressed_work() -> None:
    # a compressed matrix (8 passes per element: 80,000), then 30 biases (3 per element:
    # 3,000 each): half the cost (85,000) lies after 2 biases (86,000 is nearest), not at half
    # the elements (20,000)
    shapes = [(100, 100)] + [(1000,)] * 30
    layout = BucketLayout.packed(shapes, tail=len(shapes))
    assert PowerSGD(rank=4)._share_bounds(0, layout, 2) == ((0, 12_000), (12_000, 40_031))


def test_placement_is_checked_and_in_the_spec() -> None:
    with pytest.raises(ValueError, match="placement='host'"):
        PowerSGD(placement="host")
    assert PowerSGD(rank=2, placement="flat").spec() == "powersgd:2(placement=flat)"
    assert PowerSGD(rank=2).spec() == "powersgd:2"


def test_a_share_starts_each_matrix_from_the_flat_draw() -> None:
    layout = BucketLayout.packed([(20, 30), (7,), (30, 40)])
    flat = PowerSGD(rank=2).initial_q(3, layout)
    share = PowerSGD(rank=2)._plan(3, layout, torch.float32, torch.device("cpu"),
                                   (layout.offsets[1], layout.numel))
    assert torch.equal(share.q[:80].view(2, 40).t(), flat[1])


def test_auto_splits_by_host_only_where_it_moves_clearly_less_memory() -> None:
    # with error feedback: 4 + 9 / L passes against 9; without, never fewer
    assert memory_passes(2) == (8.5, 9.0)
    assert memory_passes(4) == (6.25, 9.0)
    assert memory_passes(2)[0] > HOST_SPLIT_MARGIN * 9.0 >= memory_passes(3)[0]
    assert memory_passes(8, error_feedback=False)[0] > 3.0
