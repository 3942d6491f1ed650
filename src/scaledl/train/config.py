"""Training configuration: what one ``scaledl train`` run does, as frozen dataclasses.

A run is described by five sections (:class:`DataConfig`, :class:`ModelConfig`,
:class:`OptimConfig`, :class:`ParallelConfig`, :class:`RunConfig`) grouped in a
:class:`TrainConfig`.  Values come from three places, later ones winning: the defaults below, an
optional TOML file with one table per section (``[data]``, ``[model]``, ``[optim]``,
``[parallel]``, ``[run]``), and command-line flags.  Flags are flat (``--lr``, ``--workers``);
:data:`FIELD_SECTION` says which section and field each flat key sets.  Every section validates
itself on construction, so a :class:`TrainConfig` that exists is a valid one.

Example TOML::

    [optim]
    lr = 0.1
    epochs = 5

    [parallel]
    workers = 4
    strategy = "allreduce"
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaledl.train.parallel_config import ParallelConfig, check_types

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DataConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "RunConfig", "TrainConfig",
    "FIELD_SECTION", "SECTIONS", "load_toml", "build_config", "OPTIMIZERS", "LR_SCHEDULES",
    "LR_SCALINGS", "DEVICES", "PRECISIONS",
]

@dataclass(frozen=True)
class DataConfig:
    """Which data set to train on and how it is batched."""

    dataset: str = "digits"
    """Data set name, as known to :mod:`scaledl.data`."""
    data_dir: str | None = None
    """Where the data set lives or is downloaded to; ``None`` uses the data module's default."""
    batch_size: int = 32
    """Samples per step on each worker (the global batch is ``batch_size * world_size``)."""
    prefetch: int = 2
    """Batches prepared ahead of the training loop (0 disables prefetching)."""
    drop_last: bool = False
    """Drop each epoch's last, incomplete batch."""
    synthetic_size: int | None = None
    """Number of random samples to train on instead of a real data set (``None``: real data)."""
    image_size: int | None = None
    """``imagefolder`` only: resize every image to this many pixels square (``None``: the
    images must all have one size already)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.dataset:
            raise ValueError("dataset '' is empty; name a data set, e.g. dataset = 'digits'")
        if self.batch_size < 1:
            raise ValueError(f"batch_size {self.batch_size} must be at least 1")
        if self.prefetch < 0:
            raise ValueError(f"prefetch {self.prefetch} must be >= 0 (0 disables prefetching)")
        if self.synthetic_size is not None and self.synthetic_size < 1:
            raise ValueError(
                f"synthetic_size {self.synthetic_size} must be at least 1, or unset for real data"
            )
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size {self.image_size} must be at least 1 pixel, or unset "
                             "to keep the images' own size")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to train."""

    name: str = "mlp"
    """Model name, as known to :mod:`scaledl.models` (the small ``mlp`` suits ``digits``), or
    ``package.module:factory``, a callable returning an ``nn.Module``
    (:mod:`scaledl.train.user_model`)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.name:
            raise ValueError("model name '' is empty; name a model, e.g. name = 'mlp'")


OPTIMIZERS = ("sgd", "adamw")
"""``optimizer`` values: ``torch.optim.SGD`` (with ``momentum``) or ``torch.optim.AdamW``."""
LR_SCHEDULES = ("constant", "step", "cosine")
"""``lr_schedule`` values (:mod:`scaledl.train.optim`)."""
LR_SCALINGS = ("none", "linear")
"""``lr_scaling`` values: ``linear`` is Goyal et al.'s rule, ``lr * global batch /
lr_reference_batch``."""


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its learning rate over time, and how long to run it."""

    lr: float = 0.05
    """Learning rate (with ``lr_scaling = "linear"``: the rate for a global batch of
    ``lr_reference_batch`` samples)."""
    momentum: float = 0.9
    """SGD's momentum factor, in [0, 1)."""
    weight_decay: float = 0.0
    """L2 penalty added to the gradient (>= 0); AdamW's decoupled decay."""
    epochs: int = 10
    """Passes over the training set (>= 1)."""
    optimizer: str = "sgd"
    """``sgd`` (torch.optim.SGD with ``momentum``) or ``adamw`` (torch.optim.AdamW, its default
    betas)."""
    lr_schedule: str = "constant"
    """``constant``; ``step`` (times ``lr_decay`` every ``lr_decay_every`` epochs); ``cosine``
    (half a cosine from the rate towards 0, reached just after the last update); all after the
    warm-up."""
    warmup_epochs: float = 0.0
    """Epochs (a fraction is allowed) over which the rate rises linearly to its full value."""
    lr_scaling: str = "none"
    """``linear``: the rate is ``lr * global batch / lr_reference_batch`` (Goyal et al. 2017),
    where the global batch is ``batch_size * workers * grad_accum``; ``none``: ``lr`` as is."""
    lr_reference_batch: int = 256
    """The global batch ``lr`` is meant for under ``lr_scaling = "linear"`` (Goyal et al.'s
    256)."""
    lr_decay: float = 0.1
    """``step`` schedule: the factor applied at every decay."""
    lr_decay_every: int | None = None
    """``step`` schedule: epochs between decays; ``None``: a third of ``epochs`` (rounded up),
    so the rate is cut twice, as in the 30/60-of-90-epoch ResNet recipe."""
    clip_grad_norm: float | None = None
    """Clip the gradients' global L2 norm to this before each update (``None``: no clipping)."""
    grad_accum: int = 1
    """Micro-batches of ``batch_size`` whose gradients are summed (averaged) before each update;
    communication happens once per update."""
    max_steps: int | None = None
    """Stop after this many updates in all, even inside an epoch (``None``: ``epochs``)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.lr > 0:
            raise ValueError(f"lr {self.lr} must be positive, e.g. 0.05")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum {self.momentum} must be in [0, 1), e.g. 0.9")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay {self.weight_decay} must be >= 0")
        if self.epochs < 1:
            raise ValueError(f"epochs {self.epochs} must be at least 1")
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        if not self.warmup_epochs >= 0:
            raise ValueError(f"warmup_epochs {self.warmup_epochs} must be >= 0 (0: no warm-up)")
        if self.lr_reference_batch < 1:
            raise ValueError(f"lr_reference_batch {self.lr_reference_batch} must be at least 1, "
                             "e.g. 256")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay {self.lr_decay} must be in (0, 1], e.g. 0.1")
        if self.lr_decay_every is not None and self.lr_decay_every < 1:
            raise ValueError(f"lr_decay_every {self.lr_decay_every} must be at least 1 epoch, or "
                             "unset for a third of the epochs")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm {self.clip_grad_norm} must be positive, or unset "
                             "for no clipping")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum {self.grad_accum} must be at least 1 (1: no "
                             "accumulation)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps {self.max_steps} must be at least 1, or unset to run "
                             "every epoch")
        self._check_unread()

    def _check_unread(self) -> None:
        """A setting of a schedule or rule that is not chosen is refused, not ignored."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, needs, value in (("lr_decay", "lr_schedule = 'step'", "step"),
                                   ("lr_decay_every", "lr_schedule = 'step'", "step"),
                                   ("lr_reference_batch", "lr_scaling = 'linear'", "linear")):
            chosen = self.lr_schedule if needs.startswith("lr_schedule") else self.lr_scaling
            if getattr(self, name) != defaults[name] and chosen != value:
                raise ValueError(f"{name} {getattr(self, name)!r} is read only with {needs}; "
                                 f"drop it or set {needs.replace(' = ', ' ')}")


@dataclass(frozen=True)
class RunConfig:
    """Where a run writes, how it is seeded, resumed, checkpointed and reported."""

    out: str = "runs/latest"
    """Run directory: metrics, checkpoints, timeline and plots go here."""
    seed: int = 0
    """Seed for model initialisation, data order and every RNG."""
    resume: str | None = None
    """Checkpoint to resume from: a path, or ``"auto"`` for the latest one in ``out``."""
    checkpoint_every: int | None = None
    """Steps between checkpoints; ``None`` checkpoints at the end of every epoch."""
    checkpoint_seconds: float | None = 300.0
    """Seconds between checkpoints, besides the steps or epochs above (rank 0's clock, agreed
    at probe steps); 0 or ``None``: no time-based checkpoints."""
    max_restarts: int = 0
    """Times every worker is restarted from the newest good checkpoint after a worker dies,
    hangs past ``timeout_s`` or raises (torch's elastic agent's ``--max-restarts``)."""
    min_workers: int | None = None
    """Go on with fewer workers, down to this many, when one does not come back (elastic);
    ``None``: the job needs all its workers."""
    log_samples: bool = False
    """Write every step's sample indices to ``samples/rank-NNNNN.jsonl`` (data coverage audit)."""
    eval_every: int | None = None
    """Steps between evaluations of the test accuracy; ``None`` evaluates once per epoch."""
    log_every: int = 10
    """Steps between metric log lines on the console (every step still goes to the JSONL)."""
    progress: bool = True
    """Show a progress bar on rank 0."""
    plots: bool = True
    """Write ``loss.png`` and ``accuracy.png`` at the end (``scaledl bench algorithms`` reads
    the metrics and skips them: matplotlib is a tenth of a short run)."""
    device: str = "cpu"
    """``cpu`` (Gloo) or ``cuda`` (NCCL, GPU ``LOCAL_RANK`` of each host for each rank)."""
    precision: str = "fp32"
    """``fp32``, or ``bf16`` / ``fp16`` autocast of forward and loss (``fp16`` with a gradient
    scaler, CUDA only); parameters, gradients and optimizer state stay float32."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.out:
            raise ValueError("out '' is empty; give a run directory, e.g. out = 'runs/latest'")
        if self.seed < 0:
            raise ValueError(f"seed {self.seed} must be >= 0")
        if self.resume is not None and not self.resume:
            raise ValueError("resume '' is empty; give a checkpoint path or 'auto'")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(
                f"checkpoint_every {self.checkpoint_every} must be at least 1 step, "
                "or unset for once per epoch"
            )
        if self.checkpoint_seconds is not None and not self.checkpoint_seconds >= 0:
            raise ValueError(f"checkpoint_seconds {self.checkpoint_seconds} must be >= 0 "
                             "(0: no time-based checkpoints)")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts {self.max_restarts} must be >= 0")
        if self.min_workers is not None and self.min_workers < 1:
            raise ValueError(f"min_workers {self.min_workers} must be at least 1, or unset for "
                             "a job that needs all its workers")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"eval_every {self.eval_every} must be at least 1 step, or unset "
                             "for once per epoch")
        if self.log_every < 1:
            raise ValueError(f"log_every {self.log_every} must be at least 1 step")
        _check_choice("device", self.device, DEVICES)
        _check_choice("precision", self.precision, PRECISIONS)


DEVICES = ("cpu", "cuda")
"""``device`` values."""
PRECISIONS = ("fp32", "bf16", "fp16")
"""``precision`` values (:mod:`scaledl.train.precision`)."""


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """A one-line error naming ``value`` and the allowed ones."""
    if value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}; use one of them")


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "parallel": ParallelConfig,
    "run": RunConfig,
}
"""TOML table name -> the dataclass it fills (also the :class:`TrainConfig` attribute name)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs."""

    data: DataConfig = field(default_factory=DataConfig)
    """Data set and batching."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model to train."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and schedule."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Workers, strategy and communication."""
    run: RunConfig = field(default_factory=RunConfig)
    """Output, seeding, checkpoints and reporting."""

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"TrainConfig.{name} must be a {cls.__name__}")

    def with_workers(self, workers: int) -> TrainConfig:
        """This config with ``parallel.workers`` set to ``workers`` where it was left to the
        launch (one per core, or the launcher's ranks), so what is recorded is what ran."""
        if self.parallel.workers is not None:
            return self
        return dataclasses.replace(
            self, parallel=dataclasses.replace(self.parallel, workers=workers))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dict, one entry per section (JSON-, TOML- and checkpoint-safe)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from a nested dict such as :meth:`to_dict` or a TOML file gives; missing
        sections and fields take their defaults, unknown ones raise ``ValueError``."""
        unknown = sorted(set(values) - set(SECTIONS))
        if unknown:
            raise ValueError(
                f"unknown config section {unknown[0]!r}; allowed sections: {', '.join(SECTIONS)}"
            )
        sections = {}
        for name, section_cls in SECTIONS.items():
            section = values.get(name, {})
            if not isinstance(section, Mapping):
                raise ValueError(f"config section {name!r} must be a table, got {section!r}")
            sections[name] = section_cls(**_known_fields(name, section_cls, section))
        return cls(**sections)


def _section_fields() -> dict[str, tuple[str, str]]:
    table = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            table[f.name] = (section, f.name)
    table["model"] = ("model", "name")
    del table["name"]
    return table


FIELD_SECTION: dict[str, tuple[str, str]] = _section_fields()
"""Flat CLI key -> (section, field): ``"lr" -> ("optim", "lr")``, ``"model" -> ("model",
"name")``.  Every other key is its field's name."""


def _known_fields(section: str, cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in allowed:
            raise ValueError(
                f"unknown key {key!r} in [{section}]; allowed keys: {', '.join(allowed)}"
            )
    return dict(values)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a nested dict; ``ValueError`` naming the path when it is
    missing or malformed."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist; check the --config path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"config file {path} cannot be read: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"config file {path} is not valid TOML: {error}") from None


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> TrainConfig:
    """Merge a TOML file's sections with flat CLI overrides (``None`` = flag not given) into a
    validated :class:`TrainConfig`; overrides win."""
    merged: dict[str, dict[str, Any]] = {}
    for key, value in file_values.items():
        if key in SECTIONS and isinstance(value, Mapping):
            merged[key] = dict(value)
        elif key in FIELD_SECTION:
            section, _ = FIELD_SECTION[key]
            raise ValueError(f"config key {key!r} must be inside the [{section}] table")
        else:
            raise ValueError(
                f"unknown config section {key!r}; allowed sections: {', '.join(SECTIONS)}"
            )
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in FIELD_SECTION:
            raise ValueError(
                f"unknown option {key!r}; allowed options: {', '.join(sorted(FIELD_SECTION))}"
            )
        section, name = FIELD_SECTION[key]
        merged.setdefault(section, {})[name] = value
    return TrainConfig.from_dict(merged)
