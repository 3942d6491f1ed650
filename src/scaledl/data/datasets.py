"""Datasets: in-memory tensors for data-parallel training, loaded by name.

An :class:`ArrayDataset` holds every sample of one split as two tensors (float32 features, int64
labels), so a loader gathers a batch with one ``index_select`` instead of per-sample Python.
:func:`load_dataset` builds one from a registry of names:

=================  ==============================================================================
``digits``         scikit-learn's 8x8 digits (1797 images, 10 classes), shipped with the package:
                   the default, always offline.  Fixed 80/20 split (360 test images).
``mnist``          MNIST IDX files (raw or ``.gz``) from ``data_dir``.
``fashion-mnist``  Fashion-MNIST IDX files from ``data_dir``, by default Debian's
                   ``/usr/share/datasets/fashion-mnist`` (package ``dataset-fashion-mnist``).
``cifar10``        CIFAR-10 binary batches from ``data_dir`` or its ``cifar-10-batches-bin``.
``npz``            a user ``.npz`` (``data_dir`` is the file, or a directory of
                   ``train.npz``/``test.npz``) with arrays ``x``/``y`` or ``features``/``labels``.
``synthetic``      class-dependent means plus Gaussian noise, for throughput runs; the name may
                   carry a shape and class count: ``synthetic:1x28x28:10``, ``synthetic:64:5``.
``imagefolder``    a directory of images, ``train/CLASS/*`` and ``test/CLASS/*`` (or ``val/``),
                   read with Pillow (:mod:`scaledl.data.imagefolder`); ``image_size`` resizes.
``module:factory`` a user's ``package.module:factory`` returning a torch ``Dataset`` or a
                   ``(train, test)`` pair of them (:func:`load_factory_dataset`).
=================  ==============================================================================

Images are scaled to [0, 1] and standardized per channel: with the usual published train-split
constants for MNIST, Fashion-MNIST and CIFAR-10, and with statistics of the train split for digits
and npz.  ``seed`` only affects ``synthetic``; the real datasets' splits never depend on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scaledl.data.factory import call_factory, first_line, is_factory_spec, load_factory
from scaledl.data.formats import (
    IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, find_file, read_cifar10_batches, read_digits, read_idx,
    read_npz,
)
from scaledl.data.imagefolder import read_imagefolder
from scaledl.data.synthetic import make_synthetic, parse_synthetic

__all__ = [
    "ArrayDataset", "DatasetRequest", "SPLITS", "FASHION_MNIST_DIR", "available_datasets",
    "declared_shape", "load_dataset", "load_factory_dataset", "is_dataset_name",
]

logger = logging.getLogger(__name__)

SPLITS = ("train", "test")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
"""Where Debian's ``dataset-fashion-mnist`` package installs the four ``.gz`` IDX files."""
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 1797
"""Seeds the fixed digits permutation; independent of the user's seed so the test set is stable."""
SYNTHETIC_DEFAULT_SIZE = {"train": 4096, "test": 1024}
# Per-channel mean and std of the train split in [0, 1] units (the usual published constants).
MNIST_STATS = ((0.1307,), (0.3081,))
FASHION_MNIST_STATS = ((0.2860,), (0.3530,))
CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """One split of a dataset held as tensors; ``dataset[i]`` is ``(features[i], labels[i])``."""

    features: torch.Tensor
    """float32 ``(N, C, H, W)`` images or ``(N, D)`` vectors, standardized."""
    labels: torch.Tensor
    """int64 ``(N,)`` class indices in ``0..num_classes-1``."""
    num_classes: int
    """Number of classes the labels range over."""
    name: str
    """Registry name the dataset was loaded under, for logs and results."""

    def __post_init__(self) -> None:
        features, labels = self.features, self.labels
        if features.dtype != torch.float32 or features.dim() < 2:
            raise ValueError(
                f"dataset {self.name}: features must be float32 (N, ...) with N samples, got "
                f"{features.dtype} {tuple(features.shape)}; convert with .float()"
            )
        if labels.dtype != torch.int64 or labels.shape != (features.shape[0],):
            raise ValueError(
                f"dataset {self.name}: labels must be int64 ({features.shape[0]},), got "
                f"{labels.dtype} {tuple(labels.shape)}; one label per sample, as .long()"
            )
        if len(labels) < 1 or int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
            raise ValueError(
                f"dataset {self.name}: labels must lie in 0..{self.num_classes - 1} and N >= 1; "
                f"got {len(labels)} labels; pass the right num_classes"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features, e.g. ``(1, 28, 28)``."""
        return tuple(self.features.shape[1:])

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[index], self.labels[index]

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch ``(features, labels)`` at ``indices`` (int64), with one copy per tensor."""
        return self.features.index_select(0, indices), self.labels.index_select(0, indices)


@dataclass(frozen=True)
class DatasetRequest:
    """What :func:`load_dataset` was asked for, as passed to a registered loader."""

    name: str
    """The full name, e.g. ``"synthetic:1x28x28:10"``."""
    data_dir: Path | None
    """Directory (or file, for npz) holding the data; None for the loader's default."""
    split: str
    """``"train"`` or ``"test"``."""
    seed: int
    """Seed for generated data (synthetic only)."""
    synthetic_size: int | None
    """Samples in a synthetic split; None for the default."""
    image_size: int | None = None
    """imagefolder: the side every image is resized to; None keeps their size."""


def _standardize(
    images: np.ndarray, mean: np.ndarray, std: np.ndarray, scale: float = 1.0
) -> torch.Tensor:
    """``(images * scale - mean) / std`` per channel (dim 1), as a new float32 tensor."""
    view = (1, -1) + (1,) * (images.ndim - 2)
    scaled = np.array(images, dtype=np.float32, order="C")
    scaled *= np.float32(scale)
    scaled -= mean.astype(np.float32).reshape(view)
    scaled /= std.astype(np.float32).reshape(view)
    return torch.from_numpy(scaled)


def _channel_stats(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    axes = (0,) + tuple(range(2, features.ndim))
    mean = features.mean(axis=axes, dtype=np.float64)
    std = features.std(axis=axes, dtype=np.float64)
    return mean.astype(np.float32), np.where(std > 1e-8, std, 1.0).astype(np.float32)


def _load_digits(request: DatasetRequest) -> ArrayDataset:
    table = read_digits()
    images = (table[:, :-1] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(images))
    test_count = int(np.ceil(len(images) * DIGITS_TEST_FRACTION))
    train, test = order[test_count:], order[:test_count]
    chosen = train if request.split == "train" else test
    mean, std = _channel_stats(images[train])
    labels = torch.from_numpy(table[chosen, -1].astype(np.int64))
    return ArrayDataset(_standardize(images[chosen], mean, std), labels, 10, request.name)


def _load_idx_family(
    request: DatasetRequest, folder: str, stats: tuple[tuple[float, ...], ...], fix: str
) -> ArrayDataset:
    if request.data_dir is None:
        raise ValueError(f"dataset {request.name} needs its IDX files; {fix}")
    root = request.data_dir
    directories = [root, root / "raw", root / folder / "raw"]
    prefix = "train" if request.split == "train" else "t10k"
    images_path = find_file(
        directories, [f"{prefix}-images-idx3-ubyte", f"{prefix}-images.idx3-ubyte"], "IDX", fix
    )
    labels_path = find_file(
        directories, [f"{prefix}-labels-idx1-ubyte", f"{prefix}-labels.idx1-ubyte"], "IDX", fix
    )
    images = read_idx(images_path, IDX_IMAGES_MAGIC, fix)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC, fix)
    if len(images) != len(labels) or int(labels.max(initial=0)) > 9:
        raise ValueError(
            f"{labels_path} holds {len(labels)} labels (max {labels.max(initial=0)}) for "
            f"{len(images)} images in {images_path}; expected one label 0..9 per image; {fix}"
        )
    mean, std = (np.asarray(s, dtype=np.float32) for s in stats)
    features = _standardize(images[:, None], mean, std, 1.0 / 255.0)
    return ArrayDataset(features, torch.from_numpy(labels.astype(np.int64)), 10, request.name)


def _load_mnist(request: DatasetRequest) -> ArrayDataset:
    fix = (
        "download the four IDX files from http://yann.lecun.com/exdb/mnist/ (or a mirror) "
        "into one directory and pass it as --data-dir"
    )
    return _load_idx_family(request, "MNIST", MNIST_STATS, fix)


def _load_fashion_mnist(request: DatasetRequest) -> ArrayDataset:
    fix = (
        "apt-get install dataset-fashion-mnist, or download the IDX files from "
        "https://github.com/zalandoresearch/fashion-mnist and pass their directory as --data-dir"
    )
    data_dir = request.data_dir or FASHION_MNIST_DIR
    request = DatasetRequest(request.name, data_dir, request.split, request.seed, None)
    return _load_idx_family(request, "FashionMNIST", FASHION_MNIST_STATS, fix)


def _load_cifar10(request: DatasetRequest) -> ArrayDataset:
    fix = (
        "download cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, "
        "extract it and pass the directory as --data-dir"
    )
    if request.data_dir is None:
        raise ValueError(f"dataset cifar10 needs its binary batches; {fix}")
    directories = [request.data_dir / "cifar-10-batches-bin", request.data_dir]
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if request.split == "train" else [
        "test_batch.bin"
    ]
    base = next((d for d in directories if (d / names[0]).is_file()), request.data_dir)
    paths = [find_file([base], [name], "CIFAR-10", fix) for name in names]
    images, labels = read_cifar10_batches(paths, fix)
    mean, std = (np.asarray(s, dtype=np.float32) for s in CIFAR10_STATS)
    features = _standardize(images, mean, std, 1.0 / 255.0)
    return ArrayDataset(features, torch.from_numpy(labels.astype(np.int64)), 10, request.name)


def _npz_paths(request: DatasetRequest) -> tuple[Path, Path]:
    """The ``.npz`` of the requested split and the one of the train split (may be the same)."""
    source = request.data_dir
    if source is None:
        raise ValueError(
            "dataset npz needs a path; pass --data-dir FILE.npz or a directory holding "
            "train.npz and test.npz"
        )
    if not source.is_dir():
        if request.split == "test":
            logger.warning("npz %s is one file, so it is also the test split: the test accuracy "
                           "is measured on the training samples (give a directory with "
                           "train.npz and test.npz for a held-out one)", source)
        return source, source
    path = source / f"{request.split}.npz"
    if not path.is_file():
        raise ValueError(
            f"{path} not found; put {request.split}.npz in {source} or pass the .npz file "
            "itself as --data-dir"
        )
    train_path = source / "train.npz"
    return path, train_path if train_path.is_file() else path


def _load_npz(request: DatasetRequest) -> ArrayDataset:
    path, train_path = _npz_paths(request)
    features, labels = read_npz(path)
    same = train_path == path
    train_features, train_labels = (features, labels) if same else read_npz(train_path)
    unseen = np.setdiff1d(np.unique(labels), np.unique(train_labels))
    if unseen.size:
        shown = ", ".join(str(label) for label in unseen[:5].tolist())
        raise ValueError(f"{path} has labels ({shown}{', ...' if unseen.size > 5 else ''}) that "
                         f"{train_path} never has, so the model could not learn them; give "
                         "the test split of the same classes")
    scale = 1.0 / 255.0 if train_features.dtype == np.uint8 else 1.0
    mean, std = _channel_stats(train_features.astype(np.float32) * scale)
    num_classes = int(max(labels.max(), train_labels.max())) + 1
    scale = 1.0 / 255.0 if features.dtype == np.uint8 else 1.0
    tensor = _standardize(features, mean, std, scale)
    return ArrayDataset(tensor, torch.from_numpy(labels.astype(np.int64)), num_classes, "npz")


def _load_synthetic(request: DatasetRequest) -> ArrayDataset:
    shape, num_classes = parse_synthetic(request.name)
    size = request.synthetic_size
    size = SYNTHETIC_DEFAULT_SIZE[request.split] if size is None else size
    split_index = SPLITS.index(request.split)
    features, labels = make_synthetic(shape, num_classes, size, request.seed, split_index)
    return ArrayDataset(features, labels, num_classes, request.name)


def _load_imagefolder(request: DatasetRequest) -> ArrayDataset:
    if request.data_dir is None:
        raise ValueError("dataset imagefolder needs its directory; pass --data-dir DIR holding "
                         "train/CLASS/IMAGE and test/CLASS/IMAGE")
    images, labels, classes = read_imagefolder(request.data_dir, "train", request.image_size)
    mean, std = _channel_stats(images.astype(np.float32) / 255.0)  # the train split's
    if request.split != "train":
        shape = images.shape[1:]
        images, labels, _ = read_imagefolder(request.data_dir, request.split, request.image_size)
        if images.shape[1:] != shape:
            raise ValueError(f"imagefolder {request.data_dir}: test images are "
                             f"{images.shape[1:]} but training images {shape} (channels, "
                             "height, width); give --image-size N to resize both alike")
    return ArrayDataset(_standardize(images, mean, std, 1.0 / 255.0),
                        torch.from_numpy(labels), len(classes), "imagefolder")


_LOADERS: dict[str, Callable[[DatasetRequest], ArrayDataset]] = {
    "digits": _load_digits,
    "mnist": _load_mnist,
    "fashion-mnist": _load_fashion_mnist,
    "cifar10": _load_cifar10,
    "npz": _load_npz,
    "synthetic": _load_synthetic,
    "imagefolder": _load_imagefolder,
}


_FROM_FILES = frozenset({"mnist", "fashion-mnist", "cifar10", "npz", "imagefolder"})
"""The data sets read from files (``data_dir``); digits ships with the package and synthetic is
generated."""


_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((1, 8, 8), 10), "mnist": ((1, 28, 28), 10), "fashion-mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
}


def declared_shape(name: str) -> tuple[tuple[int, ...], int] | None:
    """``(sample shape, classes)`` of dataset ``name`` known without reading it (its family's,
    or a synthetic spec's); None where only the files tell (``npz``)."""
    family = name.split(":", 1)[0].lower()
    if family == "synthetic":
        return parse_synthetic(name.lower())
    return _SHAPES.get(family)


def available_datasets() -> list[str]:
    """Registered dataset names (``synthetic`` also accepts ``synthetic:SHAPE[:CLASSES]``;
    besides them, a ``package.module:factory`` names a user's data set)."""
    return list(_LOADERS)


def is_dataset_name(name: str) -> bool:
    """Whether ``name`` is a registered data set (with its spec) or a ``module:factory``."""
    return name.split(":", 1)[0].lower() in _LOADERS or is_factory_spec(name)


def load_dataset(
    name: str = "digits",
    data_dir: str | Path | None = None,
    split: str = "train",
    seed: int = 0,
    synthetic_size: int | None = None,
    image_size: int | None = None,
) -> ArrayDataset:
    """Load split ``split`` of dataset ``name`` into memory (see the module docstring)."""
    family = name.split(":", 1)[0].lower()
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if family not in _LOADERS and is_factory_spec(name):
        _check_options(name, "factory", None, synthetic_size, image_size)
        return load_factory_dataset(name, data_dir, split)
    if family not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}"
                         ", or your own as package.module:factory")
    _check_options(name, family, data_dir, synthetic_size, image_size)
    directory = None if data_dir is None else Path(data_dir).expanduser()
    request = DatasetRequest(name.lower(), directory, split, seed, synthetic_size, image_size)
    dataset = _LOADERS[family](request)
    logger.info(
        "loaded %s/%s: %d samples of shape %s, %d classes",
        name, split, len(dataset), dataset.input_shape, dataset.num_classes,
    )
    return dataset


def _check_options(name: str, family: str, data_dir: str | Path | None,
                   synthetic_size: int | None, image_size: int | None = None) -> None:
    """An option the data set would not read is refused, not ignored."""
    if synthetic_size is not None and family != "synthetic":
        raise ValueError(f"synthetic_size {synthetic_size} (--synthetic-size) sizes the "
                         f"synthetic data set, and {name} has its own size; drop it, or train "
                         "on --dataset synthetic")
    if image_size is not None and family != "imagefolder":
        raise ValueError(f"image_size {image_size} (--image-size) resizes the images of "
                         f"--dataset imagefolder, and {name} is not one; drop it")
    if data_dir is not None and family not in _FROM_FILES:
        where = "ships with scaledl" if family == "digits" else "is generated"
        raise ValueError(f"data_dir {data_dir} (--data-dir) names files to read, and {name} "
                         f"{where}; drop it, or name a data set read from files "
                         f"({', '.join(sorted(_FROM_FILES))})")


_FACTORY_SPLITS: dict[tuple[str, str | None], tuple[ArrayDataset, ArrayDataset]] = {}
"""The last user data set's two splits, so that loading the test split after the train split
does not call the factory again (one entry: a process trains one data set)."""


def load_factory_dataset(spec: str, data_dir: str | Path | None = None,
                         split: str = "train") -> ArrayDataset:
    """Split ``split`` of the user's data set ``package.module:factory``.

    The contract: ``factory()`` (``factory(data_dir=...)`` with ``--data-dir``, which it must
    then take) returns a ``(train, test)`` pair of map-style datasets, or one dataset that is
    then both splits (a warning says so).  A dataset has ``len()`` and items ``(features,
    label)``: features a tensor (or array) of one shape, the label an int class index.
    ``torch.utils.data.TensorDataset`` and :class:`ArrayDataset` are read whole, others item by
    item.  The classes are ``num_classes`` of the train set when it has that attribute, else
    the largest label plus one.  Features are taken as they are (no standardization: the
    factory owns its transforms), as float32, and held in memory.  Every process that trains
    calls the factory, so it must return the same data on every rank.
    """
    key = (spec, None if data_dir is None else str(data_dir))
    if key not in _FACTORY_SPLITS:
        factory = load_factory(spec, "dataset")
        offered = {} if data_dir is None else {"data_dir": str(data_dir)}
        if offered and "data_dir" not in _keywords(factory):
            raise ValueError(f"data_dir {data_dir} (--data-dir) is given, and dataset factory "
                             f"{spec!r} takes no data_dir parameter; drop --data-dir or add "
                             "data_dir to the factory")
        made = call_factory(factory, spec, "dataset", **offered)
        _FACTORY_SPLITS.clear()
        _FACTORY_SPLITS[key] = _factory_splits(spec, made)
    dataset = _FACTORY_SPLITS[key][SPLITS.index(split)]
    logger.info("loaded %s/%s: %d samples of shape %s, %d classes", spec, split, len(dataset),
                dataset.input_shape, dataset.num_classes)
    return dataset


def _keywords(factory: Callable[..., object]) -> set[str]:
    import inspect

    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {"data_dir"}
    return {p.name for p in parameters}


def _factory_splits(spec: str, made: object) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, test)`` from what a dataset factory returned."""
    if isinstance(made, tuple) and len(made) == 2:  # a pair of datasets, not a dataset
        train_source, test_source = made
    else:
        train_source = test_source = made
    train_x, train_y = _tensors(spec, "train", train_source)
    if test_source is train_source:
        logger.warning("dataset factory %s returned one dataset, so it is also the test split: "
                       "the test accuracy is measured on the training samples (return a "
                       "(train, test) pair for a held-out one)", spec)
    test_x, test_y = (train_x, train_y) if test_source is train_source else \
        _tensors(spec, "test", test_source)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise ValueError(f"dataset factory {spec!r}: test samples have shape "
                         f"{tuple(test_x.shape[1:])} and training samples "
                         f"{tuple(train_x.shape[1:])}; return splits of one sample shape")
    declared = getattr(train_source, "num_classes", None)
    classes = int(declared) if isinstance(declared, int) else \
        int(max(int(train_y.max()), int(test_y.max()))) + 1
    return (ArrayDataset(train_x, train_y, classes, spec),
            ArrayDataset(test_x, test_y, classes, spec))


def _tensors(spec: str, split: str, source: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (float32) and labels (int64) of every item of one split."""
    where = f"dataset factory {spec!r}: the {split} set"
    if isinstance(source, ArrayDataset):
        return source.features, source.labels
    tensors = getattr(source, "tensors", None)  # torch.utils.data.TensorDataset
    if isinstance(tensors, tuple) and len(tensors) == 2 and \
            all(isinstance(t, torch.Tensor) for t in tensors):
        features, labels = tensors
    else:
        if not hasattr(source, "__len__") or not hasattr(source, "__getitem__"):
            raise ValueError(f"{where} is a {type(source).__name__}, not a dataset; return a "
                             "map-style torch Dataset (len() and items (features, label))")
        items = [source[i] for i in range(len(source))]
        bad = next((i for i, item in enumerate(items)
                    if not (isinstance(item, (tuple, list)) and len(item) == 2)), None)
        if bad is not None:
            raise ValueError(f"{where}: item {bad} is {type(items[bad]).__name__}, not a "
                             "(features, label) pair; return items (features, label)")
        try:
            features = torch.stack([torch.as_tensor(x) for x, _ in items]) if items else \
                torch.empty(0)
            labels = torch.as_tensor([int(y) for _, y in items], dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{where}: its items are not (features of one shape, int label) "
                             f"({first_line(error)}); return tensors of one shape and int "
                             "labels") from error
    if len(features) == 0:
        raise ValueError(f"{where} is empty; return at least one sample")
    if features.dim() < 2 or labels.shape != (len(features),):
        raise ValueError(f"{where}: {tuple(features.shape)} features and {tuple(labels.shape)} "
                         "labels are not one label per sample of one shape; return items "
                         "(features, label)")
    if labels.is_floating_point() or int(labels.min()) < 0:
        raise ValueError(f"{where}: labels must be int class indices >= 0, got "
                         f"{labels.dtype} (min {labels.min().item()}); return int labels")
    return features.to(torch.float32).contiguous(), labels.to(torch.int64)
