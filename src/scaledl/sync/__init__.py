"""Synchronisation: gradients to buckets to collectives overlapped with backward; per-layer model
propagation overlapped with forward; a DDP comm hook; gradient compression on the wire."""

from scaledl.sync.bucketing import Bucket, plan_buckets
from scaledl.sync.compression import (
    BF16Compression, CastCompression, FP16Compression, NoCompression, resolve_compression,
)
from scaledl.sync.data_parallel import DataParallel
from scaledl.sync.ddp_hook import ddp_hook
from scaledl.sync.powersgd import PowerSGD
from scaledl.sync.propagation import ReduceBroadcast
from scaledl.sync.reducer import GradientReducer
from scaledl.sync.stats import SpanRecorder, SyncStats
from scaledl.sync.wire import BucketLayout, GradientCompression

__all__ = [
    "Bucket", "plan_buckets", "DataParallel", "ddp_hook", "ReduceBroadcast",
    "GradientReducer", "SpanRecorder", "SyncStats", "GradientCompression", "BucketLayout",
    "NoCompression", "CastCompression", "BF16Compression", "FP16Compression", "PowerSGD",
    "resolve_compression",
]
