"""Published single-GPU training rates beside the device model's (docs/validation.md, "Device
efficiency"): how far the FLOP-based roofline of each GPU preset can be trusted without a
measured rate (``--compute-time``) or profile (``--profile``).

The rates are data (``single_gpu_rates.toml`` beside this module, its header says where they come
from).  Every reproduction case that states a single-GPU rate uses it as the measured compute, so
these rates check only the predictions a user gets from a preset alone; the ones marked ``used``
set a preset, the others were not used for anything.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from scaledl.sim.job import Job
from scaledl.sim.scenario import resolve

__all__ = ["RateCheck", "RATE_CHECKS", "load_rate_checks", "predicted_rate", "rate_table"]

RATES_FILE = "single_gpu_rates.toml"
"""The rates, package data of :mod:`scaledl.sim`."""


@dataclass(frozen=True)
class RateCheck:
    """One single-GPU training rate, published (or, for the H100 and H200, measured here)."""

    device: str
    model: str
    batch: int
    published: float
    """Samples per second (images, or sequences for BERT)."""
    source: str
    input_shape: tuple[int, ...] | None = None
    used: bool = False
    """Whether the rate set the device preset (then the model meets it by construction)."""
    mixed_precision: bool = False
    """Measured with FP16 on tensor cores (AMP); otherwise at the preset's own precision."""
    channels_last: bool = False
    """The recipe's model was NHWC (``torch.channels_last``)."""


_REQUIRED = ("device", "model", "batch", "published", "source")
"""The fields without a default (:class:`RateCheck`)."""
_KINDS: dict[str, tuple[type, ...]] = {"device": (str,), "model": (str,), "batch": (int,),
                                       "published": (int, float), "source": (str,),
                                       "input_shape": (list,), "used": (bool,),
                                       "mixed_precision": (bool,), "channels_last": (bool,)}


def load_rate_checks(text: str, name: str = RATES_FILE) -> tuple[RateCheck, ...]:
    """The ``[[rate]]`` records of a TOML ``text`` (from the file ``name``), checked: a
    ValueError names the file, the record and the field."""
    records = tomllib.loads(text).get("rate", [])
    checks = []
    for index, record in enumerate(records, 1):
        where = f"{name}, rate {index}"
        missing = [key for key in _REQUIRED if key not in record]
        if missing:
            raise ValueError(f"{where}: field {missing[0]!r} is missing")
        values: dict[str, Any] = {}
        for key, value in record.items():
            kinds = _KINDS.get(key)
            if kinds is None:
                raise ValueError(f"{where}: unknown field {key!r}; use one of {', '.join(_KINDS)}")
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"{where}: field {key!r} is {value!r}, not "
                                 f"{' or '.join(kind.__name__ for kind in kinds)}")
            values[key] = tuple(value) if isinstance(value, list) else value
        checks.append(RateCheck(**values))
    return tuple(checks)


RATE_CHECKS = load_rate_checks(
    (resources.files("scaledl.sim") / RATES_FILE).read_text(encoding="utf-8"))
"""The rates, presets' own first, the H100's and H200's measured ones last."""


def predicted_rate(check: RateCheck) -> float:
    """Samples per second the device preset predicts on one GPU (compute and update)."""
    job = Job(model=check.model, input_shape=check.input_shape, gpus=1, topology="1",
              device=check.device, batch=check.batch, mixed_precision=check.mixed_precision,
              channels_last=check.channels_last)
    return check.batch / resolve(job).run().iteration_s


def rate_table(checks: tuple[RateCheck, ...] = RATE_CHECKS) -> str:
    """The published (or measured) and predicted rates as a markdown table."""
    lines = ["| device | model | batch | rate /s | predicted /s | error | set the preset | "
             "source |", "|---|---|---:|---:|---:|---:|---|---|"]
    for check in checks:
        predicted = predicted_rate(check)
        model = check.model + (f" ({'x'.join(map(str, check.input_shape))})"
                               if check.input_shape else "") + \
            (", mixed" if check.mixed_precision else "") + (", NHWC" if check.channels_last else "")
        lines.append(f"| {check.device} | {model} | {check.batch} | {check.published:g} | "
                     f"{predicted:.1f} | {round(100 * (predicted / check.published - 1)):+d}% | "
                     f"{'yes' if check.used else 'no'} | {check.source} |")
    return "\n".join(lines)
