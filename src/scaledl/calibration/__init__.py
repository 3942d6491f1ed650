"""Calibration: the benchmark file and every fit of a cost model to what it measured.

Below ``bench`` (which measures and writes the file) and ``sim`` (which fits its links on the
replay and validates against the file), above ``collectives`` (whose plans and cost model the
fits use):

- :mod:`~scaledl.calibration.bench_file`: the file ``scaledl bench collectives --json`` writes,
  its values, and its checked reader;
- :mod:`~scaledl.calibration.fit`: ``auto``'s cost model fitted to measured medians (the
  scheduled algorithms' links, ``native``'s per-round cost and bandwidth factor, shared memory);
- :mod:`~scaledl.calibration.link_fit`: link parameters fitted through a replay's critical
  paths (the simulator's replay, :mod:`scaledl.sim.calibrate`, is passed in).
"""
