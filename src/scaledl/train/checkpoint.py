"""Checkpoints: a run's state on disk, written atomically, checksummed, loaded without code.

A checkpoint is one ``torch.save`` file holding a dict of plain values only, so that
:func:`load_checkpoint` can use ``torch.load(weights_only=True)``, which refuses to run code
from the file.  :func:`save_checkpoint` accepts exactly the values that load back as they were
(:mod:`scaledl.train.checkpoint_values`: tensors, numbers, strings, bytes, ``None``, dtypes,
devices, ``torch.Size`` and plain lists, tuples, sets and dicts of them, by exact type) and
raises ``TypeError`` naming the key of anything else -- a numpy scalar, an enum, a namedtuple,
a tensor subclass -- before writing, rather than leave a file that will not load or convert
the value behind the caller's back.

Every checkpoint carries :data:`REQUIRED_KEYS`: ``version`` (:data:`CHECKPOINT_VERSION`, stamped
by :func:`save_checkpoint`), ``step``, ``epoch``, ``world_size`` and ``config`` (the
``TrainConfig.to_dict()`` of the run), so a trainer can refuse or adapt when it resumes with
another world size.  The rest (``model``, ``optimizer``, ``strategy``, ``rng`` from
:func:`capture_rng`, ...) is the trainer's.  It also carries :data:`CHECKSUM_KEY`, the SHA-256
of everything else (tensor bytes, dtypes, shapes and every other value); :func:`load_checkpoint`
recomputes it and refuses a file whose data changed (a flipped bit), and :func:`load_latest`
(``--resume auto``) then falls back to an older checkpoint.  Version-1 files, written before
the checksum existed, still load, with a warning.

Writing is crash-safe: the file goes to a temporary name in the same directory, is fsynced, then
``os.replace``-d onto its final name, so a file under a checkpoint name is always complete; a
failed write removes its temporary file.  Files are created with mode 0666 less the umask, like
any file the user writes (``umask 077`` keeps them private).  In a run directory,
:func:`write_checkpoint` names files ``checkpoint-step000123.pt``, then points the ``latest``
file (also replaced atomically) at the new one, then prunes old ones, keeping the newest
``keep_last`` and never the one ``latest`` names.  One process writes to a run directory.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from scaledl.files import TMP_PREFIX, create_temporary
from scaledl.train.checkpoint_values import DIGEST_ALGORITHM, state_digest

__all__ = [
    "CHECKPOINT_VERSION", "REQUIRED_KEYS", "CHECKSUM_KEY", "LATEST_NAME", "save_checkpoint",
    "load_checkpoint", "checkpoint_file", "checkpoint_path", "write_checkpoint", "list_checkpoints",
    "latest_checkpoint", "load_latest", "prune_checkpoints", "capture_rng", "restore_rng",
]

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2
"""Format version stored in every checkpoint; bump it when the layout changes (2: checksum)."""
_READABLE_VERSIONS = (1, CHECKPOINT_VERSION)
"""Versions :func:`load_checkpoint` reads; version 1 has no checksum."""

CHECKSUM_KEY = "checksum"
"""Key of ``"sha256:<hex>"``, the digest of every other key (:func:`state_digest`)."""

REQUIRED_KEYS: tuple[str, ...] = ("version", "step", "epoch", "world_size", "config")
"""Keys every checkpoint holds; :func:`load_checkpoint` rejects a file missing any of them."""

LATEST_NAME = "latest"
"""File in a run directory holding the file name of the newest complete checkpoint."""

_PATTERN = re.compile(r"^checkpoint-step(\d+)\.pt$")


# -- one file ---------------------------------------------------------------------------------
def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` (with ``version`` and the checksum stamped in) to ``path`` atomically.

    ``TypeError`` naming the key when a value would not load back as it is (see the module
    docstring); nothing is written then.
    """
    path = Path(path)
    missing = [key for key in REQUIRED_KEYS if key != "version" and key not in state]
    if missing:
        raise ValueError(
            f"checkpoint state lacks {', '.join(missing)}; include every key of {REQUIRED_KEYS}"
        )
    payload = {key: value for key, value in state.items() if key != CHECKSUM_KEY}
    payload["version"] = CHECKPOINT_VERSION
    payload[CHECKSUM_KEY] = f"{DIGEST_ALGORITHM}:{state_digest(payload)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda handle: torch.save(payload, handle))


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` means: ``path`` itself, or for a run directory or its
    :data:`LATEST_NAME` pointer, the newest checkpoint of that run; ``ValueError`` naming the
    path when there is none."""
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise ValueError(f"run directory {path} holds no checkpoint; pass a checkpoint file, "
                             "or train with --checkpoint-every first")
        return found
    if path.name == LATEST_NAME and path.is_file():
        pointed = _pointed(path.parent)
        if pointed is None:
            raise ValueError(f"{path} names no checkpoint that exists; pass a checkpoint file, "
                             "or 'auto' to resume from the newest good one")
        return pointed
    if not path.is_file():
        raise ValueError(
            f"checkpoint {path} does not exist; pass an existing checkpoint file, or 'auto' "
            "to resume from the latest one in the run directory"
        )
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` onto the CPU and verify its checksum;
    ``ValueError`` naming the path when it is missing, unreadable, truncated, corrupt or not a
    scaledl checkpoint.  The returned dict has no :data:`CHECKSUM_KEY`."""
    path = checkpoint_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if not zipfile.is_zipfile(path):
            raise ValueError(f"{path} is not a checkpoint (torch.save did not write it); pass a "
                             "checkpoint file of a run, its run directory, or 'auto'") from None
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        what = f" ({found.group(1)})" if found else ""
        raise ValueError(
            f"checkpoint {path} holds an object other than tensors and plain values{what}, so "
            "it cannot be loaded safely; write it with save_checkpoint"
        ) from None
    except Exception as error:  # torch reports truncation as RuntimeError, EOFError, ...
        raise ValueError(
            f"checkpoint {path} is truncated or corrupt ({type(error).__name__}); delete it "
            "and resume from an older checkpoint"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict; "
                         "pass a checkpoint written by scaledl")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {', '.join(missing)}; pass a checkpoint "
                         "written by scaledl")
    if state["version"] not in _READABLE_VERSIONS:
        raise ValueError(
            f"checkpoint {path} has format version {state['version']} but this scaledl reads "
            f"version {CHECKPOINT_VERSION}; resume with the scaledl version that wrote it"
        )
    _verify(path, state)
    return state


def _verify(path: Path, state: dict[str, Any]) -> None:
    """Pop the stored checksum and compare it with the loaded data's (version 1: none)."""
    stored = state.pop(CHECKSUM_KEY, None)
    if state["version"] == 1 and stored is None:
        log.warning("checkpoint %s has no checksum (format version 1); its data is not "
                    "verified", path)
        return
    try:
        actual = f"{DIGEST_ALGORITHM}:{state_digest(state)}"
    except TypeError as error:
        raise ValueError(f"checkpoint {path} holds values scaledl does not write ({error}); "
                         "pass a checkpoint written by scaledl") from None
    if stored != actual:
        raise ValueError(
            f"checkpoint {path} is corrupt: its data does not match the {DIGEST_ALGORITHM} "
            "checksum stored with it; delete it and resume from an older checkpoint"
        )


# -- a run directory --------------------------------------------------------------------------
def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """``run_dir/checkpoint-step000123.pt`` for step 123."""
    if step < 0:
        raise ValueError(f"checkpoint step {step} must be >= 0")
    return Path(run_dir) / f"checkpoint-step{step:06d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint file in ``run_dir``, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for entry in run_dir.iterdir():
        match = _PATTERN.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def write_checkpoint(
    run_dir: str | Path, step: int, state: Mapping[str, Any], keep_last: int = 2
) -> Path:
    """Save ``state`` as step ``step``'s checkpoint, point ``latest`` at it, prune old ones."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last} must be at least 1")
    path = checkpoint_path(run_dir, step)
    save_checkpoint(path, state)
    _atomic_write(Path(run_dir) / LATEST_NAME, lambda handle: handle.write(
        f"{path.name}\n".encode()
    ))
    prune_checkpoints(run_dir, keep_last)
    return path


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint ``latest`` names, else the highest-step file, else ``None``."""
    run_dir = Path(run_dir)
    pointed = _pointed(run_dir)
    if pointed is not None:
        return pointed
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def load_latest(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint of ``run_dir`` that loads, skipping (with a warning) corrupt
    newer ones; ``None`` when there is none.  This is what ``resume = "auto"`` means."""
    candidates = [path for _, path in reversed(list_checkpoints(run_dir))]
    pointed = _pointed(Path(run_dir))
    if pointed is not None:
        candidates.remove(pointed)
        candidates.insert(0, pointed)
    for path in candidates:
        try:
            return path, load_checkpoint(path)
        except ValueError as error:
            log.warning("skipping %s", error)
    return None


def prune_checkpoints(run_dir: str | Path, keep_last: int = 2) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints, never the one ``latest`` names, and
    leftover temporary files of interrupted writes; return what was deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last} must be at least 1")
    run_dir = Path(run_dir)
    pointed = _pointed(run_dir)
    found = list_checkpoints(run_dir)
    doomed = [path for _, path in found[:-keep_last] if path != pointed]
    if run_dir.is_dir():
        doomed += [entry for entry in run_dir.iterdir() if entry.name.startswith(TMP_PREFIX)]
    for path in doomed:
        path.unlink(missing_ok=True)
        log.debug("deleted %s", path)
    return doomed


def _pointed(run_dir: Path) -> Path | None:
    try:
        name = (run_dir / LATEST_NAME).read_text().strip()
    except OSError:
        return None
    path = run_dir / name
    if _PATTERN.match(name) and path.is_file():
        return path
    return None


# -- random number generators ------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """The state of Python's, numpy's and torch's (CPU and CUDA) global RNGs, as plain values
    that survive ``weights_only=True``."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = cast(
        "tuple[str, np.ndarray, int, int, float]", np.random.get_state()
    )
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
    }
    initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # unannotated
    if torch.cuda.is_available() and initialized:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put the global RNGs back to a :func:`capture_rng` state."""
    try:
        python, numpy_state = state["python"], state["numpy"]
        torch.set_rng_state(state["torch"])
        random.setstate((python["version"], tuple(int(v) for v in python["internal"].tolist()),
                         python["gauss_next"]))
        np.random.set_state((numpy_state["name"], numpy_state["keys"].numpy().astype(np.uint32),
                             numpy_state["pos"], numpy_state["has_gauss"],
                             numpy_state["cached_gaussian"]))
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"RNG state is malformed (missing or wrong {error}); pass the dict "
                         "capture_rng returned") from None
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- helpers ----------------------------------------------------------------------------------
def _atomic_write(path: Path, write: Any) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, fsync, rename onto ``path``.

    The temporary file is created with mode 0666 less the umask (as ``open(path, "w")`` would),
    not ``tempfile.mkstemp``'s fixed 0600, and is removed when anything fails.
    """
    descriptor, tmp_path = create_temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(descriptor)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(descriptor)
