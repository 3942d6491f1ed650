"""Datasets by name: digits, IDX (MNIST family), CIFAR-10 binary, npz, synthetic, and bad input."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from scaledl.data import ArrayDataset, available_datasets, declared_shape, load_dataset
from scaledl.data.datasets import FASHION_MNIST_DIR, MNIST_STATS
from scaledl.data.synthetic import parse_synthetic
from tests.helpers_imports import modules_loaded_by
from scaledl.data import formats
from scaledl.data.formats import CIFAR10_RECORD_BYTES, read_digits


# -- digits ---------------------------------------------------------------------------------------
def test_digits_shapes_classes_and_stable_split() -> None:
    train = load_dataset("digits")
    test = load_dataset("digits", split="test", seed=123)
    assert train.input_shape == (1, 8, 8) and train.num_classes == 10
    assert (len(train), len(test)) == (1437, 360)
    assert train.features.dtype == torch.float32 and train.labels.dtype == torch.int64
    assert abs(train.features.mean().item()) < 1e-4 and abs(train.features.std().item() - 1) < 1e-3
    again = load_dataset("digits", split="test", seed=7)
    assert torch.equal(test.features, again.features) and torch.equal(test.labels, again.labels)
    assert set(test.labels.tolist()) == set(range(10))


def test_digits_are_scikit_learns_values_read_without_importing_it() -> None:
    """The table scaledl reads from scikit-learn's CSV is ``load_digits``'s, and loading the
    dataset in a fresh process imports neither scikit-learn nor SciPy (about a second of CPU
    in every training process)."""
    from sklearn.datasets import load_digits

    bunch, table = load_digits(), read_digits()
    assert np.array_equal(table[:, :-1], bunch.data) and table.dtype == bunch.data.dtype
    assert np.array_equal(table[:, -1].astype(int), bunch.target)
    assert not table.flags.writeable
    loaded = modules_loaded_by("from scaledl.data import load_dataset; load_dataset('digits')",
                               ("sklearn", "scipy"))
    assert loaded == []


def test_digits_come_from_load_digits_where_the_csv_is_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = read_digits().copy()
    monkeypatch.setattr(formats, "DIGITS_CSV", ("no", "such", "digits.csv.gz"))
    read_digits.cache_clear()
    try:
        assert np.array_equal(read_digits(), expected)
    finally:
        read_digits.cache_clear()


# -- IDX ------------------------------------------------------------------------------------------
def _idx(array: np.ndarray) -> bytes:
    magic = bytes([0, 0, 0x08, array.ndim])
    dims = np.asarray(array.shape, dtype=">i4").tobytes()
    return magic + dims + array.astype(np.uint8).tobytes()


def _write(path: Path, blob: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)
    return path


def _write_mnist(
    root: Path, prefix: str = "train", count: int = 6, suffix: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(count)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    _write(root / f"{prefix}-images-idx3-ubyte{suffix}", _idx(images))
    _write(root / f"{prefix}-labels-idx1-ubyte{suffix}", _idx(labels))
    return images, labels


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path: Path, suffix: str) -> None:
    images, labels = _write_mnist(tmp_path, "t10k", 7, suffix)
    dataset = load_dataset("mnist", tmp_path, split="test")
    assert dataset.input_shape == (1, 28, 28) and len(dataset) == 7
    assert dataset.labels.tolist() == labels.tolist()
    (mean,), (std,) = MNIST_STATS
    expected = (images[:, None].astype(np.float32) / 255 - mean) / std
    np.testing.assert_allclose(dataset.features.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_idx_found_in_torchvision_layout(tmp_path: Path) -> None:
    _write_mnist(tmp_path / "FashionMNIST" / "raw", "train", 3, ".gz")
    assert len(load_dataset("fashion-mnist", tmp_path)) == 3


def _error(call: object) -> str:
    with pytest.raises(ValueError) as info:
        call()  # type: ignore[operator]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_idx_missing_file_names_path_and_fix(tmp_path: Path) -> None:
    message = _error(lambda: load_dataset("mnist", tmp_path))
    assert str(tmp_path) in message and "train-images-idx3-ubyte" in message
    assert "--data-dir" in message
    assert "--data-dir" in _error(lambda: load_dataset("mnist"))


def test_idx_wrong_magic(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    images = tmp_path / "train-images-idx3-ubyte"
    labels.write_bytes(images.read_bytes())
    message = _error(lambda: load_dataset("mnist", tmp_path))
    assert str(labels) in message and "magic number 0x00000803, expected 0x00000801" in message


def test_idx_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    message = _error(lambda: load_dataset("mnist", tmp_path))
    assert re.search(re.escape(str(images)) + r" is truncated: \d+ bytes where", message)
    gz_dir = tmp_path / "gz"
    _write_mnist(gz_dir, suffix=".gz")
    broken = gz_dir / "train-labels-idx1-ubyte.gz"
    broken.write_bytes(broken.read_bytes()[:20])
    message = _error(lambda: load_dataset("mnist", gz_dir))
    assert str(broken) in message and "cannot be read" in message


def test_idx_label_count_mismatch(tmp_path: Path) -> None:
    _write_mnist(tmp_path, count=5)
    _write(tmp_path / "train-labels-idx1-ubyte", _idx(np.zeros(4, dtype=np.uint8)))
    assert "holds 4 labels" in _error(lambda: load_dataset("mnist", tmp_path))


@pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
    reason="Debian package dataset-fashion-mnist is not installed",
)
def test_fashion_mnist_from_the_debian_package() -> None:
    test = load_dataset("fashion-mnist", split="test")
    assert len(test) == 10_000 and test.input_shape == (1, 28, 28)
    assert test.labels.bincount().tolist() == [1000] * 10
    assert abs(test.features.mean().item()) < 0.05 and abs(test.features.std().item() - 1) < 0.05


# -- CIFAR-10 -------------------------------------------------------------------------------------
def _cifar_records(count: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, size=(count, CIFAR10_RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = np.arange(count) % 10
    return records.tobytes()


def test_cifar10_binary_batches(tmp_path: Path) -> None:
    root = tmp_path / "cifar-10-batches-bin"
    root.mkdir()
    for batch in range(1, 6):
        (root / f"data_batch_{batch}.bin").write_bytes(_cifar_records(3, batch))
    test_blob = _cifar_records(4, 9)
    (root / "test_batch.bin").write_bytes(test_blob)
    train = load_dataset("cifar10", tmp_path)
    test = load_dataset("cifar10", root, split="test")
    assert len(train) == 15 and train.input_shape == (3, 32, 32)
    assert test.labels.tolist() == [0, 1, 2, 3]
    first_red_pixel = test_blob[1] / 255
    assert test.features[0, 0, 0, 0].item() == pytest.approx((first_red_pixel - 0.4914) / 0.2470)


def test_cifar10_bad_size_and_missing(tmp_path: Path) -> None:
    (tmp_path / "test_batch.bin").write_bytes(_cifar_records(2, 0)[:-1])
    message = _error(lambda: load_dataset("cifar10", tmp_path, split="test"))
    assert str(tmp_path / "test_batch.bin") in message and "3073-byte" in message
    message = _error(lambda: load_dataset("cifar10", tmp_path))
    assert "data_batch_1.bin" in message and "cifar.html" in message


# -- npz ------------------------------------------------------------------------------------------
def test_npz_file_and_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(5, 3, size=(50, 6))
    np.savez(tmp_path / "train.npz", x=features, y=np.arange(50) % 3)
    np.savez(tmp_path / "test.npz", features=features[:10], labels=np.arange(10) % 3)
    train = load_dataset("npz", tmp_path)
    assert train.input_shape == (6,) and train.num_classes == 3
    assert abs(train.features.mean().item()) < 1e-5
    test = load_dataset("npz", tmp_path, split="test")
    assert test.num_classes == 3 and torch.allclose(test.features, train.features[:10])
    assert "also the test split" not in caplog.text
    single = load_dataset("npz", tmp_path / "train.npz", split="test")
    assert torch.equal(single.features, train.features)
    assert "is one file, so it is also the test split: the test accuracy is measured on the " \
        "training samples" in caplog.text  # said, since it is what the accuracy means


def test_npz_test_labels_the_train_split_never_has_are_refused(tmp_path: Path) -> None:
    """A class only the test split has could never be predicted (a model sized by the train
    split had no output for it): the accuracy would be silently capped."""
    features = np.random.default_rng(0).normal(size=(12, 4))
    np.savez(tmp_path / "train.npz", x=features, y=np.arange(12) % 3)
    np.savez(tmp_path / "test.npz", x=features, y=np.arange(12) % 4 + 1)
    message = _error(lambda: load_dataset("npz", tmp_path, split="test"))
    assert f"{tmp_path / 'test.npz'} has labels (3, 4) that {tmp_path / 'train.npz'} never " \
        "has" in message and "give the test split of the same classes" in message


def test_npz_uint8_images_and_bad_arrays(tmp_path: Path) -> None:
    images = np.full((4, 1, 2, 2), 255, dtype=np.uint8)
    images[:2] = 0
    np.savez(tmp_path / "ok.npz", x=images, y=np.array([0, 1, 0, 1]))
    assert load_dataset("npz", tmp_path / "ok.npz").input_shape == (1, 2, 2)
    np.savez(tmp_path / "short.npz", x=images, y=np.array([0, 1]))
    assert "same N" in _error(lambda: load_dataset("npz", tmp_path / "short.npz"))
    np.savez(tmp_path / "float_labels.npz", x=images, y=np.zeros(4))
    assert "must be integers" in _error(lambda: load_dataset("npz", tmp_path / "float_labels.npz"))
    np.savez(tmp_path / "names.npz", a=images)
    assert "not x/y" in _error(lambda: load_dataset("npz", tmp_path / "names.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert str(tmp_path / "junk.npz") in _error(lambda: load_dataset("npz", tmp_path / "junk.npz"))
    assert "test.npz" in _error(lambda: load_dataset("npz", tmp_path, split="test"))


# -- synthetic ------------------------------------------------------------------------------------
def test_synthetic_is_deterministic_per_seed_and_learnable() -> None:
    first = load_dataset("synthetic:1x8x8:4", seed=3, synthetic_size=256)
    again = load_dataset("synthetic:1x8x8:4", seed=3, synthetic_size=256)
    other = load_dataset("synthetic:1x8x8:4", seed=4, synthetic_size=256)
    assert torch.equal(first.features, again.features) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.features, other.features)
    assert first.input_shape == (1, 8, 8) and first.num_classes == 4 and len(first) == 256
    # Nearest class mean (estimated on train) classifies the test split well above chance.
    test = load_dataset("synthetic:1x8x8:4", seed=3, split="test", synthetic_size=256)
    flat = first.features.flatten(1)
    means = torch.stack([flat[first.labels == k].mean(0) for k in range(4)])
    predicted = torch.cdist(test.features.flatten(1), means).argmin(1)
    assert (predicted == test.labels).float().mean() > 0.9


def test_synthetic_names() -> None:
    assert parse_synthetic("synthetic") == ((3, 32, 32), 10)
    assert parse_synthetic("synthetic:1x28x28") == ((1, 28, 28), 10)
    assert parse_synthetic("synthetic:64:5") == ((64,), 5)
    assert len(load_dataset("synthetic:16:3", split="test")) == 1024
    assert "synthetic_size 0" in _error(lambda: load_dataset("synthetic", synthetic_size=0))
    for bad in ("synthetic:2x2", "synthetic:0x4x4", "synthetic:axb", "synthetic:8:1"):
        assert repr(bad) in _error(lambda bad=bad: parse_synthetic(bad))


# -- registry and values --------------------------------------------------------------------------
def test_unknown_dataset_and_split() -> None:
    message = _error(lambda: load_dataset("imagenet"))
    assert "'imagenet'" in message and ", ".join(available_datasets()) in message
    assert "digits" in available_datasets() and "synthetic" in available_datasets()
    assert "'val'" in _error(lambda: load_dataset("digits", split="val"))


def test_array_dataset_checks_its_tensors() -> None:
    features = torch.zeros(3, 2)
    dataset = ArrayDataset(features, torch.tensor([0, 1, 1]), 2, "tiny")
    x, y = dataset[2]
    assert x.shape == (2,) and y.item() == 1 and len(dataset) == 3
    assert "float32" in _error(lambda: ArrayDataset(features.double(), dataset.labels, 2, "d"))
    assert "int64" in _error(lambda: ArrayDataset(features, dataset.labels.int(), 2, "i"))
    assert "0..0" in _error(lambda: ArrayDataset(features, dataset.labels, 1, "k"))


def test_declared_shapes_are_what_the_loaders_load(tmp_path: Path) -> None:
    """What ``scaledl train`` checks the model against before launch is the loaded shape."""
    _write_mnist(tmp_path / "mnist")
    root = tmp_path / "cifar" / "cifar-10-batches-bin"
    root.mkdir(parents=True)
    for batch in range(1, 6):
        (root / f"data_batch_{batch}.bin").write_bytes(_cifar_records(2, batch))
    (root / "test_batch.bin").write_bytes(_cifar_records(2, 9))
    loads = {"digits": None, "mnist": tmp_path / "mnist", "cifar10": tmp_path / "cifar",
             "synthetic": None, "synthetic:3x75x75:7": None, "synthetic:64:5": None}
    for name, directory in loads.items():
        size = 4 if name.startswith("synthetic") else None
        dataset = load_dataset(name, directory, synthetic_size=size)
        assert declared_shape(name) == (dataset.input_shape, dataset.num_classes), name
    assert declared_shape("npz") is None


@pytest.mark.parametrize("name, options, told", [
    ("digits", {"synthetic_size": 100}, "synthetic_size 100 (--synthetic-size) sizes the "
     "synthetic data set, and digits has its own size"),
    ("mnist", {"synthetic_size": 100}, "and mnist has its own size"),
    ("digits", {"data_dir": "/nonexistent"}, "data_dir /nonexistent (--data-dir) names files "
     "to read, and digits ships with scaledl"),
    ("synthetic:64:5", {"data_dir": "/tmp"}, "and synthetic:64:5 is generated"),
])
def test_an_option_the_data_set_does_not_read_is_refused(
        name: str, options: dict[str, object], told: str) -> None:
    assert told in _error(lambda: load_dataset(name, **options))  # type: ignore[arg-type]
