"""The model of a run: one of :mod:`scaledl.models`, or the user's ``package.module:factory``.

A factory is any callable returning an ``nn.Module`` (a function, or the model class itself).
It is called with those of two keywords its signature names: ``input_shape`` (one sample's
shape, e.g. ``(3, 32, 32)``) and ``num_classes``, so ``def make(num_classes): ...`` and ``def
make(): ...`` both work.  The launching process builds it once on the CPU before any worker
starts, so a factory that does not import, raises, or returns something other than a module is
one line there; each worker then builds its own, seeded alike (rank 0's parameters are
broadcast anyway).
"""

from __future__ import annotations

from torch import nn

from scaledl.data.factory import call_factory, is_factory_spec, load_factory
from scaledl.models import build_model

__all__ = ["is_user_model", "build_train_model"]


def is_user_model(name: str) -> bool:
    """Whether ``name`` names a user's factory rather than a model of the registry."""
    return is_factory_spec(name)


def build_train_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Model ``name`` for samples of ``input_shape`` and ``num_classes`` classes."""
    if not is_user_model(name):
        return build_model(name, input_shape, num_classes)
    factory = load_factory(name, "model")
    model = call_factory(factory, name, "model", input_shape=tuple(input_shape),
                         num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model factory {name!r} returned a {type(model).__name__}, not an "
                         "nn.Module; return the model instance (e.g. return Net(), not Net)")
    return model
