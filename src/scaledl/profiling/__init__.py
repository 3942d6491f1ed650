"""Profiling: a model's compute measured on a device, and the measured profile file.

What ``scaledl simulate profile`` does and writes: measured inputs of the simulator, as
:mod:`scaledl.calibration` holds the measured links.  It sits above ``models`` (the profiler
builds and runs registry models, the file's reader checks a model's layers) and below ``sim``,
which prices a profile (:func:`scaledl.sim.compute.measured_compute`) but owns none of its
measuring:

- :mod:`~scaledl.profiling.measure`: each leaf module's forward and backward seconds, the whole
  iteration, its jitter and the interference of communication-like work;
- :mod:`~scaledl.profiling.measure_host`: what a collective costs the host (the work run beside
  compute, a loopback TCP stream's CPU cost per byte);
- :mod:`~scaledl.profiling.profile_file`: the file (schema ``scaledl.simulate.profile/1``), its
  checked reader and its writer;
- :mod:`~scaledl.profiling.profile_trust`: whether a profile's own numbers show a busy machine.
"""
