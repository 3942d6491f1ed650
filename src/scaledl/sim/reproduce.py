"""Published scaling results beside scaledl's predictions, with the error of every point
(docs/simulation.md, "Reproducing published results").

Each :class:`Case` is one published number with its hardware, batch, network and source, and a
``predict(ideal)`` that runs :class:`~scaledl.sim.job.Job` with the presets of
:mod:`scaledl.sim.presets` (the same for every case: no per-case knob beyond what the source
states).  :func:`error` is the difference in points for an efficiency or a share, and the
relative error for a speedup; the target (:func:`within_target`) is 5 points or 15%.  The
cases themselves are in :mod:`scaledl.sim.cases` and, by source, :mod:`scaledl.sim.cases_horovod`,
:mod:`scaledl.sim.cases_dle`, :mod:`scaledl.sim.cases_dle_pytorch` and
:mod:`scaledl.sim.cases_convnets2020` (NVIDIA's image recipes), :mod:`scaledl.sim.cases_bert`,
:mod:`scaledl.sim.cases_bert2019`, :mod:`scaledl.sim.cases_bert2020` and
:mod:`scaledl.sim.cases_bert_tf2` (NVIDIA's BERT recipes), :mod:`scaledl.sim.cases_dlperf` (the
same recipes measured by DLPerf) and :mod:`scaledl.sim.cases_megatron` (Megatron-LM's GPT, also
measured by DLPerf).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from scaledl.sim.job import Job

__all__ = ["Case", "Prediction", "Row", "error", "within_target", "evaluate", "idealised",
           "mean_absolute_error", "weak_scaling", "against_one_gpu", "METRICS",
           "TARGET_POINTS", "TARGET_RELATIVE"]

METRICS = ("efficiency", "speedup", "share")
TARGET_POINTS = 5.0
"""Largest acceptable error of an efficiency, in percentage points."""
TARGET_RELATIVE = 0.15
"""Largest acceptable relative error of a speedup."""


@dataclass(frozen=True)
class Prediction:
    """A predicted value, the line that explains it and the job it prices."""

    value: float
    detail: str
    job: Job | None = None
    """The larger job of the comparison (None where the value is not one job's, as a share
    compared between strategies): what :mod:`scaledl.sim.trust` classifies the point by."""


@dataclass(frozen=True)
class Case:
    """One published result and how scaledl predicts it."""

    name: str
    metric: str
    """``efficiency`` (fraction), ``speedup`` (ratio) or ``share`` (fraction; no target)."""
    published: float
    setup: str
    """Hardware, batch, network and software as the source states them, and assumptions."""
    source: str
    """Where the number is published (paper and table or figure, file and section)."""
    predict: Callable[[bool], Prediction]
    """``predict(ideal)``: the prediction with every loss (False) or the ideal model (True)."""

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric {self.metric!r} is not one of {METRICS}")


@dataclass(frozen=True)
class Row:
    """A case with its prediction and error."""

    case: Case
    prediction: Prediction
    error: float
    within: bool | None
    """Whether the error meets the target (None: a share, reported without a target)."""


def error(metric: str, published: float, predicted: float) -> float:
    """Points (efficiency, share) or relative error (speedup) of ``predicted``."""
    if metric == "speedup":
        return predicted / published - 1.0
    return (predicted - published) * 100.0


def within_target(metric: str, err: float) -> bool | None:
    """5 points of efficiency or 15% of a speedup; None for a share."""
    if metric == "share":
        return None
    limit = TARGET_RELATIVE if metric == "speedup" else TARGET_POINTS
    return abs(err) <= limit + 1e-12


def evaluate(cases: tuple[Case, ...], ideal: bool = False) -> list[Row]:
    """Every case predicted (with the ideal model if ``ideal``) and scored."""
    rows = []
    for case in cases:
        prediction = case.predict(ideal)
        err = error(case.metric, case.published, prediction.value)
        rows.append(Row(case, prediction, err, within_target(case.metric, err)))
    return rows


def mean_absolute_error(rows: list[Row]) -> tuple[float, int] | None:
    """The mean absolute error of the efficiency rows, in points, and how many there are (None
    without any: speedups and shares are not on the same scale)."""
    errors = [abs(row.error) for row in rows if row.case.metric == "efficiency"]
    if not errors:
        return None
    return sum(errors) / len(errors), len(errors)


def weak_scaling(jobs: Callable[[bool], tuple[Job, Job]], per_gpu: bool = True
                 ) -> Callable[[bool], Prediction]:
    """Efficiency of the second job against the first: the ratio of their per-GPU throughputs
    (samples per second per GPU, so two jobs that accumulate different numbers of
    micro-batches per step compare as published strong-scaling tables do)."""
    def predict(ideal: bool) -> Prediction:
        base, big = jobs(ideal)
        small, large = base.run(), big.run()
        value = ((large.batch_per_gpu / large.iteration_s)
                 / (small.batch_per_gpu / small.iteration_s)) if per_gpu else large.efficiency
        return Prediction(value, f"{large.iteration_s * 1e3:.0f} ms per step at {big.gpus} GPUs "
                                 f"vs {small.iteration_s * 1e3:.0f} ms at {base.gpus} "
                                 f"(comm busy {large.communication_s * 1e3:.0f} ms, exposed "
                                 f"{large.communication_share:.0%})", big)
    return predict


def idealised(job: Job, ideal: bool) -> Job:
    """``job`` under the ideal model when ``ideal`` (which has no precision, layout, input
    pipeline or negotiation cycle to price: those options are dropped), else ``job``."""
    return replace(job, ideal=True, mixed_precision=False, channels_last=False, input_rate=None,
                   cycle_ms=None) if ideal else job


def against_one_gpu(job: Job) -> Callable[[bool], tuple[Job, Job]]:
    """The job against itself on one GPU."""
    def jobs(ideal: bool) -> tuple[Job, Job]:
        big = idealised(job, ideal)
        return replace(big, gpus=1, topology="1"), big
    return jobs
