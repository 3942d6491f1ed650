"""Checkpoint values: what a checkpoint may hold, and the digest that proves it came back intact.

A checkpoint is loaded with ``torch.load(weights_only=True)``, whose unpickler rebuilds only an
allowlist of classes.  :func:`state_digest` walks a state and accepts a value only when its
*exact* type is one that allowlist rebuilds -- ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``, ``bytearray``, ``None``, ``torch.dtype``, ``torch.device``, ``torch.Size``,
``torch.Tensor``, ``torch.nn.Parameter``, and ``dict``, ``OrderedDict``, ``Counter``, ``list``,
``tuple`` and ``set`` of them.  Subclasses are refused even where ``isinstance`` would pass them
(``numpy.float64`` is a ``float``, an ``IntEnum`` an ``int``, a ``StrEnum`` a ``str``, a
``namedtuple`` a ``tuple``): pickle records their class, which ``weights_only`` then refuses to
load.  Nothing is converted behind the caller's back; the ``TypeError`` names the key and the fix
(``.item()``, ``.value``, a plain container), so what loads is exactly what was saved.

The same walk feeds SHA-256 with every value: for a tensor its type, dtype, shape and raw bytes;
for other values a type tag and an exact encoding (``repr`` of a float round-trips); for
containers their length and items in order (a set's items sorted by their own digests, as a
set's order is not kept).  The checkpoint stores the digest; the loader recomputes it, so a
flipped bit in tensor data or metadata is caught instead of loading silently.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections import Counter, OrderedDict
from typing import Any

import torch

__all__ = ["state_digest", "DIGEST_ALGORITHM"]

DIGEST_ALGORITHM = "sha256"
"""Hash of :func:`state_digest`."""

_SCALARS: dict[type, bytes] = {
    bool: b"b", int: b"i", float: b"f", complex: b"c", str: b"s", bytes: b"y",
    bytearray: b"a", type(None): b"n", torch.dtype: b"t", torch.device: b"d",
}
_SEQUENCES: dict[type, bytes] = {list: b"L", tuple: b"T", torch.Size: b"Z"}
_MAPPINGS: dict[type, bytes] = {dict: b"D", OrderedDict: b"O", Counter: b"C"}
_TENSORS: dict[type, bytes] = {torch.Tensor: b"X", torch.nn.Parameter: b"P"}


def state_digest(state: Any, where: str = "state") -> str:
    """Hex SHA-256 of ``state``; ``TypeError`` naming the key of the first value that
    ``torch.load(weights_only=True)`` would not give back as it is."""
    hasher = hashlib.sha256()
    _feed(hasher, state, where)
    return hasher.hexdigest()


def _feed(hasher: Any, value: Any, where: str) -> None:
    kind = type(value)
    if kind in _TENSORS:
        _feed_tensor(hasher, _TENSORS[kind], value)
    elif kind in _SCALARS:
        _feed_bytes(hasher, _SCALARS[kind], _scalar_bytes(value))
    elif kind in _SEQUENCES:
        _feed_bytes(hasher, _SEQUENCES[kind], struct.pack("<q", len(value)))
        for index, item in enumerate(value):
            _feed(hasher, item, f"{where}[{index}]")
    elif kind in _MAPPINGS:
        _feed_bytes(hasher, _MAPPINGS[kind], struct.pack("<q", len(value)))
        for key, item in value.items():
            _feed(hasher, key, f"{where} key {key!r}")
            _feed(hasher, item, f"{where}[{key!r}]")
    elif kind is set:
        digests = sorted(state_digest(item, f"{where} item {item!r}") for item in value)
        _feed_bytes(hasher, b"S", "".join(digests).encode())
    else:
        raise TypeError(_refusal(value, where))


def _feed_bytes(hasher: Any, tag: bytes, data: bytes) -> None:
    hasher.update(tag + struct.pack("<q", len(data)))
    hasher.update(data)


def _scalar_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return (repr(value) if isinstance(value, (float, complex)) else str(value)).encode()


def _feed_tensor(hasher: Any, tag: bytes, tensor: torch.Tensor) -> None:
    """Type, dtype, shape and the bytes of the values (dense, on the CPU, conj/neg resolved)."""
    data = tensor.detach()
    if data.is_quantized:
        data = data.int_repr()
    elif data.layout != torch.strided:
        data = data.to_dense()
    data = data.resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    header = f"{tensor.dtype}|{tuple(tensor.shape)}".encode()
    _feed_bytes(hasher, tag, header)
    raw = data.view(torch.uint8).numpy() if data.numel() else b""
    hasher.update(struct.pack("<q", len(raw)))
    hasher.update(raw)


def _refusal(value: Any, where: str) -> str:
    """One sentence: what ``where`` holds, that ``weights_only`` refuses it, and the fix."""
    kind = type(value)
    if kind.__module__ == "numpy":
        hint = "convert it with .item() (a numpy scalar) or torch.from_numpy (an array)"
    elif isinstance(value, enum.Enum):
        hint = "store its .value and rebuild the enum after loading"
    elif isinstance(value, torch.Tensor):
        hint = "store a plain tensor, e.g. value.as_subclass(torch.Tensor)"
    elif isinstance(value, dict):
        hint = "use a plain dict"
    elif isinstance(value, (list, tuple, set, frozenset)):
        hint = "use a plain list, tuple or set"
    else:
        hint = "store tensors and plain values (numbers, strings, lists, dicts) only"
    return (f"checkpoint {where} is a {kind.__module__}.{kind.__qualname__}, which "
            f"torch.load(weights_only=True) cannot load back; {hint}")
