"""Gradient compression without processes: choosing one by name (and refusing bad names before
any collective), fp16's scale, Gram-Schmidt, and what PowerSGD compresses."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import scaledl
from scaledl.sync import (
    BF16Compression, BucketLayout, FP16Compression, NoCompression, PowerSGD, resolve_compression,
)
from scaledl.sync.compression import FP16_HEADROOM, fp16_scale
from scaledl.sync.powersgd import orthogonalize


def test_names_choose_compressions() -> None:
    assert isinstance(resolve_compression("none"), NoCompression)
    assert isinstance(resolve_compression("BF16"), BF16Compression)
    assert isinstance(resolve_compression("fp16"), FP16Compression)
    default, ranked = resolve_compression("powersgd"), resolve_compression("powersgd:8")
    assert isinstance(default, PowerSGD) and default.rank == 4
    assert isinstance(ranked, PowerSGD) and ranked.spec() == "powersgd:8"
    mine = PowerSGD(rank=2, start_iter=10)
    assert resolve_compression(mine) is mine
    assert mine.spec() == "powersgd:2(start_iter=10)"


@pytest.mark.parametrize("value", ["fp8", "powersgd:0", "powersgd:x", "powersgd:-1", "powersgd:",
                                   "topk"])
def test_unknown_names_are_refused_naming_the_valid_ones(value: str) -> None:
    with pytest.raises(ValueError, match=f"unknown compression '{value}'; use 'none', 'bf16'"):
        resolve_compression(value)


def test_bad_values_are_refused_before_any_collective() -> None:
    with pytest.raises(TypeError, match="compression=3 \\(int\\) is not a compression"):
        resolve_compression(3)
    # no process group exists here: the value is checked first, on every rank alike
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        scaledl.DataParallel(nn.Linear(2, 2), compression="zip")
    with pytest.raises(ValueError, match="unknown compression 'fp32'"):
        scaledl.ddp_hook(compression="fp32")
    with pytest.raises(ValueError, match="PowerSGD rank=0 must be a positive integer"):
        PowerSGD(rank=0)
    with pytest.raises(ValueError, match="min_compression_rate=0 must be a positive number"):
        PowerSGD(min_compression_rate=0)
    with pytest.raises(ValueError, match="start_iter=-1 must be an integer >= 0"):
        PowerSGD(start_iter=-1)


def test_one_powersgd_instance_serves_one_model() -> None:
    shared = PowerSGD()
    first = scaledl.ddp_hook(compression=shared)
    with pytest.raises(ValueError, match="already used by another model's wrapper or hook"):
        scaledl.ddp_hook(compression=shared)
    del first  # once the first hook is gone the instance is free again
    scaledl.ddp_hook(compression=shared)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 1000])
def test_fp16_scale_is_the_largest_power_of_two_that_fits(world_size: int) -> None:
    for amax in (1e-30, 3e-8, 1e-3, 0.7, 1.0, 65504.0, 1e6, 3e38):
        scale = fp16_scale(amax, world_size)
        assert math.log2(scale).is_integer()
        bound = world_size * amax * scale
        assert bound <= FP16_HEADROOM and (bound * 2 > FP16_HEADROOM or scale == 2.0 ** 126)
        assert math.isfinite(bound)
    for amax in (0.0, math.inf, math.nan):
        assert fp16_scale(amax, world_size) == 1.0


def test_gram_schmidt_gives_orthonormal_columns_and_keeps_zero_columns_zero() -> None:
    matrix = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    orthogonalize(matrix)
    torch.testing.assert_close(matrix.t() @ matrix, torch.eye(4), atol=1e-5, rtol=0)
    degenerate = torch.zeros(6, 3)  # a gradient of rank 1 seen at rank 3: a zero column
    degenerate[:, 0] = 1.0
    degenerate[:, 2] = torch.arange(6.0)
    orthogonalize(degenerate)
    assert torch.isfinite(degenerate).all() and degenerate[:, 1].abs().max() == 0
    torch.testing.assert_close(degenerate[:, 0] @ degenerate[:, 2], torch.tensor(0.0))


def test_powersgd_compresses_only_matrices_that_gain() -> None:
    # a 1000x500 matrix (rank 4: 6000 instead of 500000), a bias, a 4x4 matrix (no gain:
    # (4 + 4) * 4 * 2 >= 16), a conv weight 64x(32*3*3) and two flags
    layout = BucketLayout.packed([(1000, 500), (1000,), (4, 4), (64, 32, 3, 3)], tail=2)
    compression = PowerSGD(rank=4)
    sent = compression.wire_numel(layout)
    assert sent == (1000 + 500) * 4 + 1000 + 16 + (64 + 288) * 4 + 2
    assert [tuple(q.shape) for q in compression.initial_q(0, layout)] == [(500, 4), (288, 4)]
    again = PowerSGD(rank=4).initial_q(0, layout)  # every rank draws the same
    assert all(torch.equal(a, b) for a, b in zip(compression.initial_q(0, layout), again))
