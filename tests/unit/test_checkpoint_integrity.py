"""Checkpoint integrity: the save-time check matches ``weights_only``, a checksum catches flipped
bits (and ``--resume auto`` skips such a file), and files honour the umask."""

from __future__ import annotations

import enum
import io
import os
import stat
from collections import Counter, OrderedDict, namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.train.checkpoint import (
    CHECKSUM_KEY, load_checkpoint, load_latest, save_checkpoint, write_checkpoint,
)

BASE: dict[str, Any] = {"step": 1, "epoch": 0, "world_size": 2, "config": {"name": "abcdef"}}


class Colour(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class Table(dict):  # type: ignore[type-arg]
    pass


class Items(list):  # type: ignore[type-arg]
    pass


class Marked(torch.Tensor):
    pass


Pair = namedtuple("Pair", "a b")

ACCEPTED: dict[str, Any] = {
    "bool": True, "int": -3, "float": 0.1, "nan": float("nan"), "complex": 1 + 2j, "str": "x",
    "bytes": b"\x00\xff", "bytearray": bytearray(b"ab"), "none": None, "dtype": torch.bfloat16,
    "device": torch.device("cpu"), "size": torch.Size([2, 3]), "tensor": torch.arange(6.0),
    "bool_tensor": torch.tensor([True, False]), "scalar_tensor": torch.tensor(3),
    "empty": torch.empty(0, 4), "param": torch.nn.Parameter(torch.ones(2)),
    "list": [1, [2.5]], "tuple": (1, "a"), "set": {1, 2, 3}, "ordered": OrderedDict(a=1),
    "counter": Counter("aab"), "dict": {1: {"deep": torch.zeros(2)}},
}


def _torch_round_trip(value: Any) -> Any:
    buffer = io.BytesIO()
    torch.save({"value": value}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["value"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_every_accepted_value_loads_back_as_it_was(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.pt", {**BASE, "values": ACCEPTED})
    loaded = load_checkpoint(tmp_path / "c.pt")["values"]
    for key, value in ACCEPTED.items():
        assert _same(value, loaded[key]), key


@pytest.mark.parametrize(("value", "hint"), [
    (np.float64(0.5), r"\.item\(\)"), (np.int64(3), r"\.item\(\)"), (np.bool_(True), r"\.item"),
    (np.float32(1.5), r"\.item"), (np.zeros(2), "torch.from_numpy"),
    (ReduceOp.AVG, r"\.value"), (Level.LOW, r"\.value"), (Colour.RED, r"\.value"),
    (Pair(1, 2), "plain list, tuple"), (Items([1]), "plain list"), (frozenset({1}), "plain"),
    (Table(a=1), "plain dict"), (torch.ones(2).as_subclass(Marked), "plain tensor"),
    (range(3), "plain values"), (object(), "plain values"),
])
def test_values_that_do_not_load_back_are_refused_at_save(
    tmp_path: Path, value: Any, hint: str
) -> None:
    with pytest.raises(Exception):  # noqa: B017,PT011 - the refusal is justified: torch refuses
        _torch_round_trip(value)
    with pytest.raises(TypeError, match=r"state\['extra'\]\['k'\] is a .*" + hint) as caught:
        save_checkpoint(tmp_path / "c.pt", {**BASE, "extra": {"k": value}})
    assert "\n" not in str(caught.value)
    assert not list(tmp_path.iterdir())


def _flip(path: Path, needle: bytes, offset: int = 0, bit: int = 0x01) -> None:
    """Flip one bit of the first occurrence of ``needle`` in the file (stored uncompressed)."""
    raw = bytearray(path.read_bytes())
    index = raw.find(needle)
    assert index >= 0
    raw[index + offset] ^= bit
    path.write_bytes(bytes(raw))


def _weights() -> torch.Tensor:
    return torch.arange(1000, dtype=torch.float32).mul_(1.0001)  # distinctive bytes


def test_flipped_bit_in_tensor_data_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, {**BASE, "w": _weights()})
    _flip(path, _weights()[500:502].numpy().tobytes(), offset=2, bit=0x40)
    with pytest.raises(ValueError, match=f"{path} is corrupt: .*checksum") as caught:
        load_checkpoint(path)
    assert "\n" not in str(caught.value)


def test_flipped_bit_in_metadata_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, {**BASE, "w": _weights()})
    _flip(path, b"abcdef", offset=5)  # 'abcdef' -> 'abcdeg': still a valid pickle
    with pytest.raises(ValueError, match="is corrupt"):
        load_checkpoint(path)


def test_checksum_is_stored_and_not_returned(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, {**BASE, CHECKSUM_KEY: "forged"})
    raw = torch.load(path, weights_only=True)
    assert raw[CHECKSUM_KEY].startswith("sha256:") and len(raw[CHECKSUM_KEY]) == 7 + 64
    assert CHECKSUM_KEY not in load_checkpoint(path)
    del raw[CHECKSUM_KEY]
    torch.save(raw, path)
    with pytest.raises(ValueError, match="is corrupt"):
        load_checkpoint(path)


def test_version_one_without_checksum_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({**BASE, "version": 1, "w": torch.ones(2)}, path)
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(2))


def test_resume_auto_skips_a_newer_checkpoint_with_a_flipped_bit(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, {**BASE, "w": torch.zeros(1000)})
    newest = write_checkpoint(tmp_path, 2, {**BASE, "step": 2, "w": _weights()})
    _flip(newest, _weights()[500:502].numpy().tobytes(), offset=2, bit=0x40)
    found = load_latest(tmp_path)
    assert found is not None
    path, state = found
    assert path.name == "checkpoint-step000001.pt" and state["step"] == 1


@pytest.fixture
def umask() -> Iterator[Any]:
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_honour_the_umask(tmp_path: Path, umask: Any, mask: int, mode: int) -> None:
    umask(mask)
    path = write_checkpoint(tmp_path, 3, BASE)
    for written in (path, tmp_path / "latest"):
        assert stat.S_IMODE(written.stat().st_mode) == mode, written.name


def test_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_fsync(descriptor: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="I/O error"):
        save_checkpoint(tmp_path / "c.pt", BASE)
    assert not list(tmp_path.iterdir())
