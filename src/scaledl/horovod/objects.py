"""Moving Python objects and model/optimizer state: broadcast_object, allgather_object,
broadcast_parameters, broadcast_optimizer_state.

Objects are pickled (``pickle``, so lambdas and local classes do not travel; Horovod uses
cloudpickle) and sent as int32 words through the same negotiated collectives as tensors:
``broadcast_object`` broadcasts the length, then the bytes; ``allgather_object`` needs one
allgather, since the negotiation round already carries every rank's length.

``broadcast_optimizer_state`` makes the root's optimizer state everyone's: the root broadcasts
the state's layout (pickled, tensors replaced by their shape and dtype) and the hyper-parameters
of every parameter group, then the tensors themselves, one broadcast per dtype; the other ranks
load the result with ``load_state_dict``.  Unlike Horovod it needs no extra optimizer step to
create missing state: a rank whose optimizer has not stepped yet simply receives the root's.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from scaledl.horovod import runtime
from scaledl.horovod.allgather import start_allgather
from scaledl.horovod.broadcast import broadcast_, broadcast_tensors_
from scaledl.horovod.process_sets import ProcessSet, global_process_set

__all__ = ["broadcast_object", "allgather_object", "broadcast_parameters",
           "broadcast_optimizer_state"]


def _to_words(obj: object) -> torch.Tensor:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    padded = bytearray(data) + bytearray(-len(data) % 4)
    return torch.frombuffer(padded, dtype=torch.int32).clone()


def _from_words(words: torch.Tensor) -> Any:
    return pickle.loads(words.cpu().contiguous().numpy().tobytes())  # trailing padding is ignored


def broadcast_object(
    obj: object, root_rank: int = 0, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s ``obj`` on every member (other ranks' ``obj`` is ignored).

    Without ``name`` the call is named ``broadcast_object`` on every rank (calls are matched
    by order): a name from ``obj``'s type, as Horovod makes it, differs on the ranks that pass
    ``None`` in the usual ``broadcast_object(state if hvd.rank() == 0 else None)``.
    """
    base = name or "broadcast_object"
    is_root = runtime.current().rank == root_rank
    words = _to_words(obj) if is_root else torch.empty(0, dtype=torch.int32)
    length = broadcast_(torch.tensor([words.numel()]), root_rank, f"{base}.length", process_set)
    if not is_root:
        words = torch.empty(int(length.item()), dtype=torch.int32)
    broadcast_(words, root_rank, f"{base}.data", process_set)
    return obj if is_root else _from_words(words)


def allgather_object(
    obj: object, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every member's ``obj``, in set-rank order."""
    words = _to_words(obj)
    base = name or "allgather_object"  # the same on every rank, whatever each passes
    lengths = start_allgather(torch.tensor([words.numel()]), f"{base}.length", process_set,
                              True).wait()
    gathered = start_allgather(words, f"{base}.data", process_set, True).wait()
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(_from_words(gathered[offset:offset + length]))
        offset += length
    return objects


def _named_tensors(params: object) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        return sorted((str(k), v) for k, v in params.items())
    if isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        items = list(params)
        return [(str(p[0]), p[1]) if isinstance(p, tuple) else (str(i), p)
                for i, p in enumerate(items)]
    raise ValueError(f"broadcast_parameters takes a dict (model.state_dict()), named_parameters() "
                     f"or a list of tensors, got {type(params).__name__}")


def broadcast_parameters(params: object, root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Copy ``root_rank``'s values into ``params`` (a state dict, ``named_parameters()`` or a
    list of tensors) in place on every member."""
    named = _named_tensors(params)
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(value).__name__}, not a "
                             "tensor; use broadcast_object for other values")
    broadcast_tensors_([value for _, value in named], root_rank, "broadcast_parameters",
                       process_set)


@dataclass(frozen=True)
class _TensorSlot:
    """Stands for a state tensor in the pickled layout."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool


def _layout(state: dict[Any, Any], tensors: list[torch.Tensor]) -> dict[Any, Any]:
    layout: dict[Any, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            layout[key] = _TensorSlot(len(tensors), tuple(value.shape), value.dtype,
                                      value.device.type == "cpu")
            tensors.append(value)
        else:
            layout[key] = value
    return layout


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, model: torch.nn.Module | None = None,
    process_set: ProcessSet = global_process_set,
) -> None:
    """Give every member ``root_rank``'s optimizer state and hyper-parameters (``model`` is
    accepted for compatibility and unused)."""
    state_dict = optimizer.state_dict()
    is_root = runtime.current().rank == root_rank
    tensors: list[torch.Tensor] = []
    layout = None
    if is_root:
        layout = {"param_groups": state_dict["param_groups"],
                  "state": {pid: _layout(s, tensors) for pid, s in state_dict["state"].items()}}
    layout = broadcast_object(layout, root_rank, "optimizer_state.layout", process_set)
    if not is_root:
        tensors = _allocate(layout["state"], optimizer)
    broadcast_tensors_(tensors, root_rank, "optimizer_state.tensors", process_set)
    if is_root:
        return
    state = {pid: {k: tensors[v.index] if isinstance(v, _TensorSlot) else v for k, v in s.items()}
             for pid, s in layout["state"].items()}
    try:
        optimizer.load_state_dict({"state": state, "param_groups": layout["param_groups"]})
    except (ValueError, KeyError) as error:
        raise ValueError(f"broadcast_optimizer_state: rank {root_rank}'s optimizer state does not "
                         f"fit this rank's optimizer ({error}); build the same optimizer over the "
                         "same parameters on every rank") from None


def _allocate(layout_state: dict[Any, Any], optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots = [(slot, pid) for pid, entries in layout_state.items()
             for slot in entries.values() if isinstance(slot, _TensorSlot)]
    slots.sort(key=lambda pair: pair[0].index)
    tensors = []
    for slot, pid in slots:
        device = torch.device("cpu") if slot.on_cpu or pid >= len(params) else params[pid].device
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype, device=device))
    return tensors
