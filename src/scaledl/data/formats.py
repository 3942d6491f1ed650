"""On-disk dataset formats: IDX (MNIST family), CIFAR-10 binary batches, and ``.npz`` arrays.

Each reader returns plain numpy arrays and checks what it reads: magic numbers, header sizes
against file sizes, label ranges.  A missing, truncated or corrupt file raises ``ValueError``
naming the path, what is wrong and how to fix it, in one line.

- IDX (LeCun et al., http://yann.lecun.com/exdb/mnist/): a big-endian header ``0 0 type ndim``
  (type 0x08 = unsigned byte), then ``ndim`` int32 dimension sizes, then the data; read raw or
  gzip-compressed (``.gz``).
- CIFAR-10 binary version (https://www.cs.toronto.edu/~kriz/cifar.html): records of one label
  byte and 3072 pixel bytes (1024 red, 1024 green, 1024 blue, row-major 32x32).
- ``.npz``: arrays ``x``/``y`` (or ``features``/``labels``), one row per sample.
- scikit-learn's digits: the gzipped CSV it ships (``sklearn/datasets/data/digits.csv.gz``, 64
  pixel values 0-16 and the label per row), read without importing scikit-learn, whose import
  costs every training process about a second of CPU (``read_digits``).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
import zipfile
import zlib
from pathlib import Path

import numpy as np

__all__ = [
    "IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "CIFAR10_RECORD_BYTES",
    "find_file", "read_idx", "read_cifar10_batches", "read_npz",
]

logger = logging.getLogger(__name__)

IDX_IMAGES_MAGIC = 0x00000803
"""Magic number of an IDX file of unsigned bytes with 3 dimensions (images)."""
IDX_LABELS_MAGIC = 0x00000801
"""Magic number of an IDX file of unsigned bytes with 1 dimension (labels)."""
CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32
"""Bytes per CIFAR-10 record: one label byte and a 3x32x32 image."""


def find_file(directories: list[Path], names: list[str], what: str, fix: str) -> Path:
    """The first of ``names`` (each also tried with ``.gz``) found in ``directories``."""
    for directory in directories:
        for name in names:
            for candidate in (directory / name, directory / f"{name}.gz"):
                if candidate.is_file():
                    return candidate
    where = directories[0] if directories else Path(".")
    raise ValueError(f"{what} file {names[0]}[.gz] not found in {where}; {fix}")


def _read_bytes(path: Path, fix: str) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as stream:
                return stream.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"{path} cannot be read ({error}); {fix}") from None


def read_idx(path: Path, expected_magic: int, fix: str) -> np.ndarray:
    """The uint8 array stored in an IDX file; check magic number and size against the header."""
    blob = _read_bytes(path, fix)
    if len(blob) < 4:
        raise ValueError(f"{path} is {len(blob)} bytes, too short for an IDX header; {fix}")
    magic = int.from_bytes(blob[:4], "big")
    if magic != expected_magic:
        raise ValueError(
            f"{path} has IDX magic number {magic:#010x}, expected {expected_magic:#010x} "
            f"(is it an images file where labels were expected, or not IDX at all?); {fix}"
        )
    ndim = blob[3]
    header = 4 + 4 * ndim
    if len(blob) < header:
        raise ValueError(f"{path} is truncated inside its IDX header; {fix}")
    shape = tuple(int(d) for d in np.frombuffer(blob, dtype=">i4", count=ndim, offset=4))
    expected = header + int(np.prod(shape))
    if len(blob) != expected:
        state = "truncated" if len(blob) < expected else "longer than its header says"
        raise ValueError(
            f"{path} is {state}: {len(blob)} bytes where the header {shape} needs {expected}; {fix}"
        )
    return np.frombuffer(blob, dtype=np.uint8, offset=header).reshape(shape)


def read_cifar10_batches(paths: list[Path], fix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 3, 32, 32)`` uint8 and labels ``(N,)`` from CIFAR-10 binary batch files."""
    images, labels = [], []
    for path in paths:
        blob = _read_bytes(path, fix)
        if not blob or len(blob) % CIFAR10_RECORD_BYTES:
            raise ValueError(
                f"{path} is {len(blob)} bytes, not a positive multiple of the "
                f"{CIFAR10_RECORD_BYTES}-byte CIFAR-10 record (truncated?); {fix}"
            )
        records = np.frombuffer(blob, dtype=np.uint8).reshape(-1, CIFAR10_RECORD_BYTES)
        if records[:, 0].max() > 9:
            raise ValueError(
                f"{path} has label {records[:, 0].max()} outside 0..9; is it CIFAR-100? {fix}"
            )
        labels.append(records[:, 0])
        images.append(records[:, 1:].reshape(-1, 3, 32, 32))
    return np.concatenate(images), np.concatenate(labels)


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Features and integer labels from an ``.npz`` with ``x``/``y`` or ``features``/``labels``."""
    fix = "save it with np.savez(path, x=features, y=labels)"
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} cannot be read as .npz ({error}); {fix}") from None
    pairs = [("x", "y"), ("features", "labels")]
    found = next(((fx, fy) for fx, fy in pairs if fx in arrays and fy in arrays), None)
    if found is None:
        raise ValueError(f"{path} holds arrays {sorted(arrays)}, not x/y or features/labels; {fix}")
    features, labels = arrays[found[0]], arrays[found[1]]
    if features.ndim < 2 or labels.ndim != 1 or len(features) != len(labels) or not len(labels):
        raise ValueError(
            f"{path}: features {features.shape} and labels {labels.shape} must be (N, ...) and "
            f"(N,) with the same N >= 1; {fix}"
        )
    real = np.issubdtype(features.dtype, np.number)
    if not real or np.issubdtype(features.dtype, np.complexfloating):
        raise ValueError(f"{path}: features have dtype {features.dtype}, not a real number; {fix}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(
            f"{path}: labels have dtype {labels.dtype} (min {labels.min()}); "
            f"they must be integers >= 0; {fix}"
        )
    return features, labels


DIGITS_CSV = ("datasets", "data", "digits.csv.gz")
"""Where scikit-learn keeps the digits table, below its package directory."""


@functools.cache
def read_digits() -> np.ndarray:
    """scikit-learn's digits as one read-only float64 table: 1797 rows of 64 pixels and the
    label, the values ``sklearn.datasets.load_digits`` parses from the same file.  Where that
    file is not found (another layout of scikit-learn), ``load_digits`` itself gives them."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [path for root in roots if (path := Path(root, *DIGITS_CSV)).is_file()]
    if found:
        with gzip.open(found[0], "rt") as rows:
            table = np.loadtxt(rows, delimiter=",")
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        table = np.column_stack([bunch.data, bunch.target])
    table.setflags(write=False)
    return table
