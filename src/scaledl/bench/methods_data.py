"""The data of ``scaledl bench algorithms`` beyond a named data set: the workloads and the
held-out validation split that tuning reads.

**Workloads.**  ``mlp`` is the comparison as it always ran: the ``--model`` (default ``mlp``)
on the ``--dataset``.  ``cnn`` is one where computation is not negligible beside
communication: LeNet-5 on *CIFAR-shaped digits*, scikit-learn's 8x8 digits made 3x32x32
colour images (no download is possible here, and a CNN on random noise learns nothing):

1. each digit is scaled to [0, 1] and upsampled 4x (bilinear) to 32x32;
2. it is shifted by up to ``SHIFT`` pixels each way (zero fill), so position varies;
3. it is painted: a random background colour (each channel in [0, 0.4]) and a random ink
   colour (each channel in [0.5, 1]), ``image = background + (ink - background) * digit``;
4. Gaussian noise of standard deviation ``NOISE`` is added and the result clipped to [0, 1]
   and stored as uint8.

The train split holds ``COPIES`` differently augmented copies of digits' 1437 training images
(5748 images), the test split one copy of its 360 test images; the generator is seeded
(``DATA_SEED``), so every run and every method sees the same files.  They are written once
as ``train.npz``/``test.npz`` into the bench's output folder and read with ``--dataset npz``.

**Validation split.**  Tuning a learning rate on the test split would report a test accuracy
the lr was chosen for, so :func:`write_validation_split` holds out ``VALIDATION_FRACTION`` of
the *train* split (a fixed permutation): tuning runs train on the rest and evaluate on it, the
report runs train on the whole train split and evaluate on the test split.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from scaledl.bench.methods import BenchSpec

__all__ = ["WORKLOADS", "CNN_MODEL", "write_cnn_digits", "write_validation_split",
           "workload_spec", "VALIDATION_FRACTION"]

WORKLOADS: tuple[str, ...] = ("mlp", "cnn")
"""``mlp``: ``--model`` on ``--dataset``; ``cnn``: LeNet-5 on CIFAR-shaped digits."""
CNN_MODEL = "lenet"
COPIES, SHIFT, NOISE, DATA_SEED = 4, 3, 0.08, 2311
VALIDATION_FRACTION, VALIDATION_SEED = 0.2, 8105


def _paint(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Steps 1-4 of the module docstring on ``(N, 8, 8)`` images in [0, 1]; uint8
    ``(N, 3, 32, 32)``."""
    import torch

    big = torch.nn.functional.interpolate(torch.from_numpy(images[:, None]).float(),
                                          size=(32, 32), mode="bilinear",
                                          align_corners=False)[:, 0].numpy()
    count = len(images)
    shifted = np.zeros_like(big)
    moves = rng.integers(-SHIFT, SHIFT + 1, size=(count, 2))
    for i, (dy, dx) in enumerate(moves):
        source = big[i, max(0, -dy):32 - max(0, dy), max(0, -dx):32 - max(0, dx)]
        shifted[i, max(0, dy):max(0, dy) + source.shape[0],
                max(0, dx):max(0, dx) + source.shape[1]] = source
    background = rng.uniform(0.0, 0.4, size=(count, 3, 1, 1))
    ink = rng.uniform(0.5, 1.0, size=(count, 3, 1, 1))
    painted = background + (ink - background) * shifted[:, None]
    painted += rng.normal(0.0, NOISE, size=painted.shape)
    return np.asarray(np.clip(painted, 0.0, 1.0) * 255.0 + 0.5, dtype=np.uint8)


def _digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Digits' split as ``(N, 8, 8)`` images in [0, 1] and labels (scaledl's fixed split)."""
    from scaledl.data import load_dataset

    data = load_dataset("digits", None, split, 0)
    features = data.features.numpy()[:, 0]
    low, high = features.min(), features.max()  # undo the standardization: back to [0, 1]
    return (features - low) / (high - low), data.labels.numpy()


def write_cnn_digits(folder: Path) -> Path:
    """Write the CIFAR-shaped digits (module docstring) into ``folder`` unless they are there
    already; the folder (``--data-dir`` of ``--dataset npz``)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "train.npz").is_file() and (folder / "test.npz").is_file():
        return folder
    rng = np.random.default_rng(DATA_SEED)
    for split, copies in (("train", COPIES), ("test", 1)):
        images, labels = _digits(split)
        x = np.concatenate([_paint(images, rng) for _ in range(copies)])
        np.savez(folder / f"{split}.npz", x=x, y=np.tile(labels, copies))
    return folder


def workload_spec(spec: BenchSpec, workload: str, out: Path) -> BenchSpec:
    """``spec`` for ``workload``: unchanged for ``mlp``; for ``cnn`` LeNet-5 on the
    CIFAR-shaped digits written under ``out/data``."""
    if workload not in WORKLOADS:
        raise ValueError(f"--workload {workload!r} is unknown; use one of {', '.join(WORKLOADS)}")
    if workload == "mlp":
        return spec
    folder = write_cnn_digits(out / "data" / "cnn-digits")
    return replace(spec, dataset="npz", data_dir=str(folder), model=CNN_MODEL)


def write_validation_split(spec: BenchSpec, folder: Path) -> BenchSpec:
    """Hold out part of ``spec``'s train split (module docstring) as ``folder/test.npz``, the
    rest as ``folder/train.npz``; ``spec`` reading them."""
    from scaledl.data import load_dataset

    folder.mkdir(parents=True, exist_ok=True)
    data = load_dataset(spec.dataset, spec.data_dir, "train", spec.seed)
    features, labels = data.features.numpy(), data.labels.numpy()
    order = np.random.default_rng(VALIDATION_SEED).permutation(len(labels))
    held = int(np.ceil(len(labels) * VALIDATION_FRACTION))
    for split, rows in (("test", order[:held]), ("train", order[held:])):
        np.savez(folder / f"{split}.npz", x=features[rows], y=labels[rows])
    return replace(spec, dataset="npz", data_dir=str(folder))
