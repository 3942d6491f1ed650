"""Data for data-parallel training: datasets by name, per-rank sharding, prefetching loader."""

from __future__ import annotations

from scaledl.data.datasets import ArrayDataset, available_datasets, declared_shape, load_dataset
from scaledl.data.loader import ShardedLoader, batches_per_epoch
from scaledl.data.sharding import ShardedSampler

__all__ = [
    "ArrayDataset", "ShardedLoader", "ShardedSampler", "available_datasets", "declared_shape",
    "batches_per_epoch", "load_dataset",
]
