"""The simulator's models of one iteration, and what each one's options mean.

A strategy names its model (:attr:`scaledl.strategies.base.Strategy.timing`, one of
:data:`scaledl.strategies.base.TIMINGS`); :mod:`scaledl.sim.iteration` prices it.  What the
options that depend on the model mean for it (``--algorithm``, ``--no-overlap``, ``--tau``,
``--accumulation``, ``--allreduce-dtype``) is said here, once per model, for the checks of
:func:`scaledl.sim.job.check_job`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaledl.collectives.schedule import Collective
from scaledl.strategies.base import TIMINGS

__all__ = ["TimingModel", "TIMING_MODELS", "timing_model"]


@dataclass(frozen=True)
class TimingModel:
    """One iteration model's traits."""

    name: str
    collective: Collective
    """The collective whose algorithms ``--algorithm`` chooses among."""
    no_overlap_why: str | None
    """None where ``--no-overlap`` chooses between overlapping communication with backward and
    waiting for it; else why the choice means nothing for this model."""
    every_tau: bool
    """Its workers exchange every ``tau`` steps (the EASGD family), so ``--tau`` applies."""
    gradients: bool
    """It reduces gradients (synchronous data parallelism): its optimizer step can accumulate
    micro-batches, and its wire carries gradients, which may travel at 2 bytes; the others
    exchange weights and step locally already."""


TIMING_MODELS = {model.name: model for model in (
    TimingModel("bucketed", Collective.ALLREDUCE, None, every_tau=False, gradients=True),
    TimingModel("per-layer", Collective.REDUCE,
                "its per-layer reduces and broadcasts are its overlap (each reduce starts as "
                "backward produces the layer's gradient, forward waits for each broadcast)",
                every_tau=False, gradients=True),
    TimingModel("periodic", Collective.ALLREDUCE, None, every_tau=True, gradients=False),
    TimingModel("round-robin", Collective.ALLREDUCE,
                "a worker exchanges with the master between its own steps and waits only for "
                "its turn", every_tau=True, gradients=False),
)}
assert tuple(TIMING_MODELS) == TIMINGS, "every timing the strategies may name is described"


def timing_model(name: str) -> TimingModel:
    """The traits of timing model ``name`` (a strategy's declared :attr:`timing`)."""
    return TIMING_MODELS[name]
