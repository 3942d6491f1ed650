"""Shared pieces of the elastic-averaging and parameter-server strategies.

* :func:`flatten_parameters` makes a module's parameters views of one contiguous buffer, so a
  whole model travels as one message (You et al.'s "single-layer communication": one packed
  message per exchange instead of one per layer) with no packing copy.
* :func:`elastic_difference` is the elastic term of EASGD (Zhang, Choromanska, LeCun 2015):
  ``e = alpha * (x_worker - x_center)``; the worker moves by ``-e`` and the center by ``+e``
  (by the sum of every worker's ``e`` in the synchronous form).
* :func:`check_alpha`, :func:`check_beta`, :func:`check_tau`, :func:`check_momentum` validate
  hyper-parameters with one-line errors that name the value and the fix.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "flatten_parameters", "elastic_difference", "check_alpha", "check_beta", "check_tau",
    "check_momentum",
    "learning_rate",
]

_FLAT_ATTRIBUTE = "_scaledl_flat_parameters"


def flatten_parameters(module: nn.Module) -> torch.Tensor:
    """Move every trainable parameter of ``module`` into one flat buffer and return it.

    The parameters stay the same ``nn.Parameter`` objects (an optimizer built on them keeps
    working); their ``.data`` becomes a view of the buffer, in registration order.  All
    trainable parameters must share one dtype and device.  Calling it again on a module that is
    already flat returns the existing buffer.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(module).__name__} has no trainable parameters to flatten")
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(f"parameters of {type(module).__name__} mix dtypes/devices {kinds}; "
                         "cast the model to one dtype and device before wrapping it")
    existing = _existing_buffer(module, params)
    if existing is not None:
        return existing
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype,
                       device=params[0].device)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.data.reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    setattr(module, _FLAT_ATTRIBUTE, flat)
    return flat


def _existing_buffer(module: nn.Module, params: list[nn.Parameter]) -> torch.Tensor | None:
    """The flat buffer ``params`` already are views of, in order, or ``None``."""
    flat: torch.Tensor | None = getattr(module, _FLAT_ATTRIBUTE, None)
    if flat is None or flat.numel() != sum(p.numel() for p in params):
        return None
    offset, base = 0, flat.data_ptr()
    for p in params:
        if p.data_ptr() != base + offset * flat.element_size():
            return None
        offset += p.numel()
    return flat


def elastic_difference(worker: torch.Tensor, center: torch.Tensor, alpha: float,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``alpha * (worker - center)``, written into ``out`` when given."""
    if out is None:
        out = torch.empty_like(worker)
    torch.sub(worker, center, out=out)
    return out.mul_(alpha)


def check_alpha(alpha: float) -> float:
    """``alpha`` (the moving rate ``eta * rho``) if it is in (0, 1), else a one-line error."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha} must be in (0, 1), e.g. 0.9 / workers; it is the "
                         "moving rate eta * rho of the elastic pull (or give --rho)")
    return float(alpha)


def check_beta(alpha: float, workers: int) -> float:
    """``beta = workers * alpha`` if it is below 1, else a one-line error.

    The synchronous center update is ``c <- (1 - beta) c + beta * mean_i(x_i)``: for ``beta``
    in (0, 1) the center moves part of the way to the workers' mean; above 1 it overshoots
    (oscillates), above 2 it diverges.  Zhang, Choromanska, LeCun (2015) keep ``beta < 1`` and
    use ``beta = 0.9``, i.e. ``alpha = 0.9 / workers``.
    """
    beta = workers * alpha
    if not beta < 1:
        raise ValueError(f"sync-easgd needs beta = workers * alpha = {workers} * {alpha:g} = "
                         f"{beta:g} below 1, or the center oscillates or diverges; give alpha "
                         f"{0.9 / workers:.3g} (0.9 / workers) or smaller")
    return beta


def check_tau(tau: int) -> int:
    """``tau`` (local steps between exchanges) if it is a positive integer."""
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
        raise ValueError(f"tau {tau!r} must be an integer >= 1 (local steps between "
                         "exchanges; 1 communicates every step)")
    return tau


def check_momentum(momentum: float) -> float:
    """``momentum`` if it is in [0, 1)."""
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum {momentum} must be in [0, 1), e.g. 0.9")
    return float(momentum)


def learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of ``optimizer``'s first parameter group."""
    return float(optimizer.param_groups[0]["lr"])
