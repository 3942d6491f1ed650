"""The trained model of a run, as a file of its own: ``model.pt``, and :func:`load_model`.

At the end of a run rank 0 writes ``model.pt`` in the run directory: the parameters and buffers
of the model whose test accuracy the summary reports (for the elastic strategies the center
variable, else the trained replica), on the CPU, with what rebuilds it: the model's name (a
registry name or ``package.module:factory``), one sample's shape and the number of classes.
:func:`load_model` rebuilds the model from that and loads the weights; a run stopped before its
end has no ``model.pt``, and then the newest good checkpoint's model (rank 0's replica) is
loaded instead.  Both are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaledl.files import create_temporary
from scaledl.train.user_model import build_train_model

__all__ = ["MODEL_NAME", "save_model", "load_model"]

log = logging.getLogger(__name__)

MODEL_NAME = "model.pt"
"""The trained model's file in a run directory."""


def save_model(out: Path, model: nn.Module, name: str, input_shape: tuple[int, ...],
               num_classes: int) -> Path:
    """Write ``out/model.pt`` whole or not at all (staged, then renamed into place)."""
    state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
    payload = {"model": name, "input_shape": list(input_shape), "num_classes": int(num_classes),
               "state_dict": state}
    path = out / MODEL_NAME
    descriptor, temporary = create_temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(payload, handle)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def load_model(run_dir: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The trained model of the run in ``run_dir``, in eval mode, on ``map_location``.

    Built as the run built it (``scaledl.models`` by name, or the user's factory, which must
    import from where this is called), with the weights of ``model.pt``, or of the newest good
    checkpoint when the run ended before writing it.  A one-line ``ValueError`` when the
    directory holds neither.
    """
    run = Path(run_dir)
    path = run / MODEL_NAME
    if path.is_file():
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        name, shape = payload["model"], tuple(payload["input_shape"])
        classes, state = int(payload["num_classes"]), payload["state_dict"]
    else:
        name, shape, classes, state = _from_checkpoint(run)
    model = build_train_model(name, shape, classes)
    model.load_state_dict(state)
    return model.to(map_location).eval()


def _from_checkpoint(run: Path) -> tuple[str, tuple[int, ...], int, dict[str, Any]]:
    """What :func:`load_model` needs, from the newest good checkpoint of ``run``."""
    from scaledl.data import declared_shape, load_dataset
    from scaledl.train.checkpoint import load_latest

    latest = load_latest(run) if run.is_dir() else None
    if latest is None:
        raise ValueError(f"{run} holds no {MODEL_NAME} and no checkpoint; give the --out "
                         "directory of a run that reached its first checkpoint")
    checkpoint, state = latest
    log.warning("%s has no %s (the run did not finish); loading rank 0's model of %s", run,
                MODEL_NAME, checkpoint.name)
    config = state["config"]
    name, data = config["model"]["name"], config["data"]
    sample = state.get("sample")
    if sample is not None:
        shape, classes = tuple(sample["input_shape"]), int(sample["num_classes"])
    else:  # a checkpoint from before the sample's shape was recorded: the data set tells
        known = declared_shape(data["dataset"])
        if known is None:
            train = load_dataset(data["dataset"], data.get("data_dir"), "train",
                                 config["run"]["seed"], data.get("synthetic_size"),
                                 data.get("image_size"))
            known = (train.input_shape, train.num_classes)
        shape, classes = known
    return name, shape, classes, state["strategy"]["model"]
