"""Benchmarks, each measured side by side with its baseline in one run.

* Collectives, nccl-tests style beside the native Gloo/NCCL baseline:
  :mod:`scaledl.bench.collectives` measures, :mod:`scaledl.bench.report` presents (table, JSON,
  plot) and :mod:`scaledl.bench.fit` calibrates ``auto``'s cost model from the measurements.
* Training throughput, scaledl DataParallel against torch DDP: :mod:`scaledl.bench.train`.
* Training algorithms (the EASGD family, asynchronous and synchronous SGD) on one budget:
  :mod:`scaledl.bench.algorithms` and its ``algorithms_*`` modules.
"""
