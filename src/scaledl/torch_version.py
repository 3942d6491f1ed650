"""The oldest PyTorch scaledl runs on, checked when scaledl is imported.

``MIN_TORCH`` is pyproject's ``torch>=`` bound (a unit test keeps the two equal). Below it
scaledl does not merely lack features, it can hang: before torch 2.8, dropping the last Python
reference to a Gloo process group joins the group's worker threads while holding the GIL, and a
worker that is just freeing a finished asynchronous operation whose tensors Python had
already dropped needs the GIL to do so. That deadlocks ``hvd.shutdown()`` and any
``destroy_process_group`` that follows an asynchronous collective, intermittently (seen in this
project's suite on torch 2.4.1; fixed by pytorch/pytorch#154976, "Release GIL in PG destructor",
June 2025). pip enforces the bound when it installs scaledl; this check covers the environments
it does not (``--no-deps``, a source tree on ``PYTHONPATH``, a downgrade after installing):
``import scaledl`` runs :func:`check_installed_torch` first.  It reads the installed
distribution's version rather than importing torch (which takes seconds), so that the package
imports lazily; a torch without distribution metadata is imported to read its version.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata

MIN_TORCH = "2.8"
"""The oldest torch release scaledl supports (major.minor)."""


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``2.13.0+cpu`` or ``2.9.0a0+git``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"torch version {version!r} is not major.minor[...]")
    return int(found.group(1)), int(found.group(2))


def check_torch(version: str) -> None:
    """Raise ``ImportError`` naming the fix when ``version`` is older than :data:`MIN_TORCH`."""
    if release(version) < release(MIN_TORCH):
        raise ImportError(
            f"scaledl needs torch >= {MIN_TORCH}, and this environment has torch {version}: "
            f"upgrade it (pip install 'torch>={MIN_TORCH}')")


def installed_torch_version() -> str:
    """The version of the torch this interpreter has imported, or would import: an imported
    torch's ``__version__``, else its distribution's metadata, else (a build without metadata)
    the ``__version__`` of torch imported for the purpose."""
    if "torch" not in sys.modules:
        try:
            return metadata.version("torch")
        except metadata.PackageNotFoundError:
            pass
    import torch

    return str(torch.__version__)


def check_installed_torch() -> None:
    """:func:`check_torch` on :func:`installed_torch_version`."""
    check_torch(installed_torch_version())
