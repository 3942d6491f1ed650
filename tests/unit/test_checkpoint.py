"""Checkpoints: atomic writes, weights_only loading, RNG round trips, retention and errors."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from scaledl.train import checkpoint as ckpt
from scaledl.train.checkpoint import (
    CHECKPOINT_VERSION, LATEST_NAME, capture_rng, checkpoint_file, checkpoint_path,
    latest_checkpoint, list_checkpoints,
    load_checkpoint, load_latest, prune_checkpoints, restore_rng, save_checkpoint,
    write_checkpoint,
)
from scaledl.train.config import TrainConfig


def _state(step: int = 7) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return {
        "step": step, "epoch": 1, "world_size": 4, "config": TrainConfig().to_dict(),
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "rng": capture_rng(), "sampler": {"epoch": 1, "offset": 96},
    }


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_loads_with_weights_only(tmp_path: Path) -> None:
    state = _state()
    path = tmp_path / "c.pt"
    save_checkpoint(path, state)
    raw = torch.load(path, weights_only=True)
    assert raw["version"] == CHECKPOINT_VERSION
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["world_size"] == 4
    assert TrainConfig.from_dict(loaded["config"]) == TrainConfig()
    for key, tensor in state["model"].items():
        assert torch.equal(loaded["model"][key], tensor)
    momentum = loaded["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, state["optimizer"]["state"][0]["momentum_buffer"])
    assert "version" not in state  # the caller's dict is not modified
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary files left


def test_rng_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leave a cached gaussian in numpy's state
    random.gauss(0, 1)
    save_checkpoint(tmp_path / "c.pt", {**_state(), "rng": capture_rng()})
    expected = _draw()
    restore_rng(load_checkpoint(tmp_path / "c.pt")["rng"])
    assert _draw() == expected


def test_restore_rng_rejects_malformed_state() -> None:
    with pytest.raises(ValueError, match="capture_rng"):
        restore_rng({"torch": torch.get_rng_state()})


def test_save_rejects_what_weights_only_refuses(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"\['sampler'\]\['offset'\].*numpy.*\.item\(\)"):
        save_checkpoint(tmp_path / "c.pt", {**_state(), "sampler": {"offset": np.int64(3)}})
    with pytest.raises(ValueError, match="world_size"):
        save_checkpoint(tmp_path / "c.pt", {"step": 1, "epoch": 0, "config": {}})
    assert not list(tmp_path.iterdir())


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path / 'none.pt'} does not exist"):
        load_checkpoint(tmp_path / "none.pt")


@pytest.mark.parametrize("cut", [0, 10, 0.5])
def test_truncated_file(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, _state())
    data = path.read_bytes()
    path.write_bytes(data[: int(cut if cut >= 1 else cut * len(data))])
    with pytest.raises(ValueError, match=f"{path} is truncated or corrupt") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


def test_wrong_content(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"model": {}}, path)
    with pytest.raises(ValueError, match=f"{path} lacks version, step"):
        load_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="list, not a state dict"):
        load_checkpoint(path)
    torch.save({**_state(), "version": CHECKPOINT_VERSION + 1}, path)
    with pytest.raises(ValueError, match="format version"):
        load_checkpoint(path)
    torch.save({**_state(), "extra": np.zeros(2)}, path)  # not loadable with weights_only
    with pytest.raises(ValueError, match=f"{path} holds an object other than tensors and plain "
                                         r"values \(numpy[\w.]+\), so it cannot be loaded "
                                         "safely") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
    assert "weights_only" not in str(info.value)  # torch's advice to load it unsafely


def test_a_file_torch_did_not_write_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "notackpt.pt"
    path.write_text("garbage\n")
    with pytest.raises(ValueError) as info:
        load_checkpoint(path)
    assert str(info.value) == (f"{path} is not a checkpoint (torch.save did not write it); pass "
                               "a checkpoint file of a run, its run directory, or 'auto'")


def test_a_run_directory_or_its_latest_pointer_means_its_newest_checkpoint(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (4, 8):
        write_checkpoint(run, step, _state(step=step))
    assert load_checkpoint(run)["step"] == 8
    assert load_checkpoint(run / LATEST_NAME)["step"] == 8
    assert checkpoint_file(run / LATEST_NAME) == latest_checkpoint(run)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"run directory {empty} holds no checkpoint"):
        load_checkpoint(empty)
    (empty / LATEST_NAME).write_text("checkpoint-step000099.pt")
    with pytest.raises(ValueError, match="names no checkpoint that exists; pass a checkpoint"):
        load_checkpoint(empty / LATEST_NAME)


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, _state(step=1))

    def broken_save(obj: Any, handle: Any) -> None:
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, _state(step=2))
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_run_directory_naming_pointer_and_retention(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None
    assert checkpoint_path(tmp_path, 123).name == "checkpoint-step000123.pt"
    for step in (10, 20, 30):
        path = write_checkpoint(tmp_path, step, _state(step), keep_last=2)
        assert latest_checkpoint(tmp_path) == path
    assert [step for step, _ in list_checkpoints(tmp_path)] == [20, 30]
    assert (tmp_path / "latest").read_text().strip() == "checkpoint-step000030.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-step000020.pt", "checkpoint-step000030.pt", "latest"]


def test_pruning_never_deletes_the_pointed_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, _state(step), keep_last=3)
    (tmp_path / "latest").write_text("checkpoint-step000001.pt\n")  # e.g. after a rollback
    (tmp_path / ".tmp-checkpoint-step000004.pt.abc").write_bytes(b"leftover")
    deleted = prune_checkpoints(tmp_path, keep_last=1)
    assert sorted(p.name for p in deleted) == [".tmp-checkpoint-step000004.pt.abc",
                                               "checkpoint-step000002.pt"]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1, 3]
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 1)
    with pytest.raises(ValueError, match="keep_last 0"):
        prune_checkpoints(tmp_path, keep_last=0)


def test_latest_falls_back_without_pointer_and_load_latest_skips_corrupt(
    tmp_path: Path,
) -> None:
    for step in (5, 6):
        write_checkpoint(tmp_path, step, _state(step), keep_last=5)
    (tmp_path / "latest").unlink()
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 6)
    checkpoint_path(tmp_path, 6).write_bytes(b"garbage")
    found = load_latest(tmp_path)
    assert found is not None
    path, state = found
    assert path == checkpoint_path(tmp_path, 5) and state["step"] == 5
    assert load_latest(tmp_path / "empty") is None
