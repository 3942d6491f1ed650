"""Simulation: replay scaledl's collective plans on a network model and predict training time.

- :mod:`~scaledl.sim.network`: link classes (intra-host, inter-host, rack uplink), shared links;
- :mod:`~scaledl.sim.device_model`, :mod:`~scaledl.sim.presets`: what a device is, and the
  devices and links with their sources (docs/simulation.md);
- :mod:`~scaledl.sim.compiled`, :mod:`~scaledl.sim.fastreplay`: every rank's schedule compiled to
  arrays and replayed in virtual time, vectorised (equal to
  :func:`scaledl.collectives.replay.replay` on the same plans);
- :mod:`~scaledl.sim.hostcpu`: where bytes pass through host CPUs (TCP): CPU work per round, the
  cores shared by processor sharing, stages as CPU work;
- :mod:`~scaledl.sim.collective`: one collective's predicted time, plans cached;
- :mod:`~scaledl.sim.profile`, :mod:`~scaledl.sim.compute`: per-layer bytes and FLOPs, and how
  long each layer takes (ideal rule, device roofline, a measured profile: the measuring and
  its file are :mod:`scaledl.profiling`'s);
- :mod:`~scaledl.sim.losses`, :mod:`~scaledl.sim.overlap`, :mod:`~scaledl.sim.iteration`: what
  real clusters lose, the overlapped timelines, one training iteration;
- :mod:`~scaledl.sim.calibrate`: fit links to ``scaledl bench collectives --json`` on the replay
  and validate (the file and ``native``'s fit are :mod:`scaledl.calibration`'s);
- :mod:`~scaledl.sim.reproduce`: published results (TOML files under ``published/``, one per
  source) and the errors of their predictions; :mod:`~scaledl.sim.device_checks`: published
  single-GPU rates (``single_gpu_rates.toml``);
- :mod:`~scaledl.sim.job`: what ``scaledl simulate`` takes (a job spec) and refuses (its checks,
  errors naming the fields); :mod:`~scaledl.sim.scenario`: what a checked job resolves to (its
  topology, network, device, losses, compute model and profile) and the prediction on it;
  :mod:`~scaledl.sim.sweep`: the same scenario on smaller topologies.
"""

from __future__ import annotations

from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.iteration import IterationResult, simulate_iteration
from scaledl.sim.job import Job
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.scenario import Scenario, resolve

__all__ = ["CollectiveSimulator", "IterationResult", "Job", "LinkClass", "Network", "Scenario",
           "resolve", "simulate_iteration"]
