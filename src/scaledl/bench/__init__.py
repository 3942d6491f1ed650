"""Benchmarks, each measured side by side with its baseline in one run.

* Collectives, nccl-tests style beside the native Gloo/NCCL baseline:
  :mod:`scaledl.bench.collectives` measures, :mod:`scaledl.bench.report` presents (JSON, plot,
  header lines; the console table is :mod:`scaledl.cli.bench_collectives`'s) and
  :mod:`scaledl.bench.fit` calibrates ``auto``'s cost model from the measurements.
* Training throughput, scaledl DataParallel against torch DDP: :mod:`scaledl.bench.train`.
* Training methods (the EASGD family, asynchronous and synchronous SGD) on one budget
  (``scaledl bench algorithms``): :mod:`scaledl.bench.methods` and its ``methods_*`` modules.
"""
