"""How far to trust a prediction: the model's errors on the published points most like it.

``scaledl simulate`` prints one predicted scaling efficiency.  What a user about to pay for a
cluster also needs is how wrong such a number has been where it could be checked.  The
reproduction table (:mod:`scaledl.sim.reproduce`, docs/validation.md) holds the answer: every
published efficiency beside the same model's prediction.  This module keeps those errors, each
with four traits of the job it priced, and picks the points most like a new job:

1. the same GPU generation (``a100`` and ``a100-80gb`` are one), the same kind of model
   (transformer, convolutional or a multilayer perceptron), the same precision (mixed or full)
   and the same reach (one host or several);
2. if fewer than :data:`MINIMUM` points match, the GPU is dropped, then the reach, then the
   precision, then the kind, so that the band always rests on enough points and says which
   traits it kept; the points that share all four, if any, are kept beside it (a widened band
   must not hide that the few exact matches did worse).

The errors are data (``published_errors.json`` beside this module), written from the table by
``scaledl simulate reproduce --write-errors src/scaledl/sim/published_errors.json`` and
checked against a fresh evaluation by the test suite, so a change to the model that moves any
prediction must rewrite them.  Nothing here changes a prediction: the band describes the
model's record, it does not correct it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from scaledl.sim.job import Job
from scaledl.sim.presets import INSIDE_HOST_LINKS, device, link
from scaledl.sim.profile import TOKEN_MODELS
from scaledl.sim.reproduce import TARGET_POINTS, Row, within_target

__all__ = ["Traits", "PublishedError", "Band", "traits", "published_errors", "load_errors",
           "write_errors", "band", "trait_table", "MINIMUM", "ERRORS_FILE", "GENERATIONS",
           "TRAITS", "RELAX", "count_within"]

MINIMUM = 8
"""Fewest published points a band rests on before a trait is dropped."""
ERRORS_FILE = "published_errors.json"
"""The data file in this package (``scaledl simulate reproduce --write-errors`` rewrites it)."""
GENERATIONS = ("k80", "p100", "v100", "a100", "h100", "h200")
"""The GPU generations of the device presets, oldest first (the order of tables)."""
TRAITS = ("gpu", "kind", "precision", "reach")
"""What a band matches on (:class:`Traits`' fields)."""
RELAX = (("gpu",), ("gpu", "reach"), ("gpu", "reach", "precision"), TRAITS)
"""The traits dropped, in turn, while fewer than :data:`MINIMUM` points match: the GPU
generation first (the same recipes scale alike on V100 and A100 in the table), the precision
late (mixed precision is where the model misses most)."""


@dataclass(frozen=True)
class Traits:
    """What the band matches a job on."""

    gpu: str
    """The device preset's generation (``v100``; ``a100-80gb`` is ``a100``)."""
    kind: str
    """``transformer``, ``convolutional`` or ``multilayer perceptron`` (no published point)."""
    precision: str
    """``mixed`` or ``full``."""
    reach: str
    """``one host`` or ``several hosts``."""

    def describe(self, kept: tuple[str, ...]) -> str:
        """The kept traits in words (``any GPU`` when none is)."""
        words = [getattr(self, name) for name in ("gpu", "kind", "reach", "precision")
                 if name in kept]
        words = [f"{word} precision" if word in ("mixed", "full") else word for word in words]
        return ", ".join(words) if words else "any GPU"


@dataclass(frozen=True)
class PublishedError:
    """One published efficiency: its name and value, the prediction's error in points, and the
    traits of the job it priced."""

    name: str
    published: float
    """The published efficiency (a fraction)."""
    error: float
    traits: Traits


@dataclass(frozen=True)
class Band:
    """The model's record on the published points like a job."""

    kept: tuple[str, ...]
    """The traits the points share with the job (the others were dropped to reach enough)."""
    traits: Traits
    errors: tuple[float, ...]
    """Predicted minus published efficiency, points, sorted."""
    published: tuple[float, float]
    """The lowest and highest published efficiency of the points (fractions)."""
    exact: tuple[float, ...] = ()
    """When traits were dropped: the errors, sorted, of the points that share all four."""

    def covers(self, efficiency: float) -> bool:
        """Whether ``efficiency`` is within the target of the points' published range: outside
        it the record speaks of other regimes (a prediction of 40% against points of 70-99%)."""
        margin = TARGET_POINTS / 100.0
        return self.published[0] - margin <= efficiency <= self.published[1] + margin

    @property
    def within(self) -> int:
        """How many of the points are within the target (5 points)."""
        return count_within(self.errors)

    @property
    def median(self) -> float:
        """The median error, points (positive: the model was optimistic)."""
        return statistics.median(self.errors)

    def to_dict(self) -> dict[str, object]:
        """The band as JSON-ready data."""
        return {"matched": self.traits.describe(self.kept), "points": len(self.errors),
                "within_target": self.within, "median_error_points": self.median,
                "lowest_error_points": self.errors[0], "highest_error_points": self.errors[-1],
                "published_range": list(self.published),
                "exact_match_errors_points": list(self.exact)}


def traits(job: Job) -> Traits:
    """The four traits of ``job`` (its GPUs: ``job.gpus`` on its topology and network)."""
    hosts = 1 if link(job.network).name in INSIDE_HOST_LINKS else job.topology_value().num_nodes
    model = job.model.lower()
    kind = ("transformer" if model in TOKEN_MODELS
            else "multilayer perceptron" if model == "mlp" else "convolutional")
    measured = job.measured()  # a profile's precision is the one it was measured in
    mixed = job.mixed_precision or (measured is not None and measured.mixed_precision)
    return Traits(gpu=job.device.lower().split("-")[0], kind=kind,
                  precision="mixed" if mixed else "full",
                  reach="several hosts" if hosts > 1 else "one host")


def published_errors(rows: list[Row]) -> list[PublishedError]:
    """The efficiency points of the reproduction table with their errors and traits (a point
    whose prediction names no job, or that is not an efficiency, has no band to join)."""
    errors = []
    for row in rows:
        job = row.prediction.job
        if row.case.metric == "efficiency" and job is not None:
            errors.append(PublishedError(row.case.name, round(row.case.published, 5),
                                         round(row.error, 3), traits(job)))
    return errors


def load_errors(path: Path | None = None) -> list[PublishedError]:
    """The errors this package ships (or those in ``path``)."""
    text = (path.read_text() if path is not None
            else resources.files("scaledl.sim").joinpath(ERRORS_FILE).read_text())
    return [PublishedError(item["name"], item["published"], item["error"],
                           Traits(**item["traits"]))
            for item in json.loads(text)["points"]]


def write_errors(errors: list[PublishedError], path: Path) -> None:
    """Write ``errors`` as the data file :func:`load_errors` reads."""
    data = {"about": "scaledl simulate's error on each published efficiency of docs/"
                     "simulation.md (predicted minus published, points); rewrite with "
                     "`scaledl simulate reproduce --write-errors src/scaledl/sim/"
                     "published_errors.json`",
            "points": [asdict(e) for e in errors]}
    path.write_text(json.dumps(data, indent=1) + "\n")


def band(job: Job, errors: list[PublishedError] | None = None) -> Band | None:
    """The errors of the published points most like ``job``; None for a job not on GPUs (every
    published point is)."""
    if not device(job.device).is_gpu:
        return None
    errors = load_errors() if errors is None else errors
    if not errors:
        raise ValueError("no published errors to compare a job with (the package's "
                         f"{ERRORS_FILE} is empty): rewrite it with scaledl simulate reproduce "
                         "--write-errors")
    want = traits(job)
    exact = _errors(_like(errors, want, TRAITS))
    for dropped in ((), *RELAX[:-1]):
        kept = tuple(name for name in TRAITS if name not in dropped)
        like = _like(errors, want, kept)
        if len(like) >= MINIMUM:
            return _band(kept, want, like, () if kept == TRAITS else exact)
    return _band((), want, errors, exact)


def _like(errors: list[PublishedError], want: Traits, kept: tuple[str, ...]
          ) -> list[PublishedError]:
    """The points that share ``want``'s traits named in ``kept``."""
    return [e for e in errors if all(getattr(e.traits, n) == getattr(want, n) for n in kept)]


def _errors(points: list[PublishedError]) -> tuple[float, ...]:
    return tuple(sorted(e.error for e in points))


def _band(kept: tuple[str, ...], want: Traits, like: list[PublishedError],
          exact: tuple[float, ...] = ()) -> Band:
    values = [e.published for e in like]
    return Band(kept, want, _errors(like), (min(values), max(values)), exact)


def count_within(errors: tuple[float, ...]) -> int:
    """How many efficiency errors (points) meet the target."""
    return sum(bool(within_target("efficiency", e)) for e in errors)


def _table_order(t: Traits) -> tuple[int, str, str, str]:
    """Oldest GPU first (a generation without a preset last), then kind, reach, precision."""
    age = GENERATIONS.index(t.gpu) if t.gpu in GENERATIONS else len(GENERATIONS)
    return age, t.kind, t.reach, t.precision


def trait_table(errors: list[PublishedError]) -> str:
    """The errors grouped by all four traits, as ``scaledl simulate reproduce`` prints them: the
    groups a prediction's published check draws from before any trait is dropped."""
    groups: dict[Traits, list[PublishedError]] = {}
    for e in errors:
        groups.setdefault(e.traits, []).append(e)
    lines = ["| GPU | model | hosts | precision | points | within target | median error | "
             "errors | published |", "|---|---|---|---|---:|---:|---:|---|---|"]
    for key in sorted(groups, key=_table_order):
        found = _band(TRAITS, key, groups[key])
        lines.append(f"| {key.gpu} | {key.kind} | {key.reach} | {key.precision} | "
                     f"{len(found.errors)} | {found.within} | {found.median:+.1f} pt | "
                     f"{found.errors[0]:+.1f} to {found.errors[-1]:+.1f} pt | "
                     f"{found.published[0]:.1%}-{found.published[1]:.1%} |")
    return "\n".join(lines)
