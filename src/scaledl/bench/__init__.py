"""Benchmarks: collectives measured nccl-tests style beside the native Gloo/NCCL baseline.

:mod:`scaledl.bench.collectives` measures, :mod:`scaledl.bench.report` presents (table, JSON,
plot) and :mod:`scaledl.bench.fit` calibrates ``auto``'s cost model from the measurements.
"""
