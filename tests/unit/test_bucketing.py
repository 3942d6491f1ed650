"""The bucket plan: reverse registration order, size cap, dtype splits, per-layer buckets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaledl.sync.bucketing import layer_of, plan_buckets


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.Linear(20, 5))


def test_buckets_cover_every_parameter_once_in_reverse_order() -> None:
    named = list(_model().named_parameters())
    buckets = plan_buckets(named, bucket_bytes=4 * 1200)
    order = [name for b in buckets for name in b.names]
    assert order == [name for name, _ in reversed(named)]
    for bucket in buckets:
        assert bucket.offsets[0] == 0
        assert list(bucket.offsets[1:]) == [
            sum(bucket.numels[:i]) for i in range(1, len(bucket.numels))
        ]


def test_cap_is_respected_except_for_a_single_large_parameter() -> None:
    named = list(_model().named_parameters())
    cap = 4 * 1200
    for bucket in plan_buckets(named, bucket_bytes=cap):
        assert bucket.nbytes <= cap or len(bucket.names) == 1
    assert len(plan_buckets(named, bucket_bytes=1 << 30)) == 1


def test_dtypes_never_share_a_bucket() -> None:
    model = _model()
    model[2].to(torch.float64)
    buckets = plan_buckets(list(model.named_parameters()), bucket_bytes=1 << 30)
    assert len(buckets) == 3
    assert [b.dtype for b in buckets] == [torch.float32, torch.float64, torch.float32]


def test_per_layer_buckets() -> None:
    buckets = plan_buckets(list(_model().named_parameters()), 1, by_layer=True)
    assert [set(map(layer_of, b.names)) for b in buckets] == [{"3"}, {"2"}, {"0"}]


def test_frozen_parameters_are_skipped_and_bad_size_rejected() -> None:
    model = _model()
    model[0].weight.requires_grad_(False)
    names = [n for b in plan_buckets(list(model.named_parameters()), 1 << 20) for n in b.names]
    assert "0.weight" not in names and "0.bias" in names
    with pytest.raises(ValueError, match="bucket size 0"):
        plan_buckets(list(model.named_parameters()), 0)
