"""Published scaling results beside scaledl's predictions, with the error of every point
(``scaledl simulate reproduce``; the evidence is in docs/validation.md).

The published points are data: one TOML file per source under ``scaledl/sim/published/``, read by
:func:`load_cases` into :class:`Case` values.  Each case is one published number with the job
that measured it (model, GPU, batch, hosts, network, software stack, each run's measured
single-GPU rate), what it is compared against (one GPU, one node, or a smaller run) and how:

- ``throughput per GPU`` (the default): the efficiency of the job against its base, samples per
  second per GPU over the base's, as published strong- and weak-scaling tables read; the
  published value is a number, or ``{throughput = [base, job]}`` (samples/s of all GPUs of
  each), ``{per_gpu = [base, job]}`` or ``{time_ms = [base, job]}`` (time per iteration);
- ``scaling efficiency``: the job's own efficiency against one GPU (and, from ``epochs`` and
  ``train_samples``, its time to train);
- ``step time``: the speedup of the job over its base, their step times' ratio;
- ``communication share``: the job's share of exposed communication, beside the same job with
  ``versus`` changed, at each of ``input_shapes``.

Every case uses the presets as they are (:mod:`scaledl.sim.presets`; no per-case knob beyond
what the source states).  :func:`error` is the difference in points for an efficiency or a
share, and the relative error for a speedup; the target (:func:`within_target`) is 5 points or
15%.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from scaledl.json_fields import refuse_unknown
from scaledl.sim.job import Job
from scaledl.sim.scenario import resolve

__all__ = ["Case", "Prediction", "Row", "error", "within_target", "evaluate", "idealised",
           "mean_absolute_error", "weak_scaling", "METRICS", "COMPARISONS", "TARGET_POINTS",
           "TARGET_RELATIVE", "load_cases", "published_families", "published_cases"]

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
    job: Job | None = None
    """The job behind the published number, as the full model prices it (None where a case
    is not one job's)."""
    base: Job | None = None
    """What ``job`` is compared against (None: nothing, or the job's own one-GPU run)."""
    rates: tuple[float, float] | None = None
    """The published numbers behind ``published``, base first: samples/s of all GPUs, of one
    GPU, or milliseconds per iteration (None: the value itself was published)."""

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
        small, large = resolve(base).run(), resolve(big).run()
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
    return replace(job, lossless=True, mixed_precision=False, channels_last=False, input_rate=None,
                   cycle_ms=None) if ideal else job


COMPARISONS = ("throughput per GPU", "scaling efficiency", "step time", "communication share")
"""How a case's prediction is compared with its published value (the module's docstring)."""

PUBLISHED = "published"
"""The package data directory of the published points, one TOML file per source."""

ONE_GPU = {"gpus": 1, "topology": "1"}
"""A case's base when it names none: its job on one GPU."""


def per_gpu_throughput(base: Job, job: Job) -> Callable[[bool], Prediction]:
    """``job``'s per-GPU throughput over ``base``'s (:func:`weak_scaling`)."""
    return weak_scaling(lambda ideal: (idealised(base, ideal), idealised(job, ideal)))


def scaling_efficiency(job: Job, epochs: int, train_samples: int
                       ) -> Callable[[bool], Prediction]:
    """``job``'s own efficiency against one GPU, and its time for ``epochs`` passes over
    ``train_samples``."""
    def predict(ideal: bool) -> Prediction:
        priced = idealised(job, ideal)
        result = resolve(priced).run()
        minutes = epochs * train_samples / result.samples_per_s / 60
        per_gpu = result.samples_per_s / job.gpus
        return Prediction(result.efficiency,
                          f"{epochs} epochs in {minutes:.0f} min ({per_gpu:.0f} images/s/GPU, "
                          f"comm share {result.communication_share:.1%})", priced)
    return predict


def step_time_speedup(base: Job, job: Job) -> Callable[[bool], Prediction]:
    """``base``'s step time over ``job``'s: the speedup of the larger run (strong scaling)."""
    def predict(ideal: bool) -> Prediction:
        big = idealised(job, ideal)
        small, large = resolve(idealised(base, ideal)).run(), resolve(big).run()
        speedup = small.iteration_s / large.iteration_s
        return Prediction(speedup, f"{speedup / (job.gpus / base.gpus):.0%} of linear; comm share "
                                   f"{small.communication_share:.0%} -> "
                                   f"{large.communication_share:.0%}", big)
    return predict


def communication_share(job: Job, versus: Mapping[str, Any], label: str,
                        shapes: tuple[tuple[int, ...], ...]) -> Callable[[bool], Prediction]:
    """``job``'s communication share at the first of ``shapes``, with the same job changed by
    ``versus`` (named ``label``) beside it at every shape."""
    def predict(ideal: bool) -> Prediction:
        parts, value = [], None
        for shape in shapes:
            original = resolve(idealised(replace(job, input_shape=shape), ideal)).run()
            other = resolve(idealised(replace(job, input_shape=shape, **versus), ideal)).run()
            value = original.communication_share if value is None else value
            parts.append(f"{'x'.join(map(str, shape[1:]))}: {original.communication_share:.0%} "
                         f"vs {other.communication_share:.0%}")
        assert value is not None
        return Prediction(value, f"original vs {label} comm share, " + "; ".join(parts))
    return predict


@functools.cache
def published_families() -> tuple[tuple[str, tuple[Case, ...]], ...]:
    """The published points by source, in the table's order (read once; ``scaledl simulate
    reproduce`` summarises each source)."""
    return load_cases(resources.files("scaledl.sim") / PUBLISHED)


def published_cases() -> tuple[Case, ...]:
    """Every published point, in the table's order."""
    return tuple(case for _, cases in published_families() for case in cases)


def load_cases(directory: Traversable) -> tuple[tuple[str, tuple[Case, ...]], ...]:
    """Every ``*.toml`` file of ``directory`` (a path or package resource) in name order: its
    ``family`` and its cases, checked; a ValueError names the file, the case and the field."""
    families = []
    for entry in sorted(directory.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".toml"):
            continue
        where = f"published results file {entry.name}"
        try:
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{where} is not valid TOML: {exc}") from None
        refuse_unknown(data, {"family", "job", "case"}, where)
        family = _typed(data, "family", str, where)
        defaults = data.get("job", {})
        records = data.get("case", [])
        if not isinstance(defaults, dict) or not isinstance(records, list) or not records:
            raise ValueError(f"{where}: needs a [job] table of shared fields (optional) and at "
                             "least one [[case]]")
        families.append((family, tuple(_case(record, defaults, f"{where}, case {index + 1}")
                                       for index, record in enumerate(records))))
    if not families:
        raise ValueError(f"no published results (*.toml) in {directory}")
    return tuple(families)


_CASE_FIELDS = {"name", "metric", "compare", "published", "setup", "source", "job", "base",
                "epochs", "train_samples", "versus", "versus_label", "input_shapes"}


def _case(record: Any, defaults: dict[str, Any], where: str) -> Case:
    """One ``[[case]]`` record as a :class:`Case`."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a case is a table")
    name = _typed(record, "name", str, where)
    where = f"{where} ({name!r})"
    refuse_unknown(record, _CASE_FIELDS, where)
    metric, setup, source = (_typed(record, key, str, where)
                             for key in ("metric", "setup", "source"))
    compare = record.get("compare", COMPARISONS[0])
    if compare not in COMPARISONS:
        raise ValueError(f"{where}: field 'compare' is {compare!r}; use one of {COMPARISONS}")
    fields_ = {**defaults, **_typed(record, "job", dict, where)}
    job = _job(fields_, f"{where}, field 'job'")
    base = None
    if compare in ("throughput per GPU", "step time"):
        base_fields = record.get("base", ONE_GPU)
        if not isinstance(base_fields, dict):
            raise ValueError(f"{where}: field 'base' is a table of the fields that differ from "
                             "the job")
        base = _job({**fields_, **ONE_GPU, **base_fields}, f"{where}, field 'base'")
    published, rates = _published(record.get("published"), base, job, where)
    priced: Job | None = job
    predict: Callable[[bool], Prediction]
    if compare == "throughput per GPU":
        assert base is not None
        predict = per_gpu_throughput(base, job)
    elif compare == "step time":
        assert base is not None
        predict = step_time_speedup(base, job)
    elif compare == "scaling efficiency":
        predict = scaling_efficiency(job, _typed(record, "epochs", int, where),
                                     _typed(record, "train_samples", int, where))
    else:
        shapes = _typed(record, "input_shapes", list, where)
        if not shapes or not all(isinstance(shape, list) for shape in shapes):
            raise ValueError(f"{where}: field 'input_shapes' is a list of sample shapes")
        versus = _typed(record, "versus", dict, where)
        _job({**fields_, **versus}, f"{where}, field 'versus'")
        predict = communication_share(job, versus, _typed(record, "versus_label", str, where),
                                      tuple(tuple(shape) for shape in shapes))
        priced = None  # a share compared between two jobs is neither's
    try:
        return Case(name, metric, published, setup, source, predict, priced, base, rates)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _published(value: Any, base: Job | None, job: Job, where: str
               ) -> tuple[float, tuple[float, float] | None]:
    """The published value and the numbers it comes from."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None
    kinds = ("throughput", "per_gpu", "time_ms")
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in kinds:
        raise ValueError(f"{where}: field 'published' is a number or one of "
                         f"{{{' | '.join(f'{kind} = [base, job]' for kind in kinds)}}}")
    (kind, pair), = value.items()
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(x, (int, float)) and x > 0 for x in pair)):
        raise ValueError(f"{where}: field 'published.{kind}' is {pair!r}; give two numbers > 0, "
                         "the base's and the job's")
    low, high = pair
    if kind == "per_gpu":
        return high / low, (low, high)
    if kind == "time_ms":
        return low / high, (low, high)
    if base is None or job.gpus % base.gpus:
        raise ValueError(f"{where}: field 'published.throughput' needs a base whose GPUs divide "
                         f"the job's {job.gpus}")
    return high / (job.gpus // base.gpus * low), (low, high)


_JOB_FIELDS = {field.name: str(field.type) for field in fields(Job)}


def _job(values: dict[str, Any], where: str) -> Job:
    """A :class:`Job` from TOML fields (``rate``: samples/s of one GPU, for ``compute_time``)."""
    values = dict(values)
    rate = values.pop("rate", None)
    for key, value in values.items():
        kind = _JOB_FIELDS.get(key)
        if kind is None:
            raise ValueError(f"{where}: unknown job field {key!r}; use one of "
                             f"{', '.join(['rate', *_JOB_FIELDS])}")
        if not _fits(value, kind):
            raise ValueError(f"{where}: job field {key!r} is {value!r}, not {kind}")
        if key == "input_shape" and value is not None:
            values[key] = tuple(value)
    if rate is not None:
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
            raise ValueError(f"{where}: job field 'rate' is {rate!r}; give samples/s > 0")
        values["compute_time"] = values.get("batch", Job.batch) / rate
    return Job(**values)


def _fits(value: Any, kind: str) -> bool:
    """Whether a TOML value can stand for a field annotated ``kind``."""
    for option in kind.split(" | "):
        if option == "None" and value is None:
            return True
        if option == "bool" and isinstance(value, bool):
            return True
        if isinstance(value, bool):
            continue
        if (option == "int" and isinstance(value, int)) or (
                option == "float" and isinstance(value, (int, float))) or (
                option in ("str", "Path") and isinstance(value, str)) or (
                option.startswith("tuple[int") and isinstance(value, list)
                and all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            return True
    return False


def _typed(record: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """``record[key]``, which must be a ``kind``."""
    if key not in record:
        raise ValueError(f"{where}: field {key!r} is missing")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: field {key!r} is {value!r}, not {kind.__name__}")
    return value

