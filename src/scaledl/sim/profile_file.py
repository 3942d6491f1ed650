"""The measured profile file of ``scaledl simulate profile`` (JSON, schema
``scaledl.simulate.profile/1``) and how the simulator uses it.

The file holds, for each batch size measured: every leaf module's forward and backward seconds
in forward order (median over the repeats), the whole iteration's forward+backward and update
seconds, and their sum check; plus the device, the model's parameter bytes and activation
bytes, the compute slowdown measured while communication-like work ran beside it
(``interference``), the spread of iteration times (``jitter_cv``) and the CPU cost per byte of a
raw loopback TCP stream (``tcp_beta``, for reference: collectives cost what the device preset's
executor-level ``tcp_beta`` says, which includes the executor's copies and Gloo).
:func:`load_profile` checks the schema and every field and raises ``ValueError`` naming the file
and the problem.

:meth:`MeasuredProfile.compute_for` maps the leaf modules onto the simulator's layers (the
modules that own parameters): a module without parameters (ReLU, pooling) is charged to the
closest parameter-owning module before it in forward order (its backward then runs just before
that module's, as in autograd), and the time the hooks did not see (the loss, autograd's own
work) is spread over the layers in proportion to their time, so that per-layer times add up to
the measured iteration.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scaledl.sim.compute import MeasuredCompute
from scaledl.sim.profile import ModelProfile

__all__ = ["SCHEMA", "ModuleTimes", "MeasuredProfile", "load_profile", "save_profile"]

SCHEMA = "scaledl.simulate.profile/1"


@dataclass(frozen=True)
class ModuleTimes:
    """One leaf module's median seconds at every measured batch."""

    name: str
    kind: str
    parameter_bytes: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]


@dataclass(frozen=True)
class MeasuredProfile:
    """A model measured on one device (see the module docstring)."""

    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    device: dict[str, Any]
    batches: tuple[int, ...]
    modules: tuple[ModuleTimes, ...]
    forward_backward_s: tuple[float, ...]
    """Median whole forward + loss + backward per batch."""
    update_s: tuple[float, ...]
    """Median optimizer step per batch."""
    parameter_bytes: int
    activation_bytes: tuple[int, ...]
    """Bytes of every leaf module's output per batch (what backward keeps alive)."""
    repeats: int
    jitter_cv: float
    interference: float
    tcp_beta: float
    created: str = ""

    @property
    def hooked_s(self) -> tuple[float, ...]:
        """Per batch: the sum of the modules' forward and backward seconds."""
        return tuple(sum(m.forward_s[k] + m.backward_s[k] for m in self.modules)
                     for k in range(len(self.batches)))

    @property
    def coverage(self) -> tuple[float, ...]:
        """Per batch: hooked seconds over the whole forward+backward (1 = every second seen)."""
        return tuple(h / w if w > 0 else 0.0
                     for h, w in zip(self.hooked_s, self.forward_backward_s))

    @property
    def update_seconds(self) -> float:
        """The optimizer step (the median over batches: it does not depend on the batch)."""
        ordered = sorted(self.update_s)
        return ordered[len(ordered) // 2]

    def compute_for(self, profile: ModelProfile) -> MeasuredCompute:
        """Per-layer times on ``profile``'s layers (see the module docstring)."""
        index = {layer.name: i for i, layer in enumerate(profile.layers)}
        missing = [name for name in index if name not in {m.name for m in self.modules}]
        if missing:
            raise ValueError(f"the profile of {self.model} has no module {missing[0]!r}; "
                             "profile the same model (and input shape) again")
        k_count = len(self.batches)
        forward = [[0.0] * k_count for _ in profile.layers]
        backward = [[0.0] * k_count for _ in profile.layers]
        owner = 0
        for module in self.modules:
            owner = index.get(module.name, owner)
            for k in range(k_count):
                forward[owner][k] += module.forward_s[k]
                backward[owner][k] += module.backward_s[k]
        for k in range(k_count):  # spread what the hooks did not see
            seen = sum(f[k] + b[k] for f, b in zip(forward, backward))
            factor = self.forward_backward_s[k] / seen if seen > 0 else 1.0
            for f, b in zip(forward, backward):
                f[k] *= factor
                b[k] *= factor
        return MeasuredCompute(self.batches, tuple(tuple(f) for f in forward),
                               tuple(tuple(b) for b in backward))

    def to_json(self) -> str:
        """The file's text."""
        data = {"schema": SCHEMA, **asdict(self)}
        return json.dumps(data, indent=1) + "\n"


def save_profile(profile: MeasuredProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.to_json())


def _floats(value: Any, what: str, count: int) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != count:
        raise ValueError(f"{what} must be a list of {count} numbers")
    out = tuple(float(v) for v in value)
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise ValueError(f"{what} holds a negative or non-finite time")
    return out


def _parse(data: Any) -> MeasuredProfile:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"it is not a `scaledl simulate profile` file (schema {SCHEMA})")
    batches = tuple(int(b) for b in data["batches"])
    if not batches or list(batches) != sorted(set(batches)) or batches[0] < 1:
        raise ValueError(f"batches {list(batches)} must be increasing positive integers")
    count = len(batches)
    modules = tuple(
        ModuleTimes(str(m["name"]), str(m["kind"]), int(m["parameter_bytes"]),
                    _floats(m["forward_s"], f"module {m['name']!r} forward_s", count),
                    _floats(m["backward_s"], f"module {m['name']!r} backward_s", count))
        for m in data["modules"])
    if not modules:
        raise ValueError("it lists no modules")
    return MeasuredProfile(
        str(data["model"]), tuple(int(v) for v in data["input_shape"]), int(data["num_classes"]),
        dict(data["device"]), batches, modules,
        _floats(data["forward_backward_s"], "forward_backward_s", count),
        _floats(data["update_s"], "update_s", count), int(data["parameter_bytes"]),
        tuple(int(v) for v in data["activation_bytes"]), int(data["repeats"]),
        float(data["jitter_cv"]), float(data["interference"]), float(data["tcp_beta"]),
        str(data.get("created", "")))


def load_profile(path: Path) -> MeasuredProfile:
    """Read and check a profile file; ``ValueError`` naming the file and what is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read profile {path}: {error.strerror or error}; write one "
                         "with `scaledl simulate profile`") from None
    try:
        profile = _parse(json.loads(text))
    except (ValueError, TypeError, KeyError) as error:
        what = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ValueError(f"profile {path} is malformed: {what}; write it again with "
                         "`scaledl simulate profile`") from None
    for name, value in (("jitter_cv", profile.jitter_cv), ("interference", profile.interference),
                        ("tcp_beta", profile.tcp_beta)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"profile {path} is malformed: {name} {value} must be >= 0")
    return profile
