"""Benchmarks, each measured side by side with its baseline in one run.

* Collectives, nccl-tests style beside the native Gloo/NCCL baseline:
  :mod:`scaledl.bench.collectives` measures, :mod:`scaledl.bench.report` presents (plot,
  header lines; the console table is :mod:`scaledl.cli.bench_collectives`'s); the JSON file and
  the fit of ``auto``'s cost model to it are :mod:`scaledl.calibration`'s.
* Training throughput, scaledl DataParallel against torch DDP: :mod:`scaledl.bench.train`.
* Training methods (the EASGD family, asynchronous and synchronous SGD) on one budget
  (``scaledl bench algorithms``): :mod:`scaledl.bench.methods` and its ``methods_*`` modules.
"""
