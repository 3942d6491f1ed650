"""The measured profile file of ``scaledl simulate profile`` (JSON, schema
``scaledl.simulate.profile/1``).

The file holds, for each batch size measured: every leaf module's forward and backward seconds
in forward order (median over the repeats), the whole iteration's forward+backward and update
seconds, and their sum check; plus the device, the model's parameter bytes and activation
bytes, the compute slowdown measured while communication-like work ran beside it
(``interference``), the spread of iteration times (``jitter_cv``) and the CPU cost per byte of a
raw loopback TCP stream (``tcp_beta``; 0 on CUDA, where none is measured), which prices a CPU
host's sockets in place of the cpu preset's (:func:`scaledl.sim.scenario.job_network`).
:func:`load_profile` checks the schema, every field and that the model builds for the input shape
with times for each of its layers (the modules that own parameters), and raises ``ValueError``
naming the file and the problem; :func:`save_profile` writes the whole file or nothing.  A
profile whose own numbers show a busy machine is still used, after a warning
(:mod:`scaledl.profiling.profile_trust`).

How the simulator turns the modules' times into per-layer times is
:func:`scaledl.sim.compute.measured_compute`'s, and which device presets the measured device is
:func:`scaledl.sim.presets.measured_presets`'s: this file knows the measurement, not the model
that prices it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from scaledl.files import write_files
from scaledl.json_fields import (
    integer, is_whole, json_list, json_object, number, shown, string)
from scaledl.models.profile import layer_profile
from scaledl.models.registry import MODELS, build_model

__all__ = ["SCHEMA", "ModuleTimes", "MeasuredProfile", "LayerNames", "layer_names", "load_profile",
           "save_profile"]

SCHEMA = "scaledl.simulate.profile/1"

MAX_BYTES = 64 << 20
"""Larger files are not profiles (a ResNet-50 profile is about 40 KB)."""


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

    @property
    def on_cpu(self) -> bool:
        """Measured on a CPU (else on CUDA)."""
        return self.device.get("type") == "cpu"

    @property
    def mixed_precision(self) -> bool:
        """Measured under autocast (``simulate profile --mixed-precision``)."""
        return self.device.get("precision", "float32") in ("float16", "bfloat16")

    @property
    def channels_last(self) -> bool:
        """Measured on NHWC tensors (``simulate profile --channels-last``)."""
        return self.device.get("memory_format") == "channels_last"

    def untimed(self, layers: Iterable[str]) -> str | None:
        """The first of the layer names ``layers`` (in order) that no module's times are for;
        None when every layer has times."""
        timed = {m.name for m in self.modules}
        return next((layer for layer in layers if layer not in timed), None)

    def to_json(self) -> str:
        """The file's text."""
        data = {"schema": SCHEMA, **asdict(self)}
        return json.dumps(data, indent=1) + "\n"


def save_profile(profile: MeasuredProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` (parents created) whole or not at all
    (:func:`scaledl.files.write_files`: an older file there survives a failure, and nothing
    partial is left); ``ValueError`` naming the path when it cannot be written."""
    text = profile.to_json()
    write_files([(Path(path), lambda target: target.write_text(text))])


def _floats(value: Any, what: str, count: int) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != count:
        raise ValueError(f"{what} must be a list of {count} numbers")
    try:
        return tuple(number(v, what) for v in value)
    except ValueError:
        raise ValueError(f"{what} holds a negative or non-finite time, or not a number") \
            from None


def _module(data: Any, count: int) -> ModuleTimes:
    if not isinstance(data, dict):
        raise ValueError(f"a module is a JSON {type(data).__name__}, not an object")
    name = string(data["name"], "a module's name")
    return ModuleTimes(name, string(data["kind"], f"module {name!r} kind"),
                       integer(data["parameter_bytes"], f"module {name!r} parameter_bytes"),
                       _floats(data["forward_s"], f"module {name!r} forward_s", count),
                       _floats(data["backward_s"], f"module {name!r} backward_s", count))


def _batches(value: Any) -> tuple[int, ...]:
    batches = tuple(integer(b, "batch", 1) for b in json_list(value, "batches"))
    if not batches or list(batches) != sorted(set(batches)):
        raise ValueError(f"batches {list(batches)} must be increasing positive integers")
    return batches


def _shape(value: Any) -> tuple[int, ...]:
    shape = json_list(value, "input_shape")
    if not shape or any(not is_whole(v) or v < 1 for v in shape):
        raise ValueError(f"input_shape {shown(shape)} must be a non-empty list of sizes >= 1")
    return tuple(shape)


def _parse(data: Any) -> MeasuredProfile:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"it is not a `scaledl simulate profile` file (schema {SCHEMA})")
    batches = _batches(data["batches"])
    count = len(batches)
    modules = tuple(_module(m, count) for m in json_list(data["modules"], "modules"))
    if not modules:
        raise ValueError("it lists no modules")
    return MeasuredProfile(
        string(data["model"], "model"), _shape(data["input_shape"]),
        integer(data["num_classes"], "num_classes", 1), json_object(data["device"], "device"),
        batches, modules, _floats(data["forward_backward_s"], "forward_backward_s", count),
        _floats(data["update_s"], "update_s", count),
        integer(data["parameter_bytes"], "parameter_bytes"),
        tuple(integer(v, "activation_bytes", 0)
              for v in json_list(data["activation_bytes"], "activation_bytes", count)),
        integer(data["repeats"], "repeats", 1), number(data["jitter_cv"], "jitter_cv"),
        number(data["interference"], "interference"), number(data["tcp_beta"], "tcp_beta"),
        string(data.get("created", ""), "created"))


LayerNames = Callable[[str, tuple[int, ...], int], Sequence[str]]
"""``(model, input shape, classes)`` to the names of the model's parameter-owning modules in
forward order; ``ValueError`` (or what torch raises) when it does not build or run."""


def layer_names(model: str, input_shape: tuple[int, ...], num_classes: int) -> list[str]:
    """The modules of registry model ``model`` that own parameters, in forward order (the
    layers a profile must time), the model built on ``meta`` and run once on a sample of
    ``input_shape`` (no memory, no arithmetic); ``ValueError`` for an unknown model or a shape
    it cannot take."""
    if model.lower() not in MODELS:
        raise ValueError(f"unknown model {model!r}; available: {', '.join(MODELS)}")
    with torch.device("meta"):
        net = build_model(model, input_shape, num_classes)
    return [layer.name for layer in layer_profile(net, input_shape)]


def _check_model(profile: MeasuredProfile, layers_of: LayerNames) -> None:
    """The model builds for the profile's input and every layer it owns has times."""
    try:
        layers = layers_of(profile.model, profile.input_shape, profile.num_classes)
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"model {profile.model!r} at input_shape "
                         f"{'x'.join(map(str, profile.input_shape))}: {error}") from None
    missing = profile.untimed(layers)
    if missing is not None:
        raise ValueError(f"it has no module {missing!r}, which {profile.model} has (its "
                         "times are of another model or input shape)")


def _read(path: Path) -> str:
    """The file's text; ``ValueError`` naming the file when it cannot be read or is not
    text."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except OSError as error:
        raise ValueError(f"cannot read profile {path}: {error.strerror or error}; write one "
                         "with `scaledl simulate profile`") from None
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError(f"it is larger than {MAX_BYTES >> 20} MiB")
        return raw.decode("utf-8")
    except ValueError as error:
        why = (f"byte {raw[error.start]:#04x} at offset {error.start} is not text"
               if isinstance(error, UnicodeDecodeError) else str(error))
        raise ValueError(f"{path} is not a `scaledl simulate profile` JSON file ({why}); give "
                         "the file `scaledl simulate profile` wrote") from None


def load_profile(path: Path, layers_of: LayerNames = layer_names) -> MeasuredProfile:
    """Read and check a profile file; ``ValueError`` naming the file and what is wrong (a
    profile from a busy machine is returned: :mod:`scaledl.profiling.profile_trust` says so).
    ``layers_of`` lists the model's layers for the check (the simulator passes its own cached
    model profile's, :func:`scaledl.sim.profile.layer_names`, which it prices next: one trace
    of the model instead of two)."""
    text = _read(Path(path))
    try:
        profile = _parse(json.loads(text))
        _check_model(profile, layers_of)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as error:
        what = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ValueError(f"profile {path} is malformed: {what}; write it again with "
                         "`scaledl simulate profile`") from None
    return profile
