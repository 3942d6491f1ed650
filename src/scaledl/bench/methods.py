"""The training-method comparison behind ``scaledl bench algorithms``: which methods, how each
one is run, and what is read back from its run directory.

Every method trains the same model on the same data set with the same budget (epochs, batch per
worker, learning rate, seed, evaluation interval) on ``workers`` training ranks; the
parameter-server methods get one dedicated server rank more (``--servers 1``), so 4 workers
means 5 processes for them.  What differs is the method itself:

* momentum: 0 for every method except the two "M" methods (Async MSGD, Async MEASGD), which use
  ``momentum`` (0.9 by default), as in You, Buluç, Demmel (SC17): SGD and EASGD follow their
  Eq. 1-2, MSGD and MEASGD Eq. 3-6;
* the elastic moving rate ``alpha = 0.9 / workers`` (Zhang et al.'s ``beta = p alpha = 0.9``)
  and ``tau = 1`` (an exchange every step, as in You et al.'s methods) for the EASGD family;
* ``tau = 4`` for local SGD (with ``tau = 1`` it would be synchronous SGD again).
Each strategy declares its own row (``Strategy.comparison``: label, momentum, tau, counterpart,
position), so a strategy added to the catalogue with a row is compared too.  What is read back
from each run is defined in :mod:`scaledl.bench.methods_result`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from scaledl.strategies.catalogue import strategies, strategy_class
from scaledl.strategies.comparison import MethodRow

__all__ = [
    "Method", "METHODS", "BenchSpec", "select_methods", "available_methods", "ranks",
    "train_command", "train_overrides", "default_target", "resolve_dataset", "check_model",
]

DEFAULT_MOMENTUM = 0.9


@dataclass(frozen=True)
class Method:
    """One training method: a strategy and the row it declares for the comparison (the options
    that make it the paper's method: :class:`~scaledl.strategies.comparison.MethodRow`)."""

    name: str
    """Method name (the strategy name, as ``scaledl train --strategy`` takes it)."""
    row: MethodRow
    """The strategy's own declaration: label, momentum, tau, counterpart, position."""

    @property
    def label(self) -> str:
        """Name in tables and plots."""
        return self.row.label

    @property
    def momentum(self) -> bool:
        """Whether the method uses the bench's momentum."""
        return self.row.momentum

    @property
    def tau(self) -> int | None:
        """Local steps between exchanges, or ``None``."""
        return self.row.tau

    @property
    def counterpart(self) -> str | None:
        """The SGD method this EASGD variant is compared with."""
        return self.row.counterpart

    def to_dict(self) -> dict[str, object]:
        """The method's definition for the results file."""
        return {"name": self.name, "label": self.label, "momentum": self.momentum,
                "tau": self.tau, "counterpart": self.counterpart, "elastic": self.elastic}

    @property
    def needs_server(self) -> bool:
        """Whether a parameter server serves it (it then gets one dedicated server rank)."""
        return strategy_class(self.name).server

    @property
    def elastic(self) -> bool:
        """Whether it takes the elastic moving rate ``alpha``."""
        return strategy_class(self.name).elastic


class _Methods(Mapping[str, Method]):
    """The methods of the comparison by name, in table order, read from the strategy catalogue
    at each use (the rows the strategies declare, sorted by ``row``)."""

    def _rows(self) -> dict[str, Method]:
        rows = []
        for name, cls in strategies().items():
            row = vars(cls).get("comparison")  # declared by the class itself, not inherited
            if row is not None:
                rows.append((row.row, Method(name, row)))
        return {method.name: method for _, method in sorted(rows, key=lambda r: r[0])}

    def __getitem__(self, name: str) -> Method:
        return self._rows()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows())

    def __len__(self) -> int:
        return len(self._rows())


METHODS: Mapping[str, Method] = _Methods()
"""Every method of the comparison, in table order."""


@dataclass(frozen=True)
class BenchSpec:
    """The budget every method gets (identical for all of them)."""

    workers: int = 4
    epochs: int = 3
    dataset: str = "digits"
    model: str = "mlp"
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = DEFAULT_MOMENTUM
    seed: int = 0
    eval_every: int = 50
    target: float = 0.9
    timeout_s: float = 600.0
    data_dir: str | None = None
    """Where the data set's files are (``scaledl train --data-dir``); None: its default."""

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(f"--workers {self.workers} must be at least 2 (the methods "
                             "differ only in how workers combine their work)")
        if not 0 < self.target <= 1:
            raise ValueError(f"--target {self.target} must be a test accuracy in (0, 1], "
                             "e.g. 0.85")
        checks = ((self.epochs, "--epochs"), (self.batch_size, "--batch-size"),
                  (self.eval_every, "--eval-every"))
        for value, flag in checks:
            if value < 1:
                raise ValueError(f"{flag} {value} must be at least 1")
        if not self.lr > 0:
            raise ValueError(f"--lr {self.lr} must be positive, e.g. 0.05")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"--momentum {self.momentum} must be in [0, 1), e.g. 0.9")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout {self.timeout_s} must be positive (seconds per run)")

    def alpha(self) -> float:
        """The elastic moving rate of the EASGD family: ``0.9 / workers``."""
        return 0.9 / self.workers


def default_target(dataset: str) -> float:
    """The default target accuracy: 0.85 on Fashion-MNIST, 0.9 on digits, 0.8 otherwise."""
    return {"fashion-mnist": 0.85, "digits": 0.9}.get(dataset, 0.8)


def available_methods() -> list[str]:
    """Methods whose strategy this build registers (the strategy catalogue)."""
    return [name for name in METHODS if name in strategies()]


def select_methods(text: str | None, available: list[str]) -> list[Method]:
    """The methods of a comma list (``None``: every available one), in table order."""
    if text is None:
        return [METHODS[name] for name in METHODS if name in available]
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--methods {text!r} names no method; give a comma list such as "
                         "sync-easgd,async-sgd")
    for name in names:
        if name not in METHODS:
            raise ValueError(f"unknown method {name!r} in --methods; choose from: "
                             f"{', '.join(METHODS)}")
        if name not in available:
            raise ValueError(f"method {name!r} is not implemented in this build; choose from: "
                             f"{', '.join(available)}")
    return [METHODS[name] for name in METHODS if name in names]


def ranks(method: Method, spec: BenchSpec) -> int:
    """Processes of a method's run: the workers, plus one server rank where it needs one."""
    return spec.workers + (1 if method.needs_server else 0)


def train_command(method: Method, spec: BenchSpec, out: Path) -> list[str]:
    """``scaledl train`` arguments (after ``scaledl``) of one method's run into ``out``."""
    args = [
        "train", "--strategy", method.name, "--workers", str(ranks(method, spec)),
        "--dataset", spec.dataset, "--model", spec.model, "--epochs", str(spec.epochs),
        "--batch-size", str(spec.batch_size), "--lr", repr(spec.lr),
        "--momentum", repr(spec.momentum if method.momentum else 0.0),
        "--seed", str(spec.seed), "--eval-every", str(spec.eval_every),
        "--out", str(out), "--no-progress", "--no-plots",  # the bench draws its own
    ]
    if spec.data_dir is not None:
        args += ["--data-dir", spec.data_dir]
    if method.needs_server:
        args += ["--servers", "1"]
    if method.tau is not None:
        args += ["--tau", str(method.tau)]
    if method.elastic:
        args += ["--alpha", repr(spec.alpha())]
    for option, value in method.row.options:
        args += ["--" + option.replace("_", "-"), value]
    return args


def train_overrides(method: Method, spec: BenchSpec, out: Path) -> dict[str, object]:
    """The config values of one method's run into ``out``, as :func:`train_command`'s flags give
    them to ``scaledl train`` (typed as its parser types them), for
    :func:`scaledl.train.config.build_config` in a process that runs the training itself (the
    bench's pool of ranks: :mod:`scaledl.bench.methods_pool`)."""
    from scaledl.strategies.catalogue import option_fields

    values: dict[str, object] = {
        "strategy": method.name, "workers": ranks(method, spec), "dataset": spec.dataset,
        "model": spec.model, "epochs": spec.epochs, "batch_size": spec.batch_size,
        "lr": spec.lr, "momentum": spec.momentum if method.momentum else 0.0,
        "seed": spec.seed, "eval_every": spec.eval_every, "out": str(out),
        "progress": False, "plots": False,
    }
    if spec.data_dir is not None:
        values["data_dir"] = spec.data_dir
    if method.needs_server:
        values["servers"] = 1
    if method.tau is not None:
        values["tau"] = method.tau
    if method.elastic:
        values["alpha"] = spec.alpha()
    fields = option_fields()
    for option, value in method.row.options:
        values[option] = fields[option].metadata["type"](value)
    return values


def resolve_dataset(name: str, data_dir: str | None = None) -> str:
    """``auto``: Fashion-MNIST when its files load (from ``data_dir`` if given), else digits;
    other names are checked (:func:`check_loads` reads them)."""
    from scaledl.data import available_datasets, load_dataset

    if name == "auto":
        try:
            load_dataset("fashion-mnist", data_dir, "test", 0)
        except ValueError:
            if data_dir is not None:
                raise ValueError(f"--dataset auto with --data-dir {data_dir}: no Fashion-MNIST "
                                 "files there; name the data set of those files with "
                                 "--dataset") from None
            return "digits"
        return "fashion-mnist"
    if name.split(":")[0] not in available_datasets():
        raise ValueError(f"unknown dataset {name!r} for --dataset; use auto or one of: "
                         f"{', '.join(available_datasets())}")
    return name


def check_loads(spec: BenchSpec) -> None:
    """Both splits of the spec's data set load, before any run starts: otherwise every run
    would fail alike (its own one-line error, e.g. MNIST's files missing: ``--data-dir``)."""
    from scaledl.data import load_dataset

    for split in ("train", "test"):
        load_dataset(spec.dataset, spec.data_dir, split, spec.seed)


def check_model(name: str) -> str:
    """``name`` if it is a known model, else the one-line error."""
    from scaledl.models import available_models

    if name not in available_models():
        raise ValueError(f"unknown model {name!r} for --model; use one of: "
                         f"{', '.join(available_models())}")
    return name
