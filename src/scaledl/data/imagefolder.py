"""``imagefolder``: a directory of images, one subdirectory per class, read with Pillow.

The layout is torchvision's ``ImageFolder``'s, one tree per split::

    DATA_DIR/train/CLASS/IMAGE      e.g. train/cat/0001.png, train/dog/0002.jpg
    DATA_DIR/test/CLASS/IMAGE       (or val/)

Classes are the subdirectory names of ``train/`` in sorted order (label 0, 1, ...); a test class
that ``train/`` lacks is refused.  Every file Pillow can open counts (hidden files are skipped).
Images are converted to RGB, or kept single-channel when every image of the split is grayscale,
resized to ``image_size`` pixels square when it is given (bilinear), else they must all have one
size.  As the other data sets, the split is held in memory: pixels scaled to [0, 1] and
standardized per channel with the train split's mean and standard deviation.  torchvision is not
needed; Pillow is (matplotlib, which scaledl depends on, installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TEST_DIRS", "read_imagefolder", "split_dir"]

TEST_DIRS = ("test", "val")
"""The names a test split's directory may have, in the order they are looked for."""


def split_dir(root: Path, split: str) -> Path:
    """The directory of ``split`` under ``root``; a one-line error when it is missing."""
    layout = ("lay it out as DIR/train/CLASS/IMAGE and DIR/test/CLASS/IMAGE (or val/), one "
              "subdirectory per class")
    if not root.is_dir():
        raise ValueError(f"imagefolder {root} is not a directory; {layout}")
    names = ("train",) if split == "train" else TEST_DIRS
    for name in names:
        if (root / name).is_dir():
            return root / name
    raise ValueError(f"imagefolder {root} has no {' or '.join(f'{n}/' for n in names)} "
                     f"directory; {layout}")


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("dataset imagefolder reads images with Pillow, which is not installed; "
                         "pip install pillow") from None
    return Image


def read_imagefolder(root: Path, split: str, image_size: int | None
                     ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(images uint8 (N, C, H, W), labels int64 (N,), class names)`` of one split; the class
    names (and so the labels) are always the train split's."""
    image_module = _pillow()
    classes = sorted(p.name for p in split_dir(root, "train").iterdir()
                     if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"imagefolder {root / 'train'} has no class subdirectories; put each "
                         "class's images in a subdirectory named after it")
    folder = split_dir(root, split)
    found = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    unknown = [name for name in found if name not in classes]
    if unknown:
        raise ValueError(f"imagefolder {folder} has class {unknown[0]!r}, which "
                         f"{root / 'train'} lacks; the test classes must be training classes")
    pictures, labels = [], []
    for label, name in enumerate(classes):
        directory = folder / name
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            pictures.append(_open(image_module, path, image_size))
            labels.append(label)
    if not pictures:
        raise ValueError(f"imagefolder {folder} holds no images; put image files (PNG, JPEG, "
                         "...) in its class subdirectories")
    gray = all(picture.mode == "L" for picture in pictures)
    arrays = [np.asarray(p if gray else p.convert("RGB")) for p in pictures]
    sizes = {array.shape[:2] for array in arrays}
    if len(sizes) > 1:
        raise ValueError(f"imagefolder {folder} has images of {len(sizes)} sizes (e.g. "
                         f"{', '.join(f'{w}x{h}' for h, w in sorted(sizes)[:2])}); give "
                         "--image-size N to resize them all to N x N")
    images = np.stack(arrays)
    images = images[:, None] if gray else images.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(images), np.asarray(labels, dtype=np.int64), classes


def _open(image_module: Any, path: Path, image_size: int | None) -> Any:
    """One image, grayscale ("L") or converted to RGB, resized when ``image_size`` is given."""
    try:
        with image_module.open(path) as picture:
            picture.load()
            mode = "L" if picture.mode in ("L", "1", "I", "I;16", "F") else "RGB"
            converted = picture.convert(mode)
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"imagefolder: {path} is not an image Pillow can read ({error}); "
                         "remove it or convert it") from None
    if image_size is not None and converted.size != (image_size, image_size):
        converted = converted.resize((image_size, image_size), image_module.Resampling.BILINEAR)
    return converted
